"""``torchkiln verify`` runs the real suite against the installed torch (the 2.13.0 CPU wheel) and must be
able to fail: a recipe that asks for CUDA 13.0, or for another torch version, fails naming the mismatch;
``--require-cuda`` turns skipped CUDA checks into failures; reports are complete and atomic."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from kit import ROOT, realtrees

# Each test runs the real verification suite in a fresh interpreter (5 to 15 s each): the integration part.
pytestmark = pytest.mark.integration

CU130 = ROOT / "recipes" / "torch-2.13-cu130-py312.toml"
CPU = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"
TIMEOUT = 240


def verify(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchkiln", "verify", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=env,
        cwd=cwd or ROOT,
        check=False,
    )


def cpu_recipe(tmp_path: Path, old: bytes, new: bytes, name: str = "variant.toml") -> Path:
    """The shipped CPU recipe made to describe the installed CPU wheel (+cpu, built with GCC 13), with one
    more change."""
    data = CPU.read_bytes().replace(b'local_version = "+cpu.kiln1"', b'local_version = "+cpu"\ngcc = 13')
    assert old in data
    path = tmp_path / name
    path.write_bytes(data.replace(old, new))
    return path


def test_cuda_recipe_against_cpu_torch_fails_naming_mismatches(tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = verify("--area", "build_config", "--recipe", str(CU130), "--report", str(out))
    text = result.stdout + result.stderr
    assert result.returncode == 1, text
    assert (
        "USE_CUDA (CUDA compiled in): expected USE_CUDA=ON (recipe asks for CUDA 13.0), actual USE_CUDA=0"
        in text
    )
    assert "CUDA version (torch.version.cuda): expected 13.0, actual None" in text
    assert "cuDNN compile version (torch._C._cudnn.getCompileVersion()): expected 9.20.0, actual None" in text
    assert "NCCL version (torch.cuda.nccl.version()): expected 2.29.7, actual None" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] is False and summary["exit_status"] == 1
    failed = {f["nodeid"].split("[")[-1].rstrip("]") for f in summary["failures"]}
    assert {"use_cuda", "cuda_version", "cudnn", "nccl", "magma", "arch_list", "local_label"} <= failed
    assert summary["areas"]["build_config"]["failed"] == len(failed)
    assert summary["options"]["recipe"] == str(CU130)
    md = (out / "summary.md").read_text()
    assert md.startswith("# torchkiln verify: FAIL") and "expected USE_CUDA=ON" in md


def test_wrong_torch_version_fails(tmp_path: Path) -> None:
    recipe = cpu_recipe(
        tmp_path, b'ref = "v2.13.0"\nversion = "2.13.0"', b'ref = "v2.13.1"\nversion = "2.13.1"'
    )
    result = verify("--area", "build_config", "--recipe", str(recipe), "--", "-q")
    text = result.stdout + result.stderr
    assert result.returncode == 1, text
    assert "torch version (torch.__version__ without local label): expected 2.13.1, actual 2.13.0" in text


def test_matching_recipe_passes_with_report(tmp_path: Path) -> None:
    recipe = cpu_recipe(tmp_path, b'name = "torch-2.13-cpu-py311"', b'name = "cpu-wheel"')
    out = tmp_path / "report"
    result = verify("--area", "build_config", "--recipe", str(recipe), "--report", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] is True and summary["areas"]["build_config"]["failed"] == 0
    # every recipe comparison ran (the CPU recipe pins USE_MKLDNN, which Build settings report)
    assert not [s for s in summary["skips"] if "test_build_matches_recipe" in s["nodeid"]]
    assert summary["environment"]["torch_version"].startswith("2.13.0")
    suite = ET.parse(out / "junit.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    total = sum(summary["areas"]["build_config"][k] for k in ("passed", "failed", "skipped", "error"))
    assert int(suite.get("tests")) == total and int(suite.get("failures")) == 0
    assert sorted(p.name for p in out.iterdir()) == ["junit.xml", "summary.json", "summary.md"]


def test_require_cuda_turns_cuda_skips_into_failures(tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = verify("--area", "amp", "--require-cuda", "--report", str(out), "--", "-k", "state_machine")
    text = result.stdout + result.stderr
    assert result.returncode == 1, text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["areas"]["amp"]["passed"] == 1 and summary["areas"]["amp"]["failed"] == 1
    (failure,) = summary["failures"]
    assert failure["nodeid"].endswith("test_state_machine[cuda]")
    assert (
        "CUDA is required (--require-cuda was given): this CUDA check could not run: needs CUDA"
        in (failure["message"])
    )
    # A failure in pytest's own summary and in junit.xml as well, not an error (issue 11).
    assert "1 failed" in text and "error" not in text.split("short test summary")[-1], text
    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    assert suite is not None and (suite.get("failures"), suite.get("errors")) == ("1", "0")
    without = verify("--area", "amp", "--", "-q", "-k", "state_machine")
    assert without.returncode == 0, without.stdout + without.stderr


def test_invalid_recipe_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[recipe]\nname = "x"\n[accelerator]\nkind = "tpu"\n')
    out = tmp_path / "report"
    result = verify("--recipe", str(bad), "--report", str(out))
    assert result.returncode == 2
    assert "accelerator.kind" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists(), "nothing runs (and no report is written) for an invalid recipe"


def test_report_path_that_is_a_file_is_a_usage_error(tmp_path: Path) -> None:
    file = tmp_path / "report"
    file.write_text("")
    result = verify("--report", str(file))
    assert result.returncode == 2 and "exists and is not a directory" in result.stderr


def test_suite_dir_from_environment(tmp_path: Path) -> None:
    env = {**os.environ, "TORCHKILN_VERIFY_DIR": str(tmp_path)}
    result = verify("--area", "amp", env=env)
    assert (
        result.returncode == 2
        and "TORCHKILN_VERIFY_DIR" in result.stderr
        and "no conftest.py" in result.stderr
    )


def test_plain_pytest_rejects_an_invalid_recipe(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("not toml [")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", str(ROOT / "verify"), "--recipe", str(bad)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 4, result.stdout + result.stderr
    assert "invalid TOML" in result.stderr


@pytest.mark.parametrize(
    "module",
    [
        "torchkiln.verify.buildconfig",
        "torchkiln.verify.report",
        "torchkiln.verify.proc",
        "torchkiln.verify.provenance",
        "torchkiln.verify.attestation",
        "torchkiln.verify.gpuhost",
        "torchkiln.verify.hang",
    ],
)
def test_suite_support_does_not_import_build_machinery(module: str) -> None:
    """The runtime image has torchkiln's pure-Python core only: no rich, no build/cache/image modules."""
    code = (
        f"import sys, {module}; heavy = sorted(m for m in sys.modules if m == 'rich' or m.startswith"
        "(('torchkiln.build.loop', 'torchkiln.cache', 'torchkiln.images.spec', 'torchkiln.source.git', 'torch.'))"
        " or m == 'torch'); print(heavy)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


def _fake_torchvision(root: Path, init: str) -> dict[str, str]:
    """A stand-in torchvision package on PYTHONPATH (no torchvision wheel exists for this machine's torch)."""
    package = root / "torchvision"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(init)
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
    }


def test_torchvision_that_fails_to_import_is_a_failure(tmp_path: Path) -> None:
    """What a torchvision built against another torch does (reproduced with the PyPI cu130 wheel on the CPU
    torch): its import raises while registering its ops. That must fail the area, not skip it."""
    env = _fake_torchvision(tmp_path, 'raise RuntimeError("operator torchvision::nms does not exist")\n')
    result = verify("--area", "torchvision", "--", "-q", env=env)
    text = result.stdout + result.stderr
    assert result.returncode == 1, text
    assert "import torchvision failed: RuntimeError: operator torchvision::nms does not exist" in text


def test_torchvision_of_another_release_is_named(tmp_path: Path) -> None:
    env = _fake_torchvision(tmp_path, '__version__ = "0.27.1"\n')
    result = verify("--area", "torchvision", "--", "-q", "-k", "version_pairs", env=env)
    text = result.stdout + result.stderr
    assert result.returncode == 1, text
    assert "torchvision 0.27.1 does not pair with torch 2.13.0+cpu: expected torchvision 0.28.x" in text


def test_empty_selection_is_a_usage_error() -> None:
    result = verify("--area", "amp", "--", "-q", "-k", "no_such_check_anywhere")
    assert result.returncode == 2, result.stdout + result.stderr


@pytest.fixture(scope="module")
def torch_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of the installed torch (upstream's 2.13.0+cpu), as a build would have left it in dist/."""
    import torch

    return realtrees.pypi_wheel_in(tmp_path_factory.mktemp("dist"), f"torch==={torch.__version__}")


def _manifest_of(wheel: Path, commit: str | None, path: Path) -> Path:
    from kit.dists import manifest_of, source_lock

    from torchkiln.artifacts.manifest import WheelRecord, write_manifest

    write_manifest(
        path, manifest_of([WheelRecord.of(wheel, "torch")], {"torch": source_lock("torch", commit)})
    )
    return path


def test_manifest_of_the_installed_wheel_passes_and_another_commit_fails(
    torch_wheel: Path, tmp_path: Path
) -> None:
    """``--manifest`` checks the installed torch's version, commit and files against what a build recorded:
    here the manifest a build of upstream's wheel would write (its commit is torch.version.git_version)."""
    import torch

    good = _manifest_of(torch_wheel, torch.version.git_version, tmp_path / "good.json")
    out = tmp_path / "report"
    result = verify(
        "--area", "build_config", "--manifest", str(good), "--report", str(out), "--", "-k", "manifest"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((out / "summary.json").read_text())
    outcomes = {c["nodeid"].split("[")[-1].rstrip("]"): c["outcome"] for c in summary["checks"]}
    assert outcomes["files-torch"] == outcomes["version-torch"] == outcomes["commit-torch"] == "passed"
    assert summary["options"]["manifest"] == str(good)

    moved = _manifest_of(torch_wheel, "f" * 40, tmp_path / "moved.json")
    result = verify("--area", "build_config", "--manifest", str(moved), "--", "-k", "manifest")
    text = result.stdout + result.stderr
    assert result.returncode == 1, text
    assert (
        f"manifest wheels[torch]: git_version {torch.version.git_version}, the manifest's source commit is {'f' * 40}"
        in text
    )


def test_the_suite_controls_its_environment(tmp_path: Path) -> None:
    """Issue 14 item 12: a caller's TORCH_DISTRIBUTED_DEBUG (garbage, or DETAIL, which crashes gloo's DDP
    workers) reaches neither pytest nor the helpers; the report is written and announced only when it exists."""
    out = tmp_path / "report"
    env = {**os.environ, "TORCH_DISTRIBUTED_DEBUG": "garbage", "RANK": "7"}
    result = verify("--area", "build_config", "--report", str(out), env=env)
    text = result.stdout + result.stderr
    assert result.returncode == 0, text
    assert f"report in {out.resolve()}/summary.md" in text and (out / "summary.md").is_file()


def test_no_report_is_announced_when_none_was_written(tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = verify("--report", str(out), "--", "--collect-only", "-k", "no-such-test-anywhere")
    text = result.stdout + result.stderr
    assert result.returncode == 2, text
    if not (out / "summary.md").is_file():
        assert "no report was written" in text and "report in" not in text, text


def test_missing_torchvision_that_the_recipe_builds_is_a_failure_not_an_error(tmp_path: Path) -> None:
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here")
    out = tmp_path / "report"
    result = verify("--area", "torchvision", "--recipe", str(CPU), "--report", str(out))
    text = result.stdout + result.stderr
    assert result.returncode == 1, text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["areas"]["torchvision"]["failed"] >= 1 and summary["areas"]["torchvision"]["error"] == 0
    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("errors") == "0", text


def test_a_ddp_launch_that_fails_names_the_workers_cause_in_the_summary(tmp_path: Path) -> None:
    """Issue 27 item 3: real torch (CPU) and real torchrun, gloo told to use an interface this host lacks.
    pytest's message starts with ``torch.distributed.run ... exited 1`` and the tail of torchrun's output;
    the summary row names the failed worker's own cause line, as torchrun's root-cause block gives it."""
    report = tmp_path / "report"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "nosuchif0"}
    done = verify(
        "--area", "ddp", "--report", str(report), "--", "-k", "test_standalone_params_identical_across_ranks",
        env=env,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    summary = json.loads((report / "summary.json").read_text())
    [failure] = summary["failures"]
    assert failure["message"].startswith("AssertionError: ") and "torch.distributed.run" in failure["message"]
    assert failure["cause"].startswith("RuntimeError: [enforce fail at ")
    assert failure["cause"].endswith("Unable to find address for: nosuchif0")
    row = next(
        line for line in (report / "summary.md").read_text().splitlines() if "| `test_ddp.py::" in line
    )
    assert "| `RuntimeError: [enforce fail at " in row and "Unable to find address for: nosuchif0` | " in row
