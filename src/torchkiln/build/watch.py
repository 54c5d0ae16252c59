"""The configure watcher: read CMake's configuration summary while the build runs and stop it early.

PyTorch's CMake turns features off silently when it cannot find them (CUDA, cuDNN, NCCL, MKL, MAGMA): the
build then compiles for hours and produces a wheel without them (pytorch#84162, #30463, #15167, #9063).
Every configure ends with a ``******** Summary ********`` block (cmake/Summary.cmake). The watcher parses
that block from the compile step's output and compares it with what the step asked for (its ``USE_*``
variables and the recipe's CUDA version); on a contradiction the build is stopped right after configure,
with the setting that came out wrong and the likely cause found in the lines CMake printed before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from torchkiln.recipe.model import Recipe
from torchkiln.recipe.spelling import truth

SUMMARY_START = "******** Summary ********"
SUMMARY_LINE = re.compile(r"^--\s+(?P<key>[A-Za-z][A-Za-z0-9_ .+()/-]*?)\s*:\s?(?P<value>.*?)\s*$")
SUMMARY_END = re.compile(r"^-- (Configuring done|Configuring incomplete|Generating done)")

# Settings the watcher compares when the step sets them. USE_MKL's summary line prints CAFFE2_USE_MKL.
WATCHED = (
    "USE_CUDA",
    "USE_CUDNN",
    "USE_NCCL",
    "USE_MKL",
    "USE_MAGMA",
    "USE_MKLDNN",
    "USE_DISTRIBUTED",
    "USE_FBGEMM",
    "USE_KINETO",
    "USE_NUMPY",
    "USE_OPENMP",
    "USE_FLASH_ATTENTION",
    "USE_MEM_EFF_ATTENTION",
    "USE_CUSPARSELT",
    "USE_CUDSS",
    "USE_CUFILE",
    "USE_GLOO",
    "USE_MPI",
)

# setting -> ((regex over the configure output, likely cause), ...), most specific first.
CAUSES: dict[str, tuple[tuple[re.Pattern[str], str], ...]] = {
    "USE_CUDA": (
        (
            re.compile(
                r"Could NOT find CUDA|CUDA cannot be found|Not compiling with CUDA|No CMAKE_CUDA_COMPILER"
            ),
            "CMake found no CUDA toolkit: nvcc is not on PATH, or CUDA_HOME/CUDACXX point to a directory without "
            "it (is the CUDA toolkit installed in the build image?)",
        ),
    ),
    "USE_CUDNN": (
        (
            re.compile(r"Could NOT find CUDNN|Cannot find cuDNN|cuDNN.*not found", re.IGNORECASE),
            "cuDNN was not found: its headers and libraries must be under CUDA_HOME, or set CUDNN_INCLUDE_DIR "
            "and CUDNN_LIBRARY (pytorch#15167)",
        ),
    ),
    "USE_NCCL": (
        (
            re.compile(r"Could NOT find NCCL|NCCL.*not found", re.IGNORECASE),
            "NCCL was not found under NCCL_ROOT_DIR / NCCL_INCLUDE_DIR / NCCL_LIB_DIR (install the pinned NCCL "
            "into the CUDA toolkit directory)",
        ),
    ),
    "USE_MKL": (
        (
            re.compile(r"MKL.*not found|Could NOT find MKL", re.IGNORECASE),
            "MKL was not found: mkl-static and mkl-include must be installed in the build venv and "
            "CMAKE_INCLUDE_PATH / CMAKE_LIBRARY_PATH point to them",
        ),
    ),
    "USE_MAGMA": (
        (
            re.compile(r"MAGMA not found|Could NOT find MAGMA", re.IGNORECASE),
            "MAGMA was not found under MAGMA_HOME (pytorch#9063): install the pinned MAGMA there",
        ),
    ),
}

# Settings whose outcome the summary does not print, and the configure line that says they came out off.
# cmake/Summary.cmake has no USE_MAGMA line; cmake/Dependencies.cmake prints "MAGMA not found. Compiling
# without MAGMA support" (and turns USE_MAGMA off) when find_package(MAGMA) fails, or warns "Not compiling
# with MAGMA" when USE_MAGMA is on without CUDA/ROCm. Such a line, anywhere before the summary, is a
# contradiction when the step asked for the setting.
OFF_LINES: dict[str, re.Pattern[str]] = {
    "USE_MAGMA": re.compile(r"MAGMA not found\. Compiling without MAGMA support|Not compiling with MAGMA"),
}

GENERIC_CAUSE = {
    "USE_CUDA": "CUDA was not detected: nvcc not on PATH, or CUDA_HOME/CUDACXX wrong",
    "USE_CUDNN": "cuDNN headers/libraries not found (CUDNN_INCLUDE_DIR / CUDNN_LIBRARY), or USE_CUDA is off",
    "USE_NCCL": "NCCL not found (NCCL_ROOT_DIR), or USE_CUDA / USE_DISTRIBUTED is off",
    "USE_MKL": "MKL not found (mkl-static/mkl-include in the build venv, CMAKE_INCLUDE_PATH/CMAKE_LIBRARY_PATH)",
    "USE_MAGMA": "MAGMA not found under MAGMA_HOME, or USE_CUDA is off",
}


@dataclass(frozen=True)
class Contradiction:
    setting: str
    expected: str
    actual: str
    cause: str
    evidence: str | None = None  # the configure line the cause was read from

    def __str__(self) -> str:
        text = f"{self.setting} came out {self.actual or '(empty)'}, the recipe asks for {self.expected}"
        text += f"; likely cause: {self.cause}"
        if self.evidence:
            text += f" (configure said: {self.evidence.strip()!r})"
        return text


@dataclass
class Expectations:
    """What the configure summary must say: ON/OFF settings, and version prefixes."""

    flags: dict[str, bool] = field(default_factory=dict)
    cuda_version: str | None = None  # "13.0"
    blas: str | None = None  # "mkl" | "open"

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
        blas = {"mkl": "mkl", "openblas": "open"}.get(recipe.blas.kind)
        return cls(flags, cuda, blas)


def parse_summary(lines: list[str]) -> dict[str, str]:
    """``key -> value`` of a summary block (first occurrence wins: nested keys never repeat top ones)."""
    out: dict[str, str] = {}
    for line in lines:
        match = SUMMARY_LINE.match(line.rstrip("\n"))
        if match and match["key"] not in out:
            out[match["key"].strip()] = match["value"]
    return out


def off_lines(lines: list[str]) -> dict[str, str]:
    """setting -> the first of ``lines`` that says it came out off (:data:`OFF_LINES`)."""
    found: dict[str, str] = {}
    for line in lines:
        for name, pattern in OFF_LINES.items():
            if name not in found and pattern.search(line):
                found[name] = line
    return found


def compare(
    summary: Mapping[str, str],
    expect: Expectations,
    before: list[str],
    off: Mapping[str, str] | None = None,
) -> list[Contradiction]:
    """Every setting the summary (or an :data:`OFF_LINES` line) contradicts; ``before`` are the configure
    lines printed before the summary, ``off`` the off-lines seen in all of them (default: found in
    ``before``)."""
    off = off_lines(before) if off is None else off
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
        cause, evidence = _likely_cause(name, before) if wanted else ("the build enabled it anyway", None)
        found.append(Contradiction(name, "ON" if wanted else "OFF", summary[name], cause, evidence))
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
                    expect.blas.upper() if expect.blas == "mkl" else "OpenBLAS",
                    got,
                    GENERIC_CAUSE["USE_MKL"] if expect.blas == "mkl" else "OpenBLAS not found",
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

    :meth:`feed` returns None until a complete summary was read, then the list of contradictions once (an
    empty list: configure agrees with the recipe).
    """

    def __init__(self, expect: Expectations, *, keep_before: int = 400) -> None:
        self.expect = expect
        self._before: list[str] = []
        self._keep = keep_before
        self._block: list[str] | None = None
        self._off: dict[str, str] = {}  # OFF_LINES seen anywhere before the summary, not only the last lines
        self.summary: dict[str, str] | None = None
        self.contradictions: list[Contradiction] | None = None

    def feed(self, line: str) -> list[Contradiction] | None:
        if self.contradictions is not None:
            return None
        text = line.rstrip("\n")
        if self._block is None:
            if SUMMARY_START in text:
                self._block = []
            else:
                for name, line in off_lines([text]).items():
                    self._off.setdefault(name, line)
                self._before.append(text)
                if len(self._before) > self._keep:
                    del self._before[: len(self._before) - self._keep]
            return None
        if SUMMARY_END.match(text) or not text.startswith("--"):
            return self._finish()
        self._block.append(text)
        return None

    def close(self) -> list[Contradiction] | None:
        """End of output: evaluate a summary that was still open (output ended right after it)."""
        if self._block is not None and self.contradictions is None:
            return self._finish()
        return None

    def _finish(self) -> list[Contradiction]:
        assert self._block is not None
        self.summary = parse_summary(self._block)
        self.contradictions = compare(self.summary, self.expect, self._before, self._off)
        return self.contradictions
