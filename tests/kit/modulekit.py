"""What a torchkiln command imports: run in a fresh interpreter, the names in ``sys.modules`` at its end
(issue 38: a command imports only what it uses)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence

from kit import ROOT

TESTS = ROOT / "tests"

# The machinery of SBOMs, signatures and images: none of it is needed by `build --help`, `check`, a no-op
# build or `verify` (each imports it only where it writes an SBOM, signs or checks a signature, or builds
# an image).
HEAVY = (
    "torchkiln.artifacts.sbom",
    "torchkiln.artifacts.sbom_bundled",
    "torchkiln.artifacts.sbom_debian",
    "torchkiln.artifacts.sbom_image",
    "torchkiln.artifacts.sbom_toolchain",
    "torchkiln.artifacts.signing",
    "torchkiln.artifacts.provenance",
    "torchkiln.images",
    "cyclonedx",
    "cryptography",
)

_RUN = """
import json, sys
sys.path.insert(0, {tests!r})
argv = json.loads(sys.argv[1])
from {module} import main
try:
    code = main(argv)
except SystemExit as exc:
    code = exc.code
print("\\nkiln-modules " + json.dumps({{"code": code, "modules": sorted(sys.modules)}}))
"""


def imported(
    argv: Sequence[str], *, module: str = "torchkiln.cli", env: Mapping[str, str] | None = None
) -> tuple[int, set[str], str]:
    """(exit status, the modules imported, the output) of ``main(argv)`` of ``module`` in a fresh
    interpreter."""
    code = _RUN.format(tests=str(TESTS), module=module)
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(list(argv))],
        capture_output=True,
        text=True,
        check=False,
        env=None if env is None else dict(env),
    )
    line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith("kiln-modules ")), None)
    assert line is not None, done.stdout + done.stderr
    found = json.loads(line.removeprefix("kiln-modules "))
    return int(found["code"] or 0), set(found["modules"]), done.stdout + done.stderr


def heavy(modules: set[str]) -> list[str]:
    """The modules of :data:`HEAVY` (or under them) among ``modules``."""
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))
