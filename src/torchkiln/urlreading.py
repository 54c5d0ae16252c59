"""URLs as the tools torchkiln hands them to will read them, and what a host must be once read.

A URL is checked on what its tool makes of it, not on the text: git percent-decodes a URL before it splits
host, port and path, so ``ssh://%2doProxyCommand=x/p`` is a host beginning with ``-``; ccache decodes
``%XX`` and drops ``.`` and ``..`` path segments, so ``redis://h:6379/%2e%2e`` names the database ``""``.
Each reader here is a port of the tool's own parser, with its source:

* :func:`git_decode`: git's ``url_decode`` (git url.c ``url_decode_mem``, ``url_decode_internal``):
  everything after the first ``:`` is decoded, ``%XX`` becoming that byte when XX is two hex digits whose
  value is not 0 (``%00`` stays three characters); nothing else changes.
* :func:`git_reading`: git connect.c ``parse_connect_url`` (decode when ``is_url``: a scheme of
  ``[A-Za-z0-9][A-Za-z0-9+.-]*`` then ``://``), ``host_end`` and ``get_host_and_port`` (a bracketed host
  loses its brackets; a port is what follows the last ``:`` when it is all digits below 65536), ``user@``
  before the host; ``[user@]host:path`` (scp-like) and local paths are taken as written. ``git fetch-pack
  --diag-url URL`` prints git's own reading, which the tests compare with this one.
* :func:`ccache_url`: ccache v4.7.5 src/third_party/url.cpp ``Url::parse_url`` (the character classes of
  its ``tbl``, ``decode`` of user info, host and path, ``normalize_path``, a lowercased scheme and host).
  A malformed URL is the ``ValueError`` ccache's ``Url::parse_error`` would be.

:func:`host_problem` is what a host must be after its tool's decoding, wherever a host reaches a tool, in
the one spelling every tool reads alike (issue 45): a lowercase ASCII host name without a trailing ``.``
(letters, digits and inner ``-``, labels of at most 63, RFC 1123; a Unicode name is written in IDNA's
``xn--`` form, so a look-alike is visible as one), an IPv4 address as a decimal dotted quad (:func:`inet_aton`
is how git, curl and ccache read the other spellings), or an IPv6 literal in its compressed form. Standard
library only.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?", re.ASCII)
HOST_VALID = (
    "a lowercase ASCII host name (letters, digits, inner '-'; a Unicode name in its xn-- form), an IPv4 "
    "address as four decimal numbers, or a bracketed IPv6 address in its compressed form"
)
# What every part of a URL must be once its tool decoded it: printable ASCII, no space (what a recipe
# string is before any decoding: torchkiln.recipe.validators.plain_string, URL_RE).
PRINTABLE = re.compile(r"[!-~]*", re.ASCII)


def inet_aton(host: str) -> str | None:
    """The IPv4 address glibc's ``inet_aton`` reads ``host`` as (getaddrinfo asks it first: git, ssh, curl,
    ccache's hiredis and Python's sockets connect there), in dotted-quad form; None when it is no address.
    glibc inet_addr.c ``inet_aton_exact``: one to four parts split at ``.``, each decimal, octal after a
    leading ``0`` or hex after ``0x`` (``2130706433``, ``0x7f.1``, ``0177.0.0.1`` and ``127.1`` are all
    127.0.0.1), the last part filling the bytes the others left. The WHATWG URL parser (the url crate:
    sccache, sccache-dist) reads the same forms."""
    parts: list[int] = []
    for text in host.split("."):
        match = re.fullmatch(r"0[xX]([0-9A-Fa-f]+)|(0[0-7]*)|([1-9][0-9]*)", text, re.ASCII)
        if match is None:
            return None
        hexa, octal, decimal = match.groups()
        parts.append(int(hexa, 16) if hexa else int(octal, 8) if octal else int(decimal))
    if not 1 <= len(parts) <= 4 or any(part > 0xFF for part in parts[:-1]):
        return None
    if parts[-1] >= 256 ** (5 - len(parts)):
        return None
    value = sum(part << (8 * (3 - i)) for i, part in enumerate(parts[:-1])) + parts[-1]
    return str(ipaddress.IPv4Address(value))


# The WHATWG URL standard's "ends in a number" (the last label decimal digits, or 0x and hex digits): such a
# host is an IPv4 address to a URL parser, and an address or a name to look up elsewhere (``foo.123``).
_ENDS_IN_A_NUMBER = re.compile(r"(?:.*\.)?(?:[0-9]+|0[xX][0-9A-Fa-f]*)", re.ASCII | re.DOTALL)


def host_problem(host: str) -> str | None:
    """Why ``host`` (as its tool reads it: brackets removed) is not a host written in its one canonical form,
    which every tool reads alike; None when it is. A name: lowercase, no trailing ``.``; an IPv4 address:
    the dotted quad in decimal (every other form, ``2130706433``, ``0x7f.1``, ``127.1``, ``0177.0.0.1``,
    names the same address to git, curl and ccache: :func:`inet_aton`); an IPv6 address: its compressed
    lowercase form, no zone, not an IPv4-mapped one (``::ffff:127.0.0.1`` connects to 127.0.0.1)."""
    if not host:
        return "no host"
    if ":" in host:
        return _ipv6_problem(host)
    if host.endswith(".") and len(host) > 1:
        return f"the host {host!r} ends with '.' (curl, git and ccache look it up differently): write {host[:-1]}"
    if _ENDS_IN_A_NUMBER.fullmatch(host):
        if _is_dotted_quad(host):
            return None
        address = inet_aton(host)
        if address is not None:
            return f"the host {host!r} is the IPv4 address {address} to git, curl and ccache: write {address}"
        return f"the host {host!r} ends in a number but is no IPv4 address (tools read it differently)"
    if host.startswith("-"):
        return f"the host {host!r} begins with '-', which ssh and git read as an option"
    if not host.isascii() or not PRINTABLE.fullmatch(host):
        return f"the host {host!r} holds a character that is not printable ASCII"
    if len(host) > 253 or not all(LABEL.fullmatch(label) for label in host.split(".")):
        return f"the host {host!r} is not a host name"
    if host != host.lower():
        return f"the host {host!r} is written in capitals (ccache and URL parsers lower-case it): write {host.lower()}"
    return None


def _is_dotted_quad(host: str) -> bool:
    """Four decimal numbers 0..255 without leading zeros: the one spelling of an IPv4 address."""
    try:
        return str(ipaddress.IPv4Address(host)) == host
    except ValueError:
        return False


def _ipv6_problem(host: str) -> str | None:
    try:
        address = ipaddress.IPv6Address(host)
    except ValueError:
        return f"the host {host!r} is not a host name or IP address"
    if address.scope_id is not None:
        return f"the IPv6 host {host!r} names a zone (tools read a zone differently)"
    if address.ipv4_mapped is not None:
        return (
            f"the IPv6 host {host!r} is the IPv4 address {address.ipv4_mapped}: write {address.ipv4_mapped}"
        )
    if str(address) != host:
        return f"the IPv6 host {host!r} is not in its canonical form: write [{address}]"
    return None


def printable_problem(what: str, value: str, how: str = "once decoded") -> str | None:
    """Why a part of a URL as its tool reads it (``how``) is not printable ASCII without spaces (a control
    character, a space, a byte that is not ASCII once decoded); None when it is."""
    if PRINTABLE.fullmatch(value):
        return None
    bad = next(c for c in value if not PRINTABLE.fullmatch(c))
    return f"its {what} {value!r} holds {bad!r} {how}"


# --------------------------------------------------------------------------------------------------
# git
# --------------------------------------------------------------------------------------------------

_GIT_SCHEME = re.compile(r"[A-Za-z0-9][A-Za-z0-9+.-]*://", re.ASCII)
_PERCENT_XX = re.compile(rb"%([0-9A-Fa-f]{2})")
_STRAY_PERCENT = re.compile(rb"%(?![0-9A-Fa-f]{2})")  # a '%' not before two hex digits


def _percent_decoded(data: bytes, *, keep_nul: bool = False) -> bytes:
    """Every ``%XX`` (two hex digits) of ``data`` as its byte, the decoders of git and ccache alike; with
    ``keep_nul`` (git's) ``%00`` stays as it is. Any other ``%`` stays too (ccache refuses it first)."""

    def byte(match: re.Match[bytes]) -> bytes:
        value = int(match[1], 16)
        return match[0] if keep_nul and value == 0 else bytes([value])

    return _PERCENT_XX.sub(byte, data)


def git_is_url(url: str) -> bool:
    """git url.c ``is_url``: a scheme of letters, digits, ``+``, ``.``, ``-`` (not first), then ``://``."""
    return _GIT_SCHEME.match(url) is not None


def git_decode(url: str) -> str:
    """git url.c ``url_decode``: the part after the first ``:`` percent-decoded (a non-zero byte only);
    bytes that are not UTF-8 come back as surrogates (``surrogateescape``), so they fail any ASCII check."""
    data = url.encode("utf-8", "surrogateescape")
    colon = data.find(b":")
    head, rest = (data[:colon], data[colon:]) if colon > 0 else (b"", data)
    rest = rest.split(b"\0", 1)[0]  # git stops at a NUL byte
    return (head + _percent_decoded(rest, keep_nul=True)).decode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class GitReading:
    """A repository URL as git reads it: its transport (``ssh``, ``git``, ``file``, ``local``, or the scheme
    of a remote helper such as ``https``, whose URL goes to curl), what git hands on as the host (``ssh``:
    ``[user@]host`` as ssh gets it; ``git``: the host it connects to), the port and the path, after git's
    decoding where git decodes (``decoded``)."""

    transport: str
    host: str | None = None
    port: str | None = None
    path: str = ""
    decoded: bool = False

    @property
    def user(self) -> str | None:
        """The user ssh takes from ``user@host`` (OpenSSH splits at the last ``@``)."""
        return self.host.rpartition("@")[0] if self.host and "@" in self.host else None

    @property
    def hostname(self) -> str | None:
        return self.host.rpartition("@")[2] if self.host is not None else None


_GIT_TRANSPORTS = {"ssh": "ssh", "git": "git", "git+ssh": "ssh", "ssh+git": "ssh", "file": "file"}
_STRTOL_PORT = re.compile(r"\s*[+-]?[0-9]+", re.ASCII)


def _strtol_port(text: str) -> bool:
    """Whether connect.c takes ``text`` (all of it) as a port: ``strtol`` base 10 (leading space and a sign
    allowed), the whole rest consumed, 0 <= value < 65536."""
    return _STRTOL_PORT.fullmatch(text) is not None and 0 <= int(text) < 65536


def _host_end(host: str) -> int:
    """connect.c ``host_end(&host, 0)``: the index of the ``]`` of a bracketed host (``[h]``, ``user@[h]``),
    else 0 (the host's start)."""
    at = host.find("@[")
    start = at + 1 if at >= 0 else 0
    if host[start : start + 1] == "[":
        end = host.find("]", start + 1)
        return end if end >= 0 else 0
    return 0


def _host_and_port(hostandport: str) -> tuple[str, str | None]:
    """connect.c ``get_host_and_port``: brackets removed (what followed ``]`` is cut off the host), a port
    after the first ``:`` (after the brackets) that ``strtol`` reads whole; a bare trailing ``:`` dropped."""
    at = hostandport.find("@[")
    start = at + 1 if at >= 0 else 0
    if hostandport[start : start + 1] == "[":
        close = hostandport.find("]", start + 1)
        if close >= 0:
            host, after = hostandport[:start] + hostandport[start + 1 : close], hostandport[close + 1 :]
            colon = after.find(":")
            if colon >= 0 and _strtol_port(after[colon + 1 :]):
                return host, after[colon + 1 :]
            return host, None
    colon = hostandport.find(":")
    if colon < 0:
        return hostandport, None
    if _strtol_port(hostandport[colon + 1 :]):
        return hostandport[:colon], hostandport[colon + 1 :]
    if hostandport[colon + 1 :] == "":
        return hostandport[:colon], None
    return hostandport, None


def git_reading(url: str) -> GitReading:
    """What git makes of a repository URL: connect.c ``parse_connect_url`` for the transports it connects
    itself (ssh, git, file, a local path), then ``get_host_and_port`` (and for ssh ``get_port``); for any
    other scheme (https) the scheme names the remote helper, which gets the URL as written."""
    decoded = git_is_url(url)
    text = git_decode(url) if decoded else url
    found = text.find("://")
    if found >= 0:
        scheme, rest = text[:found], text[found + 3 :]
        if scheme not in _GIT_TRANSPORTS:
            # transport.c: only a URL (url.c is_url) goes to a remote helper; anything else with '://' is
            # git's own transport, and connect.c get_protocol dies: "protocol 's@sh' is not supported"
            return _helper_reading(scheme, url) if decoded else GitReading("unsupported", path=rest)
        transport, separator = _GIT_TRANSPORTS[scheme], "/"
    else:
        rest = text
        colon, slash = text.find(":"), text.find("/")
        local = colon < 0 or (0 <= slash < colon)
        transport, separator = ("local", "/") if local else ("ssh", ":")
    if transport == "local":
        return GitReading("local", path=rest, decoded=decoded)
    end = _host_end(rest)
    cut = rest.find(separator, end)
    if cut < 0:
        return GitReading(transport, rest, None, "", decoded)  # git: "no path specified"
    hostandport, path = rest[:cut], rest[cut + (1 if separator == ":" else 0) :]
    if transport in ("git", "ssh") and path[1:2] == "~":
        path = path[1:]
    if transport == "file":
        return GitReading("file", hostandport, None, path, decoded)
    host, port = _host_and_port(hostandport)
    if transport == "ssh" and port is None:  # connect.c get_port: the first ':' of what is left
        colon = host.find(":")
        if colon >= 0 and _strtol_port(host[colon + 1 :]):
            host, port = host[:colon], host[colon + 1 :]
    return GitReading(transport, host, port, path, decoded)


def _helper_reading(scheme: str, url: str) -> GitReading:
    """A URL for a remote helper (``git-remote-https``: curl's URL, with git's decoding for its credential
    helpers): scheme://[user@]host[:port]/path, each part percent-decoded."""
    rest = url[len(scheme) + 3 :]
    slash = rest.find("/")
    authority, path = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
    user, at, hostport = authority.rpartition("@")
    host, port = _host_and_port(hostport)
    host = git_decode(":" + host)[1:]
    if at:
        host = f"{git_decode(':' + user)[1:]}@{host}"
    return GitReading(scheme, host, port, git_decode(":" + path)[1:], True)


# --------------------------------------------------------------------------------------------------
# ccache
# --------------------------------------------------------------------------------------------------

# ccache's url.cpp ``tbl``: a bit mask per ASCII character.
_UNRESERVED_SUBDELIMS = frozenset(
    "!$&'()*+,-.0123456789;=ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~"
)
_MASKS: dict[int, frozenset[str]] = {
    0x01: _UNRESERVED_SUBDELIMS,
    0x02: frozenset("@"),
    0x04: frozenset(":"),
    0x08: frozenset("/"),
    0x10: frozenset("?"),
    0x20: frozenset("%"),
}


def _is_chars(text: str, mask: int) -> bool:
    allowed = frozenset().union(*(chars for bit, chars in _MASKS.items() if mask & bit))
    return all(c in allowed for c in text)


def _ccache_decode(text: str) -> str:
    """url.cpp ``decode``: every ``%XX`` (two hex digits) becomes its byte; any other ``%`` is an error."""
    data = text.encode("utf-8", "surrogateescape")
    if _STRAY_PERCENT.search(data):
        raise ValueError("Invalid percent encoding")
    return _percent_decoded(data).decode("utf-8", "surrogateescape")


def _normalize_path(path: str) -> str:
    """url.cpp ``normalize_path``: empty and ``.`` segments dropped, ``..`` drops the one before it (a
    trailing ``.`` leaves a trailing ``/``)."""
    if not path:
        return path
    *middle, last = path.split("/")
    elems: list[str] = []
    for elem in middle:
        if elem in ("", "."):
            continue
        if elem == "..":
            if elems:
                elems.pop()
            continue
        elems.append(elem)
    if last == ".":
        elems.append("")
    elif last == "..":
        if elems:
            elems.pop()
    else:
        elems.append(last)
    return ("/" if path.startswith("/") else "") + "/".join(elems)


def _is_ipv4(text: str) -> bool:
    return 7 <= len(text) <= 254 and all(c == "." or c.isdigit() and c.isascii() for c in text)


@dataclass(frozen=True)
class CcacheUrl:
    """A remote storage URL as ccache 4.7.5 reads it (its ``Url`` accessors): decoded and normalised."""

    scheme: str
    user_info: str
    host: str
    port: str
    path: str
    query: list[tuple[str, str]] = field(default_factory=list)
    fragment: str = ""
    has_query: bool = False


def ccache_url(url: str) -> CcacheUrl:
    """ccache's reading of one remote storage URL (url.cpp ``Url::parse_url``); ValueError with ccache's
    own message where ccache would refuse it."""
    if len(url) > 8000:
        raise ValueError("URI is longer than 8000 characters")
    found = next((i for i, c in enumerate(url) if c in ":/?#"), len(url))
    scheme = ""
    rest_start = 0
    if found < len(url) and url[found] == ":":
        candidate = url[:found]
        if (
            not candidate
            or not candidate[0].isascii()
            or not candidate[0].isalpha()
            or not all(c.isascii() and (c.isalnum() or c in "+-.") for c in candidate)
        ):
            raise ValueError(f"Scheme in '{url}' is invalid")
        scheme, rest_start = candidate.lower(), found + 1
    rest = url[rest_start:]
    user = host = port = ""
    if rest.startswith("//"):
        authority_end = next((i for i, c in enumerate(rest[2:], 2) if c in "/?#"), len(rest))
        authority, rest = rest[2:authority_end], rest[authority_end:]
        at = authority.find("@")
        if at >= 0:
            if not _is_chars(authority[:at], 0x25):
                raise ValueError(f"User info in '{url}' is invalid")
            user, authority = _ccache_decode(authority[:at]), authority[at + 1 :]
        if authority.startswith("["):
            close = authority.find("]")
            if close < 0:
                raise ValueError(f"Missing ] in '{url}'")
            literal = authority[1:close]
            try:
                ipaddress.IPv6Address(literal)
            except ValueError:
                raise ValueError(f"Host address in '{url}' is invalid") from None
            host, authority = literal.lower(), authority[close + 1 :]
        else:
            colon = authority.find(":")
            raw = authority if colon < 0 else authority[:colon]
            if not (_is_ipv4(raw) or _is_chars(raw, 0x01)):
                raise ValueError(f"Host address in '{url}' is invalid")
            host, authority = _ccache_decode(raw).lower(), authority[len(raw) :]
        if authority.startswith(":"):
            port = authority[1:]
            if not (port.isascii() and port.isdigit() and int(port) <= 65535) and port != "":
                raise ValueError(f"Port '{port}' in '{url}' is invalid")
    query_at = next((i for i, c in enumerate(rest) if c in "?#"), len(rest))
    raw_path, tail = rest[:query_at], rest[query_at:]
    if not _is_chars(raw_path, 0x2F):
        raise ValueError(f"Path '{raw_path}' in '{url}' is invalid")
    path = _normalize_path(_ccache_decode(raw_path))
    query: list[tuple[str, str]] = []
    has_query = tail.startswith("?")
    fragment = ""
    if has_query:
        hash_at = tail.find("#")
        text, tail = (tail[1:], "") if hash_at < 0 else (tail[1:hash_at], tail[hash_at:])
        for item in re.split(r"[;&]", text) if text else []:
            key, _, value = item.partition("=")
            query.append((_ccache_decode(key.replace("+", " ")), _ccache_decode(value.replace("+", " "))))
    if tail.startswith("#"):
        fragment = _ccache_decode(tail[1:])
    return CcacheUrl(scheme, user, host, port, path, query, fragment, has_query)


def ccache_redis_database(reading: CcacheUrl) -> str | None:
    """The database ccache's redis storage selects (RedisStorage.cpp ``select_database``: the path after its
    ``/``, as written once decoded and normalised; None: no path, database 0)."""
    return reading.path[1:] if reading.path else None


# --------------------------------------------------------------------------------------------------
# What a repository URL must be as git reads it.
# --------------------------------------------------------------------------------------------------

USER = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]{0,63}", re.ASCII)
PORT = re.compile(r"[0-9]{1,5}", re.ASCII)


def _port_problem(port: str) -> str | None:
    if PORT.fullmatch(port) and 0 < int(port) < 65536:
        return None
    return f"its port {port!r} is not a number from 1 to 65535"


def repo_reading_problem(url: str) -> str | None:
    """Why git's reading of the repository URL ``url`` (:func:`git_reading`) is not a plain repository:
    a user or host that ssh or git would take as an option or that is no host, a password (it would be
    written into the lock file, the manifest and the provenance), a port that is not a number, a path that
    git refuses or that holds what the URL's text did not show (a control character, a space, a byte that
    is not ASCII once decoded), a ``file://`` host git ignores. None when it is fine."""
    reading = git_reading(url)
    problem = _reading_problem(reading, url)
    if problem is None:
        return None
    if reading.decoded and git_decode(url) != url:
        return f"{problem} (git decodes %XX before it reads the URL)"
    return problem


def _reading_problem(reading: GitReading, url: str) -> str | None:
    if reading.transport == "unsupported":
        scheme = url.split("://", 1)[0]
        return f"git reads {scheme!r} as its protocol, which it does not support (ssh://, git://, https://, file://)"
    if reading.transport == "local":
        return printable_problem("path", reading.path)
    if reading.transport == "file":
        if reading.host:
            return (
                f"git ignores its host {reading.host!r} and reads the path {reading.path!r} (a local "
                "repository is file:///ABSOLUTE/PATH)"
            )
        return printable_problem("path", reading.path)
    host = reading.host or ""
    if reading.transport not in ("ssh", "git"):  # https via curl: a host written as it is read
        raw_authority = url.split("://", 1)[1].split("/", 1)[0]
        if "%" in raw_authority:
            return "its host or user is percent-encoded (git and curl decode it; write it as it is meant)"
    user, at, name = host.rpartition("@")
    if at:
        if reading.transport == "git":
            return f"the git protocol takes no user, and {host!r} is no host"
        if ":" in user:
            return "a password is written into it (it would be recorded in the lock file, the manifest and the provenance)"
        if user.startswith("-"):
            return "its user begins with '-', which ssh and git read as an option"
        if not USER.fullmatch(user):
            return f"its user {user!r} is not a user name (letters, digits, '.', '_', '-')"
    if name.startswith("-"):
        return "its host begins with '-', which ssh and git read as an option"
    if ":" in name and not name.startswith("["):
        head, _, port = name.rpartition(":")
        if host_problem(head) is None:
            return _port_problem(port)
    problem = host_problem(name)
    if problem:
        return problem
    if reading.port is not None:
        problem = _port_problem(reading.port)
        if problem:
            return problem
    if not reading.path:
        return "it names no path (git: no path specified)"
    if reading.path.startswith("-"):
        return "its path begins with '-', which git refuses as an option"
    return printable_problem("path", reading.path)


def download_url_problem(url: str) -> str | None:
    """Why ``url`` is not a plain https:// download as curl reads it (``curl --globoff --url``: no globbing;
    curl's URL parser takes the scheme case-insensitively, decodes the user info and, in current releases,
    a percent-encoded host): the scheme https, no user info (a credential in a recipe), a host written as it
    is read, a path printable once decoded. None when it is."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme != "https":
        return f"{url[:60]!r} is not an https:// URL"
    authority, _, path = rest.partition("/")
    if "@" in authority:
        return "it carries user info (a credential in a recipe is written into every record)"
    if "%" in authority:
        return "its host is percent-encoded (curl decodes it; write it as it is meant)"
    if authority.startswith("["):  # an IPv6 literal, its port after the ']'
        host, _, after = authority[1:].partition("]")
        port = after.removeprefix(":")
    else:
        host, _, port = authority.rpartition(":") if authority.count(":") == 1 else (authority, "", "")
    problem = host_problem(host) or (_port_problem(port) if port else None)
    if problem:
        return problem
    return printable_problem("path", git_decode(":/" + path)[1:])
