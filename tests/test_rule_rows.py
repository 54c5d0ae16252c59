"""Each recipe rule's row sits on its function (``@rule``, issue 48): every declared rule runs, once, in the
table's order, and the table holds nothing undeclared."""

from __future__ import annotations

import importlib
import inspect

import pytest

from torchkiln.recipe import rules
from torchkiln.recipe.rules_violations import Rule, row, rule

SUBJECTS = ("rules_versions", "rules_cuda", "rules_toolchain", "rules_settings")


def declared() -> dict[str, Rule]:
    """Every function of the rule modules by subject that carries a row."""
    found = {}
    for subject in SUBJECTS:
        module = importlib.import_module(f"torchkiln.recipe.{subject}")
        for name, function in inspect.getmembers(module, inspect.isfunction):
            if function.__module__ == module.__name__ and hasattr(function, "__torchkiln_rule__"):
                found[f"{subject}.{name}"] = row(function)
    return found


def test_every_declared_rule_is_in_the_table_once_and_nothing_else_is() -> None:
    table = [r.check for r in rules.RULES]
    assert len(table) == len(set(table))
    assert {r.check for r in declared().values()} == set(table)
    ids = [r.id for r in rules.RULES]
    assert len(ids) == len(set(ids)), ids


def test_each_row_names_its_own_function_and_fields_of_the_recipe() -> None:
    for r in rules.RULES:
        assert row(r.check) is r
        assert r.reads and all(part for field in r.reads for part in field.split("."))


def test_an_undeclared_function_is_refused_by_name() -> None:
    def _undeclared(recipe: object) -> None:
        return None

    with pytest.raises(TypeError, match="_undeclared is not declared a rule"):
        row(_undeclared)


def test_a_rule_blocked_by_a_malformed_field_it_reads_or_its_table() -> None:
    @rule("x", "reads one field", ("accelerator.cuda",))
    def _x(recipe: object) -> list[tuple[str, str, str]]:
        return []

    r = row(_x)
    assert r.blocked_by({"accelerator"}) and r.blocked_by({"accelerator.cuda"})
    assert r.blocked_by({"accelerator.cuda.major"})
    assert not r.blocked_by({"accelerator.cudnn"}) and not r.blocked_by({"accel"})
