"""``torchkiln reproduce PROVENANCE_OR_MANIFEST``: build the recorded wheels again from the recorded inputs,
in a fresh work directory at another path, and compare each wheel's sha256 with the record.

The strongest check of a record is to rebuild from it. The inputs (torchkiln.plan.rebuild, each checked
against the record before anything runs): the recipe file (its sha256), the sources at the recorded commits
fetched from the recorded repositories (or a tree the user points at with ``--source-dir``, whose sha256 or
commit must be the recorded one), the recorded projects and ``--torch``, and each compile's recorded
``SOURCE_DATE_EPOCH``. The rebuild runs the same plan a build runs, without the post-build checks (they
change no wheel), through the recorded compiler cache's tool (ccache runs the compiler with the paths under
its basedir made relative: the tool shapes the commands) but with an empty cache directory and no remote
store, so no object another build cached is reused. A wheel that differs is explained member by member, for ELF
members section by section (torchkiln.artifacts.wheeldiff), when the recorded wheel is at hand (beside the
record, or ``--wheels DIR``). Exit 0 when every wheel is the same, 1 when one differs, 2 for unusable input.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

from torchkiln.artifacts import wheelfile
from torchkiln.artifacts.jsonfile import to_data
from torchkiln.artifacts.manifest import load_manifest
from torchkiln.artifacts.record import Record, load_record
from torchkiln.artifacts.signing import load_public_key
from torchkiln.artifacts.wheeldiff import WheelVerdict, compare, report_lines
from torchkiln.build.loop import BuildOptions, run_build
from torchkiln.cache import resolve_cache
from torchkiln.errors import EXIT_FAILURE, UsageError
from torchkiln.files.digests import file_sha256
from torchkiln.plan.given_torch import GivenTorch, resolve_given_torch
from torchkiln.plan.make import make_plan
from torchkiln.plan.model import PROJECTS, Plan
from torchkiln.plan.rebuild import (
    accepted_versions,
    check_recipe,
    given_tree,
    pin_epochs,
    pinned_recipe,
    refuse_changed,
)
from torchkiln.plan.source_adoption import adopt_source_versions
from torchkiln.printing import Console, make_console, say
from torchkiln.recipe.loader import load_recipe, resolve_recipe_path
from torchkiln.recipe.model import Recipe

from .plan import env_store_from_args, parse_source_dirs

REPORT = "reproduce.json"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "record", metavar="PROVENANCE_OR_MANIFEST", help="dist/<recipe>.intoto.jsonl or dist/manifest.json"
    )
    parser.add_argument(
        "--key", metavar="PUB", help="verify the provenance statement with this public key first"
    )
    parser.add_argument(
        "--recipe",
        help="the recipe file (default: the path the record names); its sha256 must be the recorded one",
    )
    parser.add_argument(
        "--source-dir",
        action="append",
        default=[],
        metavar="PROJECT=PATH",
        help="the tree to rebuild PROJECT from instead of fetching the recorded commit (or instead of the "
        "recorded --source-dir path): its sha256, or its commit, must be the recorded one; it is copied",
    )
    parser.add_argument(
        "--torch",
        dest="given_torch",
        metavar="WHEEL|REQ",
        help="the torch a --torch build installed, if not at its recorded path (a wheel must have the recorded sha256)",
    )
    parser.add_argument(
        "--wheels",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="where the recorded wheels are, to name what differs (default: beside the record)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="a new, empty directory for the rebuild (default: ./reproduce-<recipe>[-N])",
    )
    parser.add_argument(
        "--jobs", "-j", type=int, default=None, help="MAX_JOBS (default: from cores and memory)"
    )
    parser.add_argument(
        "--cache",
        choices=("none", "ccache", "sccache"),
        default=None,
        help="compiler cache of the rebuild (default: the recorded one's tool, with an empty directory: the "
        "tool shapes the compile commands, what it held is not reused)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="its directory (default: an empty one in the work directory)",
    )
    parser.add_argument(
        "--env-store", default=None, metavar="DIR|off", help="as for build (venvs kept by their content)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")


def _recipe(record: Record, given: str | None) -> Recipe:
    name = given or record.recipe_path
    if not name:
        raise UsageError(
            f"{record.file}: names no recipe file (valid: --recipe FILE, sha256 {record.recipe_sha256})"
        )
    path = resolve_recipe_path(name)
    if not path.is_file():
        raise UsageError(
            f"recipe {name}: no such file (valid: --recipe FILE, the recipe the wheels were built with, sha256 "
            f"{record.recipe_sha256})"
        )
    recipe = load_recipe(path)
    check_recipe(record, recipe)
    return recipe


def _fresh_workdir(given: Path | None, record: Record) -> Path:
    """A new directory at another path than the recorded build's."""
    if given is None:
        base = Path(f"reproduce-{record.recipe_name or 'build'}").absolute()
        given = next(p for p in (base, *(Path(f"{base}-{n}") for n in range(2, 1000))) if not p.exists())
    given = given.absolute()
    if given.exists() and (not given.is_dir() or any(given.iterdir())):
        raise UsageError(f"--workdir {given}: exists and is not empty (valid: a new or empty directory)")
    if record.workdir and Path(record.workdir).resolve() in (given.resolve(), (given / "work").resolve()):
        raise UsageError(f"--workdir {given}: the recorded build ran there (valid: another path)")
    given.mkdir(parents=True, exist_ok=True)
    return given


def _only(record: Record) -> str | None:
    projects = [p for p in record.projects if p in PROJECTS]
    if not projects:
        raise UsageError(
            f"{record.file}: records no project built (valid: a torchkiln manifest or statement)"
        )
    return None if set(projects) == set(PROJECTS) else projects[0]


def _given_torch(
    args: argparse.Namespace, record: Record, recipe: Recipe, only: str | None, originals: list[Path]
) -> GivenTorch | None:
    """The torch torchvision builds against: --torch, else the recorded one, else (an --only torchvision build
    without --torch took it from dist/) the torch wheel beside the record at the build venv's version."""
    text = args.given_torch or (record.torch.install if record.torch else None)
    if text is None and only == "torchvision":
        version = record.build_packages.get("torch")
        found = [
            w
            for d in originals
            for w in sorted(d.glob("torch-*.whl"))
            if (p := wheelfile.parse(w.name)) is not None and p.version == version
        ]
        if not found:
            raise UsageError(
                f"{record.file}: torchvision was built against torch {version or '(unrecorded)'}, and no wheel of "
                "it is beside the record (valid: --torch WHEEL|REQ)"
            )
        text = str(found[0])
    if text is None:
        return None
    wanted = record.torch.sha256 if record.torch else None
    if text.endswith(".whl") and wanted:
        if not Path(text).is_file():
            raise UsageError(
                f"--torch {text}: no such file (valid: --torch WHEEL, the wheel with sha256 {wanted})"
            )
        if file_sha256(Path(text)) != wanted:
            raise UsageError(f"--torch {text}: sha256 {file_sha256(Path(text))} is not the recorded {wanted}")
    return resolve_given_torch(text, recipe, only)


def _sources(args: argparse.Namespace, record: Record, workdir: Path) -> tuple[dict[str, Path], list[Any]]:
    """The trees the rebuild is given (checked and copied) and the sources it fetches (at recorded commits)."""
    given = parse_source_dirs(args.source_dir)
    trees: dict[str, Path] = {}
    fetched = []
    for project in record.projects:
        source = record.sources.get(project)
        if source is None:
            raise UsageError(f"{record.file}: records no source of {project}")
        path = given.get(project) or (Path(source.path) if source.provided else None)
        if path is None:
            refuse_changed(source)
            fetched.append(source)
        else:
            trees[project] = given_tree(source, path, workdir / "given" / project)
    return trees, fetched


def _context(record: Record, manifest_path: Path) -> list[str]:
    """What differs around the wheels: source commits, tool and build-package versions."""
    rebuilt = load_manifest(manifest_path)
    lines = []
    for name, source in record.sources.items():
        lock = rebuilt.sources.get(name)
        if lock is None:
            continue
        if source.commit and lock.commit != source.commit:
            lines.append(f"{name}: rebuilt from {lock.commit}, the record's commit is {source.commit}")
        subs = {s.path: s.commit for s in lock.submodules}
        wrong = [p for p, c in source.submodules.items() if subs.get(p) != c]
        if wrong:
            lines.append(f"{name}: submodules at other commits than recorded: {', '.join(wrong[:8])}")
    tools = {n: t.version for n, t in rebuilt.toolchain.tools.items() if t.version is not None}
    for group, recorded, found in (
        ("tool", record.tools, tools),
        ("build package", record.build_packages, rebuilt.toolchain.build_packages),
    ):
        for name in sorted(recorded.keys() & found.keys()):
            if recorded[name] != found[name]:
                lines.append(f"{group} {name} {found[name]} (recorded {recorded[name]})")
    return lines


def _originals(args: argparse.Namespace, record: Record) -> list[Path]:
    """Where the recorded wheels may be: --wheels, then beside the record."""
    return [*args.wheels, record.file.parent.absolute()]


def _plan(args: argparse.Namespace, record: Record, recipe: Recipe, workdir: Path, console: Console) -> Plan:
    """The rebuild's plan, every input checked against the record (torchkiln.plan.rebuild)."""
    only = _only(record)
    trees, fetched = _sources(args, record, workdir)
    recipe = pinned_recipe(recipe, fetched)
    recipe, notes = adopt_source_versions(recipe, trees, accepted_versions(record, recipe))
    missing = [p for p in record.projects if p not in record.epochs]
    if missing:
        say(
            console,
            f"note: the record has no SOURCE_DATE_EPOCH of {', '.join(missing)}: the rebuild takes it from its tree",
        )
    plan = make_plan(
        recipe,
        workdir=workdir / "work",
        dist=workdir / "dist",
        jobs=args.jobs,
        source_dirs=trees,
        only=only,
        cache=resolve_cache(
            recipe.cache,
            kind=args.cache or record.cache or recipe.cache.kind,
            dir=args.cache_dir or workdir / "cache",
            remote="",  # nothing another build stored
        ),
        cluster=None,
        notes=notes,
        torch=_given_torch(args, record, recipe, only, _originals(args, record)),
        env_store=env_store_from_args(args),
    )
    return pin_epochs(plan, record.epochs)


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    key = load_public_key(Path(args.key)) if args.key else None
    record = load_record(Path(args.record), key)
    recipe = _recipe(record, args.recipe)
    _only(record)
    console = make_console(stderr=args.json)
    existed = args.workdir is not None and args.workdir.exists()
    workdir = _fresh_workdir(args.workdir, record)
    try:
        plan = _plan(args, record, recipe, workdir, console)
    except BaseException:  # refused before anything was built: leave nothing behind
        shutil.rmtree(workdir, ignore_errors=True)
        if existed:
            workdir.mkdir()
        raise
    say(console, ("torchkiln reproduce", "bold"), f" {record.file}: rebuilding in {workdir}")
    result = run_build(plan, BuildOptions(skip_postcheck=True, console=console))
    verdicts = compare(record.wheels, result.wheels, _originals(args, record))
    context = _context(record, result.manifest)
    seconds = round(time.monotonic() - started, 1)
    same = all(v.same for v in verdicts)
    _report(workdir / REPORT, record, verdicts, context, same, seconds)
    if args.json:
        print((workdir / REPORT).read_text(), end="")
    else:
        for line in report_lines(verdicts):
            say(console, line)
        for line in context:
            say(console, f"context: {line}")
        verdict = "reproduced: every wheel has the recorded sha256" if same else "NOT reproduced"
        say(console, f"{verdict} ({seconds:.0f} s; {workdir / REPORT})")
    return 0 if same else EXIT_FAILURE


def _report(
    path: Path, record: Record, verdicts: list[WheelVerdict], context: list[str], same: bool, seconds: float
) -> None:
    data = {
        "record": str(record.file),
        "signature": record.signature,
        "same": same,
        "seconds": seconds,
        "wheels": [to_data(v) for v in verdicts],
        "context": context,
    }
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
