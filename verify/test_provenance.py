"""Area 1, build config: the installed wheels are the subjects of a signed provenance statement.

With ``--provenance dist/<recipe>.intoto.jsonl --key PUB`` (``torchkiln build --sign-key-*`` wrote the
statement): the signature by that key verifies, the installed distributions are the wheels the statement
names (version, commit, the wheel's sha256, the installed files), and the byproducts beside the statement
(manifest, lock file, SBOMs) have the digests it binds. Each failure names the statement, the subject and
what differs; a wrong key and a changed statement fail ``test_provenance_signature``.
"""

from __future__ import annotations

import pytest

from torchkiln.verify import attestation
from torchkiln.verify.comparison import Comparison

pytestmark = pytest.mark.build_config


@pytest.fixture(scope="module")
def results(provenance: object) -> dict[str, Comparison]:
    if provenance is None:
        pytest.skip("no --provenance given: no signed statement to check the installed wheels against")
    path, envelope, key = provenance  # type: ignore[misc]
    return attestation.attestation_checks(envelope, key, str(path), directory=path.parent)


def _assert(checks: list[Comparison]) -> None:
    failed = [c.message for c in checks if c.status not in ("pass", "skip")]
    if failed:
        pytest.fail("\n".join(failed), pytrace=False)
    if checks and all(c.status == "skip" for c in checks):
        pytest.skip("; ".join(c.message for c in checks))


def test_provenance_signature(results: dict[str, Comparison]) -> None:
    _assert([results["signature"]])


@pytest.mark.parametrize("check_id", attestation.SUBJECT_CHECKS)
def test_provenance_subjects(results: dict[str, Comparison], check_id: str) -> None:
    if results["signature"].status != "pass":
        pytest.skip("the statement is not signed by the given key: its subjects say nothing")
    _assert([c for key, c in results.items() if key.endswith(f".{check_id}")])


def test_provenance_byproducts(results: dict[str, Comparison]) -> None:
    _assert([results["byproducts"]] if "byproducts" in results else [])
