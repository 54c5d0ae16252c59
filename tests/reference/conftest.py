"""The reference tier: torchkiln's verify against upstream's own CUDA builds (``nox -s reference``).

These tests need one of upstream's PyPI pairs installed (torch 2.12.1+cu130 / torchvision 0.27.1,
2.13.0 / 0.28.0, 2.14.0 / 0.29.0 or 2.14.1 / 0.29.1: noxfile.py's REFERENCE_PAIRS) and
``TORCHKILN_REFERENCE_RECIPE`` naming the recipe that describes it; the nox session sets both up in a fresh
venv. Anywhere else they are skipped, with that reason.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ENV = "TORCHKILN_REFERENCE_RECIPE"
REPORT_ENV = "TORCHKILN_REFERENCE_REPORT"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(ENV):
        return
    skip = pytest.mark.skip(
        reason=f"reference tier: run by `nox -s reference` (needs {ENV} and upstream's wheels)"
    )
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(skip)
