"""``--torch WHEEL|REQ``: build torchvision alone against a torch the user already has.

Without it, ``--only torchvision`` installs exactly the recipe's torch (``torch==2.13.0+cpu.kiln1``), which
exists only where an earlier torchkiln build left it. With it, the build env gets the given torch (a wheel
file, or a requirement pinned with ``==``), after a check that it pairs with the recipe's torchvision
(torch 2.N <-> torchvision 0.(N+15), data/compat.toml) and suits its accelerator; torchvision's
``PYTORCH_VERSION`` (its wheel's torch requirement) is that torch's version, and the manifest records what
was used (the wheel's sha256).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from torchkiln.artifacts.wheelfile import parse
from torchkiln.errors import UsageError
from torchkiln.files.digests import file_sha256
from torchkiln.recipe.compat import compat, minor
from torchkiln.recipe.model import Recipe

VALID = "a torch wheel file, or a requirement such as torch==2.13.0"


@dataclass(frozen=True)
class GivenTorch:
    """The torch torchvision is built against: what pip installs, its version, and the manifest's note."""

    install: str  # a wheel path or a requirement: pip's argument
    version: Version
    note: str

    @property
    def find_links(self) -> str | None:
        """The wheel's directory, for the post-build check's pip (None for a requirement: the index)."""
        return str(Path(self.install).parent) if self.install.endswith(".whl") else None


def _version(text: str) -> tuple[str, Version, str]:
    """(what pip installs, the version, how it was given) of ``--torch TEXT``; UsageError when unusable."""
    if text.endswith(".whl"):
        path = Path(text).absolute()
        name = parse(path.name)
        if name is None or canonicalize_name(name.distribution) != "torch":
            raise UsageError(f"--torch {text!r}: not a torch wheel file name (valid: {VALID})")
        if not path.is_file():
            raise UsageError(f"--torch {text!r}: no such file (valid: {VALID})")
        try:
            version = Version(name.version)
        except InvalidVersion:
            raise UsageError(
                f"--torch {text!r}: {name.version!r} is not a version (valid: {VALID})"
            ) from None
        return str(path), version, f"wheel {path.name} (sha256 {file_sha256(path)})"
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        raise UsageError(f"--torch {text!r}: {exc} (valid: {VALID})") from None
    pins = [s for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version]
    if canonicalize_name(req.name) != "torch" or len(pins) != 1 or req.url or req.marker:
        raise UsageError(f"--torch {text!r}: not torch pinned to one version with == (valid: {VALID})")
    return str(req), Version(pins[0].version), f"requirement {req} (from the configured index)"


def resolve_given_torch(text: str, recipe: Recipe, only: str | None) -> GivenTorch:
    """Check ``--torch TEXT`` against the recipe (it pairs with its torchvision, suits its accelerator)."""
    if only != "torchvision":
        raise UsageError("--torch: only with --only torchvision (a build of torch makes its own)")
    install, version, given = _version(text)
    release = compat()["torch"].get(minor(version))
    pairs = release["torchvision"] if release else None
    if pairs != minor(recipe.torchvision.version):
        wanted = f"torch {minor(recipe.torch.version)}.x (torchvision 0.(N+15) pairs with torch 2.N)"
        raise UsageError(
            f"--torch {text!r}: torch {version} does not pair with the recipe's torchvision "
            f"{recipe.torchvision.version} (valid: {wanted})"
        )
    local = version.local or ""
    is_cuda = recipe.accelerator.is_cuda
    if local.startswith("cu") and not is_cuda or local.startswith("cpu") and is_cuda:
        raise UsageError(
            f"--torch {text!r}: a {local} build of torch for a {recipe.accelerator.kind} recipe "
            f"(valid: a torch built for {recipe.accelerator.kind})"
        )
    note = f"--torch: torchvision built against torch {version}, {given}, not the recipe's own torch build"
    return GivenTorch(install, version, note)
