"""The tests' helpers, one package (issue 48): ``from kit.imagekit import need``, ``from kit import
realtrees``. tests/ is on ``sys.path`` (pytest's rootdir-relative import of tests/conftest.py; bench/ and
the scripts that run a helper insert it themselves). This module holds only :data:`ROOT` and imports
nothing heavy: a helper is imported by name where it is used."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The checkout's root (pyproject.toml, src/, tests/, recipes/): the one constant every test derives its
paths from."""
