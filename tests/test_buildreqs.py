"""Build requirements of both projects resolve in one go; a conflict stops the build before compiling."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

from torchkiln.buildreqs import collect, conflicts, main


def make_tree(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(text)
    return root


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
    assert conflicts(reqs) == []


def test_conflict_names_both_sides_and_installs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch = make_tree(tmp_path / "pytorch", {"requirements-build.txt": "setuptools>=82\n"})
    vision = make_tree(tmp_path / "vision", {"setup.py": "import pkg_resources\n"})
    # --python points nowhere: reaching pip would fail differently; the conflict must stop us first.
    rc = main(
        [
            "--python",
            str(tmp_path / "no-python"),
            "--source",
            f"torch={torch}",
            "--source",
            f"torchvision={vision}",
        ]
    )
    assert rc == 1
    err = capsys.readouterr().err
    assert "build requirements conflict (nothing was compiled)" in err
    assert "setuptools" in err
    assert "torch: requirements-build.txt" in err and "torchvision: setup.py imports pkg_resources" in err


def test_compatible_ranges_do_not_conflict() -> None:
    from packaging.requirements import Requirement

    from torchkiln.buildreqs import Req

    reqs = [
        Req(Requirement("setuptools>=77.0.3"), "a"),
        Req(Requirement("setuptools<81"), "b"),
        Req(Requirement("numpy>=2,<3"), "c"),
        Req(Requirement("numpy!=2.1.0"), "d"),
    ]
    assert conflicts(reqs) == []
    assert conflicts([Req(Requirement("numpy<2"), "a"), Req(Requirement("numpy>=2.0"), "b")])


def test_bad_source_argument_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--python", sys.executable, "--source", "torch"]) == 2
    assert "expected PROJECT=DIR" in capsys.readouterr().err


def test_installs_into_the_given_venv(tmp_path: Path) -> None:
    """Real pip, real venv, offline index: the requirement lands in the build venv, not in ours."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    src = make_tree(tmp_path / "src", {"requirements-build.txt": "six\n"})
    result = subprocess.run(
        [sys.executable, "-m", "torchkiln.buildreqs", "--python", str(python), "--source", f"torch={src}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    check = subprocess.run(
        [str(python), "-c", "import six; print(six.__name__)"], capture_output=True, text=True, check=False
    )
    assert check.stdout.strip() == "six"
