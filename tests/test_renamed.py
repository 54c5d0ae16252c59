"""Issue 48, one meaning per name: a renamed recipe table or command-line flag keeps its old spelling, which
does what the new one does and says the new name once; a recipe with both spellings of a table is refused.

The cases come from the code's own tables: every field :data:`~torchkiln.recipe.schema.SCHEMA` declares
under each table of :data:`~torchkiln.recipe.schema.RENAMED_TABLES`, every hidden old flag of every command's
parser (:func:`torchkiln.commands.add_renamed`).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit import ROOT

from torchkiln.build.loop import BuildOptions
from torchkiln.cli import COMMANDS, build_parser, main
from torchkiln.commands import _Renamed
from torchkiln.recipe import loader
from torchkiln.recipe.schema import FIELDS, RENAMED_TABLES

# A valid value of each field of the renamed tables; a field the schema gains must be given one here (the
# test below fails naming it), so no field of the table goes untested under its old spelling.
VALID: dict[str, object] = {
    "cluster.scheduler_url": "http://10.0.0.1:10600",
    "cluster.auth": "token",
    "cluster.credentials_env": "KILN_TOKEN",
    "cluster.credentials_file": "/run/secrets/dist_token",
}
# What the table needs beside the field under test (the rules: a scheduler; the cache it runs through).
NEEDS: dict[str, dict[str, object]] = {"cluster": {"scheduler_url": "http://10.0.0.1:10600"}}
RENAMED_FIELDS = [
    (old, path)
    for old, new in sorted(RENAMED_TABLES.items())
    for path in FIELDS
    if path.startswith(f"{new}.")
]


@pytest.fixture(autouse=True)
def _nothing_said_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "_RENAME_SAID", set())


def _recipe_file(tmp_path: Path, name: str, tables: dict[str, dict[str, object]]) -> Path:
    from test_recipe import mutate

    path = tmp_path / f"{name}.toml"
    path.write_text(mutate(cache={"kind": "sccache"}, **tables))
    return path


def test_every_field_of_a_renamed_table_has_a_value_here() -> None:
    assert {path for _, path in RENAMED_FIELDS} == set(VALID)


@pytest.mark.parametrize(("old", "path"), RENAMED_FIELDS)
def test_old_table_name_loads_as_the_new_one_saying_so_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, path: str
) -> None:
    new, key = path.split(".", 1)
    table = {**NEEDS.get(new, {}), key: VALID[path]}
    current = loader.load_recipe(_recipe_file(tmp_path, "new", {new: table}))
    assert capsys.readouterr().err == ""
    old_file = _recipe_file(tmp_path, "old", {old: table})
    former = loader.load_recipe(old_file)
    again = loader.load_recipe(old_file)  # a command may read its recipe more than once
    assert capsys.readouterr().err == f"{old_file}: [{old}] is deprecated: it is now [{new}]\n"
    assert getattr(former, new) == getattr(current, new) == getattr(again, new)
    assert getattr(former, new) is not None and not hasattr(former, old)
    # The recorded digest is of the file's bytes: a record of a build from the old spelling still names it.
    assert former.sha256 == hashlib.sha256(old_file.read_bytes()).hexdigest()


@pytest.mark.parametrize(("old", "path"), RENAMED_FIELDS)
def test_a_problem_under_the_old_name_names_the_new_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, path: str
) -> None:
    new, key = path.split(".", 1)
    bad = _recipe_file(tmp_path, "bad", {old: {**NEEDS.get(new, {}), key: 7}})
    assert main(["recipe", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: {path}: wrong type int" in err, err


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED_TABLES.items()))
def test_both_spellings_of_a_table_are_refused_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str
) -> None:
    both = _recipe_file(tmp_path, "both", {old: NEEDS.get(new, {}), new: NEEDS.get(new, {})})
    assert main(["recipe", "check", str(both)]) == 2
    err = capsys.readouterr().err
    assert f"{both}: {old}: given with [{new}] (valid: [{new}] alone ([{old}] is its old name))" in err, err
    assert "deprecated" not in err


def test_reproduce_reads_a_record_of_a_build_from_the_old_spelling(tmp_path: Path) -> None:
    """A manifest or statement written before the rename names the recipe file by path and sha256; that file
    still says ``[dist]``, and reproduce takes it as the recipe the wheels were built with."""
    from torchkiln.artifacts.record import Record
    from torchkiln.commands.reproduce import _recipe

    for old, new in RENAMED_TABLES.items():
        path = _recipe_file(tmp_path, old, {old: NEEDS.get(new, {})})
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        record = Record(tmp_path / "manifest.json", "manifest", "r", str(path), digest, [], {}, {}, None, [])
        assert getattr(_recipe(record, None), new) is not None


def _renamed_flags() -> list[tuple[str, str, str, bool]]:
    """(command, old flag, new flag, whether it takes a value) of every hidden old spelling in every command's
    parser."""
    found = []
    for command in COMMANDS:
        parser = build_parser(only=command)
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        for action in sub.choices[command]._actions:
            if isinstance(action, _Renamed):
                found += [(command, o, action.new, action.nargs != 0) for o in action.option_strings]
    return found


RENAMED_FLAGS = _renamed_flags()


def test_the_renamed_flags_are_found() -> None:
    found = {(command, old, new) for command, old, new, _ in RENAMED_FLAGS}
    assert ("build", "--skip-checks", "--skip-postcheck") in found
    # "dist" is the output directory: the sccache-dist cluster's options are --cluster-* in every command
    # that plans a build, and the image build's token file
    for command in ("plan", "check", "build"):
        for part in ("scheduler", "token-env", "token-file"):
            assert (command, f"--dist-{part}", f"--cluster-{part}") in found
    assert ("images", "--dist-secret", "--cluster-secret") in found


@pytest.mark.parametrize(("command", "old", "new", "takes_value"), RENAMED_FLAGS)
def test_old_flag_sets_what_the_new_one_does_saying_so_once(
    capsys: pytest.CaptureFixture[str], command: str, old: str, new: str, takes_value: bool
) -> None:
    def parsed(*flags: str) -> dict[str, object]:
        given = [part for flag in flags for part in ([flag, "given-value"] if takes_value else [flag])]
        recipe = ["--recipe", "recipe.toml"] if command == "images" else ["recipe.toml"]
        return vars(build_parser(only=command).parse_args([command, *recipe, *given]))

    assert parsed(new) == parsed(old) != parsed()
    assert capsys.readouterr().err == f"torchkiln: '{old}' is deprecated: it is now '{new}'\n"
    parsed(old, old)
    assert capsys.readouterr().err.count("deprecated") == 1
    assert parsed(old, new) == parsed(new)
    capsys.readouterr()
    # The help names only the new spelling; abbreviations stay refused (allow_abbrev=False).
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert new in out and old not in out
    with pytest.raises(SystemExit):
        parsed(old[:-1])
    dest = new.lstrip("-").replace("-", "_")
    if (
        command == "build" and not takes_value
    ):  # what the build's options are made of: the same field either way
        assert dest in {f.name for f in dataclasses.fields(BuildOptions)}


# "dist" in torchkiln's code is the output directory (--dist, Plan.paths.dist, artifacts.published) or, as
# importlib.metadata says it, an installed distribution; the sccache-dist build cluster is "cluster" (issue 48).
# Each name with the word "dist" in it, with what it means; a new one must say here what it means.
DIST_NAMES = {
    "dist": "the output directory, or an installed distribution (importlib.metadata)",
    "check_dist": "the output directory, checked before a build",
    "dist_info": "a .dist-info directory",
    "dist_infos": "the .dist-info directories of a venv",
    "_dist_version": "an installed distribution's version",
    "torch_dist": "torch's installed distribution",
    "find_sccache_dist": "the sccache-dist program",
}
# Names the cluster keeps from before the rename: a record's key that older tools read (the manifest's "dist").
CLUSTER_KEPT = {("Manifest", "dist")}
_DIST_WORD = re.compile(r"(?:^|_)dist(?:_|$)|Dist(?:[A-Z_]|$)|(?:^|_)DIST(?:_|$)")
_CLUSTER_TYPE = re.compile(r"Cluster|Scheduler|PreparedClient|Dist(?:[A-Z]|\b)")


def _names(tree: ast.AST) -> Iterator[tuple[str, str, str]]:
    """(name, the class it is a field of or "", its annotation or "") of every name a module spells."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):  # its fields, and what its methods annotate on self
            for item in ast.walk(node):
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, (ast.Name, ast.Attribute)):
                    target = item.target.id if isinstance(item.target, ast.Name) else item.target.attr
                    yield target, node.name, ast.unparse(item.annotation)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name, "", ""
        elif isinstance(node, ast.arg):
            yield node.arg, "", ast.unparse(node.annotation) if node.annotation else ""
        elif isinstance(node, ast.Name):
            yield node.id, "", ""
        elif isinstance(node, ast.Attribute):
            yield node.attr, "", ""
        elif isinstance(node, ast.keyword) and node.arg:
            yield node.arg, "", ""
        elif isinstance(node, ast.alias):
            yield node.asname or node.name.rsplit(".", 1)[-1], "", ""


def dist_misnamed(root: Path) -> list[str]:
    """Where the code under ``root`` names something "dist" that :data:`DIST_NAMES` does not list, or gives a
    name "dist" to a cluster's value (its annotation) outside :data:`CLUSTER_KEPT`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for name, owner, annotation in _names(ast.parse(path.read_text(encoding="utf-8"))):
            if _DIST_WORD.search(name) and name not in DIST_NAMES:
                found.append(f"{path.relative_to(root)}: {name}")
            elif name == "dist" and _CLUSTER_TYPE.search(annotation) and (owner, name) not in CLUSTER_KEPT:
                found.append(f"{path.relative_to(root)}: {owner or 'a parameter'}.{name}: {annotation}")
    return sorted(set(found))


def test_dist_names_the_output_directory_and_cluster_the_cluster() -> None:
    assert dist_misnamed(ROOT / "src" / "torchkiln") == []


def test_the_name_check_finds_a_cluster_called_dist(tmp_path: Path) -> None:
    """Each spelling the check is for, in a module of its own: a name it must find, and one it must leave."""
    cases = {
        "class DistSpec: ...": ["DistSpec"],
        "def resolve_dist(): ...": ["resolve_dist"],
        "DIST_SECRET_ID = 1": ["DIST_SECRET_ID"],
        "def f(dist_spec=None): ...": ["dist_spec"],
        "x.dist_env = 1": ["dist_env"],
        "class Plan:\n    dist: ClusterSpec | None = None": ["Plan.dist: ClusterSpec | None"],
        "def f(dist: PreparedClient): ...": ["a parameter.dist: PreparedClient"],
        "class Cache:\n    def __init__(self):\n        self.dist: PreparedClient | None = None": [
            "Cache.dist: PreparedClient | None"
        ],
        "class Manifest:\n    dist: ClusterRecord | None = None": [],
        "def f(dist: Path, distro: str, distribution: str): ...": [],
        "import importlib.metadata\nfor dist in importlib.metadata.distributions(): pass": [],
    }
    for index, (source, expected) in enumerate(cases.items()):
        (tmp_path / f"m{index}.py").write_text(source + "\n")
        assert [line.split(": ", 1)[1] for line in dist_misnamed(tmp_path)] == expected, source
        (tmp_path / f"m{index}.py").unlink()
