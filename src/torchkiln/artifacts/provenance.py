"""``dist/<recipe>.intoto.jsonl``: the build's provenance as an in-toto Statement v1 with a SLSA
Provenance v1 predicate, signed as a DSSE envelope (:mod:`.signing`).

The statement says which wheels a build made (its ``subject``: each wheel's file name and sha256, with its
project, version, source commit, installed-files digest and its tree's version file as read beside the label,
``version_file``, as annotations) and how:

* ``buildDefinition.buildType``: :data:`BUILD_TYPE` (how to read the rest; docs/supply-chain.md);
* ``externalParameters``: what the user chose: the recipe (name, path, sha256, its text's digest) and the
  command line's choices (projects, jobs, cache, source trees given, a given torch, skipped checks);
* ``internalParameters``: the environment each compile ran with (ENV_TABLE's variables: no secrets), and
  ``isolation``: whether every build step ran in a sandbox that hides the signing key and the build's other
  secrets from it (``bubblewrap``), or not (``none``, with the reason and the steps, and
  ``allow_unisolated``: true, the signer's explicit ``--allow-unisolated``, without which such a build is
  not signed);
* ``resolvedDependencies``: each project's source (``git+<repo>@<ref>`` at its commit, or its tree's
  sha256; a tree that differed from its commit names each path in ``annotations.tree_changes``: its kind,
  extra / modified / removed, and what was built: a file's sha256, a symbolic link's text; a tree with
  links that lead out of it, built under ``--allow-dirty``, names each in ``annotations.outside_links``),
  every submodule at its commit, and the build venv's packages at their versions;
* ``runDetails``: the builder (:data:`BUILDER_ID` with torchkiln's version), start and end, the compiler
  cache and the build cluster used (``builder.builderDependencies``: they run beside the build and, with
  content-keyed caches, do not change its output), and the byproducts (manifest, lock file, SBOMs) by
  digest, so the statement binds them too.

Everything comes from the manifest the same publish step wrote (:mod:`.manifest`), so the statement says
nothing the manifest does not. Reading a statement back (:func:`read_statement`) is what ``torchkiln verify
--provenance`` and the runtime image's gate do: the subjects, typed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchkiln.errors import UsageError
from torchkiln.files import atomic
from torchkiln.files.digests import file_sha256

from . import wheelfile
from .intoto import PREDICATE_TYPE as PREDICATE_TYPE
from .intoto import STATEMENT_TYPE as STATEMENT_TYPE
from .intoto import read_statement_data
from .lockfile import SourceLock
from .manifest import CacheRecord, ClusterRecord, Manifest
from .published import STATEMENT_SUFFIX
from .published import statement_name as statement_name  # named in .published (no signing needed to find one)
from .signing import Envelope, PrivateKey, sign

# torchkiln's own URIs, each a section of docs/supply-chain.md: what a build of wheels means (how to read
# the parameters), and the builder (torchkiln run by whoever holds the signing key, on their host).
DOCS = "https://github.com/torchkiln/torchkiln/blob/main/docs/supply-chain.md"
BUILD_TYPE = f"{DOCS}#build-type-wheels-v1"
BUILDER_ID = f"{DOCS}#builder-local"
SUFFIX = STATEMENT_SUFFIX


@dataclass(frozen=True)
class Subject:
    """One wheel a statement is about."""

    name: str
    sha256: str
    project: str
    distribution: str
    version: str
    commit: str | None
    files_sha256: str | None


@dataclass(frozen=True)
class Byproduct:
    name: str
    sha256: str


@dataclass(frozen=True)
class Statement:
    subjects: list[Subject]
    byproducts: list[Byproduct] = field(default_factory=list)
    recipe: str = ""


def _subjects(manifest: Manifest) -> list[dict[str, Any]]:
    out = []
    for wheel in manifest.wheels:
        source = manifest.sources.get(wheel.project)
        parsed = wheelfile.parse(wheel.name)
        annotations: dict[str, Any] = {
            "project": wheel.project,
            "distribution": parsed.project if parsed else wheel.project,
            "version": wheel.version,
            "files_sha256": wheel.files_sha256,
        }
        if source is not None and source.commit:
            annotations["commit"] = source.commit
        elif source is not None and source.tree_sha256:
            annotations["tree_sha256"] = source.tree_sha256
        if source is not None and source.version is not None:  # the tree's own version text, as read
            annotations["version_file"] = _version_file(source)
        out.append({"name": wheel.name, "digest": {"sha256": wheel.sha256}, "annotations": annotations})
    return out


def _version_file(lock: SourceLock) -> dict[str, Any]:
    record = lock.version
    assert record is not None
    return {
        "file": record.file,
        "text": record.text,
        "sha256": record.sha256,
        "label": record.label,
        "reading": record.reading,
    }


def _git_uri(repo: str | None, ref: str | None) -> str | None:
    if not repo:
        return None
    return f"git+{repo}@{ref}" if ref else f"git+{repo}"


def _resolved(manifest: Manifest) -> list[dict[str, Any]]:
    """Sources at their commits (or tree digests), their submodules, the build venv's packages."""
    out: list[dict[str, Any]] = []
    for name, lock in sorted(manifest.sources.items()):
        entry: dict[str, Any] = {"name": name}
        uri = _git_uri(lock.repo, lock.ref)
        if uri:
            entry["uri"] = uri
        entry["digest"] = {"gitCommit": lock.commit} if lock.commit else {"sha256": lock.tree_sha256 or ""}
        entry["annotations"] = {"dirty": lock.dirty, "provided": lock.provided, "path": lock.path}
        if lock.changed:  # the paths that differ from the commit (a fetched checkout: --allow-dirty)
            entry["annotations"]["changed"] = list(lock.changed)
        if lock.tree_changes:  # how each differs, and what was built there: a file's sha256, a link's text
            entry["annotations"]["tree_changes"] = [
                {"path": c.path, "kind": c.kind, "sha256": c.sha256, "detail": c.detail, "link": c.link}
                for c in lock.tree_changes
            ]
        if lock.version is not None:  # its version file as read, beside the label the wheel got
            entry["annotations"]["version_file"] = _version_file(lock)
        if lock.outside_links:  # symbolic links that lead out of the tree (built under --allow-dirty)
            entry["annotations"]["outside_links"] = [
                {"path": link.path, "link": link.link} for link in lock.outside_links
            ]
        if manifest.rebuild is not None and name in manifest.rebuild.tree_outputs:
            # a tree without git: the files its build wrote into it, which its sha256 leaves out
            entry["annotations"]["tree_outputs"] = manifest.rebuild.tree_outputs[name]
        out.append(entry)
        for sub in lock.submodules:
            item: dict[str, Any] = {"name": f"{name}/{sub.path}", "digest": {"gitCommit": sub.commit}}
            if sub.url:
                item["uri"] = f"git+{sub.url}"
            item["annotations"] = {"state": sub.state}
            out.append(item)
    for package, version in sorted(manifest.toolchain.build_packages.items()):
        out.append({"name": package, "uri": f"pkg:pypi/{package}@{version}"})
    return out


def _rebuild_parameters(manifest: Manifest) -> dict[str, Any]:
    """What `torchkiln reproduce` needs beyond the sources: each compile's SOURCE_DATE_EPOCH, and the torch a
    --torch build installed (with its wheel's sha256)."""
    rebuild = manifest.rebuild
    if rebuild is None:
        return {}
    out: dict[str, Any] = {"source_date_epoch": dict(rebuild.source_date_epoch)}
    if rebuild.torch is not None:
        out["given_torch"] = {"install": rebuild.torch.install, "sha256": rebuild.torch.sha256}
    return out


def _cache(record: CacheRecord | None, parameters: Mapping[str, Any]) -> dict[str, Any] | None:
    cache = parameters.get("cache")
    if not isinstance(cache, Mapping) or cache.get("kind") in (None, "none"):
        return None
    entry: dict[str, Any] = {"name": f"compiler-cache:{cache['kind']}"}
    if cache.get("remote"):
        entry["uri"] = str(cache["remote"])
    if record is not None:
        entry["annotations"] = {
            "hits": record.hits,
            "misses": record.misses,
            "remote_hits": record.remote.hits,
            "hit_rate": record.hit_rate,
        }
    return entry


def _cluster(record: ClusterRecord | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {
        "name": "build-cluster:sccache-dist",
        "uri": record.scheduler_url,
        "annotations": {
            "used": record.used,
            "remote": record.remote,
            "local": record.local,
            "fallback": record.fallback,
            "servers": sorted(record.by_server),
        },
    }


def _isolation(manifest: Manifest) -> dict[str, Any]:
    """How the build steps ran (the manifest's record): ``isolation`` with mode, reason and the unsandboxed
    steps; nothing for a manifest from before it was recorded."""
    record = manifest.isolation
    if record is None:
        return {}
    return {
        "isolation": {
            "mode": record.mode,
            "reason": record.reason,
            "steps": list(record.steps),
            "allow_unisolated": record.allow_unisolated,
        }
    }


def statement(
    manifest: Manifest,
    *,
    parameters: Mapping[str, Any],
    byproducts: list[Path],
    recipe_text_sha256: str | None = None,
    builder_id: str = BUILDER_ID,
) -> dict[str, Any]:
    """The in-toto Statement (a dict, ready for JSON) of the build ``manifest`` describes.

    ``parameters``: the command line's choices (JSON-able, no secrets: the cache's remote URL as the
    plan shows it); ``byproducts``: files the statement binds by digest (manifest, lock file, SBOMs)."""
    recipe: dict[str, Any] = {
        "name": manifest.recipe.name,
        "path": manifest.recipe.path,
        "digest": {"sha256": manifest.recipe.sha256},
    }
    if recipe_text_sha256:
        recipe["file_sha256"] = recipe_text_sha256
    builder_deps = [d for d in (_cache(manifest.cache, parameters), _cluster(manifest.dist)) if d]
    return {
        "_type": STATEMENT_TYPE,
        "subject": _subjects(manifest),
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"recipe": recipe, "options": dict(parameters)},
                "internalParameters": {
                    "build_env": manifest.build_env,
                    "projects": manifest.projects,
                    **_rebuild_parameters(manifest),
                    **_isolation(manifest),
                },
                "resolvedDependencies": _resolved(manifest),
            },
            "runDetails": {
                "builder": {
                    "id": builder_id,
                    "version": {"torchkiln": manifest.torchkiln},
                    **({"builderDependencies": builder_deps} if builder_deps else {}),
                },
                "metadata": {
                    "invocationId": str(uuid.uuid4()),
                    "startedOn": manifest.started,
                    "finishedOn": manifest.finished,
                },
                "byproducts": [{"name": p.name, "digest": {"sha256": file_sha256(p)}} for p in byproducts],
            },
        },
    }


def canonical(data: Mapping[str, Any]) -> bytes:
    """The payload bytes that are signed: compact JSON with sorted keys."""
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode("utf-8")


def write_signed(path: Path, data: Mapping[str, Any], key: PrivateKey) -> Envelope:
    """Sign the statement ``data`` and write its envelope to ``path`` (atomically)."""
    envelope = sign(canonical(data), key)
    atomic.write_text(path, envelope.to_line())
    return envelope


def _problem(where: str, field_name: str, valid: str) -> UsageError:
    return UsageError(f"{where}: {field_name}: missing or malformed (valid: {valid})")


def _subject(item: Any, index: int, where: str) -> Subject:
    if not isinstance(item, dict):
        raise _problem(where, f"subject[{index}]", "a resource descriptor")
    digest = item.get("digest")
    notes = item.get("annotations") or {}
    if not isinstance(digest, dict) or not isinstance(digest.get("sha256"), str):
        raise _problem(where, f"subject[{index}].digest.sha256", "the wheel's hex sha256")
    if not isinstance(notes, dict) or not isinstance(notes.get("project"), str):
        raise _problem(where, f"subject[{index}].annotations.project", "torch or torchvision")
    return Subject(
        name=str(item.get("name", "")),
        sha256=digest["sha256"],
        project=notes["project"],
        distribution=str(notes.get("distribution") or notes["project"]),
        version=str(notes.get("version", "")),
        commit=notes.get("commit") if isinstance(notes.get("commit"), str) else None,
        files_sha256=notes.get("files_sha256") if isinstance(notes.get("files_sha256"), str) else None,
    )


def read_statement(envelope: Envelope, where: str) -> Statement:
    """The subjects and byproducts of the statement an envelope carries, checked as in-toto and SLSA say
    (:func:`torchkiln.artifacts.intoto.read_statement_data`: a Departure naming ``where``, the field and the
    rule otherwise), plus what torchkiln reads of each subject (its project). Call it on a *verified*
    envelope: an unsigned payload says nothing."""
    data = read_statement_data(envelope.payload, where)
    subjects = [_subject(item, i, where) for i, item in enumerate(data["subject"])]
    predicate = data.get("predicate") or {}
    run = predicate.get("runDetails", {})
    byproducts = [
        Byproduct(str(b.get("name")), str((b.get("digest") or {}).get("sha256")))
        for b in (run.get("byproducts") or [] if isinstance(run, dict) else [])
        if isinstance(b, dict)
    ]
    recipe = predicate["buildDefinition"]["externalParameters"].get("recipe", {})
    name = recipe.get("name", "") if isinstance(recipe, dict) else ""
    return Statement(subjects, byproducts, str(name))
