"""How a function declares itself a recipe rule (:func:`rule`, its :class:`Rule` row), what every rule's
check yields (:data:`Violation`), how a finding words a version range
(:func:`_describe`) and the finding of a version outside the torch release's range (:func:`torch_range`):
shared by the rule modules by subject (:mod:`.rules_versions`, :mod:`.rules_cuda`, :mod:`.rules_toolchain`,
:mod:`.rules_settings`) and the table that runs them (:mod:`.rules`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from .compat import minor, torch_release
from .model import Recipe

# A finding: (field path, what is wrong, what would be valid).
Violation = tuple[str, str, str]
RuleFunction = Callable[[Recipe], Iterator[Violation]]
_ROW = "__torchkiln_rule__"  # the attribute :func:`rule` keeps a function's row in


@dataclass(frozen=True)
class Rule:
    """One rule: ``reads`` names the fields (or whole tables) it looks at; when one of them is itself
    malformed, the rule is not run (its finding would only echo that problem), every other rule is."""

    id: str
    summary: str
    check: RuleFunction
    reads: tuple[str, ...]

    def blocked_by(self, bad: Collection[str]) -> bool:
        return any(r == b or r.startswith(b + ".") or b.startswith(r + ".") for r in self.reads for b in bad)


def rule(id: str, summary: str, reads: tuple[str, ...]) -> Callable[[RuleFunction], RuleFunction]:
    """Declares the function it decorates a rule: its row (``id``, ``summary``, the fields it ``reads``) sits
    on its definition, where a change to one shows beside the other; :data:`.rules.RULES` lists the
    functions in the order they run."""

    def declare(check: RuleFunction) -> RuleFunction:
        setattr(check, _ROW, Rule(id, summary, check, reads))
        return check

    return declare


def row(check: RuleFunction) -> Rule:
    """The row :func:`rule` declared on ``check``."""
    found = getattr(check, _ROW, None)
    if not isinstance(found, Rule):
        raise TypeError(f"{check.__qualname__} is not declared a rule (@rule)")
    return found


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
