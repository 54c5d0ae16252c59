"""Area 7, torchvision (when installed): it pairs with this torch and its compiled parts work.

A torchvision built against another torch (or without its C++ extension) typically fails at import or at
the first op with ``operator torchvision::nms does not exist``; that is a failure here, not a skip. Not
installed at all: skipped, unless ``--recipe`` was given (the recipe builds torchvision, so it must be
there).
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

import pytest
import torch
from packaging.version import Version

pytestmark = pytest.mark.torchvision


@pytest.fixture(scope="module")
def tv(recipe: object) -> ModuleType:
    if importlib.util.find_spec("torchvision") is None:
        if recipe is not None:
            pytest.fail(
                f"torchvision is not installed, but recipe {getattr(recipe, 'name', '?')} builds "
                f"torchvision {getattr(recipe, 'torchvision_wheel_version', '?')}",
                pytrace=False,
            )
        pytest.skip("torchvision is not installed")
    try:
        return importlib.import_module("torchvision")
    except Exception as exc:  # noqa: BLE001 - e.g. "operator torchvision::nms does not exist"
        pytest.fail(f"import torchvision failed: {type(exc).__name__}: {exc}", pytrace=False)


def expected_torchvision_minor(torch_version: Version) -> str:
    """The torchvision release that pairs with this torch: compat.toml, else upstream's 0.(N+15) rule."""
    from torchkiln.rules import compat

    entry = compat().get("torch", {}).get(f"{torch_version.major}.{torch_version.minor}")
    if entry and "torchvision" in entry:
        return str(entry["torchvision"])
    return f"0.{torch_version.minor + 15}"


def test_version_pairs_with_torch(tv: ModuleType, recipe: object) -> None:
    torch_v, tv_v = Version(torch.__version__), Version(tv.__version__)
    want = expected_torchvision_minor(torch_v)
    assert f"{tv_v.major}.{tv_v.minor}" == want, (
        f"torchvision {tv_v} does not pair with torch {torch_v}: expected torchvision {want}.x"
    )
    if recipe is not None:
        assert str(tv_v) == str(Version(recipe.torchvision_wheel_version)), (  # type: ignore[attr-defined]
            f"torchvision version: expected {recipe.torchvision_wheel_version}, actual {tv_v}"
        )  # type: ignore[attr-defined]


def test_cuda_version_matches_torch(tv: ModuleType) -> None:
    tv_cuda = getattr(getattr(tv, "version", None), "cuda", None)
    assert tv_cuda == torch.version.cuda, (
        f"torchvision was built for CUDA {tv_cuda}, torch for CUDA {torch.version.cuda}"
    )


BOXES = [[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [0, 0, 10, 9]]
SCORES = [0.9, 0.8, 0.7, 0.95]


def _nms(tv: ModuleType, device: str) -> list[int]:
    boxes = torch.tensor(BOXES, dtype=torch.float32, device=device)
    scores = torch.tensor(SCORES, device=device)
    return tv.ops.nms(boxes, scores, 0.5).cpu().tolist()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_nms_runs(tv: ModuleType, device: str) -> None:
    # box 3 (score .95) suppresses boxes 0 and 1 (IoU > .5); box 2 does not overlap.
    assert _nms(tv, device) == [3, 2]
    assert torch.ops.torchvision.nms is not None


def test_png_round_trip(tv: ModuleType) -> None:
    g = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, (3, 24, 32), dtype=torch.uint8, generator=g)
    encoded = tv.io.encode_png(image)
    assert encoded.dtype == torch.uint8 and encoded[:8].tolist() == [137, 80, 78, 71, 13, 10, 26, 10]
    assert torch.equal(tv.io.decode_png(encoded), image)


def test_jpeg_round_trip(tv: ModuleType) -> None:
    image = torch.zeros(3, 32, 32, dtype=torch.uint8)
    image[0, :, :16] = 200  # smooth blocks: JPEG keeps them close
    image[2, 16:, :] = 120
    decoded = tv.io.decode_jpeg(tv.io.encode_jpeg(image, quality=95))
    assert decoded.shape == image.shape
    assert (decoded.int() - image.int()).abs().float().mean().item() < 4.0
