"""What every recipe rule's check yields (:data:`Finding`) and how a finding words a version range
(:func:`_describe`): shared by the rule modules by subject (:mod:`.rules_versions`, :mod:`.rules_cuda`,
:mod:`.rules_toolchain`, :mod:`.rules_settings`) and the table that runs them (:mod:`.rules`).
"""

from __future__ import annotations

from packaging.specifiers import SpecifierSet

# A finding: (field path, what is wrong, what would be valid).
Finding = tuple[str, str, str]


def _describe(spec: SpecifierSet) -> str:
    """'>=3.10, <3.16': lower bounds first, as people read ranges."""
    order = {">=": 0, ">": 1, "==": 2, "~=": 2, "!=": 3, "<=": 4, "<": 5}
    return ", ".join(str(s) for s in sorted(spec, key=lambda s: (order.get(s.operator, 9), s.version)))
