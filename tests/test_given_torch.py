"""``--torch WHEEL|REQ`` with ``--only torchvision`` (issue 11): torchvision built against a torch the user
already has, checked to pair, used by the install step and the post-build check, recorded in the manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dists import tiny_wheel

from torchkiln.cli import main
from torchkiln.errors import UsageError
from torchkiln.files.digests import file_sha256
from torchkiln.plan.given_torch import resolve_given_torch
from torchkiln.plan.jobs import GIB, Resources
from torchkiln.plan.make import make_plan
from torchkiln.recipe.loader import load_recipe

ROOT = Path(__file__).resolve().parent.parent
CPU = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"
CU130 = ROOT / "recipes" / "torch-2.13-cu130-py312.toml"
BIG = Resources(cpus=8, memory_bytes=64 * GIB)


def test_a_wheel_is_installed_paired_and_recorded(tmp_path: Path) -> None:
    wheel = tiny_wheel(tmp_path, "torch", "2.13.0")
    recipe = load_recipe(CPU)
    given = resolve_given_torch(str(wheel), recipe, "torchvision")
    plan = make_plan(recipe, workdir=tmp_path / "w", only="torchvision", resources=BIG, torch=given)
    steps = {s.name: s for s in plan.steps}
    assert steps["torchvision:install-torch"].argv[-1] == str(wheel)
    assert plan.env_for("torchvision")["PYTORCH_VERSION"] == "2.13.0"  # the wheel's torch requirement
    check = steps["checks:import"].argv
    assert check[check.index("--with") + 1] == str(wheel)
    assert any(file_sha256(wheel) in note for note in plan.notes)


def test_a_pinned_requirement_is_taken_from_the_index(tmp_path: Path) -> None:
    given = resolve_given_torch("torch==2.13.0", load_recipe(CPU), "torchvision")
    assert given.install == "torch==2.13.0" and str(given.version) == "2.13.0"


@pytest.mark.parametrize(
    ("text", "only", "words"),
    [
        ("torch==2.12.0", "torchvision", "does not pair with the recipe's torchvision 0.28.0"),
        ("torch>=2.13", "torchvision", "pinned to one version"),
        ("numpy==2.0", "torchvision", "pinned to one version"),
        ("torch==2.13.0+cu130", "torchvision", "a cu130 build of torch for a cpu recipe"),
        ("torch==2.13.0", None, "only with --only torchvision"),
        ("/nonexistent/torch-2.13.0-cp311-cp311-linux_x86_64.whl", "torchvision", "no such file"),
        ("/x/notorch-1.0-py3-none-any.whl", "torchvision", "not a torch wheel"),
    ],
)
def test_unusable_torch_is_refused(text: str, only: str | None, words: str) -> None:
    with pytest.raises(UsageError, match="--torch") as info:
        resolve_given_torch(text, load_recipe(CPU), only)
    assert words in str(info.value)


def test_upstreams_unlabelled_cuda_wheel_pairs_with_a_cuda_recipe() -> None:
    assert str(resolve_given_torch("torch==2.13.0", load_recipe(CU130), "torchvision").version) == "2.13.0"


def test_cli_plan_shows_the_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wheel = tiny_wheel(tmp_path, "torch", "2.13.0")
    args = [
        "plan",
        str(CPU),
        "--only",
        "torchvision",
        "--torch",
        str(wheel),
        "--workdir",
        str(tmp_path / "w"),
    ]
    assert main([*args, "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert notes and notes[0].startswith("--torch: torchvision built against torch 2.13.0")
    assert main(["plan", str(CPU), "--torch", str(wheel)]) == 2
    assert "only with --only torchvision" in capsys.readouterr().err
