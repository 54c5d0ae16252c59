"""What the verify suite runs only on a GPU machine, checked here without one.

* The CUDA extension the release area builds (``verify/helpers/cuda_extension.py``) compiles with nvcc against
  upstream's CUDA torch headers. The first GPU run (28 Nov 2026, H200, torch 2.11.0+cu130) failed there:
  ``C10_CUDA_KERNEL_LAUNCH_CHECK`` is declared by ``c10/cuda/CUDAException.h``, which ``torch/extension.h`` does
  not include. nvcc compiles without a GPU, so the exact source is compiled here (CUDA 13.0 from NVIDIA's
  wheels, headers of upstream's cu130 wheel; a CPU wheel lacks the generated ``c10/cuda/impl`` header).
* Under ``--require-cuda`` a skipped CUDA check is a failure, except where its reason says the check does not
  apply to this build, torch or GPU (``report.not_applicable``). On the same run the "built without nvJPEG",
  "this build has no flash attention" and MAGMA-retired-op kinds of skip would have failed; every direct
  ``pytest.skip`` in a CUDA check of the suite must therefore say which kind it is (read from its source).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from kit import ROOT
from kit.realtrees import cuda_toolkit, pypi_wheel

VERIFY = ROOT / "verify"

# CUDA checks whose direct skip means CUDA (or the GPU machine) is unusable: under --require-cuda they fail.
CUDA_UNUSABLE_SKIPS: dict[str, str] = {
    "test_cuda_visibility.py::test_pci_bus_order_matches_nvml": "a GPU machine with neither NVML nor nvidia-smi "
    "has no working driver install",
    "test_parity.py::test_computes_what_upstream_computes": "upstream's reference ran no CUDA case: the CUDA "
    "parity this run must show was never measured",
}


def _load_helper() -> object:
    sys.path.insert(0, str(VERIFY / "helpers"))
    try:
        import cuda_extension

        return cuda_extension
    finally:
        sys.path.remove(str(VERIFY / "helpers"))


@pytest.mark.integration
def test_the_cuda_extension_compiles_against_upstreams_cuda_headers(tmp_path: Path) -> None:
    wheel = pypi_wheel("torch===2.13.0", python_version="3.11")  # upstream's cu130 build
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path, [n for n in archive.namelist() if n.startswith("torch/include/")])
    toolkit = cuda_toolkit()
    include = tmp_path / "torch" / "include"
    dirs = [include, include / "torch" / "csrc" / "api" / "include", toolkit / "include"]
    dirs.append(Path(sysconfig.get_paths()["include"]))  # torch/extension.h includes Python.h
    source = tmp_path / "cuda.cu"
    source.write_text(_load_helper().CUDA_SOURCE)
    # the flags torch.utils.cpp_extension gives nvcc for a load_inline build, for one capability
    argv = [str(toolkit / "bin" / "nvcc"), "-std=c++17", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC"]
    argv += ["-DTORCH_EXTENSION_NAME=kiln_cuda_extension", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    argv += ["-gencode=arch=compute_90,code=sm_90", "-c", str(source), "-o", str(tmp_path / "cuda.o")]
    argv += [arg for d in dirs for arg in ("-isystem", str(d))]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "cuda.o").stat().st_size > 0


def _is_cuda_check(function: ast.FunctionDef) -> bool:
    """Marked ``cuda`` itself or through a parameter (``pytest.param(..., marks=pytest.mark.cuda)``, ``CUDA``)."""
    for decorator in function.decorator_list:
        text = ast.unparse(decorator)
        if "mark.cuda" in text or any(
            isinstance(n, ast.Name) and n.id == "CUDA" for n in ast.walk(decorator)
        ):
            return True
    return False


def _skip_reason_kind(call: ast.Call) -> str:
    reason = call.args[0] if call.args else None
    if isinstance(reason, ast.Call) and ast.unparse(reason.func) == "report.not_applicable":
        return "not_applicable"
    return "unusable"


def _direct_skips() -> list[tuple[str, str, int]]:
    """(file::function, kind, line) of every pytest.skip inside a CUDA check of the suite."""
    found = []
    for path in sorted(VERIFY.glob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and _is_cuda_check(n)):
            for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
                if ast.unparse(call.func) == "pytest.skip":
                    found.append((f"{path.name}::{function.name}", _skip_reason_kind(call), call.lineno))
    return found


def test_the_rule_finds_the_cuda_checks_that_skip() -> None:
    """The reader sees every kind of CUDA marking the suite uses (a rule that finds nothing proves nothing)."""
    names = {name for name, _, _ in _direct_skips()}
    assert {
        "test_release.py::test_cuda_sdpa_backend_matches_math",
        "test_torchvision.py::test_nvjpeg_decodes_on_the_gpu",
        "test_cuda_visibility.py::test_invalid_device_ordinal_raises",
    } <= names


def test_every_direct_skip_of_a_cuda_check_says_whether_cuda_is_unusable() -> None:
    """A skip that is not ``report.not_applicable(...)`` fails under --require-cuda: it must be one that means
    CUDA is unusable, listed with why in CUDA_UNUSABLE_SKIPS."""
    wrong = [
        f"verify/{name}:{line}"
        for name, kind, line in _direct_skips()
        if kind == "unusable" and name not in CUDA_UNUSABLE_SKIPS
    ]
    assert not wrong, f"say report.not_applicable(...) or list it in CUDA_UNUSABLE_SKIPS: {wrong}"


def test_a_not_applicable_reason_is_its_own_skip_kind() -> None:
    from torchkiln.verify import report

    reason = report.not_applicable("built without MAGMA (torch.cuda.has_magma is False)")
    assert reason.startswith(report.NOT_APPLICABLE) and report.skip_kind(reason) == "not_applicable"


# Both of torch's MAGMA warnings, verbatim from the GPU run of 28 Nov 2026 (upstream's 2.11.0+cu130, H200):
# the one on preferring MAGMA (Context.cpp:422) and svd's own (BatchLinearAlgebra.cpp:724).
PREFERRING_MAGMA = (
    "The usage of MAGMA backend for linear algebra operations is deprecated and will be removed in future "
    "releases. cuSOLVER stays as the default backend.If you see any error messages with cuSOLVER but not MAGMA, "
    "please, file an issue on GitHub. (Triggered internally at /pytorch/aten/src/ATen/Context.cpp:422.)"
)
SVD_LEFT_MAGMA = (
    "linalg.svd: MAGMA, as a linear algebra backend, is deprecated and will be removed in future releases. "
    "linalg.svd will try dispatching to cuSOLVER instead. If you see any error messages, please, file an issue "
    "on GitHub. (Triggered internally at /pytorch/aten/src/ATen/native/cuda/linalg/BatchLinearAlgebra.cpp:724.)"
)
OPS = ["linalg.svd", "linalg.lu_factor", "linalg.lu_solve", "linalg.cholesky", "cholesky_solve",
       "cholesky_inverse", "linalg.qr", "linalg.eigh", "linalg.eig", "linalg.solve_triangular",
       "linalg.ldl_factor"]  # fmt: skip


@pytest.mark.parametrize("op", OPS)
def test_an_op_has_left_magma_only_when_torch_says_so_of_that_op(op: str) -> None:
    from torchkiln.verify import smoke

    assert smoke.magma_retirement(op, [PREFERRING_MAGMA]) is None  # said of MAGMA as a whole, not of the op
    own = SVD_LEFT_MAGMA.replace("linalg.svd", op)
    assert smoke.magma_retirement(op, [PREFERRING_MAGMA, own]) == own
    for other in OPS:  # cholesky's warning does not retire cholesky_solve, nor eig's eigh
        if other != op:
            assert smoke.magma_retirement(op, [SVD_LEFT_MAGMA.replace("linalg.svd", other)]) is None
    assert smoke.magma_retirement(op, [own.replace("deprecated", "fine")]) is None
