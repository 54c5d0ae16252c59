"""The test suites' own rules (issue 48 item 5), read from their source: every test asserts a result, every
helper lives in tests/kit/, and the checkout's root is computed once (``kit.ROOT``)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit import ROOT

TESTS = ROOT / "tests"
SUITES = (TESTS, ROOT / "verify")
# Tests whose assertions live in a named helper: the name a test calls -> the files that define it (each
# definition must itself assert: test_named_helpers_assert). A call to anything named assert, assert_* or
# _assert* (torch.testing.assert_close, verify's _assert_check) counts as asserting without being listed.
HELPERS = {
    # the fuzzed recipe's parse, its message lines, its plan; a MAGMA op's identity checked on the CPU
    "check": ("tests/test_recipe_fuzz.py", "verify/test_linalg.py"),
    "check_stopped": ("tests/kit/signalkit.py",),  # a build signalled in flight, then its rerun's wheel
    "check_controls": ("tests/kit/arm64root.py",),  # the one-field controls' verdicts, each by its field
}
ASSERTING_PYTEST = {"raises", "fail", "warns"}
ROOT_FROM_FILE = re.compile(r"Path\(__file__\)(?:\.resolve\(\))?\.(?:parents\[|parent\.parent)")


def _test_files() -> list[Path]:
    return sorted(p for suite in SUITES for p in suite.rglob("test_*.py") if "data" not in p.parts)


def _own_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``node``'s body, not of functions, lambdas or classes defined in it (they may not run)."""
    stack = list(ast.iter_child_nodes(node))
    while stack:
        found = stack.pop()
        if isinstance(found, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        yield found
        stack.extend(ast.iter_child_nodes(found))


def _called_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _names_an_assertion(name: str) -> bool:
    """assert, _assert, assert_close, _assert_check: the names of functions that assert or raise."""
    bare = name.lstrip("_")
    return bare == "assert" or bare.startswith("assert_")


def _asserts(func: ast.AST, helpers: set[str]) -> bool:
    """Whether ``func``'s own body asserts: an assert of something not constant, pytest.raises/fail/warns,
    or a call of an assert_*-named function or of one of ``helpers``."""
    for node in _own_nodes(func):
        if isinstance(node, ast.Assert) and not isinstance(node.test, ast.Constant):
            return True
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "pytest"
            and node.attr in ASSERTING_PYTEST
        ):
            return True
        if isinstance(node, ast.Call):
            name = _called_name(node)
            if _names_an_assertion(name) or name in helpers:
                return True
    return False


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def test_every_test_asserts_a_result() -> None:
    """A test that asserts nothing passes whatever the product does: each one asserts (itself, or through a
    helper named in HELPERS)."""
    silent = []
    for path in _test_files():
        for func in _functions(ast.parse(path.read_text(), str(path))):
            if func.name.startswith("test") and not _asserts(func, set(HELPERS)):
                silent.append(f"{path.relative_to(ROOT)}:{func.lineno} {func.name}")
    assert silent == [], (
        f"tests that assert nothing (assert the result, or list the helper in HELPERS): {silent}"
    )


def _asserting_functions(tree: ast.AST) -> set[str]:
    """The names of the functions of one file that assert, directly or through another of that file's."""
    funcs = _functions(tree)
    found: set[str] = set()
    while True:
        more = {f.name for f in funcs if f.name not in found and _asserts(f, found)}
        if not more:
            return found
        found |= more


@pytest.mark.parametrize("name", sorted(HELPERS))
def test_named_helpers_assert(name: str) -> None:
    """HELPERS stays true: each definition of a listed name asserts (itself or through its own file's
    functions), as does every assert_*-named function of the suites."""
    for relative in HELPERS[name]:
        tree = ast.parse((ROOT / relative).read_text(), relative)
        defined = [f for f in _functions(tree) if f.name == name]
        assert defined, f"{relative} defines no {name}(): update HELPERS"
        assert name in _asserting_functions(tree), f"{relative}: {name}() asserts nothing"
    for path in [*_test_files(), *sorted((TESTS / "kit").glob("*.py"))]:
        tree = ast.parse(path.read_text(), str(path))
        named = {f.name for f in _functions(tree) if _names_an_assertion(f.name)}
        assert named <= _asserting_functions(tree), f"{path.relative_to(ROOT)}: {named}"


def test_helpers_live_in_kit() -> None:
    """A module of tests/ that is neither a test file nor a conftest.py is a helper: it goes in tests/kit/,
    imported as ``kit.NAME`` (tests/data/ holds projects and scripts of their own)."""
    stray = [
        str(p.relative_to(ROOT))
        for p in TESTS.rglob("*.py")
        if "data" not in p.relative_to(TESTS).parts
        and p.parent != TESTS / "kit"
        and not (p.name.startswith("test_") or p.name == "conftest.py")
    ]
    assert stray == [], f"helpers outside tests/kit/: {stray}"


def test_the_checkout_root_is_computed_once() -> None:
    """``kit.ROOT`` is the checkout's root; a test or helper that climbs from its own ``__file__`` to it
    breaks when it moves (as the helpers did into tests/kit/). A script's own ``sys.path`` set-up, which
    finds kit, is the one climb allowed."""
    climbing = [
        str(p.relative_to(ROOT))
        for p in TESTS.rglob("*.py")
        if "data" not in p.relative_to(TESTS).parts
        and p != TESTS / "kit" / "__init__.py"
        and any(ROOT_FROM_FILE.search(line) and "sys.path" not in line for line in p.read_text().splitlines())
    ]
    assert climbing == [], f"use `from kit import ROOT` in: {climbing}"
    assert (ROOT / "pyproject.toml").is_file() and (ROOT / "src" / "torchkiln").is_dir()
