"""Area 1, build config: what the build says about itself, and whether that is what the recipe asked for.

``torch.__config__.show()`` (the Build settings line) and the structured probes are parsed into facts;
with ``--recipe`` each recipe field is compared and a mismatch fails naming expected and actual. Also the
CPU checks of PyTorch's own ``smoke_test.py`` / ``check_binary.sh`` (OpenMP, conv2d variants, linalg, SDPA).
"""

from __future__ import annotations

import pytest
import torch

from torchkiln.verify import buildconfig, provenance
from torchkiln.verify.comparison import Comparison

pytestmark = pytest.mark.build_config


@pytest.fixture(scope="module")
def facts() -> buildconfig.BuildFacts:
    return buildconfig.collect_facts()


def _assert_check(check: Comparison) -> None:
    if check.status == "skip":
        pytest.skip(check.message)
    if check.status != "pass":
        pytest.fail(check.message, pytrace=False)


def test_build_settings_parse(facts: buildconfig.BuildFacts) -> None:
    settings = facts.settings
    for key in ("TORCH_VERSION", "BUILD_TYPE", "USE_CUDA", "BLAS_INFO"):
        assert key in settings, f"Build settings lack {key}: {sorted(settings)}"
    assert all(k.isupper() for k in settings), sorted(settings)


@pytest.mark.parametrize("check_id", buildconfig.SELF_CHECKS)
def test_build_is_consistent(facts: buildconfig.BuildFacts, check_id: str) -> None:
    _assert_check(buildconfig.self_checks(facts)[check_id])


@pytest.mark.parametrize("check_id", buildconfig.RECIPE_CHECKS)
def test_build_matches_recipe(facts: buildconfig.BuildFacts, recipe: object, check_id: str) -> None:
    if recipe is None:
        pytest.skip("no --recipe given: nothing to compare the build with")
    _assert_check(buildconfig.recipe_checks(recipe, facts)[check_id])  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def manifest_results(facts: buildconfig.BuildFacts, manifest: object) -> dict[str, Comparison]:
    if manifest is None:
        pytest.skip("no --manifest given: nothing to compare the installed wheels with")
    return provenance.manifest_checks(manifest, facts)  # type: ignore[arg-type]


@pytest.mark.parametrize("project", ["torch", "torchvision"])
@pytest.mark.parametrize("check_id", provenance.MANIFEST_CHECKS)
def test_installed_wheels_match_manifest(
    manifest_results: dict[str, Comparison], project: str, check_id: str
) -> None:
    key = f"{project}.{check_id}"
    if key not in manifest_results:
        pytest.skip(f"the manifest lists no {project} wheel")
    _assert_check(manifest_results[key])


# --- smoke_test.py / check_binary.sh, CPU parts -------------------------------------------------------


def test_parallel_info_reports_threads() -> None:
    info = torch.__config__.parallel_info()
    assert "ATen/Parallel" in info and "at::get_num_threads()" in info, info


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kernel_size": 3, "stride": 2},
        {"kernel_size": (3, 5), "stride": (2, 1), "padding": (4, 2)},
        {"kernel_size": (3, 5), "stride": (2, 1), "padding": (4, 2), "dilation": (3, 1)},
    ],
    ids=["square", "non-square-padded", "dilated"],
)
def test_conv2d_cpu_matches_reference(kwargs: dict) -> None:
    """smoke_test_conv2d on CPU, checked against an explicit unfold + matmul (a different code path)."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(16, 33, **kwargs).double()
    x = torch.randn(4, 16, 20, 30, dtype=torch.float64)
    y = conv(x)
    cols = torch.nn.functional.unfold(
        x, conv.kernel_size, dilation=conv.dilation, padding=conv.padding, stride=conv.stride
    )
    ref = (conv.weight.view(33, -1) @ cols + conv.bias.view(1, 33, 1)).view(y.shape)
    torch.testing.assert_close(y, ref)


def test_linalg_svd_cpu() -> None:
    """smoke_test.test_linalg: full and reduced SVD shapes, batched reconstruction."""
    torch.manual_seed(0)
    a = torch.randn(5, 3, dtype=torch.float64)
    u, s, vh = torch.linalg.svd(a, full_matrices=True)
    assert (u.shape, s.shape, vh.shape) == ((5, 5), (3,), (3, 3))
    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    assert (u.shape, s.shape, vh.shape) == ((5, 3), (3,), (3, 3))
    torch.testing.assert_close(a, u @ torch.diag(s) @ vh)
    b = torch.randn(7, 5, 3, dtype=torch.float64)
    u, s, vh = torch.linalg.svd(b, full_matrices=False)
    torch.testing.assert_close(b, u @ torch.diag_embed(s) @ vh)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_sdpa_cpu_no_nan(dtype: torch.dtype) -> None:
    """smoke_test.test_sdpa: scaled_dot_product_attention with a mask gives finite output."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, dtype=dtype) for _ in range(3))
    mask = torch.ones(16, 16, dtype=torch.bool).tril()
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert out.shape == (2, 4, 16, 8)
    assert not torch.isnan(out).any()
    ref = (
        torch.softmax(
            (q.float() @ k.float().transpose(-1, -2) / 8**0.5).masked_fill(~mask, float("-inf")), -1
        )
        @ v.float()
    )
    torch.testing.assert_close(out.float(), ref, atol=3e-2 if dtype == torch.bfloat16 else 1e-5, rtol=1e-2)


def test_numpy_interop() -> None:
    """smoke_test.test_numpy: a build without NumPy support fails here when NumPy is installed."""
    np = pytest.importorskip("numpy", reason="NumPy is not installed (torch does not require it)")
    assert torch.tensor(np.arange(5)).tolist() == [0, 1, 2, 3, 4]
    assert (torch.arange(3).numpy() == np.arange(3)).all()
