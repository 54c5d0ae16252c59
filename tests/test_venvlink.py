"""A venv restored from the environment store is linked to its entry (issue 47 item 1, build.envstore.link_venv).

What must hold: the restore makes as many directory entries whatever the number of files the venv holds (the
27,000 files of a torch venv took 0.4 to 1 s to hard-link one by one); the venv works at its own path; no build
step can change the entry through it (the sandbox mounts the store read-only), and a step that installs into
it first gets files of its own, so the entry stays what its key says. Real venvs, real pip, real bubblewrap.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from kit.dists import tiny_wheel
from kit.imagekit import need_sandbox
from rich.console import Console
from test_envstore import entries, make_venv, stand_in_plan, statuses

from torchkiln.build import venvcheck
from torchkiln.build.envstore import LINKED, EnvStore, linked_origin, venv_distributions
from torchkiln.build.loop import BuildOptions, BuildResult, run_build
from torchkiln.plan.model import Plan, Step
from torchkiln.plan.records import Records

SITE = "lib/python{}.{}/site-packages".format(*sys.version_info[:2])


def tree_entries(root: Path) -> int:
    """What a copy of ``root`` had to make: its directories, files and links, symlinks not followed."""
    return sum(len(dirs) + len(files) for _, dirs, files in os.walk(root))


@pytest.mark.parametrize("files", [10, 3000])
def test_a_restore_makes_the_same_entries_whatever_the_venv_holds(tmp_path: Path, files: int) -> None:
    venv = make_venv(tmp_path / "one" / "venv")
    package = venv / SITE / "bigpkg"
    package.mkdir()
    (package / "__init__.py").write_text("N = 1\n")
    for i in range(files):
        (package / f"data{i}.txt").write_text(f"{i}\n")
    store = EnvStore(tmp_path / "store")
    entry = store.keep("k", venv, {}, "build-env:deps", {})
    assert entry is not None
    target = tmp_path / "two" / "venv"
    restored = store.restore("k", target, {})
    assert restored is not None
    # the same count for 10 files as for 3,000: the package is one link
    assert tree_entries(target) == tree_entries(make_venv(tmp_path / "bare" / "venv")) + 2  # + bigpkg, LINKED
    assert os.readlink(target / SITE / "bigpkg") == str(entry / "venv" / SITE / "bigpkg")
    assert linked_origin(target) == (entry / "venv", str(venv))
    done = subprocess.run(
        [target / "bin" / "python", "-c", "import sys, bigpkg; print(sys.prefix, bigpkg.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == [str(target), str(target / SITE / "bigpkg" / "__init__.py")]
    assert not (target / LINKED).is_symlink() and (target / "pyvenv.cfg").read_text().count(str(venv)) == 0


def run(plan: Plan, *, isolation: bool = False) -> tuple[BuildResult, str]:
    out = io.StringIO()
    options = BuildOptions(console=Console(file=out, width=400), skip_postcheck=True, isolation=isolation)
    return run_build(plan, options), out.getvalue()


def wheels_with_a_package(root: Path) -> Path:
    wheels = root / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    files = {"tinydep/__init__.py": "X = 1\n", "tinydep/data.txt": "data\n"}
    tiny_wheel(wheels, "tinydep", "1.0", module=False, files=files)
    tiny_wheel(wheels, "six", "1.17.0")
    tiny_wheel(wheels, "torch", "2.13.0+cpu")
    return wheels


def linked_plan(
    root: Path, store: Path, wheels: Path, extra: tuple[str, ...], compile_code: str = ""
) -> Plan:
    """The real venv step (without ensurepip), a real pip install of tinydep (a package: a directory the
    restore links), an ``extra`` pip command on the venv, and a compile stand-in that runs ``compile_code``
    with the venv's python and copies a wheel."""
    plan = stand_in_plan(root, store)
    venv = plan.paths.venv
    python = str(venv / "bin" / "python")
    pip = (sys.executable, "-m", "pip", "--python", python)
    offline = ("--no-index", "--find-links", str(wheels))
    made = next(s for s in plan.steps if s.name == "build-env:venv")
    wheelhouse = plan.paths.wheelhouse / "torch"
    code = f"import shutil, sys\n{compile_code}\nshutil.copy(sys.argv[1], sys.argv[2])\n"
    steps = [
        replace(made, argv=(sys.executable, "-m", "venv", "--without-pip", "--", str(venv))),
        Step("build-env:deps", "env", "", (*pip, "install", *offline, "--", "tinydep"), venv=str(venv)),
        Step("build-env:extra", "env", "", (*pip, *extra), venv=str(venv)),
        Step(
            "torch:wheel",
            "compile",
            "torch",
            (
                python,
                "-c",
                code,
                str(wheels / "torch-2.13.0+cpu-py3-none-any.whl"),
                str(wheelhouse),
            ),
            wheels=str(wheelhouse),
        ),
        next(s for s in plan.steps if s.kind == "publish"),
    ]
    return replace(plan, steps=steps)


def entry_of(store: Path, step: str) -> Path:
    import json

    return next(e for e in entries(store) if json.loads((e / "meta.json").read_text())["step"] == step)


def test_a_step_that_installs_into_a_linked_venv_gets_files_of_its_own_first(tmp_path: Path) -> None:
    """Builder B is given the venv of build-env:deps linked to its entry; its build-env:extra, unlike A's,
    uninstalls tinydep (pip removes the package's files): it runs on files of B's own, and the entry keeps
    tinydep whole."""
    store, wheels = tmp_path / "store", wheels_with_a_package(tmp_path)
    offline = ("--no-index", "--find-links", str(wheels))
    run(linked_plan(tmp_path / "a", store, wheels, ("install", *offline, "--", "six")))
    deps = entry_of(store, "build-env:deps")
    plan = linked_plan(tmp_path / "b", store, wheels, ("uninstall", "--yes", "tinydep"))
    result, _ = run(plan)
    assert statuses(result)["build-env:deps"] == "reused" and "build-env:extra" in result.ran
    venv = plan.paths.venv
    assert "tinydep-1.0.dist-info" not in venv_distributions(venv) and linked_origin(venv) is None
    assert not any(p.is_symlink() for p in (venv / SITE).iterdir()), "files of its own"
    assert (deps / "venv" / SITE / "tinydep" / "data.txt").read_text() == "data\n", "the entry is whole"
    assert venvcheck.damage(deps / "venv", Records([tmp_path / "records"])) is None


def test_no_build_step_can_change_the_entry_a_venv_is_linked_to(tmp_path: Path) -> None:
    """In its sandbox a compile that tries to write into, and remove from, the linked package is refused
    (the store is mounted read-only); the entry is as it was kept."""
    need_sandbox()
    store, wheels = tmp_path / "store", wheels_with_a_package(tmp_path)
    offline = ("--no-index", "--find-links", str(wheels))
    extra = ("install", *offline, "--", "six")
    run(linked_plan(tmp_path / "a", store, wheels, extra), isolation=True)
    attempt = (
        f"import os\np = os.path.join(sys.prefix, {SITE!r}, 'tinydep')\n"
        "for act in (lambda: open(os.path.join(p, 'new.txt'), 'w'), lambda: os.unlink(os.path.join(p, 'data.txt'))):\n"
        "    try:\n        act(); print('changed')\n"
        "    except OSError as exc:\n        print('refused', exc.errno)\n"
    )
    plan = linked_plan(tmp_path / "b", store, wheels, extra, attempt)
    result, _ = run(plan, isolation=True)
    assert statuses(result)["build-env:extra"] == "reused" and linked_origin(plan.paths.venv) is not None
    log = next(s.log for s in result.steps if s.name == "torch:wheel")
    assert log is not None
    said = Path(log).read_text()
    assert said.rstrip().splitlines()[-2:] == ["refused 30", "refused 30"], said  # EROFS, both
    entry = entry_of(store, "build-env:extra") / "venv" / SITE / "tinydep"
    assert sorted(p.name for p in entry.iterdir()) == ["__init__.py", "__pycache__", "data.txt"]


def test_a_linked_venv_works_in_the_sandbox_of_a_build_without_the_store(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A work directory whose venv an earlier run linked, built again without an environment store (``--env-store
    off``, a library caller's plan): its sandbox still shows the entry, so the compile imports the linked
    package (test_build's SIGKILL rerun, in-process and so without a store, found this: `_distutils_hack` and
    `build` missing in the sandbox, every file present outside it)."""
    need_sandbox()
    # the store apart from the wheels: the compile names a wheel, and its sandbox shows the wheel's parent's parent
    store, wheels = tmp_path_factory.mktemp("apart") / "store", wheels_with_a_package(tmp_path)
    extra = ("install", "--no-index", "--find-links", str(wheels), "--", "six")
    run(linked_plan(tmp_path / "a", store, wheels, extra), isolation=True)
    plan = linked_plan(tmp_path / "b", store, wheels, extra)
    run(plan, isolation=True)
    assert linked_origin(plan.paths.venv) is not None
    code = "import tinydep\nprint('imported', tinydep.X)"  # a changed compile: it runs again, nothing else
    result, _ = run(
        replace(linked_plan(tmp_path / "b", store, wheels, extra, code), env_store=None), isolation=True
    )
    assert result.ran == ["torch:wheel"] and linked_origin(plan.paths.venv) is not None
    log = next(s.log for s in result.steps if s.name == "torch:wheel")
    assert log is not None and "imported 1" in Path(log).read_text()
