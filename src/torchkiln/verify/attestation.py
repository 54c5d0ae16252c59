"""Whether the installed wheels are the subjects of a signed provenance statement.

``torchkiln verify --provenance dist/<recipe>.intoto.jsonl --key PUB`` (and the runtime image's gate) run
:func:`attestation_checks`, one :class:`~.comparison.Comparison` each:

* ``signature``: the DSSE envelope is an in-toto one carrying a signature by the given public key that
  verifies over its payload and type (:func:`torchkiln.artifacts.signing.verify`), and the payload is an
  in-toto Statement v1 with a SLSA provenance v1 predicate (:mod:`torchkiln.artifacts.intoto`). It fails
  naming why: another payload type, no signature by this key (a wrong key), one that does not verify (the
  statement or the signature was changed after signing), or the rule of the statement it breaks. Nothing
  else is trusted without it: the subjects' checks are then skipped, saying so;
* per subject (each wheel the statement names, keyed by its distribution): ``version``, ``commit``,
  ``wheel_sha256``, ``files``: the installed distribution against the subject's annotations and digest,
  the same comparison as ``--manifest`` (:func:`.provenance.wheel_checks`): a tampered wheel, installed,
  differs in its sha256 (when pip recorded the file it installed from) and in its files;
* ``byproducts``: the manifest, lock file and SBOMs the statement binds by digest, where they lie beside
  the statement (dist/, or ``/opt/torchkiln`` in the runtime image): each present one must have its digest.

The commit is read from the installed package's ``version.py`` (``git_version``, as torch and torchvision
write it) without importing it.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

from torchkiln.artifacts.intoto import Departure
from torchkiln.artifacts.manifest import WheelRecord
from torchkiln.artifacts.provenance import Statement, Subject, read_statement
from torchkiln.artifacts.signing import Envelope, PublicKey, verify
from torchkiln.files.digests import file_sha256

from .comparison import Comparison
from .provenance import GIT_VERSIONED, MANIFEST_CHECKS, installed, wheel_checks

SUBJECT_CHECKS = MANIFEST_CHECKS
_GIT_VERSION = re.compile(r"""^git_version\s*=\s*['"]([0-9a-f]{7,40})['"]""", re.M)


def installed_git_version(distribution: str) -> str | None:
    """``git_version`` of the installed distribution's top-level ``version.py``; None when it has none."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in dist.files or []:
        parts = entry.parts
        if len(parts) == 2 and parts[1] == "version.py":
            try:
                match = _GIT_VERSION.search(Path(str(entry.locate())).read_text(encoding="utf-8"))
            except OSError:
                continue
            if match:
                return match.group(1)
    return None


def subject_checks(subject: Subject, where: str, *, check_files: bool = True) -> dict[str, Comparison]:
    """The :data:`SUBJECT_CHECKS` of one subject against the installed distribution of its name."""
    record = WheelRecord(
        subject.name, subject.distribution, subject.version, 0, subject.sha256, subject.files_sha256 or ""
    )
    found = installed(subject.distribution, check_files=check_files)
    git_version = installed_git_version(subject.distribution)
    return wheel_checks(
        record,
        found,
        git_version,
        subject.commit,
        None,
        where=f"provenance {where} subject {subject.name}",
        document="the statement",
        reports_git=git_version is not None or subject.distribution in GIT_VERSIONED,
    )


def byproduct_check(statement: Statement, directory: Path) -> Comparison:
    """The byproducts the statement binds, where they lie in ``directory``: each present one has its digest."""
    present = [(b, directory / b.name) for b in statement.byproducts if (directory / b.name).is_file()]
    if not present:
        return Comparison("byproducts", "skip", f"none of the statement's byproducts is in {directory}")
    changed = [b.name for b, path in present if file_sha256(path) != b.sha256]
    if changed:
        return Comparison(
            "byproducts",
            "fail",
            f"{', '.join(changed)} in {directory} differ from the digests the statement binds",
        )
    names = ", ".join(b.name for b, _ in present)
    return Comparison("byproducts", "pass", f"{names} in {directory} are the ones the statement binds")


def attestation_checks(
    envelope: Envelope, key: PublicKey, where: str, *, directory: Path | None = None, check_files: bool = True
) -> dict[str, Comparison]:
    """``signature``, ``byproducts`` and ``<distribution>.<check>`` per subject (see the module docstring).
    ``where`` names the statement file in every message; ``directory`` is where its byproducts may lie."""
    verdict = verify(envelope, key)
    results = {
        "signature": Comparison(
            "signature", "pass" if verdict.ok else "fail", f"provenance {where}: {verdict.message}"
        )
    }
    if not verdict.ok:
        untrusted = f"provenance {where}: not checked: the statement is not signed by the given key"
        results["byproducts"] = Comparison("byproducts", "skip", untrusted)
        return results
    try:
        statement = read_statement(envelope, where)
    except Departure as exc:  # signed, but not a statement as in-toto and SLSA say: it vouches for nothing
        results["signature"] = Comparison("signature", "fail", f"provenance {exc}")
        results["byproducts"] = Comparison(
            "byproducts", "skip", f"provenance {where}: not checked: {exc.rule}"
        )
        return results
    for subject in statement.subjects:
        for check_id, check in subject_checks(subject, where, check_files=check_files).items():
            results[f"{subject.distribution}.{check_id}"] = check
    if directory is not None:
        results["byproducts"] = byproduct_check(statement, directory)
    return results
