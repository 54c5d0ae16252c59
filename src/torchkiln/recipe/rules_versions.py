"""Recipe rules on versions: the torch release is known, torchvision and the Pythons pair with it, the
wheel's own version (PYTORCH_BUILD_VERSION) is torch's, and torchvision's features exist in its release.
Rows of :data:`torchkiln.recipe.rules.RULES`.
"""

from __future__ import annotations

from collections.abc import Iterator

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from .compat import compat, minor, torch_release, vision_pairing, vision_pairs
from .model import Recipe
from .rules_violations import Violation, rule, torch_range


@rule("torch-known", "the torch release has compatibility data", ("torch.version",))
def _known_torch(r: Recipe) -> Iterator[Violation]:
    if torch_release(r) is None:
        known = ", ".join(f"{v}.x" for v in compat()["torch"])
        yield ("torch.version", f"torch {r.torch.version} has no compatibility data", known)


@rule(
    "torchvision-pairs-torch",
    "torchvision pairs with torch as data/compat.toml says (0.(N+15) with 2.N up to 2.14)",
    ("torch.version", "torchvision.version"),
)
def _vision_pairs_torch(r: Recipe) -> Iterator[Violation]:
    release = torch_release(r)
    if release is None:
        return
    if not vision_pairs(release, r.torchvision.version):
        yield (
            "torchvision.version",
            f"torchvision {r.torchvision.version} does not pair with torch {r.torch.version}",
            f"{vision_pairing(release)} (data/compat.toml: 0.(N+15) pairs with torch 2.N up to 2.14; 2.15 "
            "with 0.29, torch's stable ABI)",
        )


def _python_field(r: Recipe) -> str:
    """The field that names the recipe's Pythons: what a finding about one of them reports on."""
    return "python.versions" if r.pythons else "python.version"


@rule("python-range", "Python is within the torch release's supported range", ("torch.version", "python"))
def _python_range(r: Recipe) -> Iterator[Violation]:
    for python in r.python_versions:
        yield from torch_range(
            r, "python", _python_field(r), f"Python {python}", Version(python.removesuffix("t"))
        )


@rule(
    "python-free-threaded",
    "a free-threaded Python (3.13t) only where the torch release ships wheels for it",
    ("torch.version", "python"),
)
def _free_threaded(r: Recipe) -> Iterator[Violation]:
    """A free-threaded Python (``3.13t``) only for a release that ships wheels for it (data/compat.toml
    ``free_threaded``): its C API differs, and a release that never built for it is not known to."""
    release = torch_release(r)
    if release is None:
        return
    shipped = release["free_threaded"]
    for python in r.python_versions:
        base = python.removesuffix("t")
        if (
            python.endswith("t")
            and python not in shipped
            and Version(base) in SpecifierSet(release["python"])
        ):
            yield (
                _python_field(r),
                f"Python {python} (free-threaded): torch {minor(r.torch.version)} ships no cp{base.replace('.', '')}t "
                "wheels",
                f"the free-threaded Pythons of torch {minor(r.torch.version)}: {', '.join(shipped) or 'none'}"
                f"; or Python {base}",
            )


@rule(
    "build-version-pair",
    "PYTORCH_BUILD_VERSION and PYTORCH_BUILD_NUMBER together or not at all",
    ("build.pytorch_build_version", "build.pytorch_build_number", "build.local_version", "torch.version"),
)
def _build_version_pair(r: Recipe) -> Iterator[Violation]:
    have_version = r.build.pytorch_build_version is not None
    have_number = r.build.pytorch_build_number is not None
    if have_version != have_number:
        missing = "build.pytorch_build_number" if have_version else "build.pytorch_build_version"
        yield (
            missing,
            "PYTORCH_BUILD_VERSION and PYTORCH_BUILD_NUMBER are set together or not at all",
            "set both, or neither",
        )
    if have_version and r.build.local_version:
        yield (
            "build.local_version",
            "conflicts with build.pytorch_build_version, which sets the whole version",
            "put the local label into pytorch_build_version, or drop it",
        )
    if r.build.pytorch_build_version and Version(r.build.pytorch_build_version).base_version != str(
        r.torch.version
    ):
        yield (
            "build.pytorch_build_version",
            f"{r.build.pytorch_build_version} is not torch {r.torch.version}",
            f"{r.torch.version} with an optional +local label",
        )


# torchvision's video decoders: "deprecated from version 0.22 and will be removed in version 0.24" (the 0.28.0
# wheel's torchvision/io/_video_deprecation_warning.py); 0.28/0.29 wheels have neither decoder.
VIDEO_DECODERS_REMOVED = Version("0.24")


@rule(
    "torchvision-features",
    "nvJPEG and the GPU video decoder need CUDA; no video decoders from torchvision 0.24",
    ("torchvision.features", "accelerator.kind", "torchvision.version"),
)
def _vision_features(r: Recipe) -> Iterator[Violation]:
    features = r.vision
    for name in ("nvjpeg", "video_codec"):
        if getattr(features, name) and not r.accelerator.is_cuda:
            yield (
                f"torchvision.features.{name}",
                "needs CUDA (it is built against the CUDA toolkit)",
                'false, or accelerator.kind = "cuda"',
            )
    if r.torchvision.version >= VIDEO_DECODERS_REMOVED:
        for name in ("video_codec", "ffmpeg"):
            if getattr(features, name):
                yield (
                    f"torchvision.features.{name}",
                    f"torchvision {r.torchvision.version} has no video decoders (removed in 0.24)",
                    "false",
                )
