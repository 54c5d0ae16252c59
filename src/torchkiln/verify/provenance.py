"""Whether the installed torch and torchvision are the wheels a manifest lists: versions, commits, bytes.

``torchkiln verify --manifest dist/manifest.json`` compares what is installed with what the build recorded
(:mod:`torchkiln.artifacts.manifest`), per project the manifest lists a wheel of:

* ``version``: the installed distribution's version is the wheel's;
* ``commit``: ``git_version`` of the installed package is the commit its source was at (the manifest's
  ``sources``: the lock file's commit, so also when the recipe pins none);
* ``wheel_sha256``: pip's record of the file it installed from (``direct_url.json``, written when a wheel
  is installed by path) names the wheel's sha256;
* ``files``: the installed files are the wheel's: the digest of the installed RECORD equals the manifest's
  ``files_sha256`` (:func:`torchkiln.artifacts.wheelfile.record_digest`), and every file it covers (those in
  site-packages) still has the content RECORD gives for it. This holds however the wheel was installed
  (``--find-links``, in an image).

Pure Python; nothing here imports torch (the facts come from :mod:`.facts`).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from torchkiln.artifacts import wheelfile
from torchkiln.artifacts.manifest import Manifest, WheelRecord
from torchkiln.errors import few

from .comparison import Comparison
from .facts import BuildFacts

MANIFEST_CHECKS = ("version", "commit", "wheel_sha256", "files")


@dataclass(frozen=True)
class Installed:
    """What the environment holds of one project."""

    project: str
    version: str
    record_digest: str | None  # None: the installation has no RECORD
    archive_sha256: str | None  # the wheel file pip installed from, when it recorded one
    changed: list[str] = field(default_factory=list)  # installed files whose bytes differ from RECORD


def _record_hash(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return "sha256=" + base64.urlsafe_b64encode(h.digest()).decode().rstrip("=")


def installed(project: str, *, check_files: bool = True) -> Installed | None:
    """The installed distribution of ``project``; None when it is not installed."""
    try:
        dist = importlib.metadata.distribution(project)
    except importlib.metadata.PackageNotFoundError:
        return None
    record = dist.read_text("RECORD")
    archive = None
    direct = dist.read_text("direct_url.json")
    if direct:
        try:
            hashes = json.loads(direct).get("archive_info", {}).get("hashes", {})
            archive = hashes.get("sha256")
        except ValueError:
            archive = None
    changed: list[str] = []
    if check_files:
        for entry in dist.files or []:
            # The files record_digest covers: those in site-packages that came from the wheel.
            if (
                entry.hash is None
                or entry.hash.mode != "sha256"
                or wheelfile.installed_path(str(entry)) is None
            ):
                continue
            path = Path(str(entry.locate()))
            try:
                actual = _record_hash(path)
            except OSError:
                changed.append(f"{entry} (missing)")
                continue
            if actual != f"sha256={entry.hash.value}":
                changed.append(str(entry))
    digest = wheelfile.record_digest(record) if record is not None else None
    return Installed(project, dist.version, digest, archive, changed)


def _same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


# Projects whose installed package reports the commit it was built from (``<package>.version.git_version``).
GIT_VERSIONED = ("torch", "torchvision")


def _verdict(
    check_id: str, said: str, otherwise: str, expected: str, actual: str | None, ok: bool | None = None
) -> Comparison:
    """Pass with ``said``, or fail with ``said, otherwise``; ``ok`` defaults to expected == actual."""
    ok = expected == actual if ok is None else ok
    return Comparison(
        check_id, "pass" if ok else "fail", said if ok else f"{said}, {otherwise}", expected, actual
    )


def wheel_checks(
    wheel: WheelRecord,
    found: Installed | None,
    git_version: str | None,
    commit: str | None,
    tree: str | None,
    *,
    where: str | None = None,
    document: str = "the manifest",
    reports_git: bool | None = None,
) -> dict[str, Comparison]:
    """The :data:`MANIFEST_CHECKS` of one wheel against what is installed; ``where`` names the document's
    entry in every message (the manifest's ``wheels[<project>]`` by default; a provenance statement's
    subject), ``document`` the document (what it says the wheel is); ``reports_git``: whether the installed
    package reports the commit it was built from (default: torch and torchvision do)."""
    where = where or f"manifest wheels[{wheel.project}]"
    if found is None:
        missing = Comparison(
            "version", "fail", f"{where}: {wheel.project} is not installed", wheel.version, None
        )
        return {c: Comparison(c, "fail", missing.message) for c in MANIFEST_CHECKS}
    out: dict[str, Comparison] = {}
    out["version"] = _verdict(
        "version",
        f"{where}: installed {wheel.project} {found.version}",
        f"{document}'s wheel is {wheel.version} ({wheel.name})",
        wheel.version,
        found.version,
        _same_version(found.version, wheel.version),
    )
    if not (wheel.project in GIT_VERSIONED if reports_git is None else reports_git):
        out["commit"] = Comparison("commit", "skip", f"{where}: {wheel.project} reports no git_version")
    elif commit is None:
        reason = f"its source had no commit (tree sha256 {tree})" if tree else f"{document} records no commit"
        out["commit"] = Comparison(
            "commit", "skip", f"{where}: {reason}: nothing to compare git_version with"
        )
    else:
        out["commit"] = _verdict(
            "commit",
            f"{where}: git_version {git_version}",
            f"{document}'s source commit is {commit}",
            commit,
            git_version,
        )
    if found.archive_sha256 is None:
        out["wheel_sha256"] = Comparison(
            "wheel_sha256",
            "skip",
            f"{where}: pip recorded no wheel file for {wheel.project} (installed from an index or "
            "--find-links): the files check covers it",
        )
    else:
        out["wheel_sha256"] = _verdict(
            "wheel_sha256",
            f"{where}: installed from a wheel with sha256 {found.archive_sha256}",
            f"{document}'s {wheel.name} has {wheel.sha256}",
            wheel.sha256,
            found.archive_sha256,
        )
    if found.record_digest != wheel.files_sha256:
        out["files"] = Comparison(
            "files",
            "fail",
            f"{where}: the installed files are not {wheel.name}'s (RECORD digest {found.record_digest}, "
            f"{document}'s {wheel.files_sha256})",
            wheel.files_sha256,
            found.record_digest,
        )
    elif found.changed:
        out["files"] = Comparison(
            "files", "fail", f"{where}: installed files changed since installation: {few(found.changed)}"
        )
    else:
        out["files"] = Comparison("files", "pass", f"{where}: the installed files are {wheel.name}'s")
    return out


def manifest_checks(
    manifest: Manifest, facts: BuildFacts, *, check_files: bool = True
) -> dict[str, Comparison]:
    """``<project>.<check>`` for each project the manifest has a wheel of (keys of :data:`MANIFEST_CHECKS`).
    A build for several Pythons lists a wheel of each project per Python: the one of the Python running
    here is compared (``facts.python_version``; a manifest from before issue 23 records no Python)."""
    results: dict[str, Comparison] = {}
    git_versions = {
        "torch": facts.git_version,
        "torchvision": facts.torchvision.git_version if facts.torchvision else None,
    }
    for wheel in manifest.wheels:
        if wheel.python and facts.python_version and wheel.python.removesuffix("t") != facts.python_version:
            continue
        source = manifest.sources.get(wheel.project)
        commit = source.commit if source is not None else None
        tree = source.tree_sha256 if source is not None else None
        found = installed(wheel.project, check_files=check_files)
        checks = wheel_checks(wheel, found, git_versions.get(wheel.project), commit, tree)
        results.update({f"{wheel.project}.{k}": c for k, c in checks.items()})
    return results
