"""The publish step: the end of a build whose every step succeeded.

The compiler cache session is closed (its statistics, and ``--min-cache-hit-rate`` on them), each
project's wheels are copied into dist/ atomically (those of its last step that makes wheels), superseded
wheels of the same projects leave dist/, then the lock file and the manifest are written, an SBOM beside each
wheel (:mod:`torchkiln.artifacts.sbom`) and, when the build was given a key, the signed provenance statement
(:mod:`torchkiln.artifacts.provenance`). What the manifest says comes from what the steps recorded when they
ran (:mod:`torchkiln.build.kinds`), so a run that changed nothing still describes the wheels it publishes
truly. Without a key, a statement an earlier build left for this recipe is removed: it binds the manifest
this run has just rewritten, so it no longer describes dist/.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from torchkiln import __version__
from torchkiln.artifacts import jsonfile, published
from torchkiln.artifacts.lockfile import SourceLock, write_lock
from torchkiln.artifacts.manifest import (
    MANIFEST_FORMAT,
    CacheRecord,
    Checks,
    ClusterRecord,
    GivenTorchRecord,
    HitsMisses,
    Manifest,
    Rebuild,
    RecipeInfo,
    WheelRecord,
    stages_of,
    write_manifest,
)
from torchkiln.cache import CacheStats, enforce_min_hit_rate
from torchkiln.errors import BuildFailed
from torchkiln.host.toolchain import Tool, Toolchain, tool_version
from torchkiln.plan.model import Step
from torchkiln.plan.records import Records
from torchkiln.source.exact import Difference, changes, describe
from torchkiln.source.git import dirty_checkout, lock_source

from . import portable
from .buildreqs import read_constraints
from .context import BuildRecord, BuildSetup, Published
from .fingerprint import file_sha256
from .sandbox import BUBBLEWRAP, UNISOLATED_WAYS
from .sandbox import summary as isolation_summary
from .sboms import publish_sboms
from .treeguard import foreign, leaving, observe, owned_in, refuse_leaving, skipped
from .treelabel import version_record


def publish(setup: BuildSetup, record: BuildRecord) -> tuple[bool, Published]:
    """Publish the build: whether dist/ changed (a wheel copied in or a superseded one removed), and what
    reached it. What the manifest says of the build's steps comes from ``record``."""
    started = time.perf_counter()
    setup.cache.close(setup, record)
    if setup.cache.session is not None:
        enforce_min_hit_rate(setup.cache.stats, setup.options.min_hit_rate, list(record.cache_causes))
    paths = setup.plan.paths
    # the trees first: a tree that is not what the record would say is refused before dist/ changes
    locks = _locks(setup)
    _refuse_dirty(setup, record, locks)
    _refuse_leaving(setup, record, locks)
    wheels, changed = _publish_wheels(setup)
    for stale in published.remove_superseded(paths.dist, [w for w, _, _ in wheels]):
        setup.display.note(f"removed superseded wheel {stale}")
        from torchkiln.artifacts.sbom import sbom_name  # noqa: PLC0415 - CycloneDX only where needed

        (paths.dist / sbom_name(stale.name)).unlink(missing_ok=True)
        changed = True
    recipe = setup.plan.recipe
    lock_path = paths.dist / f"{recipe.name}.lock.json"
    write_lock(lock_path, recipe.name, recipe.sha256, locks)
    manifest_path = paths.dist / published.MANIFEST_NAME
    found = [WheelRecord.of(w, p, python) for w, p, python in wheels]
    manifest = _manifest(
        setup, record, locks, portable.attach(setup, record, wheels, found)
    )  # with each wheel's portability
    # the SBOMs before the manifest file (they read the record, not the file), so its overhead counts them
    sboms = publish_sboms(
        paths.dist, manifest, recipe, Records.for_build(paths.workdir, setup.plan.env_store)
    )
    overhead = {**setup.options.before, "publish": round(time.perf_counter() - started, 3)}
    manifest = replace(manifest, overhead=overhead)
    write_manifest(manifest_path, manifest)
    statement = _attest(setup, manifest, [manifest_path, lock_path, *sboms])
    return changed, Published([w for w, _, _ in wheels], manifest_path, lock_path, sboms, statement)


def _attest(setup: BuildSetup, manifest: Manifest, byproducts: list[Path]) -> Path | None:
    """The signed statement of this build (None without a key: an earlier one is removed)."""
    path = setup.plan.paths.dist / published.statement_name(setup.plan.recipe.name)
    if setup.options.sign_key is None:
        if path.exists():
            path.unlink()
            setup.display.note(f"removed {path}: no signing key given, and it described an earlier build")
        return None
    from torchkiln.artifacts import provenance  # noqa: PLC0415 - the signing machinery: a signed build's

    isolated = manifest.isolation
    if isolated is not None and isolated.mode != BUBBLEWRAP and not setup.options.allow_unisolated:
        raise BuildFailed(  # the first step refuses a host that cannot sandbox; this is what else got here
            f"refusing to sign: the build steps {', '.join(isolated.steps)} ran without a sandbox "
            f"({isolated.reason}); the wheels, manifest and lock file are in dist/, no statement was written\n"
            f"{UNISOLATED_WAYS}",
            step="publish",
        )
    data = provenance.statement(manifest, parameters=_parameters(setup), byproducts=byproducts)
    provenance.write_signed(path, data, setup.options.sign_key)
    return path


def _parameters(setup: BuildSetup) -> dict[str, Any]:
    """The command line's choices, as the provenance's externalParameters (no secret: the cache's remote
    URL without its password, credential sources by name)."""
    plan, options = setup.plan, setup.options
    return {
        "projects": list(plan.projects),
        "jobs": {"value": plan.jobs.value, "source": plan.jobs.source},
        "cache": plan.cache.to_dict(),
        "dist_scheduler": plan.cluster.scheduler_url if plan.cluster is not None else None,
        "source_dirs": {s.name: str(s.path) for s in plan.sources if s.provided},
        "notes": list(plan.notes),
        "force": options.force,
        "skip_checks": options.skip_postcheck,  # the record's key kept (docs/supply-chain.md)
        "allow_dirty": options.allow_dirty,
        "allow_unisolated": options.allow_unisolated,
        "torch": {"install": plan.given_torch} if plan.given_torch else None,
        "min_cache_hit_rate": options.min_hit_rate,
        "workdir": str(plan.paths.workdir),
        "dist": str(plan.paths.dist),
    }


def _publish_wheels(setup: BuildSetup) -> tuple[list[tuple[Path, str, str]], bool]:
    """Each project's wheels (of its last step that makes wheels, per Python) into dist/, those not already
    there. Returns ((path in dist, project, Python), ...) and whether dist/ changed."""
    out: list[tuple[Path, str, str]] = []
    changed = False
    for (project, python), step in setup.plan.published_steps().items():
        assert step.wheels is not None
        recorded = (setup.state.get(step.name) or {}).get("outputs", {}).get("wheels", {})
        for name in sorted(recorded):
            target = setup.plan.paths.dist / name
            if not (target.is_file() and file_sha256(target) == recorded[name]):
                published.publish(Path(step.wheels) / name, setup.plan.paths.dist)
                changed = True
            out.append((target, project, python or setup.plan.recipe.python))
    return out, changed


def _locks(setup: BuildSetup) -> list[SourceLock]:
    """Each source as built: its commit and every way its tree differs from it (the build's own outputs are
    no difference: torchkiln.build.treeguard), or its digest."""
    locks = []
    for source in setup.plan.sources:
        step = _tree_step(setup, source.name)
        entry = (setup.state.get(step.name) or {}) if step is not None else {}
        found = None
        observed = observe(source.path, skipped(setup.plan)) if source.path.is_dir() else None
        if observed is not None and observed.git:
            found = changes(source.path, foreign(observed, owned_in(setup.plan, source.name)))
        lock = lock_source(
            source.name,
            source.path,
            repo=None if source.provided else source.repo,
            ref=None if source.provided else source.ref,
            provided=source.provided,
            tree_digest=entry.get("outputs", {}).get("tree_sha256"),
            tree_changes=found,
            outside_links=leaving(setup.plan, source, observed) if observed is not None else [],
        )
        locks.append(replace(lock, version=version_record(setup.plan, source)))
    return locks


def _refuse_dirty(setup: BuildSetup, record: BuildRecord, locks: list[SourceLock]) -> None:
    """A fetched checkout that is not its commit's tree plus the build's own outputs at publish (changed
    during the build: the fetch steps and each compile refuse one changed before) is not published, as
    ``cargo publish`` refuses a dirty tree; with --allow-dirty it is, with a warning the manifest keeps (its
    sources record each path with its kind and sha256, the provenance annotates them). A --source-dir tree is
    the user's to change: recorded, never refused."""
    for lock in locks:
        if lock.provided or not lock.tree_changes:
            continue
        spec = setup.plan.recipe.spec(lock.name)
        differences = [Difference(c.path, c.kind, c.detail) for c in lock.tree_changes]
        if not setup.options.allow_dirty:
            raise BuildFailed(
                dirty_checkout(
                    spec, Path(lock.path), differences, "nothing was published (dist/ is unchanged)"
                ),
                step="publish",
            )
        record.warn(
            f"--allow-dirty: {lock.name} was built from {lock.path}, which differs from {spec.ref} of "
            f"{spec.repo}: {describe(differences)}"
        )


def _refuse_leaving(setup: BuildSetup, record: BuildRecord, locks: list[SourceLock]) -> None:
    """A tree with symbolic links that lead out of it (a fetched checkout's or a --source-dir tree's, a
    link its commit holds too) is not published: what the wheel holds through them is in no record. With
    --allow-dirty it is, with a warning, each link recorded with its text."""
    for lock in locks:
        if not lock.outside_links:
            continue
        source = setup.plan.source(lock.name)
        if not setup.options.allow_dirty:
            refuse_leaving(
                source, lock.outside_links, "nothing was published (dist/ is unchanged)", "publish"
            )
        shown = ", ".join(f"{link.path} -> {link.link}" for link in lock.outside_links)
        record.warn(
            f"--allow-dirty: {lock.name} was built from {lock.path}, whose links lead out of it: {shown}"
        )


def _toolchain(setup: BuildSetup, record: BuildRecord, locks: list[SourceLock]) -> Toolchain:
    """The compile steps' recorded toolchains (the first of each tool wins; a tool two projects used at
    different versions is a warning), plus git when the build read a git checkout."""
    merged: Toolchain | None = None
    for step in setup.plan.steps:
        if step.kind != "compile":
            continue
        raw = (setup.state.get(step.name) or {}).get("outputs", {}).get("toolchain")
        if raw is None:
            continue
        found = jsonfile.from_data(Toolchain, raw, file=str(setup.state.path))
        if merged is None:
            merged = found
            continue
        for name, tool in found.tools.items():
            known = merged.tools.get(name)
            if known is None:
                merged.tools[name] = tool
            elif known.version != tool.version:
                record.warn(
                    f"{step.project} was compiled with {name} {tool.version}, another project with {known.version}"
                )
    merged = merged or Toolchain()
    if any(lock.commit is not None for lock in locks):
        git: Tool | None = tool_version("git", setup.environ)
        if git is not None:
            merged.tools["git"] = git
    return merged


def _manifest(
    setup: BuildSetup, record: BuildRecord, locks: list[SourceLock], wheels: list[WheelRecord]
) -> Manifest:
    plan, recipe = setup.plan, setup.plan.recipe
    steps = [replace(r, last_run_s=_last_run(setup, r.name)) for r in record.steps if r.stage != "publish"]
    build_env = {
        step.project: (setup.state.get(step.name) or {}).get("outputs", {}).get("env", step.shown_env)
        for step in plan.steps
        if step.kind == "compile"
    }
    checks = Checks(skipped=True) if setup.options.skip_postcheck else (record.checks or Checks())
    return Manifest(
        format=MANIFEST_FORMAT,
        torchkiln=__version__,
        started=setup.started.isoformat(timespec="seconds"),
        finished=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        recipe=RecipeInfo.of(recipe),
        projects=list(plan.projects),
        jobs=plan.jobs,
        sources={lock.name: lock for lock in locks},
        toolchain=_toolchain(setup, record, locks),
        build_env=build_env,
        stages=stages_of(steps),
        steps=steps,
        cache=_cache_record(setup.cache.stats) if setup.cache.stats is not None else None,
        checks=checks,
        wheels=wheels,
        warnings=list(record.warnings),
        constraints=read_constraints(plan.paths.constraints),
        dist=_cluster_record(setup),
        python_checks={} if setup.options.skip_postcheck else dict(sorted(record.python_checks.items())),
        rebuild=_rebuild(setup, build_env),
        isolation=isolation_summary(setup),
    )


def _tree_step(setup: BuildSetup, project: str) -> Step | None:
    """The step that built ``project``'s tree: its compile step (the first Python's), whose record holds the
    tree as it found it and what it wrote there; not the final wheel step (torch:repair and
    torchvision:bundle rewrite wheels and read no tree)."""
    first = ("", setup.plan.recipe.python)
    steps = setup.plan.steps
    return next(
        (s for s in steps if s.kind == "compile" and s.project == project and s.python in first), None
    )


def _rebuild(setup: BuildSetup, build_env: dict[str, dict[str, str]]) -> Rebuild:
    """What `torchkiln reproduce` needs: each compile's SOURCE_DATE_EPOCH (as it ran), the in-tree outputs a
    tree without git left out of its digest, the torch a --torch build installed (and its wheel's digest)."""
    epochs = {p: int(env["SOURCE_DATE_EPOCH"]) for p, env in build_env.items() if "SOURCE_DATE_EPOCH" in env}
    outputs = {}
    for project in setup.plan.wheel_steps():
        step = _tree_step(setup, project)
        entry = (setup.state.get(step.name) or {}) if step is not None else {}
        written = (entry.get("outputs") or {}).get("tree_outputs")
        if written is not None:
            outputs[project] = sorted(written)
    torch = None
    given = setup.plan.given_torch
    if given is not None:
        path = Path(given)
        wheel = given.endswith(".whl") and path.is_file()
        torch = GivenTorchRecord(given, file_sha256(path) if wheel else None)
    return Rebuild(epochs, outputs, torch, setup.plan.cache.kind)


def _cluster_record(setup: BuildSetup) -> ClusterRecord | None:
    """None when no distributed compiles were asked for; ``used`` False when the preflight turned them off
    (or when this run compiled nothing: a no-op run asks no scheduler)."""
    if setup.plan.cluster is None:
        return None
    url = setup.plan.cluster.scheduler_url
    used = setup.cache.client is not None and setup.cache.client.spec is not None
    stats = setup.cache.cluster_stats
    if stats is None:
        return ClusterRecord(url, used)
    return ClusterRecord(
        url, used, stats.remote, stats.local, stats.cache_hits, stats.fallback, dict(stats.by_server)
    )


def _cache_record(stats: CacheStats) -> CacheRecord:
    rate = stats.hit_rate
    return CacheRecord(
        stats.tool,
        stats.hits,
        stats.misses,
        stats.uncacheable,
        None if rate is None else round(rate, 4),
        HitsMisses(stats.local_hits, stats.local_misses),
        HitsMisses(stats.remote_hits, stats.remote_misses),
        stats.errors,
        {k: HitsMisses(h, m) for k, (h, m) in sorted(stats.by_language.items())},
    )


def _last_run(setup: BuildSetup, name: str) -> float | None:
    entry = setup.state.get(name)
    return round(entry["duration_s"], 3) if entry and "duration_s" in entry else None
