"""Why a torchrun launch hangs, said when it does: the launcher's last lines and the likely cause.

A DDP launch that never ends is almost always the machine's network setup, not torch: torchrun gives its
workers the agent's hostname as ``MASTER_ADDR``, so a hostname that does not resolve leaves them retrying
forever (c10d prints "The IPv6 network addresses of (<host>, <port>) cannot be retrieved (gai error: -2 -
Name or service not known)" and never gives up: seen with torch 2.13 under a hostname missing from
/etc/hosts and DNS); and ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` naming an interface this machine
lacks makes the process groups wait for peers they cannot reach; a network namespace whose loopback is down
(every connect: ENETUNREACH) and a rendezvous port another process holds (a silent listener: nothing is
printed at all) hang it too. This module checks these, bounded, and writes the report a hung launch fails
with: the causes found, else the first error line of the ranks' output (:func:`first_rank_error`), and the
launch's last lines. Standard library only.
"""

from __future__ import annotations

import errno
import math
import os
import re
import socket
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

DEADLINE_ENV = "TORCHKILN_VERIFY_DDP_TIMEOUT"  # seconds the DDP launches that run together may take
DEFAULT_DEADLINE_S = 120.0
RESOLVE_TIMEOUT_S = 10.0  # getaddrinfo on a host whose DNS does not answer can block for minutes
# The interface choices the suite keeps in its workers' environment (torchkiln.verify.proc), and how each
# is matched: gloo takes exact names, NCCL (and tensorpipe's) take prefixes; "^" excludes, "=" is exact.
SOCKET_IFNAMES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
TAIL_LINES = 15
# How report() names what it found: report.cause_line reads the text after it as the failure's cause.
CAUSE_PREFIX = "likely cause: "
NO_CAUSE = "no cause found here"
FIRST_ERROR = "the ranks' first error: "  # how report() quotes first_rank_error's line
PORT_ENV = "TORCHKILN_VERIFY_DDP_PORT"  # the two-node launch's rendezvous port (default: a free one)
CONNECT_TIMEOUT_S = 5.0


def launch_deadline(environ: Mapping[str, str]) -> float:
    """The DDP launches' shared deadline: ``$TORCHKILN_VERIFY_DDP_TIMEOUT`` seconds, else 120 (three CPU
    launches take 16-20 s together on two cores). Raises ValueError naming the variable when it is not a
    positive number."""
    value = environ.get(DEADLINE_ENV, "").strip()
    if not value:
        return DEFAULT_DEADLINE_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < math.inf:
        raise ValueError(f"{DEADLINE_ENV}={value!r}: not a positive number of seconds (valid: e.g. 120)")
    return seconds


def _resolve(name: str, timeout: float) -> str | None:
    """None when ``name`` resolves within ``timeout``; else what went wrong, in words."""
    outcome: list[str | None] = []

    def lookup() -> None:
        try:
            socket.getaddrinfo(name, None)
            outcome.append(None)
        except OSError as exc:
            outcome.append(f"getaddrinfo: {exc.strerror or exc}")

    worker = threading.Thread(target=lookup, daemon=True)  # a stuck resolver is left behind, not waited on
    worker.start()
    worker.join(timeout)
    if not outcome:
        return f"getaddrinfo did not answer within {timeout:.0f} s"
    return outcome[0]


def name_resolution_problem(timeout: float = RESOLVE_TIMEOUT_S) -> str | None:
    """Whether this machine's hostname resolves, as torchrun's workers need it to."""
    host = socket.gethostname()
    problem = _resolve(host, timeout)
    if problem is None:
        return None
    return (
        f"this machine's hostname {host!r} does not resolve ({problem}): torchrun gives its workers the "
        f"agent's hostname as MASTER_ADDR, and they wait for it forever; map it in /etc/hosts (e.g. "
        f"'127.0.1.1 {host}') or in DNS"
    )


def interface_problems(environ: Mapping[str, str]) -> list[str]:
    """``*_SOCKET_IFNAME`` entries that name no interface of this machine."""
    names = sorted(name for _, name in socket.if_nameindex())
    problems = []
    for var in SOCKET_IFNAMES:
        value = environ.get(var, "").strip()
        if not value or value.startswith("^"):  # unset, or an exclusion list: nothing to be missing
            continue
        exact = var == "GLOO_SOCKET_IFNAME" or value.startswith("=")
        entries = [e.strip() for e in value.removeprefix("=").split(",") if e.strip()]
        missing = [e for e in entries if not any(n == e if exact else n.startswith(e) for n in names)]
        if missing:
            problems.append(
                f"{var}={value}: no interface {', '.join(missing)} on this machine (it has {', '.join(names)})"
            )
    return problems


def launch_port(environ: Mapping[str, str]) -> int | None:
    """The two-node launch's rendezvous port: ``$TORCHKILN_VERIFY_DDP_PORT`` (a host whose firewall opens one
    port), else None (a free one is taken). Raises ValueError naming the variable when it is not a port."""
    value = environ.get(PORT_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ValueError(f"{PORT_ENV}={value!r}: not a TCP port (valid: 1 to 65535)")
    return int(value)


def _errno(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0)
    return f"{exc.strerror or exc}" + (f" ({name})" if name else "")


def _reach(address: tuple[Any, ...], family: int, timeout: float) -> str | None:
    """None when this machine can listen at ``address`` (port 0) and connect to itself there; else why not."""
    try:
        with socket.socket(family, socket.SOCK_STREAM) as server:
            server.bind((address[0], 0))
            server.listen(1)
            port = server.getsockname()[1]
            with socket.socket(family, socket.SOCK_STREAM) as client:
                client.settimeout(timeout)
                client.connect((address[0], port))
    except OSError as exc:
        return _errno(exc)
    return None


def loopback_problems(hosts: Sequence[str], timeout: float = CONNECT_TIMEOUT_S) -> list[str]:
    """Whether this machine reaches itself over TCP at ``hosts``, where torchrun's agent and workers meet:
    localhost (``--standalone``'s rendezvous), 127.0.0.1 (the two-node launch's) and this machine's hostname
    (the workers' MASTER_ADDR), each a name that resolves. A network namespace whose loopback interface is down answers every connect
    with ENETUNREACH: the launch retries forever."""
    failed: dict[tuple[str, str], list[str]] = {}  # (address, why) -> the names that gave it
    for host in dict.fromkeys(hosts):
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError:
            continue
        for family, _, _, _, address in dict.fromkeys(infos):
            why = _reach(address, family, timeout)
            if why is not None and family == socket.AF_INET6 and "EADDRNOTAVAIL" in why:
                continue  # no IPv6 here: c10d tries the next address
            if why is not None:
                failed.setdefault((str(address[0]), why), []).append(host)
    return [
        f"this machine cannot reach itself at {', '.join(names)} ({address}): {why}: torchrun's agent and "
        "workers meet there; bring the loopback interface up (ip link set lo up) or run where the network is "
        "configured"
        for (address, why), names in failed.items()
    ]


def _listeners(port: int) -> dict[int, str]:
    """Socket inode -> ``pid N: command line`` of the processes holding TCP ``port`` (not in TIME_WAIT), as far
    as /proc lets this user see."""
    inodes: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] != "06":
                inodes.add(int(fields[9]))
    found: dict[int, str] = {}
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:[") and int(target[8:-1]) in inodes:
            pid = fd.parent.parent.name
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                argv = "?"
            found[int(target[8:-1])] = (
                f"pid {pid}: {' '.join(argv.split())[:120]}"  # one line, a -c script too
            )
    return found


def endpoint_problems(endpoints: Sequence[tuple[str, int]]) -> list[str]:
    """Rendezvous endpoints (host, port) another process holds once the launch is gone: its agents met that
    process instead of their own store (a silent listener makes them wait forever, saying nothing)."""
    problems = []
    for host, port in endpoints:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind((host, port))
            continue
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                continue
        holders = sorted(set(_listeners(port).values())) or [
            "which, /proc does not say: a socket bound to it without listening, or another user's"
        ]
        problems.append(
            f"the rendezvous endpoint {host}:{port} is taken by another process ({'; '.join(holders)}): the "
            f"launch's agents met it instead of their own store; free the port or choose another (${PORT_ENV})"
        )
    return problems


def likely_causes(
    environ: Mapping[str, str],
    timeout: float = RESOLVE_TIMEOUT_S,
    endpoints: Sequence[tuple[str, int]] = (),
) -> list[str]:
    """What in this machine's network setup makes torchrun launches hang (empty: nothing found): a hostname
    that does not resolve, an interface choice naming nothing, no way to reach itself over TCP, a rendezvous
    endpoint (``endpoints``, checked after the launch was killed) another process holds."""
    causes = interface_problems(environ)
    resolution = name_resolution_problem(timeout)
    hosts = ["localhost", "127.0.0.1", *([] if resolution else [socket.gethostname()])]
    reach = loopback_problems(hosts)
    return ([resolution] if resolution else []) + reach + endpoint_problems(endpoints) + causes


# What the ranks print when they cannot meet, by rank (the first rank with a matching line wins; within it the
# first line): c10d's socket errors as torch 2.x words them (socket.cpp: "(errno: 101 - Network is
# unreachable)", "(gai error: -2 - Name or service not known)", "... name: EADDRINUSE, message: address already
# in use"), the strerror of a refused or unreachable connection, then any error line.
RANK_ERRORS: tuple[tuple[re.Pattern[str], ...], ...] = (
    (
        re.compile(r"\(errno: ?\d+ - [^)]*\)|\(gai error: ?-?\d+ - [^)]*\)|EADDRINUSE|EADDRNOTAVAIL"),
        re.compile(r"timed out after \d+ ?ms while trying to connect to"),  # c10d: nothing answered (refused)
        re.compile(
            r"Connection refused|Network is unreachable|No route to host|Address already in use|"
            r"Cannot assign requested address|Name or service not known|Temporary failure in name resolution|"
            r"Connection reset by peer|Connection timed out",
            re.IGNORECASE,
        ),
    ),
    (
        re.compile(r"^\[E\d{4} "),  # glog's error severity (c10d)
        re.compile(r"^[A-Za-z_][\w.]*(Error|Exception)\b[^:\s]*: \S"),
        re.compile(r"^(ERROR|error|fatal)\b"),
    ),
)
GLOG_PREFIX = re.compile(r"^\[[EWIF]\d{4} [\d:.]+ [^\]]+\] ")


def first_rank_error(stdout: str, stderr: str) -> str | None:
    """The first line of the ranks' output (torchrun's, c10d's, the workers') that names an error, by
    :data:`RANK_ERRORS`, without glog's prefix; None when none does."""
    lines = [line.strip() for text in (stderr, stdout) for line in text.splitlines() if line.strip()]
    for patterns in RANK_ERRORS:
        for line in lines:
            if any(p.search(line) for p in patterns):
                return GLOG_PREFIX.sub("", line).rstrip(".")
    return None


# The frames of a C++ stack trace c10 prints with an error (``frame #12: c10d::TCPStore::doWait(...) + 0xc5
# (0x7f... in .../libtorch_cpu.so)``, ``<omitting python frames>``): addresses that say nothing of why a launch
# hung, and 40 of them push c10d's own warning (the hostname whose addresses cannot be retrieved) out of the tail.
STACK_FRAME = re.compile(r"^\s*(frame #\d+: |<omitting python frames>$)")


def _last_lines(text: str) -> list[str]:
    """The last :data:`TAIL_LINES` distinct non-empty lines (three workers print the same warning thrice),
    without the frames of a C++ stack trace (:data:`STACK_FRAME`)."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip() and not STACK_FRAME.match(line)]
    distinct = list(dict.fromkeys(reversed(lines)))[:TAIL_LINES]
    return list(reversed(distinct))


def report(what: str, stdout: str, stderr: str, deadline_s: float, causes: list[str]) -> str:
    """The failure of a launch that had not finished by its deadline: the likely ``causes``
    (:func:`likely_causes`) and the last lines torchrun and its workers wrote (stderr: torchrun's and c10d's
    logs; stdout: what the workers print)."""
    first = first_rank_error(stdout, stderr)
    said = [*causes, *([f"{FIRST_ERROR}{first}"] if first else [])]
    cause = (
        CAUSE_PREFIX + "; ".join(said)
        if said
        else f"{NO_CAUSE} (the hostname resolves, this machine reaches itself over TCP, no *_SOCKET_IFNAME "
        "names a missing interface, no rendezvous endpoint is taken, and nothing in the ranks' output names "
        "an error)"
    )
    parts = [
        f"{what} hung: not finished within the DDP launches' {deadline_s:g} s deadline "
        f"(${DEADLINE_ENV}; killed with its workers); {cause}."
    ]
    for name, text in (("stderr", stderr), ("stdout", stdout)):
        lines = _last_lines(text)
        parts.append(
            f"Last lines on {name}:" + "".join(f"\n  {line}" for line in lines)
            if lines
            else f"Nothing on {name}."
        )
    return "\n".join(parts)
