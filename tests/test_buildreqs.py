"""Build requirements of both projects resolve in one go, with pip's own resolver in the build venv; a
conflict stops the build before compiling, naming each side and where it came from.

pip runs for real, offline: a local directory of tiny wheels is the only index (PIP_NO_INDEX,
PIP_FIND_LINKS), so what resolves and what conflicts is decided by pip, not by this test's network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from kit import realtrees
from kit.dists import tiny_wheel

from torchkiln.build.buildreqs import collect, read_constraints

pytestmark = pytest.mark.integration  # a venv and pip (about 10 s)


def make_tree(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(text)
    return root


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("index")
    for version in ("1.0", "2.0"):
        tiny_wheel(root, "kilnpkg", version)
    tiny_wheel(root, "kilndep", "1.0", requires=("kilnpkg<2",))
    return root


@pytest.fixture(scope="module")
def build_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env_dir = tmp_path_factory.mktemp("venv") / "venv"
    venv.create(env_dir, with_pip=True)
    return env_dir / "bin" / "python"


def buildreqs(python: Path, index: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index), "PIP_CONFIG_FILE": os.devnull}
    return subprocess.run(
        [sys.executable, "-m", "torchkiln.build.buildreqs", "--python", str(python), *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def installed(python: Path, name: str) -> str | None:
    probe = f"import importlib.metadata as m\ntry: print(m.version({name!r}))\nexcept m.PackageNotFoundError: pass"
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True).stdout
    return out.strip() or None


def test_collect_reads_requirement_files_pyproject_and_pkg_resources(tmp_path: Path) -> None:
    torch = make_tree(
        tmp_path / "pytorch",
        {
            "requirements-build.txt": "setuptools>=77.0.3\ncmake>=3.27\n# comment\nninja\n",
            "requirements.txt": "-r requirements-build.txt\nnumpy\n--extra-index-url https://example.invalid\n",
            "pyproject.toml": '[build-system]\nrequires = ["setuptools>=77.0.3", "wheel"]\n',
        },
    )
    vision = make_tree(
        tmp_path / "vision", {"setup.py": "import os\nfrom pkg_resources import parse_version\n"}
    )
    reqs = collect("torch", torch) + collect("torchvision", vision)
    text = {(str(r.requirement), r.origin) for r in reqs}
    assert ("setuptools>=77.0.3", "torch: requirements-build.txt") in text
    assert ("numpy", "torch: requirements.txt") in text
    assert ("wheel", "torch: pyproject.toml [build-system].requires") in text
    assert ("setuptools<81", "torchvision: setup.py imports pkg_resources") in text


def test_conflict_names_both_sides_and_installs_nothing(
    index: Path, build_venv: Path, tmp_path: Path
) -> None:
    torch = make_tree(tmp_path / "pytorch", {"requirements-build.txt": "kilnpkg>=2\n"})
    vision = make_tree(tmp_path / "vision", {"requirements.txt": "kilnpkg<2\nkilndep\n"})
    done = buildreqs(build_venv, index, "--source", f"torch={torch}", "--source", f"torchvision={vision}")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "build requirements conflict (nothing was compiled)" in done.stderr
    assert "kilnpkg>=2  <- torch: requirements-build.txt" in done.stderr
    assert "kilnpkg<2  <- torchvision: requirements.txt" in done.stderr
    assert "pip says:" in done.stderr and "Traceback" not in done.stderr
    assert installed(build_venv, "kilnpkg") is None and installed(build_venv, "kilndep") is None


def test_compatible_ranges_resolve_and_install_exactly_what_pip_resolved(
    index: Path, build_venv: Path, tmp_path: Path
) -> None:
    """A range that a bound-probing heuristic could not judge (kilndep pins kilnpkg below 2 only through
    its own metadata) is pip's to resolve: 1.0 it is, and exactly that is installed."""
    src = make_tree(tmp_path / "src", {"requirements-build.txt": "kilnpkg!=1.5\nkilndep\n"})
    done = buildreqs(build_venv, index, "--source", f"torch={src}")
    assert done.returncode == 0, done.stderr
    assert "resolved kilnpkg==1.0" in done.stdout and "resolved kilndep==1.0" in done.stdout
    assert installed(build_venv, "kilnpkg") == "1.0" and installed(build_venv, "kilndep") == "1.0"


def test_bad_arguments_are_usage_errors(tmp_path: Path, index: Path) -> None:
    done = buildreqs(tmp_path / "python", index, "--source", "torch")
    assert done.returncode == 2 and "expected PROJECT=DIR" in done.stderr
    src = make_tree(tmp_path / "src", {"requirements.txt": "kilnpkg\n"})
    done = buildreqs(tmp_path / "no-python", index, "--source", f"torch={src}")
    assert done.returncode == 1 and "no-python not found" in done.stderr and "Traceback" not in done.stderr


def test_the_resolution_holds_for_every_later_pip_call(index: Path, tmp_path: Path) -> None:
    """Issue 11: deps resolved kilnpkg 1.0 (an older project's pin, like setuptools<81); a later install of
    something that would upgrade it (kilnup needs kilnpkg>=1, like torch's setuptools>=77.0.3 pulling 84)
    keeps 1.0 when it runs with the constraints file, as the plan's later pip steps do."""
    tiny_wheel(index, "kilnup", "1.0", requires=("kilnpkg>=1",))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    src = make_tree(tmp_path / "src", {"requirements.txt": "kilnpkg<2\n"})
    constraints = tmp_path / "work" / "constraints.txt"
    done = buildreqs(python, index, "--source", f"torch={src}", "--constraints", str(constraints))
    assert done.returncode == 0, done.stderr
    assert read_constraints(constraints) == ["kilnpkg==1.0"]
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index), "PIP_CONFIG_FILE": os.devnull}
    pip = [str(python), "-m", "pip", "install", "--quiet", "--upgrade", "--upgrade-strategy", "eager"]
    subprocess.run([*pip, "--constraint", str(constraints), "kilnup"], env=env, check=True)
    assert installed(python, "kilnpkg") == "1.0" and installed(python, "kilnup") == "1.0"
    # Without the constraints the same install undoes the resolution: what the file prevents.
    subprocess.run([*pip, "kilnup"], env=env, check=True)
    assert installed(python, "kilnpkg") == "2.0"


def test_a_derived_constraint_is_written_and_holds_when_the_venv_already_satisfies_it(
    vision_0_21_tree: Path, tmp_path: Path
) -> None:
    """Issue 20 item 5, with real pip, upstream's real setuptools wheels and torchvision 0.21.0's real setup.py
    (it imports pkg_resources: ``setuptools<81``). The venv already holds a setuptools that satisfies the
    bound (65.5.0, what Python 3.11's venv bundles), so a dry run that looks at the venv reports nothing to
    install; the constraint must still be written, and a later install that wants ``setuptools>=77.0.3``
    (torch 2.13.0's requirement, from its METADATA) must stay below 81 instead of taking 84."""
    index = tmp_path / "index"
    index.mkdir()
    for version in ("65.5.0", "80.9.0", "84.0.0"):
        shutil.copy(realtrees.pypi_wheel(f"setuptools=={version}"), index)
    shutil.copy(realtrees.pypi_wheel("wheel==0.45.1"), index)  # torchvision's [build-system].requires
    tiny_wheel(index, "kilntorch", "2.13.0", requires=("setuptools>=77.0.3",))
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index), "PIP_CONFIG_FILE": os.devnull}
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "setuptools==65.5.0"], env=env, check=True)
    assert ("setuptools<81", "torchvision: setup.py imports pkg_resources") in {
        (str(r.requirement), r.origin) for r in collect("torchvision", vision_0_21_tree)
    }
    constraints = tmp_path / "work" / "constraints.txt"
    done = buildreqs(
        python, index, "--source", f"torchvision={vision_0_21_tree}", "--constraints", str(constraints)
    )
    assert done.returncode == 0, done.stderr
    pins = read_constraints(constraints)
    assert "setuptools<81" in pins and "setuptools==80.9.0" in pins, constraints.read_text()
    assert "setuptools<81  # torchvision: setup.py imports pkg_resources" in constraints.read_text()
    assert installed(python, "setuptools") == "80.9.0"  # what was resolved is what is installed
    # install-torch's pip call, held to the constraints: torch's setuptools>=77.0.3 is met below 81.
    subprocess.run([*pip, "--constraint", str(constraints), "kilntorch"], env=env, check=True)
    assert installed(python, "setuptools") == "80.9.0" and installed(python, "kilntorch") == "2.13.0"
    # The derived range alone (no pin) holds too: a fresh venv at 65.5.0 gets 80.9.0, not 84.0.0.
    only_range = tmp_path / "range.txt"
    only_range.write_text("setuptools<81\n")
    other = tmp_path / "venv2"
    venv.create(other, with_pip=True)
    pip2 = [str(other / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip2, "setuptools==65.5.0"], env=env, check=True)
    subprocess.run([*pip2, "--constraint", str(only_range), "kilntorch"], env=env, check=True)
    assert installed(other / "bin" / "python", "setuptools") == "80.9.0"
    # Without any constraint, the same install takes 84.0.0: what the file prevents.
    subprocess.run([*pip2, "--force-reinstall", "--no-deps", "setuptools==65.5.0"], env=env, check=True)
    subprocess.run([*pip2, "--upgrade", "kilntorch"], env=env, check=True)
    assert installed(other / "bin" / "python", "setuptools") == "84.0.0"
