"""The one written form of a URL torchkiln hands a tool: a spelling every tool it reaches reads alike.

:mod:`torchkiln.urlreading` says what each tool makes of a URL; this module says which spellings are
accepted at all (issue 45). A URL that two tools read differently, or that a tool reads as something its
text does not say, is refused naming the form to write instead, so the recipe, the plan and every record
(lock file, manifest, provenance) hold exactly the string the tool was given, and it means one thing:

* the scheme lowercase; the authority ``[USER@]HOST[:PORT]``: HOST as :func:`urlreading.host_problem`
  wants it (a lowercase name, a decimal dotted quad: ``2130706433``, ``0x7f.1`` and ``127.1`` are 127.0.0.1
  to git, curl and ccache; a compressed ``[IPv6]``), PORT decimal 1..65535 without a leading ``0``, a USER
  only where the value's kind takes one;
* no ``%`` at all: git decodes ``%XX`` in ``ssh://``, ``git://`` and ``file://`` URLs, curl and sccache
  decode nothing, ccache decodes and then drops dot-segments (``file:///%2e%2e/x`` opens ``/../x`` while
  every record keeps ``%2e%2e``);
* a path of non-empty segments, none ``.`` or ``..`` (curl and git's https remove them, a file system
  resolves them, ccache drops them and empty ones), with no trailing ``/`` (git's https asks ``/p/`` as
  ``/p``);
* no ``#`` fragment (curl and git's https drop it before they ask, sccache took it silently, ccache refuses
  it); a ``?`` query only where the value's kind takes one (git's https appends ``/info/refs`` after it:
  ``/p?x=1`` asks for ``/p?x=1/info/refs``), and no ``+`` in it (a space to a form decoder);
* RFC 3986's characters only: no space or control character, none of ``\\ " < > ^ ` { | }``, and ``[ ]``
  only around an IPv6 host.

tests/test_values_decoded.py runs a generated corpus of URLs through the real consumers (git ls-remote,
curl, ccache, sccache) and fails where what a consumer used differs from what torchkiln records.
"""

from __future__ import annotations

import re

from torchkiln.urlreading import USER, git_decode, host_problem

SCHEME = re.compile(r"[a-z][a-z0-9+.-]*", re.ASCII)
PATH_CHARS = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:@/-]*", re.ASCII)
QUERY_CHARS = re.compile(r"[A-Za-z0-9._~!$&'()*,;=:@/?-]*", re.ASCII)
URL_CHARS = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:@/?-]*", re.ASCII)
# a user and, where a caller takes one (a cache store's own password, refused elsewhere in a recipe), a
# password: characters no tool decodes or expands (no '%', no '$')
USERINFO = re.compile(r"[A-Za-z0-9._~!&'()*+,;=-]*(?::[A-Za-z0-9._~!&'()*+,;=-]*)?", re.ASCII)
PORT = re.compile(r"[1-9][0-9]{0,4}", re.ASCII)


def url_form_problem(
    url: str, *, user: bool = False, query: bool = False, root: bool = False, named_host: bool = True
) -> str | None:
    """Why ``url`` is not written in its one form (the module's docstring), else None. ``user``: a user
    (``USER@``, for ssh and cache stores) may be given; ``query``: a ``?`` query may follow the path;
    ``root``: the path may be a lone ``/``; ``named_host``: the host is a host (not a bucket, checked by its
    caller)."""
    scheme, sep, rest = url.partition("://")
    if not sep or not SCHEME.fullmatch(scheme):
        if sep and SCHEME.fullmatch(scheme.lower()):
            return f"its scheme {scheme!r} is written in capitals: write {scheme.lower()}://"
        return "it is not a URL (scheme://HOST[:PORT]/PATH)"
    problem = _percent_problem("it", url) if "%" in rest else _characters_problem(rest)
    if problem:
        return problem
    rest, mark, text = rest.partition("?")
    if mark and not query:
        return "it holds a '?' query (git's https asks for /info/refs after it, ccache refuses it, sccache drops it)"
    if mark and not QUERY_CHARS.fullmatch(text):
        return f"its query {text!r} holds {_first_bad(text, QUERY_CHARS)!r}"
    slash = rest.find("/")
    authority, path = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
    userinfo, at, hostport = authority.rpartition("@")
    if at and not user:
        return "it carries user info before '@' (a credential would be written into every record)"
    if at and not (userinfo and USERINFO.fullmatch(userinfo)):
        return "its user info holds characters a tool decodes or expands (valid: letters, digits, ._~-)"
    problem = _authority_problem(hostport, named_host)
    if problem:
        return problem
    if root and path == "/":
        return None
    return path_form_problem(path, what="path")


def _characters_problem(rest: str) -> str | None:
    if "#" in rest:
        return "it holds a '#' fragment (curl, git's https and sccache drop it, ccache refuses it)"
    bad = _first_bad(rest.replace("[", "").replace("]", ""), URL_CHARS)
    if bad is not None:
        return f"it holds {bad!r}, which a URL cannot hold as written"
    return None


def _percent_problem(what: str, text: str) -> str:
    """'%' refused, saying what git and ccache decode it to (curl and sccache decode nothing)."""
    decoded = git_decode(":" + text)[1:]
    shown = decoded.isascii() and decoded.isprintable() and decoded != text
    reading = f" (to {decoded!r})" if shown else ""
    return (
        f"{what} holds '%': git (ssh://, git://, file://) and ccache decode %XX{reading}, curl and sccache do "
        "not; write it without percent-encoding"
    )


def _first_bad(text: str, allowed: re.Pattern[str]) -> str | None:
    return next((c for c in text if not allowed.fullmatch(c)), None)


def _authority_problem(hostport: str, named_host: bool) -> str | None:
    if hostport.startswith("["):
        host, close, after = hostport[1:].partition("]")
        if not close or ":" not in host:
            return "only an IPv6 address goes in brackets"
        if not after.startswith(":") and after:
            return f"{after!r} follows its IPv6 host"
        port = after[1:] if after else None
    else:
        if "[" in hostport or "]" in hostport:
            return "it holds '[' or ']' outside an IPv6 host"
        host, colon, rest = hostport.partition(":")
        if ":" in rest:
            return "its host holds ':' (an IPv6 address is written in brackets)"
        port = rest if colon else None
    problem = host_problem(host) if named_host or ":" in host else None
    if problem:
        return problem
    if port is not None and not (PORT.fullmatch(port) and int(port) <= 65535):
        shown = str(int(port)) if port.isascii() and port.isdigit() and 0 < int(port) <= 65535 else None
        return f"its port {port!r} is not a number from 1 to 65535" + (f": write {shown}" if shown else "")
    return None


def path_form_problem(path: str, *, what: str = "path", relative: bool = False) -> str | None:
    """Why ``path`` (a URL's path, a local path, the path of ``user@host:path``) is not written in its one
    form: RFC 3986's path characters, no ``%``, segments neither empty nor ``.`` nor ``..``, no trailing
    ``/``. ``relative``: it need not begin with ``/``. None when it is."""
    if not path:
        return None
    if "%" in path:
        return _percent_problem(f"its {what} {path!r}", path)
    bad = _first_bad(path, PATH_CHARS)
    if bad is not None:
        return f"its {what} {path!r} holds {bad!r}, which a path cannot hold as written"
    if not relative and not path.startswith("/"):
        return f"its {what} {path!r} does not begin with '/'"
    segments = path.removeprefix("/").split("/")
    if all(segment not in ("", ".", "..") for segment in segments):
        return None
    kept: list[str] = []
    for segment in segments:
        if segment == "..":
            if kept:
                kept.pop()
        elif segment not in ("", "."):
            kept.append(segment)
    canonical = ("/" if path.startswith("/") else "") + "/".join(kept)
    write = repr(canonical) if canonical.strip("/") else "no path"
    return (
        f"its {what} {path!r} has an empty, '.' or '..' segment or a trailing '/' (curl and git remove "
        f"dot-segments, ccache drops empty ones, a file system resolves them): write {write}"
    )


def repo_form_problem(value: str) -> str | None:
    """Why a repository (torch.repo, torchvision.repo) is not written in its one form, else None: a URL by
    :func:`url_form_problem` (a user only for ssh, no query), ``file://`` with an absolute path and no
    host, ``USER@HOST:PATH`` or an absolute path with :func:`path_form_problem`'s path."""
    scheme, sep, rest = value.partition("://")
    if sep and scheme.lower() == "file":
        if scheme != "file":
            return "its scheme 'FILE' is written in capitals: write file://"
        if not rest.startswith("/"):
            return "a file:// URL names no host (valid: file:///ABSOLUTE/PATH)"
        return path_form_problem(rest)
    if sep:
        return url_form_problem(value, user=scheme.lower() in ("ssh", "git+ssh", "ssh+git"))
    if value.startswith("/"):
        return path_form_problem(value)
    user, at, rest = value.partition("@")
    host, colon, path = rest.partition(":")
    if not at or not colon:
        return None  # not this form: the caller's grammar says what is valid
    if not USER.fullmatch(user):
        return f"its user {user!r} is not a user name (letters, digits, '.', '_', '-')"
    return host_problem(host) or path_form_problem(path, relative=True)
