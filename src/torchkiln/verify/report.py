"""The verification report: per-area counts, the environment, and a table a person reads first.

The suite's pytest plugin (``verify/conftest.py``) records one :class:`Outcome` per test and hands them
here; this module turns them into ``summary.json`` (machine readable) and ``summary.md`` and writes both
atomically (temp file + ``os.replace``), so a reader never sees half a report.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from torchkiln.files import atomic
from torchkiln.process.logs import first_error

from . import hang
from .facts import compiled_arch_list, decode_cudnn, parse_build_settings

# The areas of the suite; each is a pytest marker and every test carries exactly one.
AREAS: dict[str, str] = {
    "build_config": "Build config",
    "cuda_visibility": "CUDA visibility",
    "cudnn_determinism": "cuDNN / determinism",
    "amp": "AMP GradScaler",
    "ddp": "DDP launch",
    "reproducibility": "Reproducibility",
    "torchvision": "torchvision",
    "release": "Release checks",
    "parity": "Parity with upstream",
}
OUTCOMES = ("passed", "failed", "skipped", "error")
SCHEMA_VERSION = 2
# Why a check was skipped, read from its reason: it needs a GPU this machine lacks ("no_gpu"), it checks
# another kind of build than the one under test ("not_applicable"), or anything else ("other").
SKIP_KINDS = ("no_gpu", "not_applicable", "other")
# What each area proves on a CUDA build when no GPU is usable, and what only a GPU machine shows.
GPU_NOTES: dict[str, str] = {
    "build_config": "complete without a GPU: versions, cuDNN/NCCL libraries, arch list and flags are read "
    "from the build itself",
    "cuda_visibility": "needs a GPU machine to mean anything: device enumeration, CUDA_VISIBLE_DEVICES and "
    "a kernel launch on every device",
    "cudnn_determinism": "CPU determinism only; cuDNN convolutions and CUDA determinism alerts need a GPU",
    "amp": "the GradScaler state machine on CPU only; the CUDA scaler used in training needs a GPU",
    "ddp": "torchrun + gloo on CPU only; NCCL DDP needs GPUs",
    "reproducibility": "CPU RNG only; CUDA RNG streams need a GPU",
    "torchvision": "complete without a GPU but for its CUDA ops (nms on a device)",
    "release": "library resolution, oneDNN and torch.compile on the CPU run without a GPU; conv2d per dtype, "
    "each attention backend, the batched SVD and the MAGMA ops, torch.compile with triton and a CUDA extension "
    "built with nvcc need one",
    "parity": "the battery's CPU cases only; its CUDA cases (float32, float16, bfloat16 on the device) need a GPU",
}


# How a check's skip reason starts when what it checks is not in this build, this torch or this GPU (built
# without MAGMA, an op torch no longer routes through MAGMA, an attention backend the GPU's capability lacks):
# such a skip is no sign of CUDA being broken, so --require-cuda keeps it a skip (verify/conftest.py).
NOT_APPLICABLE = "not applicable: "


def not_applicable(reason: str) -> str:
    """A skip reason saying the check does not apply to this build, torch or GPU (:data:`NOT_APPLICABLE`)."""
    return NOT_APPLICABLE + reason


def skip_kind(message: str) -> str:
    """Classify a skip reason (see :data:`SKIP_KINDS`); the suite's own reasons start with these words."""
    if message.startswith(("checks a CPU-only build", NOT_APPLICABLE)) or (
        message.startswith("needs CUDA") and "built without CUDA" in message
    ):
        return "not_applicable"
    if message.startswith(("needs CUDA", "needs at least 2 visible CUDA devices")):
        return "no_gpu"
    return "other"


@dataclass(frozen=True)
class Outcome:
    """The result of one test. ``error``: setup or teardown failed; ``message``: failure or skip reason."""

    nodeid: str
    area: str
    outcome: str
    message: str = ""
    duration_s: float = 0.0


# torchrun's ChildFailedError report ends with the first failed worker: its exception's last line (under
# ``traceback :``) or, for a worker killed by a signal, the ``traceback : Signal 9 (SIGKILL) ...`` text.
# torch/distributed/elastic/multiprocessing/errors/__init__.py (ChildFailedError.format_msg) prints it.
ROOT_CAUSE = "Root Cause (first observed failure):"
CAUSE = "cause: "  # the generic marker: a message names its cause after it, to the end of its line
OUTPUT_MARK = (
    "--- output (tail) ---"  # torchkiln.process.runner.Completed.describe: a process's output follows
)
# Every way a failure message of the suite states its cause, each with what writes it: the text after the
# marker, to the end of its line (a final "." dropped), is the cause. A new message that names a cause
# names it after one of these (tests/test_verify_report_cause.py builds each writer's message and reads it).
CAUSE_MARKERS: tuple[tuple[str, str], ...] = (
    (hang.CAUSE_PREFIX, "torchkiln.verify.hang.report: a DDP launch that hung, and why (an unresolvable hostname, a missing interface, an unreachable loopback, a taken port, else the ranks' first error line)"),
    ("torch.cuda.init(): ", "verify/conftest.py: a required CUDA check that could not run, in torch's words"),
    ("raised: ", "buildconfig: a probe that raised (torch.backends.cudnn.version(), torch.cuda.nccl.version())"),
    (CAUSE, "torchkiln.verify.linkage (each entry that does not resolve and why: another version installed, none at all), torchkiln.verify.parity.failure (a reference of another release), torchkiln.verify.imported (a shadowed package)"),
)  # fmt: skip
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Failure)\b[^:\s]*: ?\S")


def _root_cause(lines: list[str]) -> str | None:
    block = lines[len(lines) - 1 - lines[::-1].index(ROOT_CAUSE) + 1 :]
    block = block[: next((i for i, line in enumerate(block) if line.startswith("====")), len(block))]
    raised = [line for line in block if _EXCEPTION_LINE.match(line)]
    if raised:
        return raised[-1]
    said = [line.partition(":")[2].strip() for line in block if line.startswith("traceback")]
    return said[0] if said and said[0] else None


def _marked(lines: list[str]) -> str | None:
    """The text after the first cause marker (:data:`CAUSE_MARKERS`) of the message, to its line's end."""
    for line in lines:
        found = [(line.index(m), m) for m, _ in CAUSE_MARKERS if m in line]
        if found:
            at, marker = min(found)
            text = line[at + len(marker) :].strip().removesuffix(".").strip()
            if text:
                return text
    return None


def cause_line(message: str) -> str | None:
    """The line of a failure message that says why it failed, wherever the message has one: torchrun's root
    cause (the failed worker's own exception, ``RuntimeError: ... Unable to find address for: nosuchif0``),
    the cause a marker of :data:`CAUSE_MARKERS` introduces (a hung launch's ``likely cause: this machine's
    hostname ... does not resolve``), else the first error line of a process's output it carries
    (:func:`torchkiln.process.logs.first_error`; a hung launch with no cause found: its last lines), else its
    first line: a message that is its own cause (a recipe mismatch names field, expected and actual). Every
    failure has one; None only for an empty message."""
    lines = [line.strip() for line in message.splitlines()]
    if ROOT_CAUSE in lines:
        found = _root_cause(lines)
        if found:
            return found
    marked = _marked(lines)
    if marked:
        return marked
    found = None
    if OUTPUT_MARK in lines:
        found = first_error(lines[lines.index(OUTPUT_MARK) + 1 :])
    elif lines and hang.NO_CAUSE in lines[0]:
        found = first_error(lines[1:])
    return found or next((line for line in lines if line), None)


def area_counts(outcomes: Iterable[Outcome]) -> dict[str, dict[str, int]]:
    keys = (*OUTCOMES, *(f"skipped_{k}" for k in SKIP_KINDS))
    counts = {area: dict.fromkeys(keys, 0) for area in AREAS}
    for o in outcomes:
        area = counts.setdefault(o.area, dict.fromkeys(keys, 0))
        area[o.outcome] += 1
        if o.outcome == "skipped":
            area[f"skipped_{skip_kind(o.message)}"] += 1
    return counts


def area_durations(outcomes: Iterable[Outcome]) -> dict[str, float]:
    """Seconds spent per area (setup + call + teardown of its tests), for the benchmark."""
    totals = dict.fromkeys(AREAS, 0.0)
    for o in outcomes:
        totals[o.area] = totals.get(o.area, 0.0) + o.duration_s
    return {area: round(seconds, 2) for area, seconds in totals.items()}


def summarize(
    outcomes: Iterable[Outcome],
    *,
    environment: Mapping[str, Any],
    exit_status: int,
    options: Mapping[str, Any],
    duration_s: float,
) -> dict[str, Any]:
    outcomes = list(outcomes)
    counts = area_counts(outcomes)
    totals = {k: sum(c[k] for c in counts.values()) for k in next(iter(counts.values()))}
    return {
        "schema": SCHEMA_VERSION,
        "ok": exit_status == 0 and totals["failed"] == 0 and totals["error"] == 0,
        "exit_status": exit_status,
        "duration_s": round(duration_s, 2),
        "options": dict(options),
        "totals": totals,
        "areas": counts,
        "area_durations_s": area_durations(outcomes),
        "checks": [
            {"nodeid": o.nodeid, "area": o.area, "outcome": o.outcome, "message": o.message} for o in outcomes
        ],
        "failures": [
            asdict(o) | {"cause": cause_line(o.message)} for o in outcomes if o.outcome in ("failed", "error")
        ],
        "skips": [asdict(o) | {"kind": skip_kind(o.message)} for o in outcomes if o.outcome == "skipped"],
        "environment": dict(environment),
    }


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _shortened(message: str, limit: int = 1000) -> str:
    """A failure's message in a table cell: a long one (a hung launch's last lines) cut, saying where it is
    whole; the cause beside it is never cut."""
    if len(message) <= limit:
        return _cell(message)
    return _cell(message[:limit]) + " … (cut: the whole message is in summary.json)"


def _code(text: str) -> str:
    """``text`` as a Markdown code span in a table cell: fenced with more backticks than it holds, so a
    backtick inside does not end it."""
    if not text:
        return ""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{_cell(text)}{pad}{fence}"


def render_markdown(summary: Mapping[str, Any]) -> str:
    env = summary["environment"]
    verdict = "PASS" if summary["ok"] else "FAIL"
    lines = [
        f"# torchkiln verify: {verdict}",
        "",
        f"torch {env.get('torch_version')} ({env.get('torch_git_version')}), CUDA {env.get('cuda_version')}, "
        f"cuDNN {env.get('cudnn_version')}, NCCL {env.get('nccl_version')}, devices: "
        f"{', '.join(env.get('devices') or []) or 'none'}; Python {env.get('python')} on {env.get('platform')}.",
        *_required_line(summary["options"]),
        *_compare_line(summary["options"]),
        "",
        "| Area | Passed | Failed | Errors | Skipped: no GPU | Skipped: not this kind of build "
        "| Skipped: other | Seconds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for area, c in summary["areas"].items():
        name = AREAS.get(area, area)
        seconds = summary.get("area_durations_s", {}).get(area, 0.0)
        lines.append(
            f"| {name} | {c['passed']} | {c['failed']} | {c['error']} | {c.get('skipped_no_gpu', 0)} "
            f"| {c.get('skipped_not_applicable', 0)} | {c.get('skipped_other', 0)} | {seconds:.1f} |"
        )
    t = summary["totals"]
    lines.append(
        f"| **Total** | {t['passed']} | {t['failed']} | {t['error']} | {t.get('skipped_no_gpu', 0)} "
        f"| {t.get('skipped_not_applicable', 0)} | {t.get('skipped_other', 0)} | {summary['duration_s']:.1f} |"
    )
    lines += _gpu_section(summary)
    lines += [
        "",
        f"Options: {_cell(json.dumps(summary['options'], sort_keys=True))}; "
        f"{summary['duration_s']} s; pytest exit status {summary['exit_status']}.",
    ]
    if summary["failures"]:
        lines += ["", "## Failures", "", "| Test | Area | Cause | Message |", "|---|---|---|---|"]
        for f in summary["failures"]:
            cause = f.get("cause") or cause_line(f["message"]) or ""
            lines.append(
                f"| {_code(f['nodeid'])} | {f['area']} | {_code(cause)} | {_shortened(f['message'])} |"
            )
    lines += _checks_section(summary)
    if summary["skips"]:
        lines += ["", "## Skipped", "", "| Test | Area | Kind | Reason |", "|---|---|---|---|"]
        for s in summary["skips"]:
            kind = s.get("kind") or skip_kind(s["message"])
            lines.append(f"| `{_cell(s['nodeid'])}` | {s['area']} | {kind} | {_cell(s['message'])[:200]} |")
    return "\n".join(lines) + "\n"


def _required_line(options: Mapping[str, Any]) -> list[str]:
    """Whether a CUDA check that could not run failed, and why (the suite decides: verify/conftest.py)."""
    if "require_cuda_reason" not in options:
        return []
    required = "yes" if options.get("require_cuda") else "no"
    return ["", f"CUDA required: {required} ({_cell(options['require_cuda_reason'])})."]


def _compare_line(options: Mapping[str, Any]) -> list[str]:
    """What --compare-with compared with, and, first of all, whether it is another release."""
    compared = options.get("compare_with")
    if not compared:
        return []
    if compared.get("notice"):
        return ["", f"**Compared with another release**: {_cell(compared['notice'])}."]
    return ["", f"Compared with torch {_cell(compared['reference_torch'])}: the same release."]


def _checks_section(summary: Mapping[str, Any]) -> list[str]:
    """The names of the checks per area: which ran, which were skipped for lack of a GPU."""
    ran: dict[str, list[str]] = {}
    no_gpu: dict[str, list[str]] = {}
    for entry in summary.get("checks", []):
        name = entry["nodeid"].split("::", 1)[-1]
        if entry["outcome"] == "skipped":
            if skip_kind(entry["message"]) == "no_gpu":
                no_gpu.setdefault(entry["area"], []).append(name)
        else:
            ran.setdefault(entry["area"], []).append(name)
    if not ran and not no_gpu:
        return []
    lines = ["", "## Checks per area", ""]
    for area in summary["areas"]:
        if area not in ran and area not in no_gpu:
            continue
        lines.append(
            f"- **{AREAS.get(area, area)}**: ran {len(ran.get(area, []))}: {_names(ran.get(area, []))}"
        )
        if area in no_gpu:
            lines.append(f"  - skipped, need a GPU machine ({len(no_gpu[area])}): {_names(no_gpu[area])}")
    return lines


def _names(names: list[str]) -> str:
    return ", ".join(f"`{_cell(n)}`" for n in names) or "none"


def _gpu_section(summary: Mapping[str, Any]) -> list[str]:
    """Per area: what ran here, what was skipped for lack of a GPU, and what needs a GPU machine."""
    env = summary["environment"]
    areas = summary["areas"]
    no_gpu = sum(c.get("skipped_no_gpu", 0) for c in areas.values())
    if env.get("devices") or not (no_gpu or env.get("cuda_version")):  # a GPU was usable: nothing to say here
        return []
    lines = [
        "",
        "## Without a GPU",
        "",
        f"torch is built with CUDA {env.get('cuda_version')}, but no CUDA device was usable here: "
        f"{no_gpu} checks were skipped for lack of a GPU and need a GPU machine "
        "(`torchkiln verify --require-cuda` there turns such a skip into a failure).",
        "",
        "| Area | Ran here (passed + failed) | Skipped: no GPU | What it means without a GPU |",
        "|---|---:|---:|---|",
    ]
    for area, c in areas.items():
        ran = c["passed"] + c["failed"] + c["error"]
        lines.append(
            f"| {AREAS.get(area, area)} | {ran} | {c.get('skipped_no_gpu', 0)} | {_cell(GPU_NOTES.get(area, ''))} |"
        )
    return lines


def write_summary(directory: Path, summary: Mapping[str, Any]) -> None:
    atomic.write_json(directory / "summary.json", summary)
    atomic.write_text(directory / "summary.md", render_markdown(summary))


def environment() -> dict[str, Any]:
    """What was verified: torch and its libraries, devices, Python and platform. Never raises."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
    }
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - the report must still say what went wrong
        env["torch_import_error"] = f"{type(exc).__name__}: {exc}"
        return env
    probes: dict[str, Any] = {
        "torch_version": lambda: str(torch.__version__),
        "torch_git_version": lambda: torch.version.git_version,
        "cuda_version": lambda: torch.version.cuda,
        "cuda_available": lambda: torch.cuda.is_available(),
        "cudnn_version": lambda: (
            ".".join(map(str, decode_cudnn(torch.backends.cudnn.version()) or ()))
            if torch.backends.cudnn.is_available()
            else None
        ),
        "nccl_version": lambda: (
            ".".join(str(p) for p in torch.cuda.nccl.version()[:3])
            if torch.distributed.is_available() and torch.distributed.is_nccl_available()
            else None
        ),
        # the build's record, not get_arch_list() (empty without a device through 2.12)
        "arch_list": lambda: list(
            compiled_arch_list(torch, parse_build_settings(torch.__config__.show()))[0]
        ),
        "devices": lambda: (
            [
                f"{torch.cuda.get_device_name(i)} (sm_{''.join(map(str, torch.cuda.get_device_capability(i)))})"
                for i in range(torch.cuda.device_count())
            ]
            if torch.cuda.is_available()
            else []
        ),
        "cuda_visible_devices": lambda: os.environ.get("CUDA_VISIBLE_DEVICES"),
        "num_threads": lambda: torch.get_num_threads(),
    }
    for key, probe in probes.items():
        try:
            env[key] = probe()
        except Exception as exc:  # noqa: BLE001
            env[key] = f"error: {type(exc).__name__}: {exc}"
    try:
        import torchvision

        env["torchvision_version"] = str(torchvision.__version__)
    except Exception:  # noqa: BLE001 - torchvision is optional
        env["torchvision_version"] = None
    return env
