"""What a failed build's log says about compiles that died for memory, and which build edges they were.

When the kernel's OOM killer (a cgroup's limit, or the machine's memory) kills a compiler it sends SIGKILL;
nothing is printed by the killed process, so the evidence is what the processes around it print. Each
signature below was read from the real tool's output for a real SIGKILL (tests/data/killed_logs/ holds
those outputs whole):

* gcc's driver when a program it ran dies (gcc 12.2, Debian 12): ``g++: fatal error: Killed signal
  terminated program cc1plus`` (``cc1``, ``as``, ...), and its ``collect2`` for the linker: ``collect2: fatal
  error: ld terminated with signal 9 [Killed]``; the driver itself exits 1;
* the shell that ninja (and nvcc) runs each command with: dash, Debian's ``/bin/sh``, prints ``Killed``;
  bash as ``/bin/sh`` prints ``bash: line 1: 1234 Killed   cmd``;
* nvcc 13.0 runs cicc, ptxas and the host compiler through ``sh -c``: their death is the shell's ``Killed``
  and nvcc exits 137, printing nothing of its own; a tool it runs directly (the host compiler's probe) is
  ``nvcc error   : 'gcc' died due to signal 9 (Kill signal)``;
* ninja 1.13 (PyPI's, the build venv's) puts the exit status in its failure line: ``FAILED: [code=137]
  obj.o`` (128 + SIGKILL), also for a command the shell exec'd, which leaves no shell to say ``Killed``;
  ninja 1.11 (Debian 12's) prints ``FAILED: obj.o`` and the command's output below it (the shell's
  ``Killed`` where a shell was left; nothing at all for an exec'd command: then only the cgroup's
  counter tells);
* not a kill but the same cause, a compiler that could not allocate (an address-space limit, overcommit
  off): gcc's ``cc1plus: out of memory allocating 6000 bytes after a total of 55029760 bytes``.

A ninja failure is a block: the ``FAILED:`` line, the command, its output, up to the next progress line
(``[12/345]``), failure or ``ninja:`` line; a signature inside a block names that edge's outputs as the unit
that died. A signature outside every block (a compile outside ninja, the build script itself) is evidence
without a unit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Signature:
    pattern: re.Pattern[str]
    source: str  # who prints it, and when


KILL_SIGNATURES: tuple[Signature, ...] = (
    Signature(
        re.compile(r": fatal error: Killed signal terminated program \S+"),
        "gcc's driver: a program it ran (cc1plus, cc1, as) died of SIGKILL",
    ),
    Signature(
        re.compile(r"^collect2: fatal error: \S+ terminated with signal 9 \[Killed\]"),
        "gcc's collect2: the linker died of SIGKILL",
    ),
    Signature(
        re.compile(r"^Killed$"), "dash (/bin/sh of ninja's and nvcc's commands): a command died of SIGKILL"
    ),
    Signature(
        re.compile(r"^\S*sh: (line \d+: )?\s*\d+ Killed\s"), "bash as /bin/sh: a command died of SIGKILL"
    ),
    Signature(
        re.compile(r"^nvcc error\s*: '[^']+' died due to signal 9\b"), "nvcc: a tool it ran died of SIGKILL"
    ),
    Signature(
        re.compile(r"^\S+: out of memory allocating \d+ bytes"),
        "gcc (libiberty's xmalloc): the compiler could not allocate memory",
    ),
)
# ninja's failure line; ``[code=N]`` in ninja 1.13 (not 1.11). 137 = 128 + SIGKILL, for a command the shell
# ran and for one it exec'd alike.
NINJA_FAILED = re.compile(r"^FAILED: (?:\[code=(?P<code>-?\d+)\] )?(?P<outputs>.*?)\s*$")
KILLED_CODES = frozenset({137})
# What ends a failed edge's output: ninja's next progress line (``[3/12] c++ ...``), its own messages.
BLOCK_END = (re.compile(r"^\[\d+/\d+\] "), re.compile(r"^ninja: "))


@dataclass(frozen=True)
class KilledEdge:
    """A ninja edge whose command died for memory: its outputs as the failure line names them."""

    outputs: tuple[str, ...]
    evidence: str  # the line that says so

    @property
    def target(self) -> str:
        return self.outputs[0]


@dataclass(frozen=True)
class Kills:
    """What a log says died for memory: the ninja edges, and every line that says something did."""

    edges: tuple[KilledEdge, ...] = ()
    evidence: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.evidence)


def signature(line: str) -> Signature | None:
    """The signature a log line matches, None for an ordinary line."""
    return next((s for s in KILL_SIGNATURES if s.pattern.search(line)), None)


def read_kills(lines: Iterable[str]) -> Kills:
    """The edges of a build log that died for memory (each once, in log order) and the evidence lines."""
    edges: dict[tuple[str, ...], KilledEdge] = {}
    evidence: list[str] = []
    block: tuple[str, ...] | None = None  # the outputs of the failed edge whose output is being read
    for raw in lines:
        line = raw.rstrip()
        failed = NINJA_FAILED.match(line)
        if failed is not None or any(end.match(line) for end in BLOCK_END):
            block = None
        if failed is not None:
            block = tuple(failed["outputs"].split())
            code = failed["code"]
            if code is None or int(code) not in KILLED_CODES:
                continue
        elif signature(line) is None:
            continue
        evidence.append(line)
        if block and block not in edges:
            edges[block] = KilledEdge(block, line)
    return Kills(tuple(edges.values()), tuple(evidence))
