"""The check's pip started during the compile (issue 47, torchkiln.build.postcheck): ``--serve`` starts pip
with its modules imported, and the check has it install the built wheels only where a fresh ``python -m pip``
would do the same.

The class is "the venv changed under the pip that waited": each way it can change between the warm-up and the
install is a row below (a module the warm-up missed that is there now, at the top level or inside pip; a
warm-up import that raised; another interpreter's prefix; a distribution replaced or one with a ``.pth`` file
added since the server's listing), and each must give the install to a fresh pip. The venvs are real (``python
-m venv`` with its bundled pip), the wheels built by pip from a real project."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from torchkiln.build import postcheck

pytestmark = pytest.mark.integration  # fresh venvs with pip, a real wheel build, torch imported by the server

HERE = str(Path(postcheck.__file__).parent)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with pip (``ensurepip``'s), whose interpreter also imports this environment's torch (a ``.pth``
    naming its site-packages, appended after the venv's own)."""
    venv = tmp_path_factory.mktemp("pipvenv") / "check-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    import torch  # noqa: PLC0415 - where this environment's torch is

    (site(venv) / "outer.pth").write_text(str(Path(torch.__file__).parents[1]) + "\n")
    return venv


def build(root: Path, requires: list[str]) -> Path:
    """``tkdemo 1.0`` requiring ``requires``, built by pip from a setuptools project under ``root``."""
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "tkdemo"\nversion = "1.0"\ndependencies = {json.dumps(requires)}\n'
    )
    (root / "tkdemo").mkdir()
    (root / "tkdemo" / "__init__.py").write_text("VALUE = 1\n")
    out = root / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(root)],
        check=True,
    )  # fmt: skip
    (found,) = out.glob("tkdemo-1.0-*.whl")
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("tkdemo"), [])


def site(venv: Path) -> Path:
    (found,) = venv.glob("lib/python*/site-packages")
    return found


@pytest.fixture
def clean(venv: Path) -> Iterator[Path]:
    """The module's venv as it was made, again after each test (tkdemo and what a test added removed)."""
    before = set(site(venv).iterdir()) | set((site(venv) / "pip").iterdir())
    yield venv
    for path in (set(site(venv).iterdir()) | set((site(venv) / "pip").iterdir())) - before:
        subprocess.run(["rm", "-rf", str(path)], check=True)


# --- the pip that waited, alone: postcheck.warm_up then postcheck.run_pip ----------------------------------------

WAITER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import postcheck
del sys.path[0]
looked, whole = postcheck.warm_up(json.loads(sys.argv[2]))
print("ready", file=sys.stderr, flush=True)
sys.exit(postcheck.run_pip(looked, whole, sys.stdin.readline()))
"""


def _nothing(site: Path) -> None:
    pass


def _top_level_added(site: Path) -> None:
    (site / "tk_missed.py").write_text("")


def _pip_module_added(site: Path) -> None:
    (site / "pip" / "_tk_missed.py").write_text("")


def _package_added(site: Path) -> None:
    (site / "tk_missed").mkdir()
    (site / "tk_missed" / "__init__.py").write_text("")


# (what the warm-up imports, made before it starts, changed between the warm-up and the request, the request's
# prefix: None for the venv's own) -> whether pip runs the install
RULES: list[tuple[str, list[str], Callable[[Path], None], Callable[[Path], None], str | None, bool]] = [
    ("nothing changed", ["pip._internal.cli.main"], _nothing, _nothing, None, True),
    ("a module missed, still missing", ["pip._internal.cli.main", "tk_missed"], _nothing, _nothing, None, True),
    ("a module missed, there now", ["tk_missed"], _nothing, _top_level_added, None, False),
    ("a package missed, there now", ["tk_missed"], _nothing, _package_added, None, False),
    ("a pip module missed, there now", ["pip._tk_missed"], _nothing, _pip_module_added, None, False),
    ("a module missed, its parent there now", ["tk_missed.sub"], _nothing, _package_added, None, False),
    ("a warm-up import raised", ["tk_raises"], lambda s: (s / "tk_raises.py").write_text("raise RuntimeError"),
     _nothing, None, False),
    ("another interpreter's prefix", ["pip._internal.cli.main"], _nothing, _nothing, "/usr", False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("modules", "before", "between", "prefix", "runs"), [r[1:] for r in RULES], ids=[r[0] for r in RULES]
)
def test_the_pip_that_waited_installs_only_in_the_venv_it_warmed_up_in(
    clean: Path,
    wheel: Path,
    modules: list[str],
    before: Callable[[Path], None],
    between: Callable[[Path], None],
    prefix: str | None,
    runs: bool,
) -> None:
    before(site(clean))
    waiter = subprocess.Popen(
        [str(clean / "bin" / "python"), "-c", WAITER, HERE, json.dumps(modules)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
    )  # fmt: skip
    assert waiter.stderr is not None and waiter.stderr.readline() == "ready\n"
    between(site(clean))
    request = {"pip": ["install", *postcheck.PIP_QUIET, "--no-index", "--", str(wheel)], "prefix": prefix}
    if prefix is None:
        request["prefix"] = str(clean)
    out, err = waiter.communicate(json.dumps(request) + "\n", timeout=300)
    installed = (site(clean) / "tkdemo" / "__init__.py").is_file()
    if runs:
        assert (waiter.returncode, installed) == (0, True), out + err
    else:
        assert (waiter.returncode, out.strip(), installed) == (3, postcheck.PIP_UNUSED, False), out + err


def test_without_a_request_the_pip_that_waited_does_nothing(clean: Path) -> None:
    done = subprocess.run(
        [str(clean / "bin" / "python"), "-c", WAITER, HERE, '["pip._internal.cli.main"]'],
        input="", capture_output=True, text=True, check=False, cwd="/",
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (0, ""), done.stderr


# --- the check with the server: postcheck.py --serve, then postcheck.py ------------------------------------------


def _replace_pip_record(site: Path) -> None:  # a reinstall of the same version writes a new RECORD
    (record,) = site.glob("pip-*.dist-info/RECORD")
    text = record.read_text()
    record.unlink()
    record.write_text(text)


def _add_with_pth(site: Path) -> None:
    info = site / "tkpth-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tkpth\nVersion: 1.0\n")
    (info / "RECORD").write_text("tkpth.pth,,\ntkpth-1.0.dist-info/RECORD,,\n")
    (site / "tkpth.pth").write_text("")


def check(venv: Path, wheel: Path, change: Callable[[Path], None]) -> subprocess.CompletedProcess[str]:
    """``postcheck.py --serve`` started in ``venv``, ``change`` made once it waits, then the check of
    ``wheel`` (no index: nothing leaves this machine)."""
    python, script = str(venv / "bin" / "python"), postcheck.__file__
    env = {**os.environ, "PIP_NO_INDEX": "1"}  # the step's environment, the server's as the check's
    server = subprocess.Popen([python, script, "--serve", "--expect", "tkdemo==1.0"], cwd="/", env=env)
    for _ in range(3000):
        if (venv / postcheck.SOCKET).exists() or server.poll() is not None:
            break
        time.sleep(0.01)
    change(site(venv))
    done = subprocess.run(
        [python, script, "--expect", "tkdemo==1.0", "--wheelhouse", str(wheel.parent)],
        capture_output=True, text=True, check=False, cwd="/", timeout=600, env=env,
    )  # fmt: skip
    assert server.wait(timeout=60) == 0
    return done


@pytest.mark.parametrize(
    ("change", "early"),
    [(_nothing, True), (_replace_pip_record, False), (_add_with_pth, False)],
    ids=["nothing changed", "a distribution replaced", "a distribution with a .pth added"],
)
def test_the_check_installs_with_the_served_pip_only_in_the_venv_it_listed(
    clean: Path, wheel: Path, change: Callable[[Path], None], early: bool
) -> None:
    done = check(clean, wheel, change)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert (postcheck.PIP_EARLY in lines, postcheck.INSTALLED in lines) == (early, True), done.stdout
    assert (site(clean) / "tkdemo" / "__init__.py").is_file()
    assert json.loads(lines[-1])["torch_version"], "the facts of the torch the venv imports"


def test_a_failed_install_by_the_served_pip_is_no_verdict_a_fresh_pip_gives_it(
    clean: Path, tmp_path: Path
) -> None:
    """The served pip fails (a requirement no index gives): a fresh pip runs, and its failure is the check's."""
    done = check(clean, build(tmp_path, ["tk-not-on-any-index"]), _nothing)
    assert done.returncode == 1 and "installing" in done.stderr, done.stdout + done.stderr
    assert "tk-not-on-any-index" in done.stderr and postcheck.PIP_EARLY not in done.stdout
    assert not (site(clean) / "tkdemo").exists()
