"""Compare two runs of the parity battery (:mod:`torchkiln.verify.battery`): the build under test against
upstream's wheel of the same release, per operation, against documented tolerances (``data/parity.toml``).

For every output: identical bytes (sha256) is "identical"; otherwise the largest absolute and relative
difference and whether every element is within ``atol + rtol * |upstream|``. An operation the build under
test cannot run but upstream's can is a difference too; one neither can run is left out. The inputs are the
battery's own (Python's ``random``), so both sides computed on the same numbers. Pure Python: no torch here.
"""

from __future__ import annotations

import array
import base64
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from torchkiln.errors import UsageError
from torchkiln.shipped import shipped_toml

from .battery import FORMAT


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    why: str


@dataclass(frozen=True)
class Output:
    """One output of one case (``matmul/cpu/float32``, output ``out``) compared."""

    case: str  # "matmul/cpu/float32"
    output: str  # "out", "grad.fc.weight", ...
    status: str  # "identical", "within", "differs", "missing"
    max_abs: float
    max_rel: float
    tolerance: Tolerance | None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("identical", "within")

    def describe(self) -> str:
        name = f"{self.case} {self.output}"
        if self.status == "identical":
            return f"{name}: identical"
        if self.status == "missing":
            return f"{name}: {self.detail}"
        assert self.tolerance is not None
        verdict = "within" if self.ok else "outside"
        return (
            f"{name}: max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g} ({verdict} rtol {self.tolerance.rtol:g}, "
            f"atol {self.tolerance.atol:g}){': ' + self.detail if self.detail else ''}"
        )


def release_notice(verified: str, reference: str) -> str | None:
    """None when the reference is of this build's release (``2.13.0+cpu`` for ``2.13.0+cu130``: the local
    labels may differ); else what a reader must know first: the comparison is of two releases, whose
    numerics may differ by design (a kernel, a default, a library changed between them), not of this build
    with upstream's build of the same source."""
    try:
        mine, theirs = Version(verified), Version(reference)
    except InvalidVersion:
        return f"the reference torch {reference} could not be compared with this torch {verified} as releases"
    if mine.public == theirs.public:
        return None
    return (
        f"the reference is another release: torch {theirs.public} ({reference}), this build torch "
        f"{mine.public} ({verified}); a difference may be the releases', not this build's"
    )


def failure(verified: str, reference: str, wrong: Sequence[str]) -> str:
    """The failure of a case whose outputs differ (``wrong``: :meth:`Output.describe` of each): against a
    reference of another release, the message names that release and gives it as the likely cause on its own
    line (``cause: ``, read by :func:`torchkiln.verify.report.cause_line`); the run's notice alone is not
    enough, a reader of one failure must not take the releases' difference for the build's."""
    head = f"torch {verified} differs from upstream's {reference}: " + "; ".join(wrong)
    notice = release_notice(verified, reference)
    return head if notice is None else f"{head}\ncause: {notice}"


def tolerances() -> list[dict[str, Any]]:
    return list(shipped_toml("parity.toml")["tolerance"])


def tolerance_for(case: str, rows: Sequence[Mapping[str, Any]]) -> Tolerance:
    """The most specific row matching ``case`` ("name/device/dtype"): see data/parity.toml."""
    name, device, dtype = case.split("/")
    wanted = {"case": name, "device": device, "dtype": dtype}
    best: tuple[tuple[int, ...], Mapping[str, Any]] | None = None
    for row in rows:
        keys = [k for k in wanted if k in row]
        # most keys first; between rows naming as many, case before device before dtype
        rank = (len(keys), *(int(k in row) for k in wanted))
        if all(row[k] == wanted[k] for k in keys) and (best is None or rank > best[0]):
            best = (rank, row)
    if best is None:
        raise KeyError(f"data/parity.toml has no tolerance for {case}")
    row = best[1]
    return Tolerance(float(row["rtol"]), float(row["atol"]), str(row["why"]))


def _floats(encoded: Mapping[str, Any]) -> array.array[float]:
    values = array.array("d")
    values.frombytes(base64.b64decode(encoded["float64"]))
    return values


def compare_output(
    case: str, output: str, got: Mapping[str, Any], want: Mapping[str, Any], tol: Tolerance
) -> Output:
    if got["sha256"] == want["sha256"]:
        return Output(case, output, "identical", 0.0, 0.0, tol)
    if got["shape"] != want["shape"] or got["dtype"] != want["dtype"]:
        detail = f"{got['dtype']}{got['shape']} where upstream gives {want['dtype']}{want['shape']}"
        return Output(case, output, "missing", math.inf, math.inf, tol, detail)
    max_abs = max_rel = 0.0
    outside = 0
    for a, b in zip(_floats(got), _floats(want), strict=True):
        if math.isnan(a) and math.isnan(b) or a == b:
            continue
        diff = abs(a - b)  # nan or inf when one side is
        rel = diff / abs(b) if b != 0 else math.inf
        max_abs, max_rel = max(max_abs, diff), max(max_rel, rel)
        if not diff <= tol.atol + tol.rtol * abs(b):
            outside += 1
    status = "differs" if outside else "within"
    total = len(base64.b64decode(want["float64"])) // 8
    detail = f"{outside} of {total} elements outside" if outside else ""
    return Output(case, output, status, max_abs, max_rel, tol, detail)


def compare(
    verified: Mapping[str, Any], reference: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]
) -> list[Output]:
    """Every output of every case upstream computed, compared (see the module docstring)."""
    results = []
    for case, want in sorted(reference["cases"].items()):
        got = verified["cases"].get(case)
        tol = tolerance_for(case, rows)
        if "unsupported" in want:
            continue  # upstream cannot run it either (the device or dtype lacks the operation)
        if got is None or "unsupported" in got:
            reason = got["unsupported"] if got else "not run (the device is not there)"
            results.append(
                Output(
                    case, "*", "missing", math.inf, math.inf, tol, f"upstream runs it, this build: {reason}"
                )
            )
            continue
        for output, encoded in sorted(want["outputs"].items()):
            mine = got["outputs"].get(output)
            if mine is None:
                results.append(
                    Output(case, output, "missing", math.inf, math.inf, tol, "no such output here")
                )
            else:
                results.append(compare_output(case, output, mine, encoded, tol))
    return results


def load(path: Path, what: str) -> dict[str, Any]:
    """A battery result; anything else is a usage error naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{what} {path}: not a parity battery result ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("cases"), dict):
        raise UsageError(
            f"{what} {path}: not a parity battery result of format {FORMAT} (valid: battery.py --out FILE)"
        )
    return data


def markdown(outputs: Sequence[Output], verified: Mapping[str, Any], reference: Mapping[str, Any]) -> str:
    """The per-operation table a person reads (summary of ``torchkiln verify --compare-with``)."""
    ok = all(o.ok for o in outputs)
    notice = release_notice(str(verified["torch"]["version"]), str(reference["torch"]["version"]))
    lines = [
        f"# Numerical parity: {'PASS' if ok else 'FAIL'}",
        "",
        *([f"**Another release**: {notice}.", ""] if notice else []),
        f"This build: torch {verified['torch']['version']} ({verified['torch']['location']}); upstream: "
        f"torch {reference['torch']['version']} ({reference['torch']['location']}); "
        f"{verified['torch']['threads']} thread, CPU capability {verified['torch']['cpu_capability']}.",
        "",
        "| Case | Output | Result | Max abs | Max rel | rtol | atol |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for o in outputs:
        tol = o.tolerance
        lines.append(
            f"| {o.case} | {o.output} | {o.status}{' (' + o.detail + ')' if o.detail else ''} | {o.max_abs:.3g} "
            f"| {o.max_rel:.3g} | {tol.rtol if tol else ''} | {tol.atol if tol else ''} |"
        )
    return "\n".join(lines) + "\n"
