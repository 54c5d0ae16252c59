"""Area 7, torchvision (when installed): it pairs with this torch and its compiled parts work.

A torchvision built against another torch (or without its C++ extension) typically fails at import or at
the first op with ``operator torchvision::nms does not exist``; that is a failure here, not a skip. Not
installed at all: skipped, unless ``--recipe`` was given (the recipe builds torchvision, so it must be
there).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from types import ModuleType

import pytest
import torch

from torchkiln.verify import buildconfig, buildconfig_torchvision, facts
from torchkiln.verify.comparison import Comparison

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
def vision_checks(tv: ModuleType, recipe: object) -> dict[str, Comparison]:
    """The comparisons torchkiln's post-build check makes too (torchkiln.verify.buildconfig_torchvision)."""
    return buildconfig_torchvision.torchvision_checks(recipe, buildconfig.collect_facts())  # type: ignore[arg-type]


def _assert_check(check: Comparison) -> None:
    if check.status == "skip":
        pytest.skip(check.message)
    if check.status != "pass":
        pytest.fail(check.message, pytrace=False)


def test_version_pairs_with_torch(vision_checks: dict[str, Comparison]) -> None:
    _assert_check(vision_checks["pairs_torch"])


def test_version_is_the_recipes(vision_checks: dict[str, Comparison]) -> None:
    _assert_check(vision_checks["version"])


def test_commit_is_the_recipes(vision_checks: dict[str, Comparison]) -> None:
    _assert_check(vision_checks["commit"])


def test_cuda_version_matches_torch(vision_checks: dict[str, Comparison]) -> None:
    """torchvision 0.28/0.29 report CUDA as an int (13000), torch as '13.0': compared as major.minor."""
    _assert_check(vision_checks["cuda"])


def test_compiled_ops_loaded(vision_checks: dict[str, Comparison]) -> None:
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


# -- optional parts: exactly those the recipe builds ([torchvision.features]) ------------------------------
# Without a recipe, what upstream's wheels have: PNG, JPEG and WebP always, nvJPEG with CUDA, no video.
NOT_COMPILED = facts.NOT_COMPILED


def test_optional_parts_are_the_recipes(vision_checks: dict[str, Comparison]) -> None:
    """Each part used once (torchkiln.verify.facts.probe_parts), against [torchvision.features]: the same
    comparison the build's post-build check makes. The tests below also check what each part does."""
    _assert_check(vision_checks["features"])


def vision_part_expected(recipe: object, part: str) -> bool:
    """Whether torchvision must have ``part`` (png, jpeg, webp, nvjpeg, video_codec, ffmpeg)."""
    return buildconfig_torchvision.expected_parts(recipe, torch.version.cuda is not None)[part]  # type: ignore[arg-type]


def check_part(recipe: object, part: str, use: Callable[[], object]) -> object:
    """Run ``use``: it must work when the part is expected, and fail as 'not compiled with ... support'
    when it is not. Returns what ``use`` returned (None when the part is absent as expected)."""
    if vision_part_expected(recipe, part):
        return use()
    with pytest.raises(RuntimeError, match=NOT_COMPILED):
        use()
    return None


def test_png_round_trip(tv: ModuleType, recipe: object) -> None:
    g = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, (3, 24, 32), dtype=torch.uint8, generator=g)
    encoded = check_part(recipe, "png", lambda: tv.io.encode_png(image))
    if encoded is None:
        return
    assert encoded.dtype == torch.uint8 and encoded[:8].tolist() == [137, 80, 78, 71, 13, 10, 26, 10]
    assert torch.equal(tv.io.decode_png(encoded), image)


def test_jpeg_round_trip(tv: ModuleType, recipe: object) -> None:
    image = torch.zeros(3, 32, 32, dtype=torch.uint8)
    image[0, :, :16] = 200  # smooth blocks: JPEG keeps them close
    image[2, 16:, :] = 120
    encoded = check_part(recipe, "jpeg", lambda: tv.io.encode_jpeg(image, quality=95))
    if encoded is None:
        return
    decoded = tv.io.decode_jpeg(encoded)
    assert decoded.shape == image.shape
    assert (decoded.int() - image.int()).abs().float().mean().item() < 4.0


WEBP_2X2 = facts.WEBP_2X2  # red, green / blue, white


def test_webp_decode(tv: ModuleType, recipe: object) -> None:
    data = torch.frombuffer(bytearray(WEBP_2X2), dtype=torch.uint8)
    decoded = check_part(recipe, "webp", lambda: tv.io.decode_webp(data))
    if decoded is None:
        return
    pixels = decoded.permute(1, 2, 0).reshape(-1, 3).tolist()
    assert pixels == [[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 255]]


def test_nvjpeg_is_compiled_in_exactly_when_asked_for(tv: ModuleType, recipe: object) -> None:
    """GPU-less: the CUDA decoder is reached; built without nvJPEG it says so, built with it the failure (no
    GPU, no driver here) comes from CUDA, not from a missing nvJPEG."""
    if not vision_part_expected(recipe, "jpeg"):
        pytest.skip("no JPEG support to feed the GPU decoder with")
    data = tv.io.encode_jpeg(torch.zeros(3, 8, 8, dtype=torch.uint8))
    try:
        decoded = torch.ops.image.decode_jpegs_cuda([data], 0, torch.device("cuda"))
    except Exception as exc:  # noqa: BLE001 - RuntimeError or torch.AcceleratorError, by torch version
        missing = NOT_COMPILED.search(str(exc)) is not None
        assert missing != vision_part_expected(recipe, "nvjpeg"), f"nvJPEG decode_jpeg(device='cuda'): {exc}"
    else:
        assert vision_part_expected(recipe, "nvjpeg") and decoded[0].shape == (3, 8, 8)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=pytest.mark.cuda)])
def test_nvjpeg_decodes_on_the_gpu(tv: ModuleType, recipe: object, device: str) -> None:
    if not vision_part_expected(recipe, "nvjpeg"):
        pytest.skip("torchvision is built without nvJPEG")
    image = torch.zeros(3, 32, 32, dtype=torch.uint8)
    image[1, 8:24, 8:24] = 180
    decoded = tv.io.decode_jpeg(tv.io.encode_jpeg(image, quality=95), device=device)
    assert decoded.is_cuda and decoded.shape == image.shape
    assert (decoded.cpu().int() - image.int()).abs().float().mean().item() < 4.0


def test_video_decoders_are_exactly_those_asked_for(tv: ModuleType, recipe: object) -> None:
    """torchvision.io reports its CPU (FFmpeg) and GPU video decoders; 0.24+ has neither."""
    built = {
        "ffmpeg": bool(getattr(tv.io, "_HAS_CPU_VIDEO_DECODER", False)),
        "video_codec": bool(getattr(tv.io, "_HAS_GPU_VIDEO_DECODER", False)),
    }
    assert built == {part: vision_part_expected(recipe, part) for part in built}
