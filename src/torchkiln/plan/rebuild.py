"""The inputs of a rebuild, from a build's record (torchkiln.artifacts.record), each checked against it
before anything is built: what ``torchkiln reproduce`` plans.

* the recipe: the file the record names (or the one given), whose sha256 must be the recorded one;
* a fetched source: the recorded repository at the recorded *commit* (the recipe's ref may have moved
  since): the plan fetches that commit and checks HEAD against it;
* a given tree (``--source-dir``): copied into the rebuild's work directory, so nothing the first build left
  in it (an in-tree ``build/``) is reused. A tree without git must have the recorded sha256 (without the
  files its build wrote into it, which are not copied); a git checkout must be at the recorded commit, with
  the recorded submodule commits, and is cleaned (``git clean -ffdx``) after the copy;
* a tree built with changes to its commit (``--allow-dirty``, a changed ``--source-dir`` checkout) is refused:
  the record names the changed files, not their contents;
* each compile's ``SOURCE_DATE_EPOCH``: the recorded one (:func:`pin_epochs`), not one from the copy's
  mtimes.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from torchkiln.artifacts import wheelfile
from torchkiln.artifacts.record import Record, RecordedSource
from torchkiln.errors import TorchkilnError, UsageError, few
from torchkiln.files.digests import tree_files, tree_sha256
from torchkiln.recipe.model import Recipe
from torchkiln.source.git import changed_files, git_output, head_commit, is_git_checkout, submodules

from .model import Plan


def check_recipe(record: Record, recipe: Recipe) -> None:
    """The recipe is the one the record names: the same bytes (sha256)."""
    if recipe.sha256 != record.recipe_sha256:
        raise UsageError(
            f"{recipe.source}: sha256 {recipe.sha256} is not the recorded recipe's {record.recipe_sha256} "
            f"({record.file}): not the recipe the wheels were built with (valid: --recipe FILE, the recipe "
            "file as it was)"
        )


def refuse_changed(source: RecordedSource) -> None:
    """A tree built with changes to its commit cannot be rebuilt: the record names the files, not what they held."""
    if source.changed:
        raise UsageError(
            f"{source.project}: built from {source.path} with {len(source.changed)} file(s) that differ from "
            f"commit {source.commit}: {few(source.changed)}; the record names them, not their contents, so no "
            "rebuild can have them (valid: a record of a build from an unchanged tree)"
        )


def pinned_recipe(recipe: Recipe, sources: list[RecordedSource]) -> Recipe:
    """``recipe`` with each fetched source at its recorded repository and commit (ref = commit)."""
    for source in sources:
        if source.commit is None or source.repo is None:
            raise UsageError(
                f"{source.project}: the record names no repository and commit to fetch (valid: "
                f"--source-dir {source.project}=PATH, the tree it was built from)"
            )
        spec = dataclasses.replace(
            recipe.spec(source.project), repo=source.repo, ref=source.commit, commit=source.commit
        )
        if source.project == "torch":
            recipe = dataclasses.replace(recipe, torch=spec)
        else:
            recipe = dataclasses.replace(recipe, torchvision=spec)
    return recipe


def accepted_versions(record: Record, recipe: Recipe) -> frozenset[str]:
    """The projects whose recorded wheels carry another version than the recipe's: the first build took the
    tree's own version (--accept-source-version), so the rebuild does too (and the tree must say the same)."""
    wants = {"torch": recipe.torch_wheel_version, "torchvision": recipe.torchvision_wheel_version}
    out = set()
    for wheel in record.wheels:
        parsed = wheelfile.parse(wheel.name)
        if parsed is not None and wheel.project in wants and parsed.version != wants[wheel.project]:
            out.add(wheel.project)
    return frozenset(out)


def given_tree(source: RecordedSource, given: Path, dest: Path) -> Path:
    """``given`` checked against the record and copied to ``dest`` (made here): the tree the rebuild builds."""
    refuse_changed(source)
    if not given.is_dir():
        raise UsageError(
            f"--source-dir {source.project}={given}: not a directory (valid: --source-dir "
            f"{source.project}=PATH, the tree the record's wheels were built from)"
        )
    if source.commit is None:
        return _copy_plain(source, given, dest)
    return _copy_checkout(source, given, dest)


def _copy_plain(source: RecordedSource, given: Path, dest: Path) -> Path:
    """A tree without git: the files its recorded sha256 covers (build outputs and the files the first
    build wrote into it left out), after checking that digest."""
    found = tree_sha256(given, source.tree_outputs)
    if found != source.tree_sha256:
        raise UsageError(
            f"--source-dir {source.project}={given}: its files' sha256 is {found}, the record's tree is "
            f"{source.tree_sha256} (without {few(source.tree_outputs) or 'no files'} its build wrote): not the "
            "tree the wheels were built from"
        )
    dest.mkdir(parents=True)
    for relative, path in tree_files(given, source.tree_outputs):
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            target.symlink_to(path.readlink())
        elif path.is_file():
            shutil.copy2(path, target)
    return dest


def _copy_checkout(source: RecordedSource, given: Path, dest: Path) -> Path:
    """A git checkout at the recorded commit and submodule commits: copied, then cleaned of everything
    untracked or ignored (a first build's outputs), and checked unchanged."""
    if not is_git_checkout(given):
        raise UsageError(
            f"--source-dir {source.project}={given}: not a git checkout (the record has commit {source.commit})"
        )
    head = head_commit(given)
    if head != source.commit:
        raise UsageError(
            f"--source-dir {source.project}={given}: HEAD is {head}, the record's commit is {source.commit} "
            f"(valid: git -C {given} checkout {source.commit})"
        )
    shutil.copytree(given, dest, symlinks=True)
    git_output(dest, "clean", "-ffdxq")
    git_output(dest, "submodule", "foreach", "--quiet", "--recursive", "git", "clean", "-ffdxq")
    changed = changed_files(dest)
    if changed:
        raise UsageError(
            f"--source-dir {source.project}={given}: {len(changed)} tracked file(s) differ from commit "
            f"{source.commit}: {few(changed)} (valid: the unchanged checkout)"
        )
    check_submodules(source, dest)
    return dest


def check_submodules(source: RecordedSource, tree: Path) -> None:
    """Every recorded submodule is at its recorded commit in ``tree``."""
    found = {s.path: s.commit for s in submodules(tree)}
    wrong = [
        f"{p} at {found.get(p, 'nothing')} (recorded {c})"
        for p, c in source.submodules.items()
        if found.get(p) != c
    ]
    if wrong:
        raise TorchkilnError(f"{source.project}: submodules not at the recorded commits: {few(wrong)}")


def pin_epochs(plan: Plan, epochs: dict[str, int]) -> Plan:
    """``plan`` with each compile step's SOURCE_DATE_EPOCH set to the recorded one (the build follows a
    plan's: torchkiln.build.compilekind), shown by the plan like every variable torchkiln sets."""
    steps = [
        dataclasses.replace(step, env={**step.env, "SOURCE_DATE_EPOCH": str(epochs[step.project])})
        if step.kind == "compile" and step.project in epochs
        else step
        for step in plan.steps
    ]
    return dataclasses.replace(plan, steps=steps)
