"""What every recipe rule's check yields (:data:`Violation`), how a finding words a version range
(:func:`_describe`) and the finding of a version outside the torch release's range (:func:`torch_range`):
shared by the rule modules by subject (:mod:`.rules_versions`, :mod:`.rules_cuda`, :mod:`.rules_toolchain`,
:mod:`.rules_settings`) and the table that runs them (:mod:`.rules`).
"""

from __future__ import annotations

from collections.abc import Iterator

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from .compat import minor, torch_release
from .model import Recipe

# A finding: (field path, what is wrong, what would be valid).
Violation = tuple[str, str, str]


def _describe(spec: SpecifierSet) -> str:
    """'>=3.10, <3.16': lower bounds first, as people read ranges."""
    order = {">=": 0, ">": 1, "==": 2, "~=": 2, "!=": 3, "<=": 4, "<": 5}
    return ", ".join(str(s) for s in sorted(spec, key=lambda s: (order.get(s.operator, 9), s.version)))


def torch_range(r: Recipe, key: str, field: str, what: str, version: Version) -> Iterator[Violation]:
    """A finding on ``field`` when ``version`` (of ``what``: "CUDA 13.0") is outside the torch release's
    ``key`` range (data/compat.toml); none when the release has no data (a rule of its own says so)."""
    release = torch_release(r)
    if release is None:
        return
    spec = SpecifierSet(release[key])
    if version not in spec:
        yield (field, f"{what} is not supported by torch {minor(r.torch.version)}", _describe(spec))
