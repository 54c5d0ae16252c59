"""Area release: what upstream's release engineering checks on every wheel before it ships.

From ``.ci/pytorch/check_binary.sh``: every shared object of torch and torchvision finds its libraries with
``LD_LIBRARY_PATH`` unset, on the machines it is deployed to as well as on this one: through what the wheel
bundles, its declared dependencies' libraries, the system libraries a manylinux policy allows, the NVIDIA
driver's, or those the recipe's ``[deploy] system_libraries`` promises; never through what only this machine's
system directories hold (docs/portability.md);
oneDNN is there and a CPU convolution runs through it. A CPU matmul gives exactly the integer product (the BLAS computes, not only loads). From
``.ci/pytorch/smoke_test/smoke_test.py``:
``torch.compile`` (inductor: C++ on the CPU with the host compiler, triton on CUDA) compiles a function and a
module whose outputs equal eager; on a GPU, conv2d in fp16/fp32/fp64, a batched SVD of the size upstream
uses (cuSOLVER and MAGMA) and scaled-dot-product attention on each backend the build has (flash,
memory-efficient, cuDNN). The verdicts come from :mod:`torchkiln.verify.smoke` and
:mod:`torchkiln.verify.linkage`, whose negative controls are in torchkiln's own tests.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator

import pytest
import torch

from torchkiln.verify import buildconfig, imported, linkage, smoke
from torchkiln.verify.comparison import flag

pytestmark = pytest.mark.release

CUDA = pytest.param("cuda", marks=pytest.mark.cuda)
DTYPES = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64}


# --- libraries resolve without LD_LIBRARY_PATH (check_binary.sh) --------------------------------------


@pytest.fixture(scope="module")
def installed() -> tuple[dict[str, linkage.Distribution], linkage.System]:
    return linkage.installed(), linkage.System.of_this_machine()


@pytest.mark.parametrize("project", ["torch", "torchvision"])
def test_libraries_resolve_without_ld_library_path(
    installed: tuple[dict[str, linkage.Distribution], linkage.System], project: str, recipe: object
) -> None:
    """The libraries of the package ``import`` loads: the installed distribution's, or the copy that shadows
    it (:mod:`torchkiln.verify.imported`), which is then what is read."""
    index, system = installed
    if project not in index:
        pytest.skip(f"{project} is not installed as a distribution (no RECORD lists its libraries)")
    deploy = getattr(recipe, "deploy", None)
    target = getattr(deploy, "system_libraries", ())
    found_at = imported.find(project, index[project])
    dist = imported.as_distribution(found_at, index[project])
    label = f"{project} imported from {found_at.package}" if found_at.shadowed else None
    found = linkage.check_distribution(dist, index, system, target=target, label=label)
    assert found.objects, f"{project}: RECORD lists no shared object"
    if found.unresolved:
        pytest.fail(found.message(), pytrace=False)


@pytest.mark.parametrize("project", ["torch", "torchvision"])
def test_the_imported_package_is_the_installed_one(
    installed: tuple[dict[str, linkage.Distribution], linkage.System], project: str
) -> None:
    """``import torch`` / ``import torchvision`` load the installed distribution's files, not a copy earlier
    on the import path (PYTHONPATH, a source tree in the working directory, an overlay): every other check
    judges what is imported, which would then not be the wheel."""
    index, _ = installed
    if project not in index:
        pytest.skip(f"{project} is not installed as a distribution (no RECORD lists its files)")
    found_at = imported.find(project, index[project])
    if found_at.shadowed:
        pytest.fail(found_at.message(), pytrace=False)


# --- the CPU BLAS computes (smoke_test.py multiplies matrices; a BLAS that loads but computes wrong passes -----
# every check above: seen with upstream's aarch64 wheel under qemu's default 512-bit SVE, whose NVPL sgemm gave
# a 3x4 x @ x.T the trace 80 instead of 506) ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(3, 4), (67, 45)], ids=["3x4", "67x45"])
def test_cpu_matmul_is_exact_on_small_integers(shape: tuple[int, int], dtype: str) -> None:
    """``x @ x.T`` of small integers is exact in float32 and float64 (every sum stays below 2**24), so the BLAS
    (MKL, OpenBLAS, NVPL) must give exactly the product Python's integers give: the small case takes the
    BLAS's small-matrix path, the odd-sized one its blocked kernels with edge tiles."""
    rows, cols = shape
    values = [[(r * 7 + c * 3) % 11 - 5 for c in range(cols)] for r in range(rows)]
    want = [[sum(a * b for a, b in zip(x, y, strict=True)) for y in values] for x in values]
    x = torch.tensor(values, dtype=DTYPES[dtype])
    got = (x @ x.T).tolist()
    wrong = [
        (i, j, got[i][j], want[i][j]) for i in range(rows) for j in range(rows) if got[i][j] != want[i][j]
    ]
    assert not wrong, f"{len(wrong)} of {rows * rows} entries wrong, e.g. (row, col, got, want) {wrong[:3]}"


# --- oneDNN on the CPU (check_binary.sh: MKL-DNN on aarch64, MKL on x86; both ship it) -----------------


def test_onednn_runs_cpu_convolution() -> None:
    settings = buildconfig.parse_build_settings(torch.__config__.show())
    claimed = flag(settings.get("USE_MKLDNN"))
    if claimed is False:
        pytest.skip(f"built without oneDNN (Build settings USE_MKLDNN={settings['USE_MKLDNN']})")
    verdict = smoke.onednn_verdict(torch.backends.mkldnn.is_available(), claimed, smoke.cpu_conv_ops())
    assert verdict.ok, verdict.message


# --- torch.compile (smoke_test.py: smoke_test_compile) ------------------------------------------------


@pytest.fixture(scope="module")
def inductor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A C++ compiler for inductor, and a fresh inductor cache: each run compiles for real (a warm cache
    would pass on a machine whose compiler no longer works)."""
    compiler = smoke.cxx_compiler()
    if compiler is None:
        pytest.skip(
            "torch.compile needs a C++ compiler on this machine (inductor runs $CXX or g++), and there is "
            "none: the runtime images ship no compiler"
        )
    saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("inductor"))
    try:
        yield compiler
    finally:
        torch._dynamo.reset()
        if saved is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved


def sin_plus_cos(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) + torch.cos(x)


class Net(torch.nn.Module):
    """smoke_test.py's Net, smaller: convolution, pooling, a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, 1)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, 1)
        self.fc1 = torch.nn.Linear(16 * 12 * 12, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.fc1(torch.flatten(torch.nn.functional.max_pool2d(x, 2), 1))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_compiled_function_equals_eager(inductor: str, device: str, dtype: str) -> None:
    x = torch.rand(3, 3, generator=torch.Generator().manual_seed(0)).to(device=device, dtype=DTYPES[dtype])
    verdict = smoke.compile_against_eager(sin_plus_cos, [x], device=device)
    assert verdict.ok, verdict.message


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_compiled_module_equals_eager(inductor: str, device: str) -> None:
    torch.manual_seed(0)
    net = Net().to(device).eval()
    x = torch.rand(4, 1, 28, 28, generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        verdict = smoke.compile_against_eager(net, [x], device=device)
    assert verdict.ok, verdict.message


def test_inductor_finds_a_vector_isa(inductor: str) -> None:
    """smoke_test.py: "Can't detect vectorized ISA for CPU" fails a release."""
    from torch._inductor.codecache import pick_vec_isa

    isa = pick_vec_isa()
    assert isa, "inductor detected no vector ISA (its CPU kernels would be scalar)"


# --- CUDA: conv2d per dtype, batched SVD, attention backends (smoke_test.py, check_binary.sh) ----------

TOLERANCE = {  # against the CPU in float64; cuDNN may use TF32 for float32 (torch.backends.cudnn.allow_tf32)
    torch.float16: 1e-2,
    torch.float32: 5e-3,
    torch.float64: 1e-10,
}


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_cuda_conv2d_matches_cpu(dtype: str) -> None:
    """smoke_test_conv2d: the dilated, padded, strided Conv2d on CUDA (and once under autocast)."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(16, 33, (3, 5), stride=(2, 1), padding=(4, 2), dilation=(3, 1)).double()
    x = torch.randn(20, 16, 50, 100, dtype=torch.float64)
    with torch.no_grad():
        expected = conv(x)
        cuda_conv = conv.to(device="cuda", dtype=DTYPES[dtype])
        got = cuda_conv(x.to(device="cuda", dtype=DTYPES[dtype]))
        if dtype == "float32":
            with torch.autocast("cuda"):
                assert cuda_conv(x.to(device="cuda", dtype=torch.float32)).dtype == torch.float16
    tol = TOLERANCE[DTYPES[dtype]]
    torch.testing.assert_close(got.double().cpu(), expected, rtol=tol, atol=tol)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("library", ["cusolver", "magma"])
def test_cuda_batched_svd(library: str, dtype: str) -> None:
    """test_linalg('cuda'): SVD of a (20, 16, 50, 100) batch, through each library the build has; the
    singular values against LAPACK's on the CPU, the factors against the input."""
    if library == "magma" and not torch.cuda.has_magma:
        pytest.skip("built without MAGMA (torch.cuda.has_magma is False)")
    a = torch.randn(20, 16, 50, 100, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    previous = torch.backends.cuda.preferred_linalg_library()
    torch.backends.cuda.preferred_linalg_library(library)
    try:
        u, s, vh = torch.linalg.svd(a.to(device="cuda", dtype=DTYPES[dtype]), full_matrices=False)
        torch.cuda.synchronize()
    finally:
        torch.backends.cuda.preferred_linalg_library(previous)
    tol = 1e-3 if dtype == "float32" else 1e-9
    torch.testing.assert_close(s.double().cpu(), torch.linalg.svdvals(a), rtol=tol, atol=tol)
    torch.testing.assert_close(((u * s.unsqueeze(-2)) @ vh).double().cpu(), a, rtol=tol, atol=tol)


# (the backend, whether this build has it, the compute capabilities it runs on: torch's own ranges,
# aten/src/ATen/native/transformers/cuda/sdp_utils.cpp check_*_hardware_support: flash and cuDNN
# [sm80, sm121], memory-efficient [sm50, sm121]). Memory-efficient attention is in every CUDA build unless
# USE_MEM_EFF_ATTENTION=0, which torch does not report.
SDPA = {
    "flash": ("FLASH_ATTENTION", lambda: torch.backends.cuda.is_flash_attention_available(), (8, 0), (12, 1)),
    "efficient": ("EFFICIENT_ATTENTION", lambda: True, (5, 0), (12, 1)),
    "cudnn": ("CUDNN_ATTENTION", lambda: torch.backends.cudnn.is_available(), (8, 0), (12, 1)),
}


@pytest.mark.cuda
@pytest.mark.parametrize("backend", list(SDPA))
def test_cuda_sdpa_backend_matches_math(backend: str) -> None:
    """test_sdpa('cuda'), per backend: only that backend enabled (so nothing falls back), causal fp16
    attention against the math backend in float32."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    name, built, lowest, highest = SDPA[backend]
    capability = torch.cuda.get_device_capability()
    if not built():
        pytest.skip(f"this build has no {backend} attention")
    if not lowest <= capability <= highest:
        pytest.skip(
            f"{backend} attention runs on sm_{lowest[0]}{lowest[1]} to sm_{highest[0]}{highest[1]}; this GPU is "
            f"sm_{capability[0]}{capability[1]}"
        )
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 128, 64, generator=generator) for _ in range(3))
    with warnings.catch_warnings(record=True) as caught, sdpa_kernel([getattr(SDPBackend, name)]):
        warnings.simplefilter("always")
        try:
            out = torch.nn.functional.scaled_dot_product_attention(
                *(t.to(device="cuda", dtype=torch.float16) for t in (q, k, v)), is_causal=True
            )
        except RuntimeError as exc:
            reasons = "; ".join(str(w.message) for w in caught)
            pytest.fail(
                f"{backend} attention did not run on sm_{capability[0]}{capability[1]}: {exc} ({reasons})"
            )
    with sdpa_kernel([SDPBackend.MATH]):
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out.float().cpu(), expected, rtol=1e-2, atol=1e-2)
