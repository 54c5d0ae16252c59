"""What a build recorded, read as the inputs of a rebuild: from ``dist/manifest.json`` or from a signed
provenance statement (``dist/<recipe>.intoto.jsonl``), the same :class:`Record` either way.

``torchkiln reproduce`` (torchkiln.commands.reproduce) rebuilds from it: the recipe (its path and sha256),
each project's source (the repository and commit it was fetched at, or a tree's sha256 and the files its build
wrote into it, with every submodule's commit), the projects built, each compile's ``SOURCE_DATE_EPOCH``, the
torch a ``--torch`` build installed, the compiler cache's tool, and the wheels with their sha256. A manifest or statement from before
issue 35 has no ``rebuild`` record: the epochs then come from the build environment it recorded, which has
them since issue 38, and a ``--torch`` wheel is not named (the command line must give it again).

A statement is checked as the specifications say (:mod:`.intoto`) and, given a public key, verified first:
a statement that is not signed by it is refused, since the rebuild would otherwise start from anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchkiln.errors import UsageError

from .intoto import read_statement_data
from .manifest import GivenTorchRecord, Manifest, load_manifest
from .signing import PublicKey, parse_envelope, verify


@dataclass(frozen=True)
class RecordedSource:
    """One project's source as the build recorded it."""

    project: str
    repo: str | None  # where it was fetched from (None: a --source-dir tree)
    ref: str | None
    commit: str | None  # None: a tree without git, known by tree_sha256
    tree_sha256: str | None
    provided: bool
    path: str
    changed: list[str] = field(default_factory=list)  # files that differed from the commit
    submodules: dict[str, str] = field(default_factory=dict)  # path -> commit
    tree_outputs: list[str] = field(default_factory=list)  # files the build wrote into a tree without git


@dataclass(frozen=True)
class RecordedWheel:
    name: str
    sha256: str
    project: str


@dataclass(frozen=True)
class Record:
    file: Path
    kind: str  # "manifest" | "provenance"
    recipe_name: str
    recipe_path: str | None
    recipe_sha256: str
    projects: list[str]
    sources: dict[str, RecordedSource]
    epochs: dict[str, int]  # project -> SOURCE_DATE_EPOCH its compile ran with
    torch: GivenTorchRecord | None
    wheels: list[RecordedWheel]
    workdir: str | None = None  # where the build ran (the rebuild must run elsewhere)
    tools: dict[str, str] = field(default_factory=dict)  # compilers & co. -> version (manifest only)
    build_packages: dict[str, str] = field(default_factory=dict)  # the build venv's -> version
    signature: str | None = None  # the verdict, when a statement was verified with a key
    cache: str | None = None  # the compiler cache's tool the compiles ran through (None: not recorded)


def load_record(path: Path, key: PublicKey | None = None) -> Record:
    """The record in ``path``: a manifest, or a provenance envelope (verified with ``key`` when given).
    UsageError (exit 2) naming the file and what is wrong otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(
            f"{path}: no such file (valid: a dist/manifest.json or <recipe>.intoto.jsonl)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise UsageError(f"{path}: cannot read: {reason}") from None
    if _is_envelope(text):
        return _from_statement(path, text, key)
    if key is not None:
        raise UsageError(f"--key: {path} is a manifest, not a signed statement: nothing to verify with a key")
    return _from_manifest(path, load_manifest(path))


def _is_envelope(text: str) -> bool:
    """Whether ``text`` is a DSSE envelope (a JSON object, or the first line of a .intoto.jsonl, with a
    payloadType) rather than a manifest."""
    for candidate in (text, next((line for line in text.splitlines() if line.strip()), "")):
        try:
            data = json.loads(candidate)
        except ValueError:
            continue
        return isinstance(data, dict) and "payloadType" in data
    return False


def _epochs(build_env: Any) -> dict[str, int]:
    """SOURCE_DATE_EPOCH of each project's recorded build environment (issue 38 recorded it there)."""
    out: dict[str, int] = {}
    for project, env in (build_env or {}).items():
        value = env.get("SOURCE_DATE_EPOCH") if isinstance(env, dict) else None
        if isinstance(value, str) and value.isdigit():
            out[str(project)] = int(value)
    return out


def _workdir(build_env: Any) -> str | None:
    """The build's work directory: its venv's parent (VIRTUAL_ENV of a compile)."""
    for env in (build_env or {}).values():
        venv = env.get("VIRTUAL_ENV") if isinstance(env, dict) else None
        if isinstance(venv, str) and venv:
            return str(Path(venv).parent)
    return None


def _from_manifest(path: Path, manifest: Manifest) -> Record:
    rebuild = manifest.rebuild
    sources = {
        name: RecordedSource(
            name,
            lock.repo,
            lock.ref,
            lock.commit,
            lock.tree_sha256,
            lock.provided,
            lock.path,
            list(lock.changed),
            {s.path: s.commit for s in lock.submodules},
            list(rebuild.tree_outputs.get(name, [])) if rebuild else [],
        )
        for name, lock in manifest.sources.items()
    }
    epochs = dict(rebuild.source_date_epoch) if rebuild and rebuild.source_date_epoch else {}
    return Record(
        file=path,
        kind="manifest",
        recipe_name=manifest.recipe.name,
        recipe_path=manifest.recipe.path,
        recipe_sha256=manifest.recipe.sha256,
        projects=list(manifest.projects),
        sources=sources,
        epochs=epochs or _epochs(manifest.build_env),
        torch=rebuild.torch if rebuild else None,
        wheels=[RecordedWheel(w.name, w.sha256, w.project) for w in manifest.wheels],
        workdir=_workdir(manifest.build_env),
        tools={n: t.version for n, t in manifest.toolchain.tools.items() if t.version is not None},
        build_packages=dict(manifest.toolchain.build_packages),
        cache=(rebuild.cache if rebuild and rebuild.cache else None)
        or (manifest.cache.tool if manifest.cache else None),
    )


def _from_statement(path: Path, text: str, key: PublicKey | None) -> Record:
    where = str(path)
    envelope = parse_envelope(text, where)
    verdict = None
    if key is not None:
        verdict = verify(envelope, key)
        if not verdict.ok:
            raise UsageError(
                f"{where}: {verdict.message}: nothing is rebuilt from a statement not signed by --key"
            )
    data = read_statement_data(envelope.payload, where)
    build = data["predicate"]["buildDefinition"]
    external, internal = build["externalParameters"], build.get("internalParameters") or {}
    recipe = external.get("recipe") if isinstance(external.get("recipe"), dict) else {}
    options = external.get("options") if isinstance(external.get("options"), dict) else {}
    given = internal.get("given_torch") if isinstance(internal, dict) else None
    torch = None
    if isinstance(given, dict) and isinstance(given.get("install"), str):
        sha = given.get("sha256")
        torch = GivenTorchRecord(given["install"], sha if isinstance(sha, str) else None)
    epochs = internal.get("source_date_epoch") if isinstance(internal, dict) else None
    return Record(
        file=path,
        kind="provenance",
        recipe_name=str(recipe.get("name", "")),
        recipe_path=recipe.get("path") if isinstance(recipe.get("path"), str) else None,
        recipe_sha256=str((recipe.get("digest") or {}).get("sha256", "")),
        projects=[str(p) for p in options.get("projects") or internal.get("projects") or []],
        sources=_statement_sources(build.get("resolvedDependencies") or []),
        epochs=(
            {str(k): int(v) for k, v in epochs.items() if isinstance(v, int)}
            if isinstance(epochs, dict)
            else _epochs(internal.get("build_env"))
        ),
        torch=torch,
        wheels=[
            RecordedWheel(
                str(s.get("name", "")),
                s["digest"]["sha256"],
                str((s.get("annotations") or {}).get("project", "")),
            )
            for s in data["subject"]
        ],
        workdir=options.get("workdir") if isinstance(options.get("workdir"), str) else None,
        build_packages=_packages(build.get("resolvedDependencies") or []),
        signature=verdict.message if verdict else None,
        cache=_cache_kind(options.get("cache")),
    )


def _cache_kind(cache: Any) -> str | None:
    kind = cache.get("kind") if isinstance(cache, dict) else None
    return kind if isinstance(kind, str) and kind else None


def _split_uri(uri: str) -> tuple[str | None, str | None]:
    """``git+<repo>@<ref>`` -> (repo, ref); the ref is after the last '@' that follows the path."""
    if not uri.startswith("git+"):
        return None, None
    rest = uri[4:]
    at = rest.rfind("@")
    if at > rest.find("://") + 3 and "/" not in rest[at:]:
        return rest[:at], rest[at + 1 :]
    return rest, None


def _statement_sources(items: list[Any]) -> dict[str, RecordedSource]:
    sources: dict[str, RecordedSource] = {}
    subs: dict[str, dict[str, str]] = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            continue
        name, digest = item["name"], item.get("digest") or {}
        notes = item.get("annotations") or {}
        if "/" in name:  # a submodule: <project>/<path>
            project, sub = name.split("/", 1)
            if isinstance(digest.get("gitCommit"), str):
                subs.setdefault(project, {})[sub] = digest["gitCommit"]
            continue
        if name not in ("torch", "torchvision") or "provided" not in notes:
            continue  # the build venv's packages (pkg:pypi/torch@... among them) are not sources
        repo, ref = _split_uri(str(item.get("uri", "")))
        sources[name] = RecordedSource(
            name,
            repo,
            ref,
            digest.get("gitCommit") if isinstance(digest.get("gitCommit"), str) else None,
            digest.get("sha256") if isinstance(digest.get("sha256"), str) else None,
            bool(notes.get("provided")),
            str(notes.get("path", "")),
            [str(c) for c in notes.get("changed") or []],
            {},
            [str(c) for c in notes.get("tree_outputs") or []],
        )
    for project, found in subs.items():
        if project in sources:
            sources[project].submodules.update(found)
    return sources


def _packages(items: list[Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        uri = item.get("uri") if isinstance(item, dict) else None
        if isinstance(uri, str) and uri.startswith("pkg:pypi/") and "@" in uri:
            name, version = uri[len("pkg:pypi/") :].rsplit("@", 1)
            out[name] = version
    return out
