"""Area parity: does this build still compute what upstream's wheel of the same release computes?

Runs only with ``--parity-reference FILE`` (``torchkiln verify --compare-with REQ`` runs the battery in a
venv holding upstream's wheel and passes its result). The battery (:mod:`torchkiln.verify.battery`) runs here
in a fresh process of this interpreter; each case on each device is compared output by output
(:mod:`torchkiln.verify.parity`, tolerances in ``data/parity.toml``). With ``--report DIR`` the per-output
numbers go to ``parity.json`` and ``parity.md`` there; the table is printed at the end either way.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from torchkiln.files import atomic
from torchkiln.verify import battery, parity, refenv

pytestmark = pytest.mark.parity


@pytest.fixture(scope="session")
def compared(
    parity_reference: dict[str, Any], tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[dict[str, Any], list[parity.Output]]]:
    out = tmp_path_factory.mktemp("parity") / "verified.json"
    refenv.run_battery(sys.executable, out, isolated=False)
    verified = parity.load(out, "the battery's result here")
    if verified["inputs_sha256"] != parity_reference.get("inputs_sha256"):
        pytest.fail(
            "the battery's inputs differ between the two sides (another battery version or Python: "
            f"{verified['python']} here, {parity_reference.get('python')} upstream)",
            pytrace=False,
        )
    outputs = parity.compare(verified, parity_reference, parity.tolerances())
    yield verified, outputs
    _report(request.config, verified, parity_reference, outputs)


def _report(config: pytest.Config, verified: dict, reference: dict, outputs: list[parity.Output]) -> None:
    table = parity.markdown(outputs, verified, reference)
    directory = config.getoption("report")
    if directory:
        atomic.write_text(Path(directory) / "parity.md", table)
        atomic.write_json(
            Path(directory) / "parity.json",
            {
                "verified": verified["torch"],
                "reference": reference["torch"],
                "outputs": [
                    {"case": o.case, "output": o.output, "status": o.status, "max_abs": o.max_abs,
                     "max_rel": o.max_rel, "rtol": o.tolerance.rtol if o.tolerance else None,
                     "atol": o.tolerance.atol if o.tolerance else None, "detail": o.detail}
                    for o in outputs
                ],
            },
        )  # fmt: skip
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        return
    counts = {s: sum(o.status == s for o in outputs) for s in ("identical", "within", "differs", "missing")}
    with capture.global_and_fixture_disabled():  # a session fixture's teardown runs under capture
        reporter.write_sep("-", "numerical parity with upstream")
        reporter.write_line(table.splitlines()[2])
        reporter.write_line(f"{len(outputs)} outputs: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
        for o in outputs:
            if o.status != "identical":
                reporter.write_line(f"  {o.describe()}")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("case", list(battery.CASES))
def test_computes_what_upstream_computes(
    compared: tuple[dict[str, Any], list[parity.Output]],
    parity_reference: dict[str, Any],
    case: str,
    device: str,
) -> None:
    verified, outputs = compared
    mine = [o for o in outputs if o.case.startswith(f"{case}/{device}/")]
    if not mine:
        pytest.skip(
            f"upstream's torch {parity_reference['torch']['version']} ran no {device} case here "
            f"(its devices: {', '.join(parity_reference['torch']['devices'])})"
        )
    wrong = [o.describe() for o in mine if not o.ok]
    if wrong:
        mine, theirs = str(verified["torch"]["version"]), str(parity_reference["torch"]["version"])
        pytest.fail(parity.failure(mine, theirs, wrong), pytrace=False)
