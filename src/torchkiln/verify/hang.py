"""Why a torchrun launch hangs, said when it does: the launcher's last lines and the likely cause.

A DDP launch that never ends is almost always the machine's network setup, not torch: torchrun gives its
workers the agent's hostname as ``MASTER_ADDR``, so a hostname that does not resolve leaves them retrying
forever (c10d prints "The IPv6 network addresses of (<host>, <port>) cannot be retrieved (gai error: -2 -
Name or service not known)" and never gives up: seen with torch 2.13 under a hostname missing from
/etc/hosts and DNS); and ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` naming an interface this machine
lacks makes the process groups wait for peers they cannot reach. This module checks both, bounded, and
writes the report a hung launch fails with. Standard library only.
"""

from __future__ import annotations

import math
import re
import socket
import threading
from collections.abc import Mapping

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


def likely_causes(environ: Mapping[str, str], timeout: float = RESOLVE_TIMEOUT_S) -> list[str]:
    """What in this machine's network setup makes torchrun launches hang (empty: nothing found)."""
    causes = interface_problems(environ)
    resolution = name_resolution_problem(timeout)
    return ([resolution] if resolution else []) + causes


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
    cause = (
        CAUSE_PREFIX + "; ".join(causes)
        if causes
        else f"{NO_CAUSE} (the hostname resolves; no *_SOCKET_IFNAME names a missing interface)"
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
