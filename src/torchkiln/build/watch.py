"""The configure watcher: read CMake's configuration summary while the build runs and stop it early.

PyTorch's CMake turns features off silently when it cannot find them (CUDA, cuDNN, NCCL, MKL, MAGMA,
cuSPARSELt, cuDSS): the build then compiles for hours and produces a wheel without them (pytorch#84162,
#30463, #15167, #9063). PyTorch's configure ends with its ``******** Summary ********`` block
(cmake/Summary.cmake), but it is not the only one: the bundled ONNX (``add_subdirectory(third_party/onnx)`` in
cmake/Dependencies.cmake) prints a block with the same title (onnx's cmake/summary.cmake) well before it. The
watcher therefore reads every block and judges the one only PyTorch's prints (:data:`PYTORCH_KEYS`), and
reads every message of the whole configure for the ones that say a setting came out off
(:data:`OFF_MESSAGES`): MAGMA's outcome is printed nowhere else. CMake prints a ``message(WARNING ...)`` as
an indented block, wrapped and with two spaces after each full stop; :class:`Messages` puts it back together.
On a contradiction the build is stopped right after configure, naming the setting that came out wrong and the
likely cause found in what CMake printed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from torchkiln.recipe.compat import compat
from torchkiln.recipe.model import Recipe
from torchkiln.recipe.spelling import truth
from torchkiln.shipped import shipped_toml

SUMMARY_START = "******** Summary ********"
SUMMARY_LINE = re.compile(r"^--\s+(?P<key>[A-Za-z][A-Za-z0-9_ .+()/-]*?)\s*:\s?(?P<value>.*?)\s*$")
SUMMARY_END = re.compile(r"^-- (Configuring done|Configuring incomplete|Generating done)")
# Keys only PyTorch's summary prints: cmake/Summary.cmake has `message(STATUS "  TORCH_VERSION         :
# ${TORCH_VERSION}")` and `message(STATUS "  USE_CUDA              : ${USE_CUDA}")` (2.6.0 tree and the
# pytorch/pytorch versions the search tool holds); onnx's cmake/summary.cmake prints neither ("ONNX version",
# "ONNX NAMESPACE", ...).
PYTORCH_KEYS = ("TORCH_VERSION", "USE_CUDA")
# How CMake starts a message(WARNING|AUTHOR_WARNING|SEND_ERROR|FATAL_ERROR|DEPRECATION) block; its text
# follows indented by two spaces, then "Call Stack (most recent call first):" or a blank line.
BLOCK_START = re.compile(r"^CMake (Warning|Error|Deprecation Warning)( \(dev\))?( at [^ ]+ \(\w+\))?:\s*$")

# What configure prints when it turns a setting off, and the likely causes: upstream's messages as data, each
# quoted with its upstream file and line (data/configure_watch.toml, which says how each row is read).
_DATA = shipped_toml("configure_watch.toml")
WATCHED: tuple[str, ...] = tuple(_DATA["watched"])
OFF_MESSAGES: dict[str, tuple[re.Pattern[str], ...]] = {
    name: tuple(re.compile(row["message"]) for row in setting.get("off", ()))
    for name, setting in _DATA["setting"].items()
}
# setting -> ((pattern over configure's messages, likely cause), ...), most specific first.
CAUSES: dict[str, tuple[tuple[re.Pattern[str], str], ...]] = {
    name: tuple(
        (re.compile(row["pattern"], re.IGNORECASE if row.get("ignore_case") else 0), row["cause"])
        for row in setting.get("cause", ())
    )
    for name, setting in _DATA["setting"].items()
}
GENERIC_CAUSE: dict[str, str] = {name: setting["generic"] for name, setting in _DATA["setting"].items()}


class Watcher(Protocol):
    """What reads a compile step's output for a configuration that contradicts the recipe."""

    what: str  # how a stop is described: "stopped right after configure, CMake's summary contradicts ..."

    def feed(self, line: str) -> list[Contradiction] | None: ...

    def close(self) -> list[Contradiction] | None: ...


@dataclass(frozen=True)
class Contradiction:
    setting: str
    expected: str
    actual: str
    cause: str
    evidence: str | None = None  # the line the cause was read from
    source: str = "configure"  # what printed it

    def __str__(self) -> str:
        text = f"{self.setting} came out {self.actual or '(empty)'}, the recipe asks for {self.expected}"
        text += f"; likely cause: {self.cause}"
        if self.evidence:
            text += f" ({self.source} said: {self.evidence.strip()!r})"
        return text


@dataclass
class Expectations:
    """What the configure summary must say: ON/OFF settings, and version prefixes."""

    flags: dict[str, bool] = field(default_factory=dict)
    cuda_version: str | None = None  # "13.0"
    blas: str | None = None  # BLAS_INFO's prefix: "mkl" | "open" | "nvpl" (compat.toml [blas.*] info)
    blas_name: str = ""  # "MKL", "OpenBLAS", "NVPL"

    @classmethod
    def for_step(cls, env: Mapping[str, str], recipe: Recipe) -> Expectations:
        flags: dict[str, bool] = {}
        for name in WATCHED:
            wanted = truth(env.get(name))
            if wanted is not None:
                flags[name] = wanted
        blas_var = env.get("BLAS")
        if blas_var is not None and "USE_MKL" not in flags:
            # PyTorch has no USE_MKL option: BLAS=MKL asks for MKL, and the summary reports USE_MKL.
            flags["USE_MKL"] = blas_var.strip().upper() == "MKL"
        cuda = (
            str(recipe.accelerator.cuda) if recipe.accelerator.is_cuda and recipe.accelerator.cuda else None
        )
        # A kind without a [blas.*] row (none the schema admits) has no summary line to expect.
        kind = compat()["blas"].get(recipe.blas.kind, {})
        return cls(flags, cuda, kind.get("info"), kind.get("name", ""))


def parse_summary(lines: list[str]) -> dict[str, str]:
    """``key -> value`` of a summary block (first occurrence wins: nested keys never repeat top ones)."""
    out: dict[str, str] = {}
    for line in lines:
        match = SUMMARY_LINE.match(line.rstrip("\n"))
        if match and match["key"] not in out:
            out[match["key"].strip()] = match["value"]
    return out


def is_pytorch_summary(summary: Mapping[str, str]) -> bool:
    """Whether a summary block is PyTorch's own (not ONNX's, nor another bundled project's)."""
    return any(key in summary for key in PYTORCH_KEYS)


def off_messages(messages: list[str]) -> dict[str, str]:
    """setting -> the first of ``messages`` that says it came out off (:data:`OFF_MESSAGES`)."""
    found: dict[str, str] = {}
    for message in messages:
        for name, patterns in OFF_MESSAGES.items():
            if name not in found and any(p.search(message) for p in patterns):
                found[name] = message
    return found


class Messages:
    """Configure output, line by line, back into CMake's messages: ``-- text`` is one message (STATUS);
    a ``CMake Warning at FILE:LINE (message):`` block is one message made of its indented lines (CMake wraps
    them and puts two spaces after a full stop: whitespace is collapsed); any other line is a message of its
    own (``message("...")`` without a mode prints the bare text)."""

    def __init__(self) -> None:
        self._block: list[str] | None = None
        self._stack = False  # inside a block's "Call Stack (most recent call first):" lines

    def feed(self, line: str) -> Iterator[str]:
        """The messages ``line`` completes (a warning block completes at the first line not in it)."""
        indented = line.startswith("  ") and bool(line.strip())
        if self._stack and indented:
            return
        self._stack = False
        if self._block is not None:
            if indented:
                self._block.append(line.strip())
                return
            yield from self.close()
        if BLOCK_START.match(line):
            self._block = []
        elif line.startswith("Call Stack"):
            self._stack = True
        elif line.startswith("-- "):
            yield " ".join(line[3:].split())
        elif line.strip():
            yield " ".join(line.split())

    def close(self) -> Iterator[str]:
        if self._block:
            yield " ".join(" ".join(self._block).split())
        self._block = None


def compare(
    summary: Mapping[str, str],
    expect: Expectations,
    before: list[str],
    off: Mapping[str, str] | None = None,
) -> list[Contradiction]:
    """Every setting PyTorch's summary (or an :data:`OFF_MESSAGES` message) contradicts; ``before`` are the
    configure's messages before the summary, ``off`` the off-messages seen in the whole configure (default:
    found in ``before``). A setting the summary prints is judged by the summary; one it does not print (MAGMA
    never, the CUDA libraries not under USE_CUDA=OFF) by the off-messages."""
    off = off_messages(before) if off is None else off
    found: list[Contradiction] = []
    for name, wanted in expect.flags.items():
        if name not in summary:
            if wanted and name in off:
                cause, evidence = _likely_cause(name, [off[name]])
                found.append(Contradiction(name, "ON", "OFF", cause, evidence or off[name]))
            continue  # not printed by this version (or nested under a disabled parent): nothing to compare
        actual = truth(summary[name])
        if actual is None or actual == wanted:
            continue
        # the message that turned it off may be thousands of lines back: it comes first
        lines = [off[name], *before] if name in off else before
        cause, evidence = _likely_cause(name, lines) if wanted else ("the build enabled it anyway", None)
        found.append(Contradiction(name, "ON" if wanted else "OFF", summary[name], cause, evidence))
    found += _versions(summary, expect)
    return found


def _versions(summary: Mapping[str, str], expect: Expectations) -> list[Contradiction]:
    """The CUDA release and the BLAS the summary names, against the recipe's."""
    found = []
    if expect.cuda_version and truth(summary.get("USE_CUDA", "ON")) is not False:
        got = summary.get("CUDA version")
        if got is not None and not _same_release(got, expect.cuda_version):
            found.append(
                Contradiction(
                    "CUDA version",
                    expect.cuda_version,
                    got,
                    f"CMake picked up another CUDA toolkit ({summary.get('CUDA root directory', '?')}): another "
                    "nvcc is first on PATH, or CUDA_HOME/CUDACXX point to it",
                )
            )
    if expect.blas:
        got = summary.get("BLAS")
        if got is not None and got.strip() and not got.strip().lower().startswith(expect.blas):
            found.append(
                Contradiction(
                    "BLAS",
                    expect.blas_name,
                    got,
                    GENERIC_CAUSE["USE_MKL"] if expect.blas == "mkl" else f"{expect.blas_name} not found",
                )
            )
    return found


def _same_release(got: str, want: str) -> bool:
    got_parts = got.strip().split(".")
    want_parts = want.strip().split(".")
    return got_parts[: len(want_parts)] == want_parts


def _likely_cause(setting: str, before: list[str]) -> tuple[str, str | None]:
    for pattern, cause in CAUSES.get(setting, ()):
        for line in before:
            if pattern.search(line):
                return cause, line
    return GENERIC_CAUSE.get(setting, "CMake turned it off (see the configure log)"), None


class SummaryWatcher:
    """Feed it the compile step's output line by line.

    :meth:`feed` returns None until PyTorch's summary block was read (other projects' blocks are read and set
    aside), then the list of contradictions once (an empty list: configure agrees with the recipe).
    """

    what = "stopped right after configure, CMake's summary contradicts the recipe"

    def __init__(self, expect: Expectations, *, keep_before: int = 400) -> None:
        self.expect = expect
        self._messages = Messages()
        self._before: list[str] = []  # the last messages, for the likely cause
        self._keep = keep_before
        self._block: list[str] | None = None
        self._off: dict[str, str] = {}  # OFF_MESSAGES seen anywhere in the configure, not only the last ones
        self.summary: dict[str, str] | None = None
        self.other_summaries: list[dict[str, str]] = []  # blocks that were not PyTorch's (ONNX's)
        self.contradictions: list[Contradiction] | None = None

    def feed(self, line: str) -> list[Contradiction] | None:
        if self.contradictions is not None:
            return None
        text = line.rstrip("\n")
        for message in self._messages.feed(text):
            self._note(message)
        if SUMMARY_START in text:
            verdict = self._end_block()  # a block that ran straight into the next one
            self._block = []
            return verdict
        if self._block is not None:
            if SUMMARY_END.match(text) or not text.startswith("--"):
                return self._end_block()
            self._block.append(text)
        return None

    def close(self) -> list[Contradiction] | None:
        """End of output: judge a summary that was still open, or, when PyTorch's summary never came, what
        the off-messages say (a configure that stopped early still said what it turned off)."""
        if self.contradictions is not None:
            return None
        for message in self._messages.close():
            self._note(message)
        verdict = self._end_block()
        if verdict is None and self._off:
            verdict = self.contradictions = compare({}, self.expect, self._before, self._off)
        return verdict

    def _note(self, message: str) -> None:
        for name, found in off_messages([message]).items():
            self._off.setdefault(name, found)
        self._before.append(message)
        if len(self._before) > self._keep:
            del self._before[: len(self._before) - self._keep]

    def _end_block(self) -> list[Contradiction] | None:
        block, self._block = self._block, None
        if block is None:
            return None
        summary = parse_summary(block)
        if not is_pytorch_summary(summary):
            self.other_summaries.append(summary)
            return None
        self.summary = summary
        self.contradictions = compare(summary, self.expect, self._before, self._off)
        return self.contradictions
