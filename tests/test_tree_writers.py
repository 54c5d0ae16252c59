"""Issue 45 item 1, the writer-by-target table: nothing a build step runs changes a tracked input unnoticed.

Real builds of the plan's own steps (fetch, the build venv's steps, the compile's ``python -m build``,
torch:repair, checks:venv, publish; not checks:import: the stand-in is not torch), real git, real bubblewrap,
real CMake, Ninja and cc. The tree (tests/data/tree_writers/project, committed here with a real submodule,
third_party/dep) is built the way torch builds: setup.py runs CMake with a C compiler the tree names; its build
dependency (tests/data/tree_writers/dependency, a wheel) brings a setuptools entry point and a .pth file. The
writers (tests/data/tree_writers/README.md): the tree's setup.py, the dependency's
``setuptools.finalize_distribution_options`` entry point (the issue's example), CMake's ``file(WRITE)``, the
tree's compiler, and a post-build hook (the .pth, in the check venv's Pythons). The targets: a tracked file,
a submodule's tracked file, git's own ``.git/config``, a declared output (``build/``).

Each writer on a tracked file or a submodule's: the build fails right after the writer's step, naming the step
and the path, nothing is published, no output record holds the path, and the next build (no writer) refuses
the checkout naming it: no manifest, lock file or provenance ever says the changed tree was clean. On
``.git/config``: in the sandbox the write fails (the tree's ``.git`` is bound read-only), and the step with it,
its log naming the path; without a sandbox it lands and the build fails right after the step naming it. Every
writer on a declared output, in one build: the build succeeds, its outputs recorded, the lock clean.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from kit import ROOT
from kit.dists import tiny_wheel
from kit.imagekit import need, need_sandbox
from rich.console import Console
from test_build_fetch import ENV, fetch_recipe_text

from torchkiln.build.loop import BuildOptions, BuildResult, run_build
from torchkiln.cache import resolve_cache
from torchkiln.errors import BuildFailed
from torchkiln.plan.make import make_plan
from torchkiln.recipe.loader import parse_recipe

pytestmark = pytest.mark.integration

DATA = ROOT / "tests" / "data" / "tree_writers"
# each writer, and the step it writes in
WRITERS = {
    "setup.py": "torch:wheel",
    "entry-point": "torch:wheel",
    "cmake": "torch:wheel",
    "compiler": "torch:wheel",
    "post-build": "checks:venv",
}
DECLARED = "build/kiln-written/"  # under the compile's in-tree build/: each writer writes <writer>.out in it


@dataclass(frozen=True)
class Target:
    name: str
    path: str  # from the top of the tree


TARGETS = (
    Target("a tracked file", "kiln_writers/__init__.py"),
    Target("a submodule's tracked file", "third_party/dep/dep.txt"),
    Target("git's own config", ".git/config"),
)


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=ENV)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The stand-in committed at tag v1, with third_party/dep a real submodule."""
    for tool in ("git", "cc", "python3.11"):
        need(tool)
    root = tmp_path_factory.mktemp("writers-upstream")
    dep = root / "dep"
    dep.mkdir()
    git(dep, "init", "-q")
    (dep / "dep.txt").write_text("the submodule's own file\n")
    git(dep, "add", "-A")
    git(dep, "commit", "-qm", "dep")
    top = root / "pytorch"
    shutil.copytree(DATA / "project", top)
    git(top, "init", "-q")
    git(top, "-c", "protocol.file.allow=always", "submodule", "add", "-q", f"file://{dep}", "third_party/dep")
    git(top, "add", "-A")
    git(top, "commit", "-qm", "v1")
    git(top, "tag", "v1")
    return f"file://{top}"


@pytest.fixture(scope="module")
def links(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where pip finds kiln-writer-dep: a wheel with the entry point and the .pth."""
    out = tmp_path_factory.mktemp("writers-links")
    source = DATA / "dependency"
    files: dict[str, str | bytes] = {
        "kiln_writer_dep/__init__.py": (source / "kiln_writer_dep" / "__init__.py").read_text(),
        "kiln_writer_dep.pth": (source / "kiln_writer_dep.pth").read_text(),
        "kiln_writer_dep-1.0.dist-info/entry_points.txt": (source / "entry_points.txt").read_text(),
    }
    tiny_wheel(out, "kiln_writer_dep", "1.0", files=files, module=False)
    return out


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's environment stores (the build venv made once, cloned by every build after it): one for
    sandboxed builds, one for the builds without a sandbox (whose venvs a sandboxed build would make again)."""
    return tmp_path_factory.mktemp("writers-stores")


def build(
    root: Path,
    url: str,
    links: Path,
    stores: Path,
    writers: list[str],
    target: str,
    *,
    checks: bool = False,
    isolation: bool = True,
) -> BuildResult:
    """The plan's steps for the stand-in fetched into ``root/work`` (checks:import left out), with
    ``writers`` writing into ``target`` (from the top of the checkout); checks:venv runs when ``checks``."""
    recipe = parse_recipe(fetch_recipe_text(url, "v1").encode(), "writers-test.toml")
    store = stores / ("sandboxed" if isolation else "unsandboxed")
    plan = make_plan(
        recipe, workdir=root / "work", dist=root / "dist", only="torch", jobs=2, env_store=store,
        cache=resolve_cache(recipe.cache, kind="none"),
    )  # fmt: skip
    steps = [s for s in plan.steps if s.name != "checks:import"]
    checkout = plan.source("torch").path
    environ = {**os.environ, "KILN_WRITE": ",".join(writers), "KILN_WRITE_TO": f"{checkout}/{target}"}
    environ["PIP_FIND_LINKS"] = " ".join([*os.environ.get("PIP_FIND_LINKS", "").split(), str(links)])
    options = BuildOptions(
        console=Console(file=io.StringIO(), width=400),
        environ=environ,
        skip_postcheck=not checks,
        isolation=isolation,
        allow_unisolated=not isolation,
    )
    return run_build(replace(plan, steps=steps), options)


def recorded_outputs(root: Path) -> set[str]:
    """Every path any step recorded as the build's own output (<workdir>/tree-outputs/*.json)."""
    found: set[str] = set()
    for record in (root / "work" / "tree-outputs").glob("*.json"):
        found |= set(json.loads(record.read_text()))
    return found


CELLS = [(w, t) for w in WRITERS for t in TARGETS]


@pytest.mark.parametrize(
    ("writer", "target"), CELLS, ids=[f"{w} x {t.name}" for w, t in CELLS]
)  # 15 builds (the compile's writers stop at the compile), ~2.5 min
def test_a_writer_that_changes_a_tracked_input_fails_the_build_naming_it(
    writer: str, target: Target, upstream: str, links: Path, stores: Path, tmp_path: Path
) -> None:
    need_sandbox()
    checkout = tmp_path / "work" / "src" / "pytorch"
    with pytest.raises(BuildFailed) as failed:
        build(tmp_path, upstream, links, stores, [writer], target.path, checks=writer == "post-build")
    error, message = failed.value, str(failed.value)
    assert error.step == WRITERS[writer], message
    assert not list((tmp_path / "dist").glob("*")), "nothing was published"
    if target.path.startswith(".git/"):  # read-only in the sandbox: the write fails, and the step with it
        assert error.log is not None
        log = error.log.read_text()
        assert "Read-only file system" in log and str(checkout / target.path) in log, log[-3000:]
        assert "written by" not in (checkout / target.path).read_text()
        return
    assert message.startswith(f"{WRITERS[writer]}: 1 path(s) of the torch tree "), message
    assert f"modified {target.path} (content)" in message and "nothing was published" in message
    assert target.path not in recorded_outputs(tmp_path), "a tracked path is never an output"
    # the next build, with no writer: the fetched checkout is refused by name, never recorded as clean
    with pytest.raises(BuildFailed, match=rf"modified {target.path} \(content\); nothing was built"):
        build(tmp_path, upstream, links, stores, [], "")


@pytest.mark.parametrize("writer", list(WRITERS))  # 5 builds without a sandbox, ~1 min
def test_without_a_sandbox_a_write_into_gits_own_data_fails_the_build_naming_it(
    writer: str, upstream: str, links: Path, stores: Path, tmp_path: Path
) -> None:
    """Where the sandbox cannot bind .git read-only (no bubblewrap, --no-sandbox), the write lands: the check
    after the step names it; the next build refuses the checkout, whose git data changed since its fetch."""
    with pytest.raises(BuildFailed) as failed:
        build(
            tmp_path,
            upstream,
            links,
            stores,
            [writer],
            ".git/config",
            checks=writer == "post-build",
            isolation=False,
        )
    message = str(failed.value)
    assert failed.value.step == WRITERS[writer], message
    assert "modified .git/config (git's own data)" in message and "nothing was published" in message
    with pytest.raises(BuildFailed, match=r"git's own data about the fetched checkout .*: \.git/config; "):
        build(tmp_path, upstream, links, stores, [], "", isolation=False)


def test_every_writer_may_write_a_declared_output(
    upstream: str, links: Path, stores: Path, tmp_path: Path
) -> None:
    """All five writers, each into build/ (the compile's declared output directory): the build succeeds,
    what each wrote is recorded as the build's own output, and the lock, the manifest say the tree is its
    commit's."""
    need_sandbox()
    result = build(tmp_path, upstream, links, stores, list(WRITERS), DECLARED, checks=True)
    checkout = tmp_path / "work" / "src" / "pytorch"
    outputs = recorded_outputs(tmp_path)
    for writer in WRITERS:
        assert (checkout / DECLARED / f"{writer}.out").is_file(), writer
        assert f"{DECLARED}{writer}.out" in outputs, writer
    lock = json.loads(result.lock.read_text())["sources"]["torch"]
    assert (lock["dirty"], lock["changed"], lock["tree_changes"]) == (False, [], [])
    assert lock == json.loads(result.manifest.read_text())["sources"]["torch"]
    assert [w.name for w in result.wheels] and "checks:venv" in result.ran
