"""The release checks of the verification suite (verify/test_release.py) and their negative controls.

Each check is run here on what it must reject, built for real: a wheel whose extension finds its library only
through LD_LIBRARY_PATH (compiled with the host's gcc, installed with pip), a torch.compile backend that
miscompiles, oneDNN switched off, a CUDA build whose NCCL or MAGMA does not add up. And on what it must
accept: the same wheel with an RPATH, or with the library from a dependency it declares (as upstream's torch
takes CUDA's libraries from the nvidia-* wheels).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
from kit.dists import pip_install_target, tiny_wheel
from kit.imagekit import need_torch, require
from test_verify_lib import cuda_facts

from torchkiln.verify import buildconfig, linkage, smoke

torch = need_torch()  # this module runs torch: skipped without it (failed under CI=true)

# --- libraries resolve without LD_LIBRARY_PATH ----------------------------------------------------------

AUX_C = "int kiln_aux(void) { return 42; }\n"
EXTENSION_C = textwrap.dedent(
    """\
    #include <Python.h>
    int kiln_aux(void);
    static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(kiln_aux()); }
    static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
    static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kilnprobe", NULL, -1, methods};
    PyMODINIT_FUNC PyInit__kilnprobe(void) { return PyModule_Create(&module); }
    """
)
# What torch/__init__.py does for the nvidia-* libraries its RPATH does not reach (_preload_cuda_deps): load
# the dependency's library by path first, so the extension's NEEDED entry finds it already loaded.
PRELOAD = textwrap.dedent(
    """\
    import ctypes, importlib.metadata
    _dist = importlib.metadata.distribution("kilnaux")
    _lib = next(f for f in _dist.files if f.name == "libkilnaux.so")
    ctypes.CDLL(str(_dist.locate_file(_lib)), mode=ctypes.RTLD_GLOBAL)
    """
)
EXT = sysconfig.get_config_var("EXT_SUFFIX")
TAG = f"cp{sys.version_info.major}{sys.version_info.minor}-cp{sys.version_info.major}{sys.version_info.minor}-linux_{platform.machine()}"
MODULE = f"_kilnprobe{EXT}"


def gcc(*args: str) -> None:
    subprocess.run(["gcc", "-shared", "-fPIC", *args], check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """libkilnaux.so, and the extension linked against it: without an RPATH, with DT_RPATH (upstream's
    --force-rpath) to ``$ORIGIN/kilnprobe.libs``."""
    require(shutil.which("gcc") is not None, "gcc is not installed")
    root = tmp_path_factory.mktemp("compiled")
    (root / "aux.c").write_text(AUX_C)
    (root / "ext.c").write_text(EXTENSION_C)
    aux = root / "libkilnaux.so"
    gcc("-o", str(aux), "-Wl,-soname,libkilnaux.so", str(root / "aux.c"))
    include = sysconfig.get_paths()["include"]
    link = ["-I", include, str(root / "ext.c"), "-L", str(root), "-lkilnaux"]
    gcc("-o", str(root / "plain.so"), *link)
    gcc("-o", str(root / "rpath.so"), *link, "-Wl,--disable-new-dtags,-rpath,$ORIGIN/kilnprobe.libs")
    # an extension that needs the NVIDIA driver's library, as upstream's libcaffe2_nvrtc.so does (a stub
    # with its soname stands in for it at link time)
    (root / "driver").mkdir()
    (root / "cuda.c").write_text("int cuInit(unsigned int flags) { return flags; }\n")
    gcc("-o", str(root / "driver" / "libcuda.so.1"), "-Wl,-soname,libcuda.so.1", str(root / "cuda.c"))
    (root / "uses_cuda.c").write_text("int cuInit(unsigned int); int kiln_init(void) { return cuInit(0); }\n")
    gcc(
        "-o",
        str(root / "uses_cuda.so"),
        str(root / "uses_cuda.c"),
        "-L",
        str(root / "driver"),
        "-l:libcuda.so.1",
    )
    libraries = (aux, root / "plain.so", root / "rpath.so", root / "uses_cuda.so")
    return {p.stem: p.read_bytes() for p in libraries} | {"aux_dir": str(root).encode()}


def install(tmp_path: Path, *wheels: Path) -> Path:
    return pip_install_target(tmp_path / "site", *wheels)


def probe_wheel(directory: Path, extension: bytes, **kw: object) -> Path:
    files = {MODULE: extension, **kw.pop("files", {})}  # type: ignore[dict-item]
    return tiny_wheel(directory, "kilnprobe", "1.0", files=files, tag=TAG, **kw)  # type: ignore[arg-type]


def check(site: Path) -> linkage.Linkage:
    index = linkage.installed([str(site)])
    return linkage.check_distribution(index["kilnprobe"], index, linkage.System.of_this_machine())


def imports(site: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"} | {
        "PYTHONPATH": str(site),
        **env,
    }
    return subprocess.run(
        [sys.executable, "-c", "import kilnprobe; print(kilnprobe.answer())"],
        capture_output=True,
        text=True,
        env=environ,
        check=False,
    )


@pytest.mark.integration
def test_library_found_only_through_ld_library_path_is_named(
    compiled: dict[str, bytes], tmp_path: Path
) -> None:
    wheel = probe_wheel(
        tmp_path, compiled["plain"], files={"kilnprobe.py": "from _kilnprobe import answer\n"}
    )
    site = install(tmp_path, wheel)
    # the situation the check exists for: it imports on the machine that has LD_LIBRARY_PATH set, only there
    assert imports(site, LD_LIBRARY_PATH=compiled["aux_dir"].decode()).stdout.strip() == "42"
    without = imports(site)
    assert without.returncode != 0 and "libkilnaux.so: cannot open shared object file" in without.stderr
    found = check(site)
    assert [(e.obj, e.needed) for e in found.unresolved] == [(MODULE, "libkilnaux.so")]
    assert "kilnprobe 1.0: 1 NEEDED entries do not resolve on the target machines" in found.message()
    assert f"cause: {MODULE} needs libkilnaux.so: not bundled" in found.message()


@pytest.mark.integration
def test_library_shipped_behind_an_rpath_resolves(compiled: dict[str, bytes], tmp_path: Path) -> None:
    files = {
        "kilnprobe.py": "from _kilnprobe import answer\n",
        "kilnprobe.libs/libkilnaux.so": compiled["libkilnaux"],
    }
    site = install(tmp_path, probe_wheel(tmp_path, compiled["rpath"], files=files))
    assert imports(site).stdout.strip() == "42"
    found = check(site)
    assert found.unresolved == ()
    (entry,) = [e for e in found.entries if e.obj == MODULE and e.needed == "libkilnaux.so"]
    assert (entry.path, entry.via, entry.kind) == (
        "kilnprobe.libs/libkilnaux.so",
        "RPATH $ORIGIN/kilnprobe.libs",
        "bundled",
    )
    assert (
        "resolve on the target without LD_LIBRARY_PATH" in found.message() and "1 bundled" in found.message()
    )


@pytest.mark.integration
@pytest.mark.parametrize("declared", [True, False], ids=["declared", "undeclared"])
def test_library_of_a_dependency_resolves_only_when_declared(
    compiled: dict[str, bytes], tmp_path: Path, declared: bool
) -> None:
    aux = tiny_wheel(
        tmp_path, "kilnaux", "1.0", files={"kilnaux_lib/libkilnaux.so": compiled["libkilnaux"]}, tag=TAG
    )
    requires = ("kilnaux>=1",) if declared else ()
    files = {"kilnprobe.py": PRELOAD + "from _kilnprobe import answer\n"}
    site = install(tmp_path, aux, probe_wheel(tmp_path, compiled["plain"], files=files, requires=requires))
    assert imports(site).stdout.strip() == "42"  # it works either way, through the preload
    found = check(site)
    if declared:
        assert found.unresolved == ()
        (entry,) = [e for e in found.entries if e.needed == "libkilnaux.so"]
        assert (entry.kind, entry.path) == ("declared", "kilnaux_lib/libkilnaux.so")
        assert entry.via.startswith("loaded first by kilnaux")
    else:  # installed, but nothing says the wheel needs it: another installation will lack it
        assert [(e.obj, e.needed) for e in found.unresolved] == [(MODULE, "libkilnaux.so")]


@pytest.mark.integration
def test_the_nvidia_drivers_library_is_left_to_the_host(compiled: dict[str, bytes], tmp_path: Path) -> None:
    files = {"kilnprobe.py": "", "kilnprobe_cuda.so": compiled["uses_cuda"]}
    site = install(tmp_path, probe_wheel(tmp_path, compiled["plain"], files=files))
    found = check(site)
    (entry,) = [e for e in found.entries if e.needed == "libcuda.so.1"]
    # the driver's on any machine: a GPU node has it with its driver, whatever this machine has
    assert (entry.kind, entry.path) == ("driver", None) and found.driver == (entry,)
    # the driver's library is no excuse for the others: libkilnaux.so is still unresolved
    assert [(e.obj, e.needed) for e in found.unresolved] == [(MODULE, "libkilnaux.so")]


def test_requires_dist_is_followed_with_extras_and_markers(tmp_path: Path) -> None:
    """torch needs cuda-toolkit[cudart,...], which brings nvidia-cuda-runtime through that extra only."""
    wheels = [
        tiny_wheel(tmp_path, "top", "1.0", requires=("kit[rt]==1.0", 'never; sys_platform == "win32"')),
        tiny_wheel(tmp_path, "kit", "1.0", requires=('runtime; extra == "rt"', 'other; extra == "all"')),
        tiny_wheel(tmp_path, "runtime", "1.0"),
        tiny_wheel(tmp_path, "other", "1.0"),
        tiny_wheel(tmp_path, "never", "1.0"),
    ]
    site = tmp_path / "site"
    site.mkdir()
    for wheel in wheels:  # unpacked, as pip would (these are pure-Python wheels)
        shutil.unpack_archive(wheel, site, "zip")
    index = linkage.installed([str(site)])
    assert sorted(linkage.declared_dependencies(index["top"], index)) == ["kit", "runtime"]


def test_the_installed_torch_resolves_everything() -> None:
    index = linkage.installed()
    found = linkage.check_distribution(index["torch"], index, linkage.System.of_this_machine())
    names = {o.rsplit("/", 1)[-1] for o in found.objects}
    assert {"libtorch_cpu.so", "libc10.so", "libtorch_python.so"} <= names
    assert found.unresolved == (), found.message()
    # torch's own libraries find each other (and its libgomp) through their RPATH/RUNPATH ($ORIGIN)
    own = [e for e in found.entries if e.needed == "libc10.so" and e.obj.endswith(".so")]
    assert own and all(e.kind == "bundled" and e.via.startswith(("RPATH", "RUNPATH")) for e in own)


# --- torch.compile: the comparison reports a compile that differs from eager ---------------------------


def sin_plus_cos(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) + torch.cos(x)


def swaps_sin_for_cos(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):  # noqa: ANN201
    """A dynamo backend that miscompiles: the graph it runs has cos where the function has sin."""
    for node in gm.graph.nodes:
        if node.target is torch.sin:
            node.target = torch.cos
    gm.recompile()
    return gm.forward


@pytest.mark.integration
def test_a_compile_that_differs_from_eager_is_reported() -> None:
    x = torch.rand(3, 3, generator=torch.Generator().manual_seed(0))
    verdict = smoke.compile_against_eager(sin_plus_cos, [x], device="cpu", backend=swaps_sin_for_cos)
    assert not verdict.ok
    assert verdict.message.startswith("sin_plus_cos: compiled (swaps_sin_for_cos) differs from eager: ")
    assert "Mismatched elements: 9 / 9" in verdict.message
    fine = smoke.compile_against_eager(sin_plus_cos, [x], device="cpu", backend="aot_eager")
    assert fine.ok, fine.message


@pytest.mark.integration
def test_a_compile_that_generates_no_kernel_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))

    def view_only(x: torch.Tensor) -> torch.Tensor:
        return x.view(-1)

    verdict = smoke.compile_against_eager(view_only, [torch.ones(2, 2)], device="cpu")
    assert not verdict.ok and verdict.message.startswith("view_only: inductor generated no cpu kernel")


# --- oneDNN: a convolution that does not run through it is reported ------------------------------------


def test_convolution_without_onednn_is_reported() -> None:
    with torch.backends.mkldnn.flags(enabled=False):
        ops = smoke.cpu_conv_ops()
    verdict = smoke.onednn_verdict(True, True, ops)
    assert not verdict.ok
    assert "did not run through it" in verdict.message and "aten::_slow_conv2d_forward" in verdict.message
    assert not smoke.onednn_verdict(False, True, smoke.cpu_conv_ops()).ok
    assert smoke.onednn_verdict(True, True, smoke.cpu_conv_ops()).ok


# --- NCCL and MAGMA in the self-checks ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "check", "status", "needle"),
    [
        ({}, "nccl_in_cuda_build", "pass", "libtorch_cuda.so needs libnccl.so.2"),
        ({"nccl_path": None}, "nccl_in_cuda_build", "fail", "expected a path, actual not found"),
        (
            {"nccl_available": False, "nccl_version": None},
            "nccl_in_cuda_build",
            "fail",
            "USE_NCCL=ON in Build settings: torch.cuda.nccl.version() gives no version",
        ),
        (
            {"nccl_version": None, "nccl_error": "RuntimeError: undefined symbol: ncclCommResume"},
            "nccl_in_cuda_build",
            "fail",
            "undefined symbol: ncclCommResume",
        ),
        ({"nccl_needed": None, "nccl_path": None}, "nccl_in_cuda_build", "pass", "linked statically"),
        ({}, "magma_linked", "pass", "MAGMA static in torch/lib/libtorch_cuda_linalg.so"),
        ({"magma_linkage": None}, "magma_linked", "fail", "expected MAGMA linked, actual no MAGMA symbols"),
        ({"has_magma": False}, "magma_linked", "fail", "expected no MAGMA, actual MAGMA static in"),
        ({"has_magma": False, "magma_linkage": None}, "magma_linked", "pass", "no MAGMA"),
        ({"libraries_read": False}, "magma_linked", "skip", "libraries were not read"),
    ],
)
def test_nccl_and_magma_self_checks(changes: dict, check: str, status: str, needle: str) -> None:
    result = buildconfig.self_checks(cuda_facts(**changes))[check]
    assert (result.status, needle in result.message) == (status, True), result.message


def test_nccl_self_check_skips_without_nccl_or_cuda() -> None:
    settings = dict(cuda_facts().settings, USE_NCCL="0")
    assert buildconfig.self_checks(cuda_facts(settings=settings))["nccl_in_cuda_build"].status == "skip"
    cpu = dataclasses.replace(cuda_facts(), cuda_version=None)
    assert {buildconfig.self_checks(cpu)[c].status for c in ("nccl_in_cuda_build", "magma_linked")} == {
        "skip"
    }
