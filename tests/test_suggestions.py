"""A fix names everything it fixes (issue 46): for each kind of message that suggests one, the suggestion is
applied as it is printed (parsed from the message, written where it says), the same check runs again, and
the problem is gone. A suggestion that named only the first undeclared library, or dropped the recipe's own
entries, fails here on the second run.

The kinds (their real-fault counterparts elsewhere): the post-build check's refusal (build.portable.judge;
tests/test_build.py runs it on a real wheel), the ``--skip-postcheck`` warning (build.portable.attach, here on
a real build with torch's libshm.so), verify's linkage failure (tests/test_verify_imported.py: the complete
``system_libraries`` line and the ``pip install`` of every wrong version), a recipe key under another table,
and ``--torch`` with a wheel for a build of several Pythons.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kit import ROOT
from kit.dists import tiny_wheel
from kit.imagekit import examples, need_torch

from torchkiln.artifacts import jsonfile
from torchkiln.artifacts.manifest import load_manifest
from torchkiln.artifacts.portability import Need, Portability, summarise
from torchkiln.build import portable
from torchkiln.build.context import BuildRecord
from torchkiln.errors import BuildFailed, RecipeError, UsageError
from torchkiln.plan.given_torch import resolve_given_torch
from torchkiln.plan.model import Step
from torchkiln.recipe.loader import load_recipe

CPU = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"
LINE = re.compile(r"\[deploy\] system_libraries = (\[[^\]\n]*\])")


def applied(text: str, message: str) -> str:
    """The recipe ``text`` with the ``[deploy] system_libraries = [...]`` line of ``message`` applied as it
    reads: the key under its table, replacing the recipe's list."""
    (value,) = LINE.findall(message)
    without = re.sub(r"(?m)^\[deploy\]\n(system_libraries = .*\n)?", "", text)
    return without.rstrip("\n") + f"\n\n[deploy]\nsystem_libraries = {value}\n"


def with_libraries(text: str, names: list[str]) -> str:
    if not names:
        return text
    return (
        text.rstrip("\n") + "\n\n[deploy]\nsystem_libraries = [" + ", ".join(f'"{n}"' for n in names) + "]\n"
    )


SONAMES = st.builds(
    lambda stem, major: f"lib{stem}.so.{major}",
    st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=6),
    st.integers(0, 30),
)


def judged(recipe_text: str, tmp_path: Path, records: dict[str, Portability]) -> str | None:
    """build.portable.judge on ``records`` under the recipe ``recipe_text``: the refusal's message, or None."""
    path = tmp_path / "r.toml"
    path.write_text(recipe_text)
    recipe = load_recipe(path)
    setup = SimpleNamespace(plan=SimpleNamespace(recipe=recipe))  # judge reads only the plan's recipe
    step = Step("checks:import", "checks", "", ("true",))
    outputs = {"portability": {name: jsonfile.to_data(r) for name, r in records.items()}}
    try:
        portable.judge(setup, BuildRecord(), step, outputs, "check.log")  # type: ignore[arg-type]
    except BuildFailed as exc:
        return str(exc)
    return None


@settings(deadline=None, max_examples=examples(25))
@given(
    st.lists(st.lists(SONAMES, min_size=1, max_size=4, unique=True), min_size=1, max_size=3),
    st.lists(SONAMES, max_size=3, unique=True),
)
@example([["libpng16.so.16", "libjpeg.so.62"]], [])  # the issue's: the first only, then a one-entry list
@example([["libpng16.so.16"], ["libjpeg.so.62"]], ["libz.so.1"])  # two wheels, the recipe's own entry
def test_the_post_build_checks_fix_ends_the_refusal_at_once(
    tmp_path_factory: pytest.TempPathFactory, wheels: list[list[str]], listed: list[str]
) -> None:
    tmp_path = tmp_path_factory.mktemp("judge")
    records = {
        f"w{i}-1.0-py3-none-any.whl": summarise(
            Portability("test", needs=[Need(f"w{i}/_C.so", n, "unresolved", "not anywhere") for n in needs])
        )
        for i, needs in enumerate(wheels)
    }
    text = with_libraries(CPU.read_text(), listed)
    message = judged(text, tmp_path, records)
    missing = {n for needs in wheels for n in needs} - set(listed)
    if not missing:
        assert message is None
        return
    assert message is not None and message.count("[deploy] system_libraries = [") == 1, message
    again = applied(text, message)
    assert judged(again, tmp_path, records) is None, again
    # nothing the recipe listed is dropped, nothing is listed twice
    names = load_recipe_text(again, tmp_path).deploy.system_libraries
    assert set(listed) <= set(names) and len(names) == len(set(names))


def load_recipe_text(text: str, tmp_path: Path):  # noqa: ANN201 - a Recipe
    path = tmp_path / "again.toml"
    path.write_text(text)
    return load_recipe(path)


@pytest.mark.integration
def test_the_skip_postcheck_warning_prints_whole_and_its_fix_ends_it(tmp_path: Path) -> None:
    """The issue's first example, for real: --skip-postcheck, a torch wheel whose libshm.so needs torch's other
    libraries (not in the wheel). The warning as printed (the build's display) holds ``[deploy]`` and the
    complete list; the recipe with that line builds again without the warning."""
    torch = need_torch()
    from test_steps import build, plan_of

    src, made = tmp_path / "src", tmp_path / "made"
    src.mkdir()
    made.mkdir()
    (src / "setup.py").write_text("# stands in for torch\n")
    shm = Path(torch.__file__).parent / "lib" / "libshm.so"
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    wheel = tiny_wheel(
        made, "torch", "2.13.0+cpu", files={"torch/lib/libshm.so": shm.read_bytes()},
        tag=f"{py}-{py}-linux_x86_64",
    )  # fmt: skip
    world = {"root": tmp_path, "src": src, "wheel": wheel}
    plan = plan_of(world)
    first, shown = build(plan)
    warnings = [w for w in load_manifest(first.manifest).warnings if w.startswith("--skip-postcheck")]
    assert len(warnings) == 1, warnings
    needed = sorted(set(re.findall(r"needs (lib[\w.+-]+\.so[\d.]*)", warnings[0])))
    assert {"libc10.so", "libtorch_cpu.so"} <= set(needed), warnings[0]
    assert (
        f"[deploy] system_libraries = [{', '.join(f'{chr(34)}{n}{chr(34)}' for n in needed)}]" in warnings[0]
    )
    assert warnings[0] in " ".join(shown.split("\n")) or all(
        part in shown for part in warnings[0].split("; ")
    )
    assert "[deploy] system_libraries = [" in shown, "the table's name printed, not eaten as markup"
    recipe = load_recipe_text(applied(plan.recipe.path.read_text(), warnings[0]), tmp_path)
    again, _ = build(dataclasses.replace(plan, recipe=recipe))
    assert not [w for w in load_manifest(again.manifest).warnings if w.startswith("--skip-postcheck")]


def test_a_key_under_the_wrong_table_names_its_table(tmp_path: Path) -> None:
    """What the issue's user did with the eaten warning: ``system_libraries`` under ``[cache]``. The message
    names the table it belongs to; moved there, the recipe loads with it."""
    text = CPU.read_text().replace("[cache]\n", '[cache]\nsystem_libraries = ["libpng16.so.16"]\n', 1)
    path = tmp_path / "r.toml"
    path.write_text(text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    (line,) = str(info.value).splitlines()
    assert line.startswith(
        f"{path}: cache.system_libraries: unknown key here; it is a key of [deploy] (valid: "
    )
    table = re.search(r"it is a key of \[(\w+)\]", line).group(1)  # type: ignore[union-attr]
    moved = text.replace('system_libraries = ["libpng16.so.16"]\n', "", 1)
    path.write_text(moved.rstrip("\n") + f'\n\n[{table}]\nsystem_libraries = ["libpng16.so.16"]\n')
    assert load_recipe(path).deploy.system_libraries == ("libpng16.so.16",)


def test_a_wheel_for_one_of_several_pythons_suggests_what_serves_them_all(tmp_path: Path) -> None:
    """One wheel file serves one CPython: for python.versions 3.12 and 3.13, downloading the other Python's
    wheel would refuse the first again; the suggestion is the requirement, which pip resolves per Python."""
    wheel = tiny_wheel(tmp_path, "torch", "2.13.0+cpu", tag="cp312-cp312-manylinux_2_28_x86_64")
    recipe = dataclasses.replace(load_recipe(CPU), python="3.12", pythons=("3.12", "3.13"))
    with pytest.raises(UsageError) as info:
        resolve_given_torch(str(wheel), recipe, "torchvision")
    message = str(info.value)
    assert "--torch 'torch==2.13.0+cpu' (pip takes each Python's wheel" in message, message
    assert "--python-version 3.13" not in message
