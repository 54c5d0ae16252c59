"""Where a wheel runs (issue 34): every NEEDED entry resolved from the installed wheel's point of view, never
the build machine's (torchkiln.artifacts.abi, .portability), and the manylinux policy from auditwheel's data.

The invariant tested here, with generated cases and on real ELF files: an entry counts as reachable on the
target only through the wheel's own files reached by its RPATH/RUNPATH (or loaded first), a declared
distribution's (the same two ways), a library a manylinux policy allows, the NVIDIA driver's, or one the
recipe's ``[deploy] system_libraries`` promises; a library that only this machine's directories hold is
unresolved, named with the file that needs it. The real ELF files: a tiny library linked against
``libcudart.so.13`` of NVIDIA's PyPI wheel (with and without the RPATH and the Requires-Dist that upstream's
torch wheels use), an extension linked against this machine's libpng, upstream's torch 2.13.0 CPU wheel (the
test venv's) and upstream's torchvision 0.28.0 wheel.
"""

from __future__ import annotations

import csv
import io
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
from auditwheel.architecture import Architecture
from auditwheel.libc import Libc
from auditwheel.policy import WheelPolicies
from hypothesis import given, settings
from hypothesis import strategies as st
from kit import ROOT
from kit.dists import pip_install_target, tiny_wheel
from kit.imagekit import examples, require

from torchkiln.artifacts import abi, installed, portability
from torchkiln.artifacts.elf import ElfDynamic
from torchkiln.artifacts.portability import DRIVER_LIBRARIES, Need, Portability
from torchkiln.errors import RecipeError
from torchkiln.recipe.loader import parse_recipe
from torchkiln.verify import linkage

HERE = ROOT / "tests"
X86 = "EM_X86_64"
POLICIES = abi.policies_for(Architecture.x86_64, Libc.GLIBC)
NEWEST = POLICIES[-1]


def elf(*, needed: tuple[str, ...] = (), rpath=(), runpath=(), machine: str = X86, versions=()) -> ElfDynamic:
    return ElfDynamic(needed, tuple(rpath), tuple(runpath), None, 64, machine, None, tuple(versions))


# --- the search path, inside site-packages only ---------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "obj", "where"),
    [
        ("$ORIGIN", "torch/lib/libtorch.so", "torch/lib"),
        ("${ORIGIN}", "torch/lib/libtorch.so", "torch/lib"),
        ("$ORIGIN/../../nvidia/cu13/lib", "torch/lib/libtorch_cuda.so", "nvidia/cu13/lib"),
        ("$ORIGIN/../torchvision.libs", "torchvision/image.so", "torchvision.libs"),
        ("$ORIGIN/.", "torchvision.libs/libz.so.1", "torchvision.libs"),
        ("$ORIGIN/..", "torch/_C.so", ""),  # site-packages itself
        ("$ORIGIN/../..", "torch/_C.so", None),  # above site-packages: another machine's directory
        ("$ORIGIN", "_ext.so", ""),
        ("/usr/local/cuda-13.0/lib64", "torch/lib/libtorch_cuda.so", None),
        ("/__w/_temp/conda_environment_28707544027/lib", "torchvision/_C.so", None),
        ("lib", "torch/_C.so", None),  # relative to the working directory
        ("$ORIGIN/$LIB", "torch/_C.so", None),
        ("$ORIGINAL/lib", "torch/_C.so", None),
    ],
)
def test_search_entries_count_only_inside_site_packages(entry: str, obj: str, where: str | None) -> None:
    assert abi.site_relative(entry, obj) == where


# --- resolution: generated installations -----------------------------------------------------------------

OBJ = "kilnprobe/_ext.so"
WHEEL, DEP, OTHER = "kilnprobe", "kilndep", "kilnother"
# route -> the kind the target sees (the oracle: what was built, not what the code computes)
ROUTES = {
    "bundled-runpath": "bundled",  # kilnprobe.libs/NAME, RUNPATH/RPATH $ORIGIN/../kilnprobe.libs
    "bundled-unreached": "unresolved",  # the wheel's file, but no search entry of this one reaches it
    "declared-runpath": "declared",  # kilndep/lib/NAME, declared, reached by $ORIGIN/../kilndep/lib
    "declared-loaded": "declared",  # kilndep/lib/NAME, declared, loaded first by kilndep
    "undeclared-runpath": "unresolved",  # kilnother/lib/NAME reached, but kilnother is not declared
    "undeclared-loaded": "unresolved",  # kilnother holds it; nothing declares kilnother
    "other-machine": "unresolved",  # kilnprobe.libs/NAME reached, but an aarch64 file
    "host-directory": "unresolved",  # an absolute search entry: a directory of the build machine
    "policy": "policy",
    "policy-too-new": "unresolved",  # libstdc++.so.6 at GLIBCXX_3.4.99: no policy's machine has it
    "policy-too-new-target": "target",  # ... unless the recipe promises the target's libstdc++
    "loader": "policy",
    "driver": "driver",
    "target": "target",
    "nothing": "unresolved",
}
ALLOWED = sorted(NEWEST.whitelist - {"libstdc++.so.6"})  # the policy route's; libstdc++ is the too-new one's


@st.composite
def installations(draw: st.DrawFn) -> tuple[ElfDynamic, abi.Installation, dict[str, str]]:
    routes = draw(st.lists(st.sampled_from(sorted(ROUTES)), min_size=1, max_size=8))
    use_runpath = draw(st.booleans())
    layout: dict[str, tuple[str, ElfDynamic | None]] = {}
    loaded: dict[str, tuple[str, str]] = {}
    own: dict[str, str] = {}
    entries: list[str] = []
    target: set[str] = set()
    versions: list[tuple[str, str]] = [("libc.so.6", "GLIBC_2.17")]  # an allowed one: no effect
    expected: dict[str, str] = {}
    policy_names = iter(draw(st.permutations(ALLOWED)))
    driver_names = iter(draw(st.permutations(DRIVER_LIBRARIES)))
    for i, route in enumerate(routes):
        name = f"libkiln{i}.so.{i + 1}"
        if route == "policy":
            name = next(policy_names)
        elif route == "loader":
            name = "ld-linux-x86-64.so.2"
            if name in expected:
                continue
        elif route == "driver":
            name = next(driver_names) + ".1"
        elif route.startswith("policy-too-new"):
            name = "libstdc++.so.6"
            if name in expected:
                continue
            versions.append((name, "GLIBCXX_3.4.99"))
            if route.endswith("target"):
                target.add(name)
        expected[name] = ROUTES[route]
        lib = elf()
        if route in ("bundled-runpath", "other-machine"):
            machine = "EM_AARCH64" if route == "other-machine" else X86
            layout[f"kilnprobe.libs/{name}"] = (WHEEL, elf(machine=machine))
            entries.append("$ORIGIN/../kilnprobe.libs")
        elif route == "bundled-unreached":  # in a directory no search entry names
            layout[f"kilnprobe/hidden/{name}"] = (WHEEL, lib)
            own[name] = f"kilnprobe/hidden/{name}"
        elif route in ("declared-runpath", "declared-loaded", "undeclared-runpath", "undeclared-loaded"):
            dist = DEP if route.startswith("declared") else OTHER
            layout[f"{dist}/lib/{name}"] = (dist, lib)
            if route.endswith("runpath"):
                entries.append(f"$ORIGIN/../{dist}/lib")
            elif dist == DEP:
                loaded[name] = (f"{dist}/lib/{name}", dist)
        elif route == "host-directory":
            entries.append("/usr/lib/x86_64-linux-gnu")
        elif route == "target":
            target.add(name)
    # a directory of the search path holds at most what its routes put there (dedupe, keep order)
    entries = list(dict.fromkeys(entries))
    obj = elf(
        needed=tuple(expected),
        runpath=entries if use_runpath else (),
        rpath=() if use_runpath else entries,
        versions=versions,
    )
    allowed = frozenset(NEWEST.whitelist)
    inst = abi.Installation(
        WHEEL,
        layout,
        frozenset({DEP}),
        loaded,
        own,
        allowed,
        frozenset(target),
        NEWEST.name,
        NEWEST.symbol_versions,
    )
    return obj, inst, expected


@settings(max_examples=examples(200), deadline=None)
@given(installations())
def test_each_needed_entry_resolves_as_the_installation_says(case) -> None:  # noqa: ANN001
    obj, inst, expected = case
    got = {name: abi.resolve(OBJ, obj, name, inst) for name in obj.needed}
    assert {name: need.kind for name, need in got.items()} == expected
    for name, need in got.items():
        assert need.file == OBJ and need.needed == name
        if need.kind == "declared":
            assert need.distribution == DEP and need.path == f"{DEP}/lib/{name}"
        if need.kind == "bundled":
            assert need.path == f"kilnprobe.libs/{name}" and need.distribution is None
        if need.kind == "unresolved":
            assert need.path is None and need.distribution is None


def test_rpath_is_not_searched_when_the_object_has_a_runpath() -> None:
    """glibc reads DT_RPATH only without DT_RUNPATH: a library behind the RPATH alone is not found."""
    layout = {"kilnprobe.libs/libaux.so": (WHEEL, elf())}
    inst = abi.Installation(WHEEL, layout, frozenset(), {}, {}, frozenset(), frozenset())
    both = elf(needed=("libaux.so",), rpath=("$ORIGIN/../kilnprobe.libs",), runpath=("$ORIGIN",))
    assert abi.resolve(OBJ, both, "libaux.so", inst).kind == "unresolved"
    only_rpath = elf(needed=("libaux.so",), rpath=("$ORIGIN/../kilnprobe.libs",))
    assert abi.resolve(OBJ, only_rpath, "libaux.so", inst).via == "RPATH $ORIGIN/../kilnprobe.libs"


@pytest.mark.parametrize(
    ("name", "driver"),
    [
        ("libcuda.so.1", True),
        ("libnvidia-ml.so.1", True),
        ("libnvidia-ptxjitcompiler.so.1", True),
        ("libnvcuvid.so.1", True),
        ("libnvidia-encode.so.1", True),
        ("libcuda.so", True),
        ("libcudart.so.13", False),  # the CUDA runtime: NVIDIA's wheel, never the driver
        ("libcudadevrt.a", False),
        ("libcuda_stub.so.1", False),
        ("libnvjpeg.so.13", False),
        ("libnvidia-ml.so.1.extra", True),
    ],
)
def test_the_drivers_libraries(name: str, driver: bool) -> None:
    assert portability.is_driver_library(name) is driver


# --- the policy: auditwheel's data, auditwheel's verdict on symbol versions ---------------------------------

FAMILIES = {
    family: sorted(NEWEST.symbol_versions[family]) for family in ("GLIBC", "GLIBCXX", "CXXABI", "GCC")
}
NEEDED_BY = {
    "GLIBC": "libc.so.6",
    "GLIBCXX": "libstdc++.so.6",
    "CXXABI": "libstdc++.so.6",
    "GCC": "libgcc_s.so.1",
}


@st.composite
def version_needs(draw: st.DrawFn) -> list[tuple[str, str]]:
    """Version needs of one file: versions drawn from the newest policy's own lists (the grammar the
    policies are written in), and now and then one no policy has (GLIBC_PRIVATE, GLIBCXX_3.4.99)."""
    picked = []
    for family, versions in FAMILIES.items():
        for version in draw(st.lists(st.sampled_from(versions), max_size=3)):
            picked.append((NEEDED_BY[family], f"{family}_{version}"))
    if draw(st.integers(0, 9)) == 0:
        picked.append(
            draw(st.sampled_from([("libc.so.6", "GLIBC_PRIVATE"), ("libstdc++.so.6", "GLIBCXX_3.4.99")]))
        )
    return picked


@settings(max_examples=examples(120), deadline=None)
@given(st.lists(version_needs(), min_size=1, max_size=3))
def test_the_policy_of_symbol_versions_is_auditwheels(files: list[list[tuple[str, str]]]) -> None:
    objects = [(f"pkg/_m{i}.so", elf(versions=needs), Path("/nonexistent")) for i, needs in enumerate(files)]
    needs = [Need(r, lib, "policy", "") for r, info, _ in objects for lib, _ in info.versions]
    platform_ = abi.Platform(Architecture.x86_64, Libc.GLIBC, {})
    policy, why = abi.best_policy(objects, needs, platform_)
    combined: dict[str, set[str]] = {}
    for info in (o[1] for o in objects):
        for lib, version in info.versions:
            combined.setdefault(lib, set()).add(version)
    theirs = WheelPolicies(libc=Libc.GLIBC, arch=Architecture.x86_64).versioned_symbols_policy(combined)
    assert policy == (theirs.name if theirs.priority > 0 else None)
    if policy is not None and policy != POLICIES[0].name:
        assert why and all(w.startswith("not manylinux_") for w in why)


@pytest.mark.parametrize(
    ("needed", "kind", "policy"),
    [
        ("libc.so.6", "policy", "manylinux_2_5_x86_64"),
        ("libexpat.so.1", "policy", "manylinux_2_12_x86_64"),  # allowed from manylinux2010 on
        ("libmvec.so.1", "policy", "manylinux_2_24_x86_64"),
        ("libpng16.so.16", "target", None),  # promised by the recipe: still no policy's
        ("libpng16.so.16", "unresolved", None),
        ("libcuda.so.1", "driver", "manylinux_2_5_x86_64"),  # as `auditwheel repair --exclude` treats it
        ("libcudart.so.13", "declared", "manylinux_2_5_x86_64"),
        ("libz.so.1", "policy", "manylinux_2_5_x86_64"),  # blacklisted symbols: none used here
    ],
)
def test_libraries_limit_the_policy(needed: str, kind: str, policy: str | None, tmp_path: Path) -> None:
    obj = ("pkg/_m.so", elf(), tmp_path / "missing.so")  # no symbol of it read: no blacklist to look at
    platform_ = abi.Platform(Architecture.x86_64, Libc.GLIBC, {})
    got, why = abi.best_policy([obj], [Need("pkg/_m.so", needed, kind, "")], platform_)
    assert got == policy
    if policy is None:
        assert why == [f"not even {NEWEST.name}: pkg/_m.so needs {needed} which {NEWEST.name} does not allow"]


def test_an_instruction_set_beyond_the_baseline_satisfies_no_policy() -> None:
    platform_ = abi.Platform(Architecture.x86_64, Libc.GLIBC, {"pkg/_m.so": "x86_64_v3"})
    policy, why = abi.best_policy([("pkg/_m.so", elf(), Path("/x"))], [], platform_)
    assert policy is None and why == [
        f"not even {NEWEST.name}: pkg/_m.so needs the x86_64_v3 instruction set"
    ]


# --- judging a record against a recipe ---------------------------------------------------------------------


def record(*needs: Need) -> Portability:
    return portability.summarise(Portability("test", needs=list(needs)))


def test_retarget_and_refusal_follow_the_recipes_list() -> None:
    png = Need("torchvision/_C.so", "libpng16.so.16", "unresolved", abi.UNRESOLVED)
    libc = Need("torchvision/_C.so", "libc.so.6", "policy", "x")
    found = record(png, libc)
    reason = portability.refusal("tv.whl", found)
    assert reason is not None and reason.startswith("tv.whl needs libpng16.so.16, which the target machines")
    assert "torchvision/_C.so needs libpng16.so.16 (not bundled" in reason
    fix = portability.system_libraries_fix([], portability.unresolved_names([found]))
    assert fix.endswith('list it in the recipe: [deploy] system_libraries = ["libpng16.so.16"]'), fix
    promised = portability.retarget(found, ["libpng16.so.16"], abi.UNRESOLVED)
    assert portability.refusal("tv.whl", promised) is None
    assert [n.kind for n in promised.needs] == ["target", "policy"]
    assert promised.on_the_machine == ["libc.so.6", "libpng16.so.16"] and promised.unresolved == []
    again = portability.retarget(promised, [], abi.UNRESOLVED)
    assert again.needs == found.needs and again.unresolved == ["torchvision/_C.so needs libpng16.so.16"]


# --- the recipe's [deploy] system_libraries ----------------------------------------------------------------

RECIPE = (HERE / "data" / "ext-cpu-test.toml").read_text()


def with_deploy(value: str) -> str:
    return RECIPE + f"\n[deploy]\nsystem_libraries = {value}\n"


@settings(max_examples=examples(100), deadline=None)
@given(
    st.lists(
        st.from_regex(r"lib[a-z0-9_+-]{1,12}\.so(\.[0-9]{1,3}){0,3}", fullmatch=True), unique=True, max_size=5
    )
)
def test_sonames_are_accepted(names: list[str]) -> None:
    recipe = parse_recipe(with_deploy(repr(names).replace("'", '"')).encode(), "r.toml")
    assert recipe.deploy.system_libraries == tuple(names)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            '["/usr/lib/x86_64-linux-gnu/libpng16.so.16"]',
            "not a soname: '/usr/lib/x86_64-linux-gnu/libpng16.so",
        ),
        ('["libpng*"]', "not a soname: 'libpng*'"),
        ('["png16"]', "not a soname: 'png16'"),
        ('["libpng16.so.16 "]', "not a soname: 'libpng16.so.16 '"),
        ('["libpng16.so.x"]', "not a soname: 'libpng16.so.x'"),
        ('["-libpng16.so.16"]', "not a soname: '-libpng16.so.16'"),
        ('["libpng16.so.16", "libpng16.so.16"]', "libpng16.so.16 listed more than once"),
        ("[1]", "not a soname: 1"),
        ('"libpng16.so.16"', "wrong type str"),
    ],
)
def test_a_bad_soname_is_refused_naming_the_field(value: str, message: str) -> None:
    with pytest.raises(RecipeError) as info:
        parse_recipe(with_deploy(value).encode(), "r.toml")
    (line,) = str(info.value).splitlines()
    assert line.startswith(f"r.toml: deploy.system_libraries: {message}"), line


# --- real ELF files ----------------------------------------------------------------------------------------

TAG = f"cp{sys.version_info.major}{sys.version_info.minor}-cp{sys.version_info.major}{sys.version_info.minor}-linux_{platform.machine()}"
CUDART = "cuda-toolkit[cudart]==13.0.3"  # torch 2.13.0's pin (data/compat.toml): nvidia-cuda-runtime 13.0.96


def gcc(*args: str) -> None:
    done = subprocess.run(["gcc", "-shared", "-fPIC", *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def cudart_wheels(tmp_path: Path) -> list[Path]:
    """NVIDIA's CUDA 13.0 runtime wheel (and the cuda-toolkit meta wheel that pins it), from the index."""
    into = tmp_path / "nvidia"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "-d", str(into), CUDART],
        capture_output=True,
        text=True,
        check=False,
    )
    require(done.returncode == 0, f"pip download {CUDART}: {done.stderr[-400:]}")
    return sorted(into.glob("*.whl"))


@pytest.fixture(scope="module")
def cudart(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """libkilncuda.so, which NEEDs libcudart.so.13 (linked against the file of NVIDIA's wheel), with and
    without upstream's RPATH into site-packages/nvidia/cu13/lib."""
    require(shutil.which("gcc") is not None, "gcc is not installed")
    root = tmp_path_factory.mktemp("cudart")
    wheels = cudart_wheels(root)
    (runtime,) = [w for w in wheels if w.name.startswith("nvidia_cuda_runtime-")]
    with zipfile.ZipFile(runtime) as archive:
        archive.extract("nvidia/cu13/lib/libcudart.so.13", root)
    lib = root / "nvidia" / "cu13" / "lib"
    (root / "kiln.c").write_text(
        "int cudaGetDeviceCount(int *count);\nint kiln_devices(void) { int n = 0; cudaGetDeviceCount(&n); return n; }\n"
    )
    link = [str(root / "kiln.c"), "-L", str(lib), "-l:libcudart.so.13"]
    gcc("-o", str(root / "plain.so"), *link)
    gcc("-o", str(root / "rpath.so"), *link, "-Wl,-rpath,$ORIGIN/../nvidia/cu13/lib")
    return {
        "wheels": wheels,
        "plain": (root / "plain.so").read_bytes(),
        "rpath": (root / "rpath.so").read_bytes(),
    }


def install_cuda_probe(tmp_path: Path, cudart: dict[str, object], *, rpath: bool, declared: bool) -> Path:
    files = {"kilncuda/__init__.py": "", "kilncuda/libkilncuda.so": cudart["rpath" if rpath else "plain"]}
    requires = ("cuda-toolkit[cudart]==13.0.3",) if declared else ()
    wheel = tiny_wheel(tmp_path, "kilncuda", "1.0", files=files, requires=requires, tag=TAG)  # type: ignore[arg-type]
    return pip_install_target(tmp_path / "site", wheel, *cudart["wheels"])  # type: ignore[misc]


def loaded_cudart(site: Path) -> subprocess.CompletedProcess[str]:
    """The loader's own answer, without LD_LIBRARY_PATH (no GPU needed: libcudart loads the driver lazily):
    the path of the libcudart.so.13 that loading the library brought in (/proc/self/maps), or its error."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    code = (
        "import ctypes, sys; ctypes.CDLL(sys.argv[1]); "
        "print(next(line.split()[-1] for line in open('/proc/self/maps') if 'libcudart.so' in line))"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(site / "kilncuda" / "libkilncuda.so")],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    ("rpath", "declared", "kind"),
    [
        (True, True, "declared"),
        (True, False, "unresolved"),
        (False, True, "declared"),
        (False, False, "unresolved"),
    ],
    ids=["rpath+requires-dist", "rpath-only", "requires-dist-only", "neither"],
)
def test_libcudart_from_nvidias_wheel_counts_only_when_declared(
    cudart: dict[str, object], tmp_path: Path, rpath: bool, declared: bool, kind: str
) -> None:
    """Upstream's torch finds libcudart.so.13 through RPATH $ORIGIN/../../nvidia/cu13/lib and declares
    cuda-toolkit[cudart] (which brings nvidia-cuda-runtime): both, and the library counts as the declared
    distribution's. Installed here by another wheel but not declared, it is not counted: another installation
    will not have it."""
    site = install_cuda_probe(tmp_path, cudart, rpath=rpath, declared=declared)
    index = installed.installed([str(site)])
    found = abi.analyse_installed(index["kilncuda"], index, analysed="test")
    (need,) = [n for n in found.needs if n.needed == "libcudart.so.13"]
    assert need.kind == kind and need.file == "kilncuda/libkilncuda.so"
    ran = loaded_cudart(site)
    if rpath:  # the wheel's RPATH finds NVIDIA's copy, whatever this machine has
        assert ran.stdout.strip() == str(site / "nvidia" / "cu13" / "lib" / "libcudart.so.13"), ran.stderr
    elif here := linkage.System.of_this_machine().where("libcudart.so.13"):
        # this machine's loader finds a CUDA toolkit's copy (/usr/local/cuda-13.0 in ld.so.conf): it loads
        # here, and only here; exactly what the record does not count
        assert Path(ran.stdout.strip()).resolve() == Path(here).resolve(), ran.stderr
    else:
        assert "libcudart.so.13: cannot open shared object file" in ran.stderr, ran.stderr
    if kind == "declared":
        assert need.distribution == "nvidia-cuda-runtime" and need.path == "nvidia/cu13/lib/libcudart.so.13"
        assert need.via == ("RUNPATH $ORIGIN/../nvidia/cu13/lib" if rpath else need.via)
        assert found.pip_brings == ["nvidia-cuda-runtime 13.0.96"] and found.unresolved == []
        assert found.policy is not None and found.policy.startswith("manylinux_")
    else:
        assert found.unresolved == ["kilncuda/libkilncuda.so needs libcudart.so.13"] and found.policy is None
        if rpath:
            assert need.via == (
                "RUNPATH reaches nvidia/cu13/lib/libcudart.so.13 of nvidia-cuda-runtime, which kilncuda does not declare"
            )
        reason = portability.refusal("kilncuda.whl", found)
        assert reason is not None and "kilncuda/libkilncuda.so needs libcudart.so.13" in reason


PNG_C = """\
#include <png.h>
#include <math.h>
int cuInit(unsigned int flags);
double kiln_png(double x) { return png_access_version_number() + sin(x) + cuInit(0); }
"""


@pytest.fixture(scope="module")
def png_ext(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A library that links this machine's libpng16, libm and the NVIDIA driver's libcuda.so.1 (a stub with
    its soname stands in at link time, as for upstream's libcaffe2_nvrtc.so)."""
    require(shutil.which("gcc") is not None and Path("/usr/include/png.h").is_file(), "gcc and libpng-dev")
    root = tmp_path_factory.mktemp("png")
    (root / "png.c").write_text(PNG_C)
    (root / "cuda.c").write_text("int cuInit(unsigned int flags) { return flags; }\n")
    gcc("-o", str(root / "libcuda.so.1"), "-Wl,-soname,libcuda.so.1", str(root / "cuda.c"))
    gcc("-o", str(root / "png.so"), str(root / "png.c"), "-lpng16", "-lm", "-L", str(root), "-l:libcuda.so.1")
    return (root / "png.so").read_bytes()


@pytest.mark.integration
def test_a_library_only_this_machine_has_is_named_even_though_it_loads_here(
    png_ext: bytes, tmp_path: Path
) -> None:
    host_png = linkage.System.of_this_machine().where("libpng16.so.16")
    assert host_png is not None, "libpng16 is installed here (libpng-dev): the case is about exactly that"
    wheel = tiny_wheel(tmp_path, "kilnpng", "1.0", files={"kilnpng/_png.so": png_ext}, tag=TAG)
    site = pip_install_target(tmp_path / "site", wheel)
    index = installed.installed([str(site)])
    kinds = {n.needed: n.kind for n in abi.analyse_installed(index["kilnpng"], index, analysed="t").needs}
    assert kinds.pop("libpng16.so.16") == "unresolved" and kinds.pop("libcuda.so.1") == "driver"
    assert kinds.pop("libm.so.6") == "policy" and set(kinds.values()) <= {"policy"}  # libc.so.6, if linked
    found = linkage.check_distribution(index["kilnpng"], index, linkage.System.of_this_machine())
    assert [(e.obj, e.needed) for e in found.unresolved] == [("kilnpng/_png.so", "libpng16.so.16")]
    assert (
        f"kilnpng/_png.so needs libpng16.so.16: {abi.UNRESOLVED} (this machine has it at {host_png}"
        in found.message()
    )
    promised = linkage.check_distribution(index["kilnpng"], index, target=["libpng16.so.16"])
    assert promised.unresolved == () and "1 target" in promised.message()


@pytest.mark.integration
def test_describe_promises_exactly_what_the_installed_torch_needs_unbundled(
    png_ext: bytes, tmp_path: Path
) -> None:
    """``recipe describe``'s ``[deploy] system_libraries`` (describe.unresolved_needs) on a real ELF file in an
    installed distribution named torch: the library only this machine has, named with the file; promised, the
    release check's linkage finds nothing unresolved."""
    from torchkiln.commands import describe

    wheel = tiny_wheel(tmp_path, "torch", "2.15.0", files={"torch/lib/libkiln.so": png_ext}, tag=TAG)
    site = pip_install_target(tmp_path / "site", wheel)
    needs = describe.unresolved_needs([str(site)])
    assert needs == {"libpng16.so.16": ["torch/lib/libkiln.so"]}
    index = installed.installed([str(site)])
    assert linkage.check_distribution(index["torch"], index, target=sorted(needs)).unresolved == ()


@pytest.mark.integration
def test_the_policy_agrees_with_auditwheel_show_where_nothing_is_excluded(tmp_path: Path) -> None:
    """auditwheel's own analysis of the same wheel file (its lddtree, this machine's libraries): for a wheel
    that needs only what policies allow, torchkiln's policy is auditwheel's."""
    from auditwheel.wheel_abi import analyze_wheel_abi

    require(shutil.which("g++") is not None, "g++ is not installed")
    (tmp_path / "m.cpp").write_text(
        '#include <string>\nextern "C" int kiln(const char *s) { return std::string(s).size(); }\n'
    )
    done = subprocess.run(
        ["g++", "-shared", "-fPIC", "-o", str(tmp_path / "m.so"), str(tmp_path / "m.cpp")], check=False
    )
    assert done.returncode == 0
    wheel = tiny_wheel(
        tmp_path, "kilncxx", "1.0", files={"kilncxx/_m.so": (tmp_path / "m.so").read_bytes()}, tag=TAG
    )
    site = pip_install_target(tmp_path / "site", wheel)
    index = installed.installed([str(site)])
    ours = abi.analyse_installed(index["kilncxx"], index, analysed="t")
    theirs = analyze_wheel_abi(None, None, wheel, frozenset(), disable_isa_ext_check=False, allow_graft=False)
    assert ours.policy == theirs.overall_policy.name and ours.unresolved == []
    assert {n.needed for n in ours.needs} >= {"libstdc++.so.6", "libc.so.6"}


# --- upstream's real wheels --------------------------------------------------------------------------------


@pytest.mark.integration
def test_upstreams_cpu_torch_is_what_its_tag_says(tmp_path: Path) -> None:
    """The test venv's torch 2.13.0 (upstream's manylinux_2_28 CPU wheel): every entry of its shared objects
    accounted for, the policy its tag names, glibc 2.28, libgomp its own (torch/lib), nothing from pip."""
    index = installed.installed()
    found = abi.analyse_installed(index["torch"], index, analysed="the test venv")
    assert found.tags == ["manylinux_2_28_x86_64"] and found.policy == "manylinux_2_28_x86_64"
    assert found.glibc == "2.28" and found.unresolved == [] and found.pip_brings == []
    assert all(w.startswith("not manylinux_2_27_x86_64: ") and "GLIBC_2.28" in w for w in found.why)
    gomp = {n.kind for n in found.needs if n.needed == "libgomp.so.1"}
    assert gomp == {"bundled"}
    assert set(found.on_the_machine) <= set(NEWEST.whitelist) | {"ld-linux-x86-64.so.2"}
    assert {n.file for n in found.needs} >= {"torch/lib/libtorch_cpu.so", "torch/lib/libc10.so"}


@pytest.mark.integration
def test_upstreams_cuda_torchvision_against_the_cpu_torch_names_what_that_torch_lacks(tmp_path: Path) -> None:
    """Upstream's torchvision 0.28.0 (its CUDA 13.0 build) installed beside the CPU torch: its codecs and
    libcudart are its own (RUNPATH $ORIGIN/../torchvision.libs), torch's libraries are the declared torch's,
    and libtorch_cuda.so and libc10_cuda.so, which only torch's CUDA build has, are named; so is _C.so's
    libcudart.so.13 (the copy the wheel bundles for image.so is on no search path of _C.so's). Its _C.so's RPATH
    into the build machine's conda environment is noted, never searched."""
    from kit import realtrees

    wheel = realtrees.pypi_wheel("torchvision==0.28.0")
    sites = [Path(p) for p in sys.path if p.endswith("site-packages") and (Path(p) / "torch").is_dir()]
    found = abi.analyse_wheel(wheel, sites[:1], analysed="beside the test venv")
    assert found.tags == ["manylinux_2_28_x86_64"] and found.policy is None
    assert sorted(set(found.unresolved)) == [
        "torchvision/_C.so needs libc10_cuda.so",
        "torchvision/_C.so needs libcudart.so.13",  # its image.so's bundled copy is no help to _C.so
        "torchvision/_C.so needs libtorch_cuda.so",
        "torchvision/image.so needs libc10_cuda.so",
        "torchvision/image.so needs libtorch_cuda.so",
    ]
    kinds = {(n.file, n.needed): n.kind for n in found.needs}
    assert kinds[("torchvision/_C.so", "libc10.so")] == "declared"
    assert all(
        k == "bundled" for (f, n), k in kinds.items() if n.startswith(("libpng16.", "libjpeg.", "libnvjpeg."))
    )
    assert any("RPATH /__w/_temp/conda_environment" in note and "not counted" in note for note in found.notes)
    assert found.pip_brings == [f"torch {installed.installed()['torch'].version}"]


# RECORD paths as pip writes them (csv.writer over the relative path, its hash and size): any character a
# file name may hold, commas and quotes among them, and the `../` of a script outside site-packages
RECORD_PATHS = st.lists(
    st.text(
        st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/\x00"),
        min_size=1,
        max_size=12,
    ).filter(lambda part: part not in (".", "..")),
    min_size=1,
    max_size=3,
).map("/".join)


def _no_path_is_a_directory_of_another(paths: list[str]) -> bool:
    return not any(other.startswith(path + "/") for path in paths for other in paths)


@given(
    paths=st.lists(RECORD_PATHS, min_size=1, max_size=8, unique=True).filter(
        _no_path_is_a_directory_of_another
    ),
    outside=st.booleans(),
    removed=st.sets(st.integers(min_value=0, max_value=7), max_size=3),
)
@settings(max_examples=examples(60), deadline=None)
def test_recorded_files_reads_a_record_as_importlib_metadata_does(
    paths: list[str], outside: bool, removed: set[int]
) -> None:
    """installed.recorded_files (a CSV read of RECORD, issue 38: torch's 40,000 rows without a path object
    each) lists every row of RECORD, in order, whether its file is still there or not (a damaged install is
    told by what RECORD says it should hold), and locates each where ``locate_file`` does. Where the files
    exist it lists what this interpreter's ``Distribution.files`` lists; whether ``files`` also lists a
    missing file is the interpreter's own (Python 3.13's importlib.metadata leaves them out), so that
    expectation is asked of the running interpreter, never written down."""
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "lib" / "site-packages"
        info = site / "demo-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
        rows = [*paths, *(["../../bin/demo-tool"] if outside else []), "demo-1.0.dist-info/RECORD"]
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        for row in rows:
            writer.writerow([row, "sha256=AAAA" if not row.endswith("RECORD") else "", "1"])
        (info / "RECORD").write_text(out.getvalue())
        for row in rows[:-1]:
            file = site / row
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text("x")
        dist = installed.installed([str(site)])["demo"]
        assert installed.recorded_files(dist) == [str(entry) for entry in dist.files or ()] == rows
        assert [installed.located(dist, r) for r in rows] == [
            Path(str(dist.locate_file(e))) for e in dist.files or ()
        ]
        gone = {rows[i] for i in removed if i < len(rows) - 1}
        for row in gone:
            (site / row).unlink()
        assert installed.recorded_files(dist) == rows  # RECORD as written, missing files included
        listed = [str(entry) for entry in dist.files or ()]  # the interpreter's own view of the same RECORD
        assert [r for r in listed if r not in gone] == [r for r in rows if r not in gone]


@pytest.mark.parametrize(
    ("change", "shared"),
    [("hard-link", True), ("same-file", True), ("copy", False), ("rewritten", False), ("touched", False)],
)
def test_an_elf_reading_is_kept_by_file_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str, shared: bool
) -> None:
    """elf.keep_in (issue 38: the check reads torch's libraries that publish read, hard links of one inode):
    a kept reading serves every path of the same inode, size and mtime, and never a file copied, rewritten
    or touched since; the reading kept is the reader's own."""
    from torchkiln.artifacts import elf

    original = tmp_path / "libkiln.so"
    shutil.copy2(Path(sys.executable).resolve(), original)  # a real ELF executable, as a file of the wheel
    other = tmp_path / "other.so"
    if change == "hard-link":
        os.link(original, other)
    elif change == "same-file":
        other = original
    else:
        shutil.copy2(original, other)
    elf.forget_readings()
    with elf.keeping([tmp_path / "keep-a", tmp_path / "keep-b"]):
        first = elf.elf_cached(str(original))
        assert first == elf.read_elf(original) and first is not None
        assert len(list((tmp_path / "keep-b").glob("elf-*.json"))) == 1, "kept in every directory"
        if change == "rewritten":
            with other.open("ab") as handle:
                handle.write(b"\0")
        if change == "touched":
            os.utime(other, ns=(os.stat(other).st_atime_ns, os.stat(other).st_mtime_ns + 1))
        elf.forget_readings()
        read = []
        real = elf.read_elf
        monkeypatch.setattr(elf, "read_elf", lambda *a, **k: read.append(a) or real(*a, **k))
        again = elf.elf_cached(str(other))
    assert again == first if change != "rewritten" else again is not None
    assert (read == []) is shared, (change, read)
    elf.forget_readings()


@pytest.mark.parametrize("change", ["none", "rewritten", "touched", "replaced"])
def test_an_elf_reading_in_this_process_answers_what_a_fresh_process_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """The process's memo of ``elf_cached`` (issue 48: two builds in one process): a file changed at the same
    path is read again, and a build keeping its readings elsewhere gets them kept in its own directories,
    whatever another build of the process read before."""
    from torchkiln.artifacts import elf

    path = tmp_path / "libkiln.so"
    shutil.copy2(Path(sys.executable).resolve(), path)
    elf.forget_readings()
    with elf.keeping([tmp_path / "one"]):
        assert elf.elf_cached(str(path)) is not None
    if change == "rewritten":
        with path.open("ab") as handle:
            handle.write(b"\0")
    elif change == "touched":
        os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 1))
    elif change == "replaced":
        fresh = tmp_path / "fresh.so"
        shutil.copy2(path, fresh)
        fresh.replace(path)
    read = []
    real = elf.read_elf
    monkeypatch.setattr(elf, "read_elf", lambda *a, **k: read.append(a) or real(*a, **k))
    with elf.keeping([tmp_path / "two"]):
        assert elf.elf_cached(str(path)) == real(path)
    assert len(list((tmp_path / "two").glob("elf-*.json"))) == 1, "kept where this build keeps them"
    assert read, "what the first build read and kept is not where this one keeps its readings: read again"
    with elf.keeping([tmp_path / "one"]):
        read.clear()
        elf.elf_cached(str(path))
    assert (read == []) is (change == "none"), "a changed file is read afresh under the first build's too"
    elf.forget_readings()
