"""The step loop and the step kinds, on plans of small real commands (no compiler, no network).

The commands are Python one-liners standing in for git, pip and ``python -m build``; what is tested is what the
builder does around them by each step's kind and declared data: skipping unchanged steps, running again what
vanished, requiring wheels, publishing, and what the lock file and manifest then say.
"""

from __future__ import annotations

import io
import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from kit import ROOT
from kit.dists import tiny_wheel
from kit.imagekit import need_torch
from rich.console import Console
from test_verify_lib import describing_recipe

from torchkiln.artifacts.manifest import load_manifest
from torchkiln.build.loop import BuildFailed, BuildOptions, BuildResult, run_build
from torchkiln.cache import resolve_cache
from torchkiln.files.digests import tree_sha256
from torchkiln.plan.make import FACTS, make_plan
from torchkiln.plan.model import Plan, Step
from torchkiln.recipe.loader import load_recipe

RECIPE = ROOT / "tests" / "data" / "ext-cpu-test.toml"


def py(code: str, *args: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code, *args)


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "setup.py").write_text("# stands in for torch\n")
    wheels = tmp_path / "made"
    wheels.mkdir()
    wheel = tiny_wheel(wheels, "torch", "2.13.0+cpu")
    return {"root": tmp_path, "src": src, "wheel": wheel}


def plan_of(world: dict[str, Path], *, compile_writes_wheel: bool = True, fail: bool = False) -> Plan:
    """The test recipe's plan for a provided torch tree, its steps replaced by small commands of each kind."""
    plan = make_plan(
        load_recipe(RECIPE),
        workdir=world["root"] / "work",
        dist=world["root"] / "dist",
        source_dirs={"torch": world["src"]},
        only="torch",
        cache=resolve_cache(None, kind="none"),
        jobs=1,
    )
    marker = world["root"] / "work" / "venv-made"
    wheelhouse = plan.paths.wheelhouse / "torch"
    copy = "import shutil, sys; shutil.copy(sys.argv[1], sys.argv[2])" if compile_writes_wheel else "pass"
    steps = [
        Step(
            "env:venv",
            "env",
            "",
            py("import sys; open(sys.argv[1], 'w').write('x')", str(marker)),
            creates=str(marker),
        ),
        Step(
            "torch:wheel",
            "compile",
            "torch",
            py(
                copy + ("; raise SystemExit('error: the compile broke')" if fail else ""),
                str(world["wheel"]),
                str(wheelhouse),
            ),
            {"MAX_JOBS": "1"},
            wheels=str(wheelhouse),
        ),
        Step("checks:import", "checks", "", py("print('{}')"), facts=True),
        next(s for s in plan.steps if s.kind == "publish"),
    ]
    return replace(plan, steps=steps)


def build(plan: Plan, **options: object) -> tuple[BuildResult, str]:
    out = io.StringIO()
    result = run_build(
        plan, BuildOptions(console=Console(file=out, width=200), skip_postcheck=True, **options)
    )  # type: ignore[arg-type]
    return result, out.getvalue()


def test_kinds_run_skip_and_publish(world: dict[str, Path]) -> None:
    first, _ = build(plan_of(world))
    assert first.ran == ["env:venv", "torch:wheel", "publish"], "checks skipped: --skip-postcheck"
    assert [p.name for p in first.wheels] == [world["wheel"].name]
    assert (first.manifest.parent / world["wheel"].name).read_bytes() == world["wheel"].read_bytes()
    manifest = load_manifest(first.manifest)
    assert [w.version for w in manifest.wheels] == ["2.13.0+cpu"]
    assert manifest.sources["torch"].commit is None
    assert manifest.sources["torch"].tree_sha256 == tree_sha256(world["src"]), (
        "no commit: the tree's contents"
    )
    assert manifest.cache is None and manifest.checks.skipped
    # the C++ compiler the build would invoke is recorded; a host without one records none
    cxx_recorded = "g++" in manifest.toolchain.tools or "clang++" in manifest.toolchain.tools
    assert cxx_recorded == (shutil.which("c++") is not None), manifest.toolchain.tools

    again, out = build(plan_of(world))
    assert again.ran == [] and "unchanged, skipped" in out

    (world["root"] / "work" / "venv-made").unlink()  # what the env step leaves vanished: it runs again
    third, _ = build(plan_of(world))
    assert third.ran == ["env:venv"], "the compile's inputs did not change"

    (world["src"] / "setup.py").write_text("# changed\n")
    fourth, _ = build(plan_of(world))
    assert fourth.ran == ["torch:wheel"], "a changed tree recompiles; the same wheel needs no publishing"
    assert load_manifest(fourth.manifest).sources["torch"].tree_sha256 == tree_sha256(world["src"])


def test_a_compile_must_leave_a_wheel(world: dict[str, Path]) -> None:
    with pytest.raises(BuildFailed, match=r"torch:wheel finished but wrote no wheel into .*wheelhouse/torch"):
        build(plan_of(world, compile_writes_wheel=False))
    assert not (world["root"] / "dist").exists()


def test_a_failing_step_names_its_first_error_and_log(world: dict[str, Path]) -> None:
    with pytest.raises(BuildFailed) as info:
        build(plan_of(world, fail=True))
    message = str(info.value)
    assert message.startswith("torch:wheel failed (exit 1)")
    assert "first error: error: the compile broke" in message
    assert (
        f"full log: {(world['root'] / 'work' / 'logs' / 'latest').resolve() / 'torch-wheel.log'}" in message
    )
    state = json.loads((world["root"] / "work" / "state.json").read_text())
    assert "torch:wheel" not in state["steps"] and "env:venv" in state["steps"], (
        "only what succeeded is recorded"
    )


def test_a_plan_without_its_publish_step_publishes_nothing(world: dict[str, Path]) -> None:
    plan = plan_of(world)
    with pytest.raises(Exception, match="the plan has no publish step"):
        build(replace(plan, steps=plan.steps[:1]))


def test_an_identical_rebuilt_wheel_leaves_the_checks_alone(world: dict[str, Path]) -> None:
    """The check venv and the import check are keyed by the wheels' content, not by the compile having run."""
    plan = plan_of(world)
    check = Step("checks:venv", "checks", "", py("pass"))
    plan = replace(plan, steps=[*plan.steps[:2], check, plan.steps[-1]])

    def run() -> BuildResult:
        return run_build(plan, BuildOptions(console=Console(file=io.StringIO(), width=200)))

    assert run().ran == ["env:venv", "torch:wheel", "checks:venv", "publish"]
    (world["src"] / "setup.py").write_text("# stands in for torch\n")  # same bytes, new mtime: recompiles
    assert run().ran == ["torch:wheel"], "the same wheel: nothing after the compile runs again"
    world["wheel"].write_bytes(world["wheel"].read_bytes() + b"\0")  # the compile now makes another wheel
    (world["src"] / "setup.py").write_text("# stands in for torch\n")
    assert run().ran == ["torch:wheel", "checks:venv", "publish"]


def test_each_pythons_post_build_check_is_in_the_manifest(world: dict[str, Path]) -> None:
    """A build for several Pythons (python.versions) checks each Python's wheels: the first Python's verdict is
    the manifest's ``checks`` (as in a one-Python build), each later one's is under ``python_checks``. Both
    check steps run the script the real post-build check runs, with the one interpreter that has torch here:
    the later step is labelled as a later Python of this interpreter's version (its own step and record)."""
    plan = plan_of(world)
    facts = (sys.executable, str(FACTS))
    later = f"{sys.version_info.major}.{sys.version_info.minor}"
    first, publish = plan.steps[2], plan.steps[3]
    steps = [
        *plan.steps[:2],
        replace(first, argv=facts),
        replace(first, name=f"checks:import@{later}", argv=facts, python=later),
        publish,
    ]
    out = io.StringIO()
    described = replace(
        plan, recipe=describing_recipe(), steps=steps
    )  # the recipe of the torch installed here
    result = run_build(described, BuildOptions(console=Console(file=out, width=200)))
    manifest = load_manifest(result.manifest)
    assert not manifest.checks.skipped and manifest.checks.results["torch.torch_version"].status == "pass"
    assert list(manifest.python_checks) == [later], manifest.python_checks
    assert manifest.python_checks[later].results == manifest.checks.results
    assert manifest.python_checks[later].torch == manifest.checks.torch


def test_an_unchecked_wheels_portability_is_read_once_and_recorded(
    world: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--skip-postcheck: the publish step reads the wheel beside the build venv (here: none) for its record, warns
    about what the post-build check would have refused, and a run that changed nothing reads nothing again
    (the record is kept in the work directory by what it depends on)."""
    torch = need_torch()

    from torchkiln.artifacts import abi

    shm = Path(torch.__file__).parent / "lib" / "libshm.so"  # a real ELF: it needs torch's other libraries
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}-cp{sys.version_info.major}{sys.version_info.minor}-linux_x86_64"
    world["wheel"].unlink()
    world["wheel"] = tiny_wheel(
        world["wheel"].parent, "torch", "2.13.0+cpu", files={"torch/lib/libshm.so": shm.read_bytes()}, tag=tag
    )
    read: list[str] = []
    real = abi.analyse_wheel
    monkeypatch.setattr(
        abi, "analyse_wheel", lambda wheel, *a, **k: read.append(wheel.name) or real(wheel, *a, **k)
    )
    first, out = build(plan_of(world))
    manifest = load_manifest(first.manifest)
    record = manifest.wheels[0].portability
    assert record is not None and record.analysed.startswith("the wheel unpacked beside the build venv")
    kinds = {n.needed: n.kind for n in record.needs}
    assert (
        kinds["libc10.so"] == kinds["libtorch_cpu.so"] == "unresolved" and kinds["libstdc++.so.6"] == "policy"
    )
    assert record.policy is None and "torch/lib/libshm.so needs libc10.so" in record.unresolved
    assert any(
        w.startswith("--skip-postcheck: the post-build check would have refused it: ")
        for w in manifest.warnings
    )
    again, _ = build(plan_of(world))
    assert again.ran == [] and read == [world["wheel"].name], "read once: nothing it depends on changed"
    assert load_manifest(again.manifest).wheels[0].portability == record
