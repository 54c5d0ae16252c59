"""torchvision's checks: it pairs with this torch, is the recipe's (version, commit, optional parts), has
torch's CUDA, and its compiled ops loaded. The suite (``verify/test_torchvision.py``) and ``torchkiln build``'s
post-build check (:func:`torchkiln.verify.buildconfig.postbuild_checks`) both call :func:`torchvision_checks`."""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from torchkiln.recipe.compat import compat, vision_pairing, vision_pairs
from torchkiln.recipe.model import Recipe

from .buildconfig_versions import _pinned_commit
from .comparison import Comparison, _cmp, _skip
from .facts import BuildFacts, TorchvisionFacts

TORCHVISION_CHECKS = ("pairs_torch", "version", "commit", "cuda", "ops", "features")
VISION_PARTS = ("png", "jpeg", "webp", "nvjpeg", "video_codec", "ffmpeg")  # VisionFeatures.NAMES


def expected_parts(recipe: Recipe | None, cuda: bool) -> dict[str, bool]:
    """The optional parts torchvision must have: the recipe's ``[torchvision.features]``; without a recipe,
    what upstream's wheels have (PNG, JPEG and WebP always, nvJPEG in CUDA builds, no video decoder)."""
    if recipe is not None:
        return {part: bool(getattr(recipe.vision, part)) for part in VISION_PARTS}
    return {part: part in ("png", "jpeg", "webp") or (part == "nvjpeg" and cuda) for part in VISION_PARTS}


def _said(built: bool | None) -> str:
    return {True: "built with it", False: "built without it", None: "could not tell"}[built]


def _parts_vs_recipe(recipe: Recipe | None, facts: BuildFacts, tv: TorchvisionFacts) -> Comparison:
    """[torchvision.features] against what the installed torchvision was built with (each codec used once,
    :func:`torchkiln.verify.facts.probe_parts`): a part asked for and left out, or built in unasked."""
    field = "torchvision.features" if recipe is not None else ""
    if not tv.parts:
        return _skip("features", "these facts do not say which parts torchvision has", field=field)
    want = expected_parts(recipe, facts.cuda_version is not None)
    wrong = []
    for part, wanted in want.items():
        built = tv.parts.get(part)
        if built is not wanted:
            note = tv.part_notes.get(part)
            wrong.append(
                f"torchvision.features.{part}: expected {'true' if wanted else 'false'}, "
                f"{_said(built)}" + (f" ({note})" if note else "")
            )
    expected = ", ".join(p for p, w in want.items() if w) or "none"
    actual = ", ".join(p for p in want if tv.parts.get(p)) or "none"
    if wrong:
        return Comparison("features", "fail", "; ".join(wrong), expected, actual, field)
    return Comparison("features", "pass", f"torchvision's optional parts: {actual}", expected, actual, field)


def expected_torchvision(torch_version: Version) -> dict[str, Any]:
    """The torchvision that pairs with this torch: compat.toml's row (``torchvision``, ``torchvision_min``),
    else upstream's 0.(N+15) rule for a release it has no row for."""
    entry = compat().get("torch", {}).get(f"{torch_version.major}.{torch_version.minor}")
    if entry and "torchvision" in entry:
        return dict(entry)
    return {"torchvision": f"0.{torch_version.minor + 15}"}


def torchvision_checks(
    recipe: Recipe | None, facts: BuildFacts, *, commit: str | None = None
) -> dict[str, Comparison]:
    """torchvision against this torch (and the recipe, when given). Keys are :data:`TORCHVISION_CHECKS`;
    all skip when torchvision is not installed (whether it must be is the caller's decision). ``commit``:
    the commit torchvision was built from, compared when the recipe pins none."""
    tv = facts.torchvision
    if tv is None or tv.version is None:
        reason = tv.error if tv is not None and tv.error else "torchvision is not installed"
        status = "fail" if tv is not None and tv.error else "skip"
        return {c: Comparison(c, status, reason) for c in TORCHVISION_CHECKS}
    out: dict[str, Comparison] = {}
    torch_v, tv_v = Version(facts.torch_version), Version(tv.version)
    row = expected_torchvision(torch_v)
    pairs, wanted = vision_pairs(row, tv_v), vision_pairing(row)
    out["pairs_torch"] = Comparison(
        "pairs_torch",
        "pass" if pairs else "fail",
        f"torchvision {tv_v} pairs with torch {torch_v}"
        if pairs
        else f"torchvision {tv_v} does not pair with torch {torch_v}: expected torchvision {wanted}",
        wanted,
        str(tv_v),
        "torchvision.version" if recipe is not None else "",
    )
    if recipe is None:
        out["version"] = _skip("version", "no recipe: nothing to compare torchvision's version with")
        out["commit"] = _skip("commit", "no recipe: nothing to compare torchvision's commit with")
    else:
        out["version"] = _cmp(
            "version",
            "torchvision version (torchvision.__version__)",
            str(Version(recipe.torchvision_wheel_version)),
            str(tv_v),
            field="torchvision.version",
        )
        if recipe.torchvision.commit or commit:
            out["commit"] = _pinned_commit(
                "commit", "torchvision", recipe.torchvision.commit, commit, tv.git_version
            )
        else:
            out["commit"] = _skip(
                "commit", "the recipe pins no torchvision commit", field="torchvision.commit"
            )
    # torchvision reports CUDA as an int (13000); torch as a string ('13.0'): compared as major.minor.
    out["cuda"] = _cmp(
        "cuda",
        f"torchvision's CUDA (torchvision.version.cuda = {tv.cuda_raw!r}) vs torch.version.cuda",
        facts.cuda_version,
        tv.cuda,
    )
    if tv.error:
        out["ops"] = Comparison("ops", "fail", f"torchvision's C++ ops: {tv.error}")
    else:
        out["ops"] = _cmp(
            "ops",
            f"torchvision's C++ ops loaded (torchvision.extension._has_ops(); ships {', '.join(tv.extensions) or 'no .so'})",
            True,
            tv.has_ops,
        )
    out["features"] = _parts_vs_recipe(recipe, facts, tv)
    return out
