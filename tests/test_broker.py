"""ccache's Redis store through torchkiln's broker (torchkiln.cache.broker): only what ccache sends passes, the
password stays in torchkiln.

The refusals are a table of what an attacker would send (with case variants), and, against a real Redis,
every command that Redis lists (``COMMAND LIST``) but the five ccache sends; the relay is checked against a
real Redis with a password: ccache's commands work (a real ccache's remote hit through it), ``CONFIG GET
requirepass`` and the rest are refused, whatever a process that finds the socket sends.
"""

from __future__ import annotations

import io
import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kit.imagekit import examples, need

from torchkiln.cache import broker
from torchkiln.cache.remote import Remote

CCACHE_KEY = b"ccache:4647ns86cnccr08i36hdb3ad63p9ns71o"  # as ccache 4.7 names an entry (Digest::to_string)
# What an attacker would ask a store for: its configuration (the password), its users, all keys, or its end.
DANGEROUS = [
    [b"CONFIG", b"GET", b"requirepass"],
    [b"ACL", b"LIST"],
    [b"ACL", b"GETUSER", b"default"],
    [b"AUTH", b"other"],
    [b"HELLO", b"3", b"AUTH", b"default", b"x"],
    [b"KEYS", b"*"],
    [b"SCAN", b"0"],
    [b"FLUSHALL"],
    [b"FLUSHDB"],
    [b"SELECT", b"1"],
    [b"EVAL", b"return redis.call('CONFIG','GET','*')", b"0"],
    [b"MODULE", b"LOAD", b"/tmp/x.so"],
    [b"DEBUG", b"OBJECT", CCACHE_KEY],
    [b"SHUTDOWN"],
    [b"MONITOR"],
    [b"INFO"],
    [b"CLIENT", b"LIST"],
    [b"REPLICAOF", b"evil", b"6379"],
    [b"MIGRATE", b"evil", b"6379", CCACHE_KEY, b"0", b"1000"],
    [b"GET", b"other:key"],  # a key that is not ccache's
    [b"SET", b"ccache:x", b"v", b"EX", b"1"],  # more arguments than ccache sends
    [b"DEL", CCACHE_KEY, b"ccache:y"],
    [b"GET"],
]
ALLOWED = [
    [b"GET", CCACHE_KEY],
    [b"EXISTS", CCACHE_KEY],
    [b"SET", CCACHE_KEY, b"\x00\x01object bytes\r\n"],
    [b"DEL", CCACHE_KEY],
    [b"PING"],
]


SCCACHE_KEY = (
    b"8/9/a/89a64125b492749edd3b9b42886786e0b9a39760c0f4629ebb7649b01b438945"  # sccache 0.16's, seen
)
SCCACHE_ALLOWED = [
    [b"PING"],
    [b"GET", b".sccache_check"],
    [b"SET", b".sccache_check", b"Hello, World!"],
    [b"GET", SCCACHE_KEY],
    [b"SET", SCCACHE_KEY, b"PK\x03\x04..."],
]


def variants(args: list[bytes]) -> list[list[bytes]]:
    name = args[0]
    return [[spelled, *args[1:]] for spelled in (name, name.lower(), name.capitalize())]


@pytest.mark.parametrize(
    "args", [v for a in DANGEROUS for v in variants(a)], ids=lambda a: b" ".join(a)[:40].decode("latin1")
)
def test_what_ccache_does_not_send_is_refused(args: list[bytes]) -> None:
    refused = broker.refusal(args)
    assert refused is not None and refused.startswith(b"-ERR torchkiln: ")


@pytest.mark.parametrize(
    "args", [v for a in ALLOWED for v in variants(a)], ids=lambda a: b" ".join(a)[:40].decode("latin1")
)
def test_what_ccache_sends_passes(args: list[bytes]) -> None:
    assert broker.refusal(args) is None


@pytest.mark.parametrize("args", SCCACHE_ALLOWED, ids=lambda a: b" ".join(a)[:40].decode("latin1"))
def test_what_sccache_sends_passes_for_sccache_only(args: list[bytes]) -> None:
    assert broker.refusal(args, "sccache") is None
    if args[0] != b"PING":
        assert broker.refusal(args, "ccache") is not None, "each tool's broker takes its own keys only"
    for dangerous in DANGEROUS:
        assert broker.refusal(dangerous, "sccache") is not None


@settings(max_examples=examples(200), deadline=None)
@given(args=st.lists(st.binary(max_size=64), min_size=1, max_size=5))
def test_commands_and_replies_read_back_as_sent(args: list[bytes]) -> None:
    wire = broker.encode(args)
    assert broker.read_command(io.BufferedReader(io.BytesIO(wire))) == args
    bulk = b"$%d\r\n%b\r\n" % (len(args[0]), args[0])
    reply = b"*2\r\n" + bulk + b":7\r\n"
    assert broker.read_reply(io.BufferedReader(io.BytesIO(reply + b"+OK\r\n"))) == reply


def test_an_inline_command_is_a_protocol_error() -> None:
    with pytest.raises(broker.ProtocolError):
        broker.read_command(io.BufferedReader(io.BytesIO(b"CONFIG GET requirepass\r\n")))


# --------------------------------------------------------------------------------------------------
# Against a real Redis (its password: the broker's alone).
# --------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[tuple[int, str]]:
    need("redis-server")
    password = f"pw-{secrets.token_hex(8)}"
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path), "--requirepass", password],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    yield port, password
    process.terminate()
    process.wait(timeout=10)


def ask(path: Path, *commands: list[bytes]) -> list[bytes]:
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(str(path))
        stream = conn.makefile("rb")
        out = []
        for command in commands:
            conn.sendall(broker.encode(command))
            out.append(broker.read_reply(stream))
        return out


@pytest.mark.integration
@pytest.mark.redis
def test_the_broker_relays_ccache_and_keeps_the_password(redis: tuple[int, str], tmp_path: Path) -> None:
    port, password = redis
    relay = broker.RedisBroker(Remote("redis", "127.0.0.1", port, "/3", None, None, {}), None, password)
    try:
        assert relay.url == f"redis+unix:{relay.socket_path}"
        assert oct(relay.directory.stat().st_mode & 0o777) == "0o700"
        value = b"\x00object\r\nbytes"
        said = ask(
            relay.socket_path, [b"SET", CCACHE_KEY, value], [b"GET", CCACHE_KEY], [b"EXISTS", CCACHE_KEY]
        )
        assert said == [b"+OK\r\n", b"$%d\r\n%b\r\n" % (len(value), value), b":1\r\n"]
        refused = ask(relay.socket_path, *DANGEROUS[:5])
        assert all(r.startswith(b"-ERR torchkiln: ") for r in refused), refused
        assert not any(password.encode() in r for r in refused)
        # every command this Redis knows, but ccache's five, is refused through the broker
        with socket.create_connection(("127.0.0.1", port)) as direct:
            stream = direct.makefile("rb")
            direct.sendall(broker.encode([b"AUTH", password.encode()]) + broker.encode([b"COMMAND", b"LIST"]))
            assert broker.read_reply(stream) == b"+OK\r\n"
            listed = broker.read_reply(stream).split(b"\r\n")[2::2]
        names = sorted({n.upper() for n in listed if n} - {b"GET", b"SET", b"EXISTS", b"DEL", b"PING"})
        assert len(names) > 100, listed[:10]
        answers = ask(relay.socket_path, *([name, CCACHE_KEY] for name in names))
        assert [n for n, a in zip(names, answers, strict=True) if not a.startswith(b"-ERR torchkiln: ")] == []
        # it went to the URL's database, as torchkiln's own authenticated connection
        cli = [
            "redis-cli",
            "-p",
            str(port),
            "-a",
            password,
            "--no-auth-warning",
            "-n",
            "3",
            "EXISTS",
            CCACHE_KEY,
        ]
        if shutil.which("redis-cli"):
            assert subprocess.run(cli, capture_output=True, text=True, check=True).stdout.strip() == "1"
        # a real ccache through it: a second, empty local cache gets the object from Redis
        if shutil.which("ccache") and shutil.which("gcc"):
            (tmp_path / "a.c").write_text("int a(void) { return 2; }\n")
            for builder in ("one", "two"):
                env = {
                    **os.environ,
                    "CCACHE_DIR": str(tmp_path / builder),
                    "CCACHE_REMOTE_STORAGE": relay.url,
                }
                subprocess.run(
                    ["ccache", "gcc", "-c", "a.c", "-o", f"{builder}.o"], cwd=tmp_path, env=env, check=True
                )
            stats = subprocess.run(
                ["ccache", "--print-stats"], env={**os.environ, "CCACHE_DIR": str(tmp_path / "two")},
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            assert "remote_storage_hit\t1" in stats, stats
    finally:
        relay.close()
    assert not relay.directory.exists()
