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
from torchkiln.artifacts import dist, jsonfile
from torchkiln.artifacts.lockfile import SourceLock, write_lock
from torchkiln.artifacts.manifest import (
    MANIFEST_FORMAT,
    CacheRecord,
    Checks,
    DistRecord,
    GivenTorchRecord,
    HitsMisses,
    Jobs,
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
from .context import Context, Published
from .fingerprint import file_sha256
from .sandbox import BUBBLEWRAP, UNISOLATED_WAYS
from .sandbox import summary as isolation_summary
from .sboms import publish_sboms
from .treeguard import foreign, leaving, observe, owned_in, refuse_leaving, skipped
from .treelabel import version_record


def publish(ctx: Context) -> bool:
    """Publish the build; whether dist/ changed (a wheel copied in or a superseded one removed)."""
    started = time.perf_counter()
    ctx.close_cache()
    if ctx.cache is not None:
        enforce_min_hit_rate(ctx.cache_stats, ctx.options.min_hit_rate, ctx.cache_causes)
    paths = ctx.plan.paths
    # the trees first: a tree that is not what the record would say is refused before dist/ changes
    locks = _locks(ctx)
    _refuse_dirty(ctx, locks)
    _refuse_leaving(ctx, locks)
    wheels, changed = _publish_wheels(ctx)
    for stale in dist.remove_superseded(paths.dist, [w for w, _, _ in wheels]):
        ctx.display.note(f"removed superseded wheel {stale}")
        from torchkiln.artifacts.sbom import sbom_name  # noqa: PLC0415 - CycloneDX only where needed

        (paths.dist / sbom_name(stale.name)).unlink(missing_ok=True)
        changed = True
    recipe = ctx.plan.recipe
    lock_path = paths.dist / f"{recipe.name}.lock.json"
    write_lock(lock_path, recipe.name, recipe.sha256, locks)
    manifest_path = paths.dist / dist.MANIFEST_NAME
    found = [WheelRecord.of(w, p, python) for w, p, python in wheels]
    manifest = _manifest(ctx, locks, portable.attach(ctx, wheels, found))  # with each wheel's portability
    # the SBOMs before the manifest file (they read the record, not the file), so its overhead counts them
    sboms = publish_sboms(paths.dist, manifest, recipe, Records.for_build(paths.workdir, ctx.plan.env_store))
    overhead = {**ctx.options.before, "publish": round(time.perf_counter() - started, 3)}
    manifest = replace(manifest, overhead=overhead)
    write_manifest(manifest_path, manifest)
    statement = _attest(ctx, manifest, [manifest_path, lock_path, *sboms])
    ctx.published = Published([w for w, _, _ in wheels], manifest_path, lock_path, sboms, statement)
    return changed


def _attest(ctx: Context, manifest: Manifest, byproducts: list[Path]) -> Path | None:
    """The signed statement of this build (None without a key: an earlier one is removed)."""
    path = ctx.plan.paths.dist / dist.statement_name(ctx.plan.recipe.name)
    if ctx.options.sign_key is None:
        if path.exists():
            path.unlink()
            ctx.display.note(f"removed {path}: no signing key given, and it described an earlier build")
        return None
    from torchkiln.artifacts import provenance  # noqa: PLC0415 - the signing machinery: a signed build's

    isolated = manifest.isolation
    if isolated is not None and isolated.mode != BUBBLEWRAP and not ctx.options.allow_unisolated:
        raise BuildFailed(  # the first step refuses a host that cannot sandbox; this is what else got here
            f"refusing to sign: the build steps {', '.join(isolated.steps)} ran without a sandbox "
            f"({isolated.reason}); the wheels, manifest and lock file are in dist/, no statement was written\n"
            f"{UNISOLATED_WAYS}",
            step="publish",
        )
    data = provenance.statement(manifest, parameters=_parameters(ctx), byproducts=byproducts)
    provenance.write_signed(path, data, ctx.options.sign_key)
    return path


def _parameters(ctx: Context) -> dict[str, Any]:
    """The command line's choices, as the provenance's externalParameters (no secret: the cache's remote
    URL without its password, credential sources by name)."""
    plan, options = ctx.plan, ctx.options
    return {
        "projects": list(plan.projects),
        "jobs": {"value": plan.jobs.value, "source": plan.jobs.source},
        "cache": plan.cache.to_dict(),
        "dist_scheduler": plan.dist.scheduler_url if plan.dist is not None else None,
        "source_dirs": {s.name: str(s.path) for s in plan.sources if s.provided},
        "notes": list(plan.notes),
        "force": options.force,
        "skip_checks": options.skip_checks,
        "allow_dirty": options.allow_dirty,
        "allow_unisolated": options.allow_unisolated,
        "torch": {"install": plan.given_torch} if plan.given_torch else None,
        "min_cache_hit_rate": options.min_hit_rate,
        "workdir": str(plan.paths.workdir),
        "dist": str(plan.paths.dist),
    }


def _publish_wheels(ctx: Context) -> tuple[list[tuple[Path, str, str]], bool]:
    """Each project's wheels (of its last step that makes wheels, per Python) into dist/, those not already
    there. Returns ((path in dist, project, Python), ...) and whether dist/ changed."""
    published: list[tuple[Path, str, str]] = []
    changed = False
    for (project, python), step in ctx.plan.published_steps().items():
        assert step.wheels is not None
        recorded = (ctx.state.get(step.name) or {}).get("outputs", {}).get("wheels", {})
        for name in sorted(recorded):
            target = ctx.plan.paths.dist / name
            if not (target.is_file() and file_sha256(target) == recorded[name]):
                dist.publish(Path(step.wheels) / name, ctx.plan.paths.dist)
                changed = True
            published.append((target, project, python or ctx.plan.recipe.python))
    return published, changed


def _locks(ctx: Context) -> list[SourceLock]:
    """Each source as built: its commit and every way its tree differs from it (the build's own outputs are
    no difference: torchkiln.build.treeguard), or its digest."""
    locks = []
    for source in ctx.plan.sources:
        step = _tree_step(ctx, source.name)
        entry = (ctx.state.get(step.name) or {}) if step is not None else {}
        found = None
        observed = observe(source.path, skipped(ctx.plan)) if source.path.is_dir() else None
        if observed is not None and observed.git:
            found = changes(source.path, foreign(observed, owned_in(ctx.plan, source.name)))
        lock = lock_source(
            source.name,
            source.path,
            repo=None if source.provided else source.repo,
            ref=None if source.provided else source.ref,
            provided=source.provided,
            tree_digest=entry.get("outputs", {}).get("tree_sha256"),
            tree_changes=found,
            outside_links=leaving(ctx.plan, source, observed) if observed is not None else [],
        )
        locks.append(replace(lock, version=version_record(ctx.plan, source)))
    return locks


def _refuse_dirty(ctx: Context, locks: list[SourceLock]) -> None:
    """A fetched checkout that is not its commit's tree plus the build's own outputs at publish (changed
    during the build: the fetch steps and each compile refuse one changed before) is not published, as
    ``cargo publish`` refuses a dirty tree; with --allow-dirty it is, with a warning the manifest keeps (its
    sources record each path with its kind and sha256, the provenance annotates them). A --source-dir tree is
    the user's to change: recorded, never refused."""
    for lock in locks:
        if lock.provided or not lock.tree_changes:
            continue
        spec = ctx.plan.recipe.spec(lock.name)
        differences = [Difference(c.path, c.kind, c.detail) for c in lock.tree_changes]
        if not ctx.options.allow_dirty:
            raise BuildFailed(
                dirty_checkout(
                    spec, Path(lock.path), differences, "nothing was published (dist/ is unchanged)"
                ),
                step="publish",
            )
        ctx.warn(
            f"--allow-dirty: {lock.name} was built from {lock.path}, which differs from {spec.ref} of "
            f"{spec.repo}: {describe(differences)}"
        )


def _refuse_leaving(ctx: Context, locks: list[SourceLock]) -> None:
    """A tree with symbolic links that lead out of it (a fetched checkout's or a --source-dir tree's, a
    link its commit holds too) is not published: what the wheel holds through them is in no record. With
    --allow-dirty it is, with a warning, each link recorded with its text."""
    for lock in locks:
        if not lock.outside_links:
            continue
        source = ctx.plan.source(lock.name)
        if not ctx.options.allow_dirty:
            refuse_leaving(
                source, lock.outside_links, "nothing was published (dist/ is unchanged)", "publish"
            )
        shown = ", ".join(f"{link.path} -> {link.link}" for link in lock.outside_links)
        ctx.warn(
            f"--allow-dirty: {lock.name} was built from {lock.path}, whose links lead out of it: {shown}"
        )


def _toolchain(ctx: Context, locks: list[SourceLock]) -> Toolchain:
    """The compile steps' recorded toolchains (the first of each tool wins; a tool two projects used at
    different versions is a warning), plus git when the build read a git checkout."""
    merged: Toolchain | None = None
    for step in ctx.plan.steps:
        if step.kind != "compile":
            continue
        raw = (ctx.state.get(step.name) or {}).get("outputs", {}).get("toolchain")
        if raw is None:
            continue
        found = jsonfile.from_data(Toolchain, raw, file=str(ctx.state.path))
        if merged is None:
            merged = found
            continue
        for name, tool in found.tools.items():
            known = merged.tools.get(name)
            if known is None:
                merged.tools[name] = tool
            elif known.version != tool.version:
                ctx.warn(
                    f"{step.project} was compiled with {name} {tool.version}, another project with {known.version}"
                )
    merged = merged or Toolchain()
    if any(lock.commit is not None for lock in locks):
        git: Tool | None = tool_version("git", ctx.environ)
        if git is not None:
            merged.tools["git"] = git
    return merged


def _manifest(ctx: Context, locks: list[SourceLock], wheels: list[WheelRecord]) -> Manifest:
    plan, recipe = ctx.plan, ctx.plan.recipe
    steps = [replace(r, last_run_s=_last_run(ctx, r.name)) for r in ctx.records if r.stage != "publish"]
    build_env = {
        step.project: (ctx.state.get(step.name) or {}).get("outputs", {}).get("env", step.shown_env)
        for step in plan.steps
        if step.kind == "compile"
    }
    checks = Checks(skipped=True) if ctx.options.skip_checks else (ctx.checks or Checks())
    return Manifest(
        format=MANIFEST_FORMAT,
        torchkiln=__version__,
        started=ctx.started.isoformat(timespec="seconds"),
        finished=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        recipe=RecipeInfo.of(recipe),
        projects=list(plan.projects),
        jobs=Jobs(plan.jobs.value, plan.jobs.source, plan.jobs.reason),
        sources={lock.name: lock for lock in locks},
        toolchain=_toolchain(ctx, locks),
        build_env=build_env,
        stages=stages_of(steps),
        steps=steps,
        cache=_cache_record(ctx.cache_stats) if ctx.cache_stats is not None else None,
        checks=checks,
        wheels=wheels,
        warnings=list(ctx.warnings),
        constraints=read_constraints(plan.paths.constraints),
        dist=_dist_record(ctx),
        python_checks={} if ctx.options.skip_checks else dict(sorted(ctx.python_checks.items())),
        rebuild=_rebuild(ctx, build_env),
        isolation=isolation_summary(ctx),
    )


def _tree_step(ctx: Context, project: str) -> Step | None:
    """The step that built ``project``'s tree: its compile step (the first Python's), whose record holds the
    tree as it found it and what it wrote there; not the final wheel step (torch:repair and
    torchvision:bundle rewrite wheels and read no tree)."""
    first = ("", ctx.plan.recipe.python)
    steps = ctx.plan.steps
    return next(
        (s for s in steps if s.kind == "compile" and s.project == project and s.python in first), None
    )


def _rebuild(ctx: Context, build_env: dict[str, dict[str, str]]) -> Rebuild:
    """What `torchkiln reproduce` needs: each compile's SOURCE_DATE_EPOCH (as it ran), the in-tree outputs a
    tree without git left out of its digest, the torch a --torch build installed (and its wheel's digest)."""
    epochs = {p: int(env["SOURCE_DATE_EPOCH"]) for p, env in build_env.items() if "SOURCE_DATE_EPOCH" in env}
    outputs = {}
    for project in ctx.plan.wheel_steps():
        step = _tree_step(ctx, project)
        entry = (ctx.state.get(step.name) or {}) if step is not None else {}
        written = (entry.get("outputs") or {}).get("tree_outputs")
        if written is not None:
            outputs[project] = sorted(written)
    torch = None
    given = ctx.plan.given_torch
    if given is not None:
        path = Path(given)
        wheel = given.endswith(".whl") and path.is_file()
        torch = GivenTorchRecord(given, file_sha256(path) if wheel else None)
    return Rebuild(epochs, outputs, torch, ctx.plan.cache.kind)


def _dist_record(ctx: Context) -> DistRecord | None:
    """None when no distributed compiles were asked for; ``used`` False when the preflight turned them off
    (or when this run compiled nothing: a no-op run asks no scheduler)."""
    if ctx.plan.dist is None:
        return None
    url = ctx.plan.dist.scheduler_url
    used = ctx.dist is not None and ctx.dist.spec is not None
    stats = ctx.dist_stats
    if stats is None:
        return DistRecord(url, used)
    return DistRecord(
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


def _last_run(ctx: Context, name: str) -> float | None:
    entry = ctx.state.get(name)
    return round(entry["duration_s"], 3) if entry and "duration_s" in entry else None
