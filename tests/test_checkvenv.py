"""The post-build check's venv from the build venv (issue 38 item 4): cloned, relocated, and pruned to what
torch and the checked wheels need at run time, the build's tools and the checked projects themselves removed.
A real venv (this Python's), real pip, tiny wheels standing in for torch, its requirements and the build tools
(installed offline, no pip configuration)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kit.dists import tiny_wheel

from torchkiln.build import checkvenv
from torchkiln.build.envstore import venv_distributions

OFFLINE = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1"}


def names(venv: Path) -> set[str]:
    """The distributions installed in ``venv`` (canonical names, pip's own included)."""
    return {entry.split("-")[0].lower().replace("_", "-") for entry in venv_distributions(venv)}


@pytest.fixture(scope="module")
def build_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A build venv: a stand-in torch with a requirement chain (one behind an extra, one behind a marker that
    is false here), the build's tools, and a distribution named like the checked project."""
    root = tmp_path_factory.mktemp("build")
    wheels = root / "wheels"
    wheels.mkdir()
    made = [
        tiny_wheel(
            wheels,
            "torch",
            "2.13.0",
            requires=("filelock", "sympy[extradep]", 'winonly ; sys_platform == "win32"'),
        ),  # fmt: skip
        tiny_wheel(wheels, "filelock", "3.0"),
        tiny_wheel(wheels, "sympy", "1.0", requires=("mpmath", 'extradep ; extra == "extradep"')),
        tiny_wheel(wheels, "mpmath", "1.0"),
        tiny_wheel(wheels, "extradep", "1.0"),
        tiny_wheel(wheels, "winonly", "1.0"),
        tiny_wheel(wheels, "ninja", "1.0"),  # a build tool
        tiny_wheel(wheels, "cmake", "1.0", requires=("ninja",)),  # a build tool needing another
        tiny_wheel(wheels, "numpy", "2.0"),  # a build tool the checked wheel needs at run time
        tiny_wheel(wheels, "kilnvision", "0.1"),  # the checked project, installed here already
    ]
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", *map(str, made)],
        check=True,
        env=OFFLINE,
    )
    return venv


def test_the_check_venv_is_the_build_venv_less_the_build_tools(build_venv: Path, tmp_path: Path) -> None:
    checked = tmp_path / "wheelhouse"
    checked.mkdir()
    tiny_wheel(checked, "kilnvision", "0.1", requires=("torch", "numpy"))
    target = tmp_path / "work" / "check-venv"
    argv = ["--from", str(build_venv), "--python", "python3", "--keep=torch", "--drop=kilnvision"]
    assert checkvenv.main([*argv, f"--requirements-of={checked}", "--", str(target)]) == 0
    kept = names(target)
    assert {"torch", "filelock", "sympy", "mpmath", "extradep", "numpy", "pip"} <= kept
    assert not kept & {"ninja", "cmake", "winonly", "kilnvision"}, kept
    assert names(build_venv) >= {"ninja", "cmake", "kilnvision"}, "the build venv is left as it was"
    # it is a working venv at its own path: its scripts and pyvenv.cfg name it, and pip installs into it
    python = target / "bin" / "python"
    prefix = subprocess.run([python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True)
    assert prefix.stdout.strip() == str(target)
    assert str(build_venv) not in (target / "bin" / "pip").read_text()
    wheel = next(checked.glob("*.whl"))
    subprocess.run([python, "-m", "pip", "install", "-q", str(wheel)], check=True, env=OFFLINE)
    assert "kilnvision" in names(target), "installed by the check, not taken as already there"


def test_without_a_build_venv_the_check_venv_is_made_afresh(tmp_path: Path) -> None:
    """A plan without the build venv's steps (a library caller's subset of one) still gets a check venv."""
    target = tmp_path / "check-venv"
    argv = [
        "--from",
        str(tmp_path / "no-venv"),
        "--python",
        sys.executable,
        "--keep=torch",
        "--",
        str(target),
    ]
    assert checkvenv.main(argv) == 0
    assert (target / "bin" / "python").exists() and names(target) <= {"pip", "setuptools"}


# Every shape of installed distribution the build's tools come in, each removed as pip's own uninstall removes
# it (pip is the oracle): a module, a package with a subpackage and data, a script (a wheel's .data/scripts,
# under bin/), a namespace directory shared with a kept distribution, a top-level .pth file.
SHAPES: dict[str, dict[str, object]] = {
    "amodule": {},
    "apackage": {
        "module": False,
        "files": {
            "apackage/__init__.py": "",
            "apackage/sub/__init__.py": "X = 1\n",
            "apackage/sub/table.bin": b"\0\1\2",
        },
    },
    "ascript": {"files": {"ascript-1.0.data/scripts/ascript-tool": "#!python\nprint('tool')\n"}},
    "nsgone": {"module": False, "files": {"sharedns/gone/__init__.py": ""}},
    "nskept": {"module": False, "files": {"sharedns/kept/__init__.py": ""}},
    "apth": {"files": {"apth.pth": "import os\n"}},
}


def tree_of(venv: Path) -> set[str]:
    return {str(p.relative_to(venv)) for p in venv.rglob("*")}


@pytest.mark.integration  # a venv and pip, twice
def test_pruning_removes_what_pip_uninstall_removes(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    made = [tiny_wheel(wheels, name, "1.0", **shape) for name, shape in SHAPES.items()]  # type: ignore[arg-type]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # not compiled by pip (whose RECORD would list the .pyc), but by imports: bytecode no RECORD names
    pip = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-compile", *map(str, made)]
    subprocess.run(pip, check=True, env=OFFLINE)
    imports = "import amodule, apackage.sub, ascript, sharedns.gone, sharedns.kept"
    writing = {k: v for k, v in OFFLINE.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([str(python), "-c", imports], check=True, env=writing)
    assert any(venv.rglob("apackage/sub/__pycache__/*.pyc"))
    gone = sorted(set(SHAPES) - {"nskept"})
    by_pip = tmp_path / "by-pip"
    subprocess.run(["cp", "-a", str(venv), str(by_pip)], check=True)
    prune = [str(python), str(Path(checkvenv.PRUNE)), "--keep=nskept"]
    done = subprocess.run(prune, capture_output=True, text=True, check=True, env=OFFLINE)
    removed = done.stdout.split("venvprune: removing ")[1].split()[0:]
    removed = [name.rstrip(",") for name in removed]
    assert set(removed) - {"setuptools"} == set(gone), done.stdout  # the venv's own setuptools goes too
    subprocess.run(  # the copy's own pip (its scripts name the original's path: run as a module)
        [str(by_pip / "bin" / "python"), "-m", "pip", "uninstall", "-y", "-q", *removed],
        check=True,
        env=OFFLINE,
    )
    assert tree_of(venv) == tree_of(by_pip)
    left = tree_of(venv)
    assert not [p for p in left if any(name in p for name in gone) and "sharedns" not in p], left
    assert any(p.endswith("sharedns/kept/__init__.py") for p in left), "the kept half of the namespace stays"
    assert names(venv) == names(by_pip) == {"nskept", "pip"}
