"""``--torch`` without asking the index on every run (issue 38 item 6), and every ``--torch`` form a message
suggests accepted by the check that suggests it.

pip's real dry run against an index that is a directory of wheels (``PIP_FIND_LINKS``, no index, no pip
configuration): counted by wrapping :func:`torchkiln.plan.given_torch.ask_pip` (which still runs)."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit import ROOT
from kit.dists import tiny_wheel

from torchkiln.errors import UsageError
from torchkiln.plan import given_torch, preflight
from torchkiln.plan.given_torch import resolve_given_torch
from torchkiln.plan.jobs import GIB, Resources
from torchkiln.plan.make import make_plan
from torchkiln.plan.records import Records
from torchkiln.recipe.loader import load_recipe
from torchkiln.recipe.model import Recipe

CPU = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"
CU130 = ROOT / "recipes" / "torch-2.13-cu130-py312.toml"
BIG = Resources(cpus=8, memory_bytes=64 * GIB)


def torch_wheel(directory: Path, version: str, cuda: str | None) -> Path:
    """A torch wheel as pip and torchkiln read one: METADATA, and ``torch/version.py`` saying its CUDA."""
    return tiny_wheel(directory, "torch", version, files={"torch/version.py": f"cuda = {cuda!r}\n"})


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip's only source of wheels: a directory (no index, no configuration file)."""
    found = tmp_path / "index"
    found.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_FIND_LINKS", str(found))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    return found


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    calls: list[str] = []
    real = given_torch.ask_pip

    def counting(text: str, python: str, find_links=()):  # noqa: ANN001, ANN202 - ask_pip's own
        calls.append(text)
        return real(text, python, find_links)

    monkeypatch.setattr(given_torch, "ask_pip", counting)
    yield calls


def resolve(text: str, recipe: Recipe, records: Records, links: tuple[Path, ...] = ()) -> str:
    return resolve_given_torch(text, recipe, "torchvision", links, records).note


def test_the_same_requirement_is_not_asked_again_while_nothing_it_depends_on_changed(
    tmp_path: Path, index: Path, asked: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu = load_recipe(CPU)
    wheel = torch_wheel(index, "2.13.0+cpu", None)
    records = Records.for_build(tmp_path / "work", tmp_path / "store")
    links = (tmp_path / "work" / "wheelhouse" / "torch", tmp_path / "dist")
    first = resolve("torch==2.13.0+cpu", cpu, records, links)
    assert asked == ["torch==2.13.0+cpu"] and "pip chose torch 2.13.0+cpu" in first
    assert resolve("torch==2.13.0+cpu", cpu, records, links) == first and len(asked) == 1
    # a fresh work directory of the same machine: the environment store's record
    other = Records.for_build(tmp_path / "work-2", tmp_path / "store")
    elsewhere = (tmp_path / "work-2" / "wheelhouse" / "torch", tmp_path / "dist-2")  # empty, other paths
    assert resolve("torch==2.13.0+cpu", cpu, other, elsewhere) == first and len(asked) == 1
    # each thing the answer depends on, changed: asked again (then kept again)
    changes = [
        ("another requirement", lambda: "torch===2.13.0+cpu"),
        ("pip's index configuration", lambda: monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///nowhere")),
        ("a pip configuration file", lambda: monkeypatch.setenv("PIP_CONFIG_FILE", str(config(tmp_path)))),
        ("a torch wheel in install-torch's find-links", lambda: torch_wheel(links[1], "2.13.0+cpu", None)),
        ("the wheel pip chose replaced", lambda: replaced(wheel)),
    ]
    text = "torch==2.13.0+cpu"
    for what, change in changes:
        links[1].mkdir(parents=True, exist_ok=True)
        before = len(asked)
        changed = change()
        text = changed if isinstance(changed, str) else text
        resolve(text, cpu, records, links)
        assert len(asked) == before + 1, what
        resolve(text, cpu, records, links)
        assert len(asked) == before + 1, f"{what}: the new answer is kept"
    # the wheel pip chose is gone: asked again (pip now says there is none)
    for found in (index, links[1]):
        for path in found.glob("torch-*.whl"):
            path.unlink()
    with pytest.raises(UsageError, match="pip cannot install it"):
        resolve(text, cpu, records, links)


def config(tmp_path: Path) -> Path:
    path = tmp_path / "pip.conf"
    path.write_text("[global]\ntimeout = 60\n")
    return path


def replaced(wheel: Path) -> None:
    """The same file name with new bytes (a wheel rebuilt, or swapped on a mirror)."""
    fresh = wheel.with_name(wheel.name + ".new")
    fresh.write_bytes(wheel.read_bytes() + b"\0")
    os.replace(fresh, wheel)


def test_a_wheel_file_is_hashed_and_read_once_while_it_is_the_same_file(tmp_path: Path) -> None:
    cpu = load_recipe(CPU)
    wheel = torch_wheel(tmp_path, "2.13.0+cpu", None)
    records = Records.for_build(tmp_path / "work", None)
    first = resolve(str(wheel), cpu, records)
    assert resolve(str(wheel), cpu, records) == first
    replaced(wheel)
    again = resolve(str(wheel), cpu, records)
    sha = re.search(r"sha256 ([0-9a-f]{64})", again)
    assert again != first and sha is not None, "a new file at the same path is read afresh"
    # a CUDA wheel at the same path is refused, whatever was kept for the CPU one before
    with pytest.raises(UsageError, match="a cu130 build of torch for a cpu recipe"):
        (tmp_path / "cuda").mkdir()
        fresh = torch_wheel(tmp_path / "cuda", "2.13.0+cpu", "13.0")
        os.replace(fresh, wheel)
        resolve(str(wheel), cpu, records)


# ------------------------------------------------------------------------------------------------------
# Every --torch form a message suggests is accepted by the check that suggested it.
# ------------------------------------------------------------------------------------------------------


def suggested_forms(message: str) -> list[str]:
    """The ``--torch`` values a message suggests: ``--torch X`` and the requirements it names (not the value
    it quotes back, the one refused)."""
    said = re.sub(r"'[^']*'", "", message)
    forms = re.findall(r"--torch ([A-Za-z/][^\s'\"]*?)[,;)]?(?:\s|$)", said)
    forms += re.findall(r"\b(torch===?[0-9][^\s,;)]*)", said)
    return sorted(set(forms))


def accepted(form: str, recipe: Recipe, tmp_path: Path, wheels: dict[str, Path]) -> None:
    """``--torch FORM`` (WHEEL: the wheel that suits the recipe) passes resolution and preflight's check
    of the torch torchvision builds against."""
    text = str(wheels["suits"]) if form == "WHEEL" else form
    given = resolve_given_torch(text, recipe, "torchvision")
    plan = make_plan(
        recipe, workdir=tmp_path / "w", dist=tmp_path / "d", only="torchvision", resources=BIG, torch=given
    )
    assert "torch-wheel" not in {f.check for f in preflight.preflight(plan, {"PATH": ""})}, form


@pytest.mark.parametrize("recipe_path", [CPU, CU130], ids=["cpu", "cu130"])
def test_every_form_a_message_suggests_is_accepted(tmp_path: Path, index: Path, recipe_path: Path) -> None:
    recipe = dataclasses.replace(load_recipe(recipe_path), python="3.11")  # the wheels' Python here
    label = "cpu" if recipe.accelerator.cuda is None else "cu130"
    other = "cu130" if label == "cpu" else "cpu"
    wheels = {
        "suits": torch_wheel(index, f"2.13.0+{label}", None if label == "cpu" else "13.0"),
        "other": torch_wheel(index, f"2.13.0+{other}", None if other == "cpu" else "13.0"),
    }
    messages = []
    # preflight: --only torchvision without --torch and without the recipe's own torch build
    plan = make_plan(recipe, workdir=tmp_path / "w", dist=tmp_path / "d", only="torchvision", resources=BIG)
    [finding] = [f for f in preflight.preflight(plan, {"PATH": ""}) if f.check == "torch-wheel"]
    messages.append(finding.fix)
    # the given torch's own checks: a build for the other accelerator, as a wheel and as a requirement
    for text in (str(wheels["other"]), f"torch==2.13.0+{other}"):
        with pytest.raises(UsageError) as info:
            resolve_given_torch(text, recipe, "torchvision")
        messages.append(str(info.value))
    forms = {form for message in messages for form in suggested_forms(message)}
    assert forms >= {"WHEEL", f"torch===2.13.0+{label}"}, messages
    for form in forms:
        accepted(form, recipe, tmp_path, wheels)


def test_the_recipes_own_version_given_as_torch_is_what_was_given(tmp_path: Path, index: Path) -> None:
    """Issue 38: with a recipe whose torch is ``2.13.0+cpu``, ``--torch torch==2.13.0+cpu`` (what the
    message suggested) was taken for the recipe's own torch build and refused by preflight for want of it in
    dist/. It is what the user gave: checked as given (pip's answer), then built against."""
    recipe = load_recipe(ROOT / "tests" / "data" / "ext-cpu-test.toml")
    assert recipe.torch_wheel_version == "2.13.0+cpu"
    wheels = {"suits": torch_wheel(index, "2.13.0+cpu", None)}
    for form in ("torch==2.13.0+cpu", "torch===2.13.0+cpu", "WHEEL"):
        accepted(form, recipe, tmp_path, wheels)
