"""Each command imports only what it uses (issue 38 item 3): ``build --help``, ``check``, ``plan`` and
``verify`` never import the SBOM, signing or image machinery (a no-op build's own test is in
tests/test_build.py, where a built work directory is at hand). Each runs in a fresh interpreter; nothing is
timed (bench/rebuild.py measures what the imports cost)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit import ROOT
from kit.modulekit import heavy, imported

RECIPE = ROOT / "tests" / "data" / "ext-cpu-test.toml"


@pytest.mark.parametrize(
    "argv",
    [
        ["build", "--help"],
        ["check", "--help"],
        ["verify", "--help"],
        ["plan", str(RECIPE), "--only", "torchvision", "--jobs", "1"],
        ["check", str(RECIPE), "--only", "torchvision", "--jobs", "1"],
        # verify as far as it goes here: its arguments checked, then refused for the missing manifest
        ["verify", "--recipe", str(RECIPE), "--manifest", "/nonexistent/manifest.json"],
    ],
    ids=lambda argv: " ".join(a if "/" not in a else Path(a).name for a in argv),
)
def test_a_command_imports_no_sbom_signing_or_image_machinery(argv: list[str], tmp_path: Path) -> None:
    argv = [
        *argv,
        *(
            ["--workdir", str(tmp_path / "w"), "--dist", str(tmp_path / "d")]
            if argv[0] in ("plan", "check") and "--help" not in argv
            else []
        ),
    ]
    code, modules, output = imported(argv)
    assert code in (0, 2), output  # check may refuse this host; what it imported is the point
    assert "torchkiln.commands." + argv[0] in modules, "the command ran"
    assert heavy(modules) == [], output


def test_signing_is_imported_where_a_signature_is_checked(tmp_path: Path) -> None:
    """The control: the same measurement sees the machinery where it is used (verify given a statement)."""
    statement, key = tmp_path / "s.intoto.jsonl", tmp_path / "k.pub"
    statement.write_text("{}")
    key.write_text("not a key")
    code, modules, output = imported(["verify", "--provenance", str(statement), "--key", str(key)])
    assert code == 2 and "torchkiln.artifacts.signing" in modules, output
