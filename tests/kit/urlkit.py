"""URLs through their real consumers (issue 45 item 4): a loopback recorder that sees where a tool connected
and what it asked for, and corpora of URL spellings generated from the grammars the tools read.

The recorder listens on several loopback addresses at one port (Linux routes all of 127/8 to lo, and a socket
may bind any of them) and on ::1: a tool that connects shows which address it reached, and its first bytes say
what it asked for (an HTTP request line and Host header, git's protocol request ``git-upload-pack PATH\\0host=
HOST\\0``). The hosts and paths below are written in every spelling glibc's ``inet_aton``, curl, git and the
WHATWG URL standard read (decimal, octal, hex, one to four parts, a trailing dot, IPv4-mapped IPv6, case,
percent-encoding; dot-segments, empty segments, encoded slashes, queries and fragments).
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import re
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import strategies as st

LOOPBACK = ("127.0.0.1", "127.0.0.2", "127.1.2.3")


@dataclass
class Hit:
    """One connection: the address it reached and the bytes the tool sent first."""

    address: str
    data: bytes = b""
    done: bool = False


@dataclass
class Recorder:
    port: int
    tls: ssl.SSLContext
    ca: Path  # the certificate a client trusts the recorder's TLS with (CURL_CA_BUNDLE, GIT_SSL_CAINFO)
    sockets: list[socket.socket] = field(default_factory=list)
    hits: list[Hit] = field(default_factory=list)

    def clear(self) -> None:
        self.hits.clear()

    def settled(self) -> list[Hit]:
        """The connections so far, once each has been read (a tool that exited has sent what it sends)."""
        deadline = time.monotonic() + 2
        while not all(hit.done for hit in self.hits) and time.monotonic() < deadline:
            time.sleep(0.01)
        return list(self.hits)

    def addresses(self) -> set[str]:
        return {hit.address for hit in self.settled()}


def _serve(recorder: Recorder, server: socket.socket) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        hit = Hit(conn.getsockname()[0])
        recorder.hits.append(hit)
        threading.Thread(target=_read, args=(conn, hit, recorder.tls), daemon=True).start()


def _read(conn: socket.socket, hit: Hit, tls: ssl.SSLContext) -> None:
    """The tool's first message (an HTTP request's head, inside TLS where the tool began a handshake; a
    git:// request; whatever comes within a second); an HTTP request is answered 404, which no tool retries."""
    conn.settimeout(2.0)
    with contextlib.suppress(OSError), contextlib.ExitStack() as stack:
        stack.callback(conn.close)
        if conn.recv(1, socket.MSG_PEEK) == b"\x16":  # a TLS ClientHello
            conn = tls.wrap_socket(conn, server_side=True)
            stack.callback(conn.close)
        while len(hit.data) < 65536 and not _whole(hit.data):
            chunk = conn.recv(65536)
            if not chunk:
                break
            hit.data += chunk
        if hit.data.startswith(b"GET"):
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    hit.done = True


def _whole(data: bytes) -> bool:
    """Whether ``data`` is a whole first message: an HTTP request's head, a git pkt-line (its 4 hex digits
    count the line), or anything else once something came (TLS records, ssh's banner)."""
    if data.startswith(b"GET"):
        return b"\r\n\r\n" in data
    if re.match(rb"[0-9a-f]{4}", data):
        return len(data) >= int(data[:4], 16)
    return bool(data)


def _certificate(directory: Path) -> tuple[ssl.SSLContext, Path]:
    """A self-signed certificate for every name and address the corpus reaches (localhost, LOOPBACK, ::1)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    names = [
        x509.DNSName("localhost"),
        *(x509.IPAddress(ipaddress.ip_address(a)) for a in (*LOOPBACK, "::1")),
    ]
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    ca = directory / "recorder.pem"
    ca.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile = directory / "recorder.key"
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(ca, keyfile)
    return context, ca


@contextlib.contextmanager
def recorder(directory: Path) -> Iterator[Recorder]:
    """Listeners on every LOOPBACK address and ::1 (where this host has IPv6), one port, speaking TLS to a
    client that begins a handshake (its certificate in ``directory``)."""
    first = socket.socket()
    first.bind((LOOPBACK[0], 0))
    rec = Recorder(first.getsockname()[1], *_certificate(directory), [first])
    for address in LOOPBACK[1:]:
        sock = socket.socket()
        sock.bind((address, rec.port))
        rec.sockets.append(sock)
    with contextlib.suppress(OSError):
        six = socket.socket(socket.AF_INET6)
        six.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        six.bind(("::1", rec.port))
        rec.sockets.append(six)
    for sock in rec.sockets:
        sock.listen(64)
        threading.Thread(target=_serve, args=(rec, sock), daemon=True).start()
    try:
        yield rec
    finally:
        for sock in rec.sockets:
            sock.close()


def run_tool(argv: list[str], home: str, **env: str) -> subprocess.CompletedProcess[str]:
    """A consumer, alone: a bare environment (no proxy, no prompts, no user config), a short timeout."""
    base = {"PATH": os.environ["PATH"], "HOME": home, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(
        argv, env={**base, **env}, capture_output=True, text=True, errors="replace", timeout=60, check=False
    )


# --------------------------------------------------------------------------------------------------
# What a tool asked for.
# --------------------------------------------------------------------------------------------------

HTTP_REQUEST = re.compile(rb"GET (\S+) HTTP/1\.[01]\r\n(?:.*\r\n)*?[Hh]ost: ([^\r]*)\r\n", re.DOTALL)
GIT_REQUEST = re.compile(rb"[0-9a-f]{4}git-upload-pack ([^\0]*)\0host=([^\0]*)\0")


def http_request(hit: Hit) -> tuple[str, str] | None:
    """(request target, Host header) of an HTTP request, or None."""
    found = HTTP_REQUEST.match(hit.data)
    return (found[1].decode("latin-1"), found[2].decode("latin-1")) if found else None


def git_request(hit: Hit) -> tuple[str, str] | None:
    """(path, host) of a git:// request (git's pack-protocol: ``git-upload-pack PATH\\0host=HOST\\0``)."""
    found = GIT_REQUEST.match(hit.data)
    return (found[1].decode("latin-1"), found[2].decode("latin-1")) if found else None


def reaches(host: str) -> set[str]:
    """The addresses a host written in its one form names: itself, or localhost's."""
    if host == "localhost":
        return {"127.0.0.1", "::1"}
    try:
        return {str(ipaddress.ip_address(host.strip("[]")))}
    except ValueError:
        return set()  # not written in its one form: no address may be reached through it


# --------------------------------------------------------------------------------------------------
# Corpora.
# --------------------------------------------------------------------------------------------------


@st.composite
def ipv4_spelling(draw: st.DrawFn, address: str) -> str:
    """``address`` spelled as inet_aton and the WHATWG URL parser read it: one to four parts, the last
    filling what the others left; each part decimal, octal (leading 0s) or hex (0x/0X, either digit case,
    leading 0s); maybe a trailing dot."""
    value = int(ipaddress.IPv4Address(address))
    count = draw(st.integers(1, 4))
    octets = list(value.to_bytes(4, "big"))
    parts = [*octets[: count - 1], int.from_bytes(bytes(octets[count - 1 :]), "big")]
    out = []
    for part in parts:
        base = draw(st.sampled_from(("dec", "oct", "hex")))
        zeros = "0" * draw(st.integers(0, 2))
        if base == "dec":
            out.append(str(part))
        elif base == "oct":
            out.append("0" + zeros + format(part, "o"))
        else:
            digits = format(part, "x")
            digits = digits.upper() if draw(st.booleans()) else digits
            out.append(draw(st.sampled_from(("0x", "0X"))) + zeros + digits)
    return ".".join(out) + ("." if draw(st.integers(0, 5)) == 0 else "")


def percent(text: str, upper: bool = True) -> str:
    return "".join((f"%{b:02X}" if upper else f"%{b:02x}") for b in text.encode())


@st.composite
def host_spelling(draw: st.DrawFn) -> str:
    """A loopback host in one of the spellings tools read (bracketed where IPv6): the canonical ones, the
    numeric IPv4 forms, IPv4-mapped IPv6, names with case or a trailing dot, percent-encoded."""
    address = draw(st.sampled_from(LOOPBACK))
    kinds = ("canonical", "canonical", "canonical", "numeric", "numeric", "mapped", "name", "encoded", "v6")
    kind = draw(st.sampled_from(kinds))
    if kind == "canonical":
        return address
    if kind == "numeric":
        return draw(ipv4_spelling(address))
    if kind == "mapped":
        mapped = ipaddress.IPv6Address("::ffff:" + address)
        return "[" + draw(st.sampled_from((str(mapped), mapped.exploded, f"::ffff:{address}"))) + "]"
    if kind == "name":
        return draw(st.sampled_from(("localhost", "localhost", "LOCALHOST", "Localhost", "localhost.")))
    if kind == "v6":
        return draw(st.sampled_from(("[::1]", "[0:0:0:0:0:0:0:1]", "[::0001]", "[::1%25lo]")))
    at = draw(st.integers(0, len(address) - 1))
    return address[:at] + percent(address[at], draw(st.booleans())) + address[at + 1 :]


def port_spelling(port: int) -> st.SearchStrategy[str]:
    """``:PORT`` as written: canonical, with leading zeros, or no port at all (the scheme's default)."""
    return st.sampled_from((f":{port}", f":{port}", f":0{port}", f":00{port}", ""))


PLAIN_SEGMENTS = ("p", "repo.git", "a", "x;y", "~u", "a+b", "v=1,2")
SEGMENTS = (*PLAIN_SEGMENTS, ".", "..", "", "%2e", "%2E%2e", "%2f", "%2F", "%70", "%20", "a%00")


@st.composite
def path_spelling(draw: st.DrawFn) -> str:
    """``/seg/seg...`` from segments that name, encode or climb (half the time only ones that name), maybe a
    '?' query or a '#' fragment."""
    segments = draw(
        st.lists(st.sampled_from(draw(st.sampled_from((PLAIN_SEGMENTS, SEGMENTS)))), min_size=1, max_size=4)
    )
    tail = draw(st.sampled_from(("", "", "", "?x=1", "#frag", "?a=b#f", "?a+b")))
    return "/" + "/".join(segments) + tail
