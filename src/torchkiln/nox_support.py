"""What noxfile.py's ``verify`` session installs before running the suite. Stdlib and nox only: the
noxfile imports this before torchkiln's own dependencies exist in any environment.

With wheels in ``dist/`` the session verifies exactly those bits: the torch wheel is installed with its
dependencies (a source build declares no CUDA wheels), torchvision with ``--no-deps`` (its ``torch==X``
pin must not pull a torch from the index) plus its other requirements read from the wheel's metadata.
A reused virtualenv is re-installed when the wheels' sha256 changed (a rebuild keeps the version) or when
it goes back to the fallback requirement. Without wheels, the fallback requirement (e.g.
``torch==2.13.0``) is installed. Then pytest, pytest-timeout, NumPy (torch does not require it, so
without it the suite's NumPy interop check, smoke_test.py's test_numpy, could only skip) and torchkiln
itself (editable).
"""

from __future__ import annotations

import json
import re
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Any

from torchkiln.files.digests import file_sha256

from .artifacts import wheelfile

ROOT = Path(__file__).resolve().parents[2]
MARKER = "torchkiln-verify-wheels.json"
SUITE_REQUIREMENTS = ("pytest>=8", "pytest-timeout>=2.3", "numpy")
_NAME_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_EXTRA_RE = re.compile(r";.*\bextra\s*==")


def find_wheels(dist: Path, python_tag: str | None = None) -> dict[str, Path]:
    """{"torch": wheel, "torchvision": wheel} from dist/ (either may be absent).

    Several wheels of one project (other Python versions) are narrowed to ``python_tag`` (e.g. cp312);
    still more than one is an error naming them, since verifying an arbitrary one proves nothing.
    """
    found: dict[str, Path] = {}
    for project in ("torch", "torchvision"):
        wheels = wheelfile.find([dist], project=project)
        if python_tag is not None and len(wheels) > 1:
            wheels = wheelfile.find([dist], project=project, python=python_tag) or wheels
        if len(wheels) > 1:
            names = ", ".join(w.name for w in wheels)
            raise ValueError(f"{dist}: several {project} wheels ({names}); keep one per Python version")
        if wheels:
            found[project] = wheels[0]
    return found


def wheel_requirements(wheel: Path, exclude: set[str]) -> list[str]:
    """Requires-Dist entries of a wheel without extras-only ones and without the ``exclude`` projects."""
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(meta_name).decode("utf-8"))
    out = []
    for req in meta.get_all("Requires-Dist") or []:
        match = _NAME_RE.match(req)
        if match is None or _EXTRA_RE.search(req):
            continue
        if match.group(1).lower().replace("_", "-") in exclude:
            continue
        out.append(req)
    return out


def _python_tag(session: Any) -> str | None:
    version = getattr(session, "python", None)
    if isinstance(version, str) and re.fullmatch(r"\d+\.\d+", version):
        return "cp" + version.replace(".", "")
    return None


def install_for_verify(session: Any, dist: Path, fallback: str) -> dict[str, Path]:
    """Install what the verify session checks (dist/ wheels, else ``fallback``) and what runs the suite.
    Returns the dist/ wheels installed (none: the fallback)."""
    try:
        wheels = find_wheels(Path(dist), _python_tag(session))
    except ValueError as exc:
        session.error(str(exc))
    venv = getattr(session, "virtualenv", None)
    location = getattr(venv, "location", None)
    marker = Path(location) / MARKER if location else None
    previous = json.loads(marker.read_text()) if marker is not None and marker.is_file() else None
    if "torch" in wheels:
        digests = {name: file_sha256(path) for name, path in wheels.items()}
        session.log("verifying wheels from %s: %s", dist, ", ".join(p.name for p in wheels.values()))
        session.install(str(wheels["torch"]))  # with its dependencies; a source build declares no CUDA wheels
        vision_requirements = (
            wheel_requirements(wheels["torchvision"], {"torch"}) if "torchvision" in wheels else []
        )
        if vision_requirements:
            session.install(*vision_requirements)
        force = ["--force-reinstall"] if previous != digests else []
        session.install(*force, "--no-deps", *(str(p) for p in wheels.values()))
        if marker is not None:
            marker.write_text(json.dumps(digests))
    else:
        if "torchvision" in wheels:
            session.error(
                f"{dist}: a torchvision wheel without a torch wheel; build both (nox -s build-wheel)"
            )
        session.log("no wheels in %s: verifying %s", dist, fallback)
        session.install(fallback)
        if previous is not None:  # a reused venv still holds dist/ wheels that may satisfy the requirement
            session.run("python", "-m", "pip", "uninstall", "-y", "torchvision")
            session.install("--force-reinstall", "--no-deps", fallback)
            marker.unlink()  # type: ignore[union-attr]
    session.install(*SUITE_REQUIREMENTS)
    session.install("-e", str(ROOT))
    return wheels if "torch" in wheels else {}


def verify_args(dist: Path, installed: dict[str, Path], args: list[str]) -> list[str]:
    """``torchkiln verify`` arguments: with wheels from dist/ and the manifest of the build that put them
    there, the installed wheels are checked against it too (``--manifest``), unless the caller chose."""
    manifest = Path(dist) / "manifest.json"
    if installed and manifest.is_file() and "--manifest" not in args:
        return ["--manifest", str(manifest), *args]
    return list(args)
