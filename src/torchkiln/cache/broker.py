"""A Redis store reached through torchkiln: the cache tool gets a Unix socket, torchkiln keeps the password.

ccache takes a remote store's credentials only inside the URL of ``remote_storage`` (its environment or its
configuration file), and whatever ccache can read there, every other process of a compile step can read too:
the tree's setup.py, the build dependencies it imports, the compilers. sccache's server reads them from its
environment, and runs the compiler its clients name with that environment to identify it (measured, sccache
0.16: ``cc -E testfile.c`` sees the server's variables), so a tree that names its own compiler reads them
there. So either tool is pointed at a Unix socket instead (ccache >= 4.7, "redis+unix-storage" in ``ccache
--version``: ``redis+unix:PATH``; sccache: ``redis+unix://localhost/PATH``) which torchkiln serves
(:class:`RedisBroker`): each connection is relayed to the real store over a connection torchkiln opened and
authenticated itself (``AUTH``, ``SELECT``), and only the commands the tools' Redis storage sends pass:
``GET``, ``EXISTS``, ``SET`` (key and value), ``DEL`` of one of the tool's own keys, and ``PING`` (ccache 4.7.5
src/storage/remote/RedisStorage.cpp: ``ccache:<digest>``; sccache 0.16 through OpenDAL, seen with ``redis-cli
MONITOR``: ``.sccache_check`` and ``a/b/c/<sha256>``). A process that finds the socket can read and write cache
entries, as the tool itself can, but cannot ask the store for anything else (``CONFIG GET requirepass``, ``ACL
LIST``, ``KEYS``, ``FLUSHALL``): the password never leaves torchkiln's own process. The compiles need no network
either.

The protocol is RESP2 (https://redis.io/docs/latest/develop/reference/protocol-spec/): hiredis sends every
command as an array of bulk strings; each reply is relayed whole, read by its type.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from torchkiln.process import runner

from .remote import Remote, login

if TYPE_CHECKING:
    from .config import CacheConfig

PREFIX = "torchkiln-redis-broker-"
SOCKET_NAME = "redis.sock"
TIMEOUT_S = 30.0  # to the store; ccache's own operation timeout (10 s) gives up first
MAX_BULK = 512 * 1024 * 1024  # Redis's own proto-max-bulk-len
MAX_ARGS = 8
# each tool's own keys
KEYS = {
    "ccache": re.compile(rb"ccache:[0-9a-z]{1,128}"),
    "sccache": re.compile(rb"\.sccache_check|[0-9a-f]/[0-9a-f]/[0-9a-f]/[0-9a-f]{64}"),
}
# command -> its numbers of arguments after the name (what the tools send: the module's docstring)
ALLOWED: dict[bytes, tuple[int, ...]] = {
    b"GET": (1,),
    b"EXISTS": (1,),
    b"DEL": (1,),
    b"SET": (2,),
    b"PING": (0, 1),
}


class ProtocolError(Exception):
    """What a connection sent or answered is not RESP2 as ccache and Redis speak it."""


def _line(stream: BinaryIO) -> bytes:
    line = stream.readline(65536)
    if not line:
        raise EOFError
    if not line.endswith(b"\r\n"):
        raise ProtocolError("a line without CRLF")
    return line


def _count(line: bytes) -> int:
    try:
        return int(line[1:-2])
    except ValueError:
        raise ProtocolError(f"not a length: {line[:20]!r}") from None


def _exactly(stream: BinaryIO, size: int) -> bytes:
    data = stream.read(size)
    if data is None or len(data) != size:
        raise EOFError
    return data


def read_command(stream: BinaryIO) -> list[bytes]:
    """One command: an array of bulk strings (``*N``, then ``$len`` and the bytes, each). EOFError at the end."""
    head = _line(stream)
    if head[:1] != b"*":
        raise ProtocolError("an inline command (hiredis sends arrays)")
    count = _count(head)
    if not 0 < count <= MAX_ARGS + 1:
        raise ProtocolError(f"{count} arguments")
    args = []
    for _ in range(count):
        bulk = _line(stream)
        size = _count(bulk)
        if bulk[:1] != b"$" or not 0 <= size <= MAX_BULK:
            raise ProtocolError("an argument that is not a bulk string")
        args.append(_exactly(stream, size + 2)[:-2])
    return args


def encode(args: Sequence[bytes]) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in args)


def read_reply(stream: BinaryIO) -> bytes:
    """One whole reply as it was sent (simple string, error, integer, bulk string, array)."""
    head = _line(stream)
    kind = head[:1]
    if kind in (b"+", b"-", b":"):
        return head
    if kind == b"$":
        size = _count(head)
        return head if size < 0 else head + _exactly(stream, size + 2)
    if kind == b"*":
        size = _count(head)
        return head + b"".join(read_reply(stream) for _ in range(max(size, 0)))
    raise ProtocolError(f"a reply of unknown type {kind!r}")


def refusal(args: Sequence[bytes], tool: str = "ccache") -> bytes | None:
    """Why ``args`` is not passed on (a RESP error line), or None when it is one that ``tool`` sends."""
    name = args[0].upper()
    arities = ALLOWED.get(name)
    shown = name.decode("ascii", "replace")[:32]
    if arities is None:
        return f"-ERR torchkiln: {shown} is not a command {tool}'s remote storage sends\r\n".encode()
    if len(args) - 1 not in arities:
        return f"-ERR torchkiln: {shown} with {len(args) - 1} arguments\r\n".encode()
    if name != b"PING" and not KEYS[tool].fullmatch(args[1]):
        return f"-ERR torchkiln: only {tool}'s own keys\r\n".encode()
    return None


class RedisBroker:
    """A Unix socket relaying ``tool``'s commands to a Redis store torchkiln authenticates to (see the module)."""

    def __init__(self, remote: Remote, user: str | None, password: str | None, tool: str = "ccache") -> None:
        self.remote = remote
        self.tool = tool
        self._login = [b"AUTH", *([user.encode()] if user else []), password.encode()] if password else None
        database = remote.path.strip("/")
        self._select = [b"SELECT", database.encode()] if database and database != "0" else None
        self.directory = Path(tempfile.mkdtemp(prefix=PREFIX))  # 0700: only this user reaches the socket
        self.socket_path = self.directory / SOCKET_NAME
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(self.socket_path))
        self._server.listen(64)
        self._closed = False
        runner.remove_at_exit(self.directory)  # also when torchkiln is killed (torchkiln.process.supervisor)
        threading.Thread(target=self._accept, name=f"{tool}-redis-broker", daemon=True).start()

    @property
    def url(self) -> str:
        """What the tool is given: the socket, no credentials (ccache's and sccache's spellings)."""
        if self.tool == "sccache":
            return f"redis+unix://localhost{self.socket_path}"
        return f"redis+unix:{self.socket_path}"

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _upstream(self) -> tuple[socket.socket, BinaryIO]:
        """A connection to the store, authenticated and on the URL's database."""
        conn = socket.create_connection((self.remote.host, self.remote.port or 6379), timeout=TIMEOUT_S)
        stream = conn.makefile("rb")
        for command in (self._login, self._select):
            if command is not None:
                conn.sendall(encode(command))
                reply = read_reply(stream)
                if not reply.startswith(b"+OK"):
                    conn.close()
                    raise ConnectionRefusedError(reply[:80].decode("utf-8", "replace").strip())
        return conn, stream

    def _serve(self, client: socket.socket) -> None:
        with client, client.makefile("rb") as incoming:
            try:
                upstream, replies = self._upstream()
            except (OSError, EOFError, ProtocolError):
                return  # ccache counts a remote storage error and compiles on (as with an unreachable store)
            with upstream, replies:
                self._relay(client, incoming, upstream, replies)

    def _relay(
        self, client: socket.socket, incoming: BinaryIO, upstream: socket.socket, replies: BinaryIO
    ) -> None:
        while True:
            try:
                args = read_command(incoming)
            except (EOFError, OSError):
                return
            except ProtocolError as exc:
                with contextlib.suppress(OSError):
                    client.sendall(f"-ERR torchkiln: {exc}\r\n".encode())
                return
            refused = refusal(args, self.tool)
            try:
                if refused is not None:
                    client.sendall(refused)
                    continue
                upstream.sendall(encode(args))
                client.sendall(read_reply(replies))
            except (OSError, EOFError, ProtocolError):
                return


def redis_broker(
    config: CacheConfig,
    remote: Remote | None,
    environ: Mapping[str, str],
    tool: str,
    usable: Callable[[], bool] = lambda: True,
) -> RedisBroker | None:
    """A broker for ``tool``'s Redis store, logged in as the recipe says; None when the store is not Redis or
    the tool cannot use one (``usable``, asked only for a Redis store)."""
    if remote is None or remote.scheme != "redis" or not usable():
        return None
    user, password = login(config, remote, environ)
    return RedisBroker(remote, user, password, tool)
