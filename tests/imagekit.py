"""What the real image builds share (tests/test_images_build.py, tests/test_images_cuda.py): the report file,
the CLI call, image sizes, the rule that CI never skips them. Their fixtures are in tests/conftest.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from torchkiln import cli
from torchkiln.images.engines import Engine

ROOT = Path(__file__).resolve().parents[1]
BASE = "localhost/torchkiln-test-base:bookworm"
REPORT = ROOT / ".torchkiln" / "images-report.json"


def require(condition: bool, reason: str) -> None:
    """Skip without the condition; under CI=true it is a failure instead (CI installs what these need)."""
    if condition:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


def report(key: str, value: object) -> None:
    """Record a measurement in .torchkiln/images-report.json (atomically)."""
    data = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    data[key] = value
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    tmp = REPORT.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, REPORT)


def say(capsys: pytest.CaptureFixture[str], text: str) -> None:
    with capsys.disabled():
        print(f"\n[images] {text}")


def stored_size(engine: Engine, image: str) -> int:
    found = engine.image_size(image)
    assert found, image
    return found


def cli_build(storage_root: Path, recipe: Path, *args: str) -> int:
    """``torchkiln images`` with buildah on the private storage and the debootstrapped base."""
    return cli.main(
        [
            "images",
            "--recipe",
            str(recipe),
            "--engine",
            "buildah",
            "--base-image",
            BASE,
            "--no-pull",
            "--storage-root",
            str(storage_root),
            "--storage-driver",
            "vfs",
            *args,
        ]
    )
