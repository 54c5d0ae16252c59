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

from torchkiln.verify import buildconfig

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


@pytest.fixture(scope="module")
def vision_checks(tv: ModuleType, recipe: object) -> dict[str, buildconfig.Check]:
    """The comparisons torchkiln's post-build check makes too (torchkiln.verify.buildconfig)."""
    return buildconfig.torchvision_checks(recipe, buildconfig.collect_facts())  # type: ignore[arg-type]


def _assert_check(check: buildconfig.Check) -> None:
    if check.status == "skip":
        pytest.skip(check.message)
    if check.status != "pass":
        pytest.fail(check.message, pytrace=False)


def test_version_pairs_with_torch(vision_checks: dict[str, buildconfig.Check]) -> None:
    _assert_check(vision_checks["pairs_torch"])


def test_version_is_the_recipes(vision_checks: dict[str, buildconfig.Check]) -> None:
    _assert_check(vision_checks["version"])


def test_commit_is_the_recipes(vision_checks: dict[str, buildconfig.Check]) -> None:
    _assert_check(vision_checks["commit"])


def test_cuda_version_matches_torch(vision_checks: dict[str, buildconfig.Check]) -> None:
    """torchvision 0.28/0.29 report CUDA as an int (13000), torch as '13.0': compared as major.minor."""
    _assert_check(vision_checks["cuda"])


def test_compiled_ops_loaded(vision_checks: dict[str, buildconfig.Check]) -> None:
    """Its C++ ops library loaded: _C.so (0.28) or _C_stable.so (0.29, torch's stable ABI)."""
    _assert_check(vision_checks["ops"])


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
