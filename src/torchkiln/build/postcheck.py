"""Post-build check, run by the plan's ``checks:import`` step with a clean virtualenv's python.

Installs the wheels just built (by path, from their wheelhouse) and, in a fresh interpreter, collects what they say
about how they were built (:mod:`torchkiln.verify.facts`, run as a script). It prints those facts as the
last line of its output; torchkiln then compares them with the recipe using the same code as the
verification suite (:func:`torchkiln.verify.buildconfig.recipe_checks`), so the build and ``torchkiln
verify`` can never disagree about what "matches the recipe" means. A wheel that does not install or import
fails here.

The two overlap (issue 38): the interpreter that collects the facts is started before pip and imports torch
while pip installs (with the torch modules the checked wheels' import reaches: :data:`WARM_UP`). It goes on
only where a fresh interpreter would see the same: pip replaced or removed no distribution that was there
(each ``.dist-info`` and its RECORD compared before and after), what it added (pillow, the checked wheels) has
no ``.pth`` file (run at start-up) and none of its top-level names was looked for, and missed, while torch was
imported (``facts.py``'s ``--import-torch-then-wait``), and each warm-up module imported. Otherwise the facts
come from a fresh interpreter, as before. On two cores this takes the install's second off the check.

The interpreter can start sooner still (issue 47): while the compile runs, :mod:`torchkiln.build.earlycheck`
starts this script with ``--serve`` in the check venv's warm clone. It lists the venv's distributions, starts
the early interpreter and waits on a socket in the venv (:data:`SOCKET`); the check, when it finds that socket,
takes that interpreter and that listing (:class:`Served`) in place of its own, under the same rule. Anything
that changed the venv since (the check venv's prune, pip) is in the comparison. The server starts the check's
pip too (:func:`warm_pip`): ``python -m pip``'s own code, its modules imported while the compile runs (a third
of a second, half of the install), then run with the check's arguments. The check uses it when its venv is
still the one it started in (:func:`early_words`' rule, and no name its imports missed is there now); when it
cannot, or its install fails (then a fresh pip's failure is the verdict), the check runs ``python -m pip``
itself.

Standard library only: this file runs outside torchkiln's own environment, in a clean venv where torchkiln
is not installed. So it runs its two commands with :mod:`subprocess` itself rather than through
:mod:`torchkiln.process.runner`, and finds the wheels with :mod:`torchkiln.artifacts.wheelfile` loaded by path (a
standard-library-only module without relative imports).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import importlib.util
import json
import os
import runpy
import socket
import subprocess
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
FACTS = HERE.parent / "verify" / "facts.py"


def _wheelfile() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "_torchkiln_wheelfile", HERE.parent / "artifacts" / "wheelfile.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def built_wheel(project: str, version: str, wheelhouses: list[str]) -> Path | None:
    """The wheel of ``project`` at exactly ``version`` that the build wrote (never one from an index: a
    local label such as +cpu can also exist upstream, and the check must test what was built)."""
    found: list[Path] = _wheelfile().find([Path(d) for d in wheelhouses], project=project, version=version)
    return found[0] if found else None


WAIT = "--import-torch-then-wait"  # facts.py's early start (its WAIT)
# The modules of torch a checked project's import reaches, imported by the early interpreter with torch, while
# pip installs: torchvision's import reaches torch._dynamo (torchvision/ops/roi_align.py: ``from
# torch._dynamo.utils import is_compile_supported``, in the 0.21.0 release tree), most of its import's time.
# Measured in the check venv of the real 0.21.0 tree against torch 2.13.0+cpu: a fresh torch then torchvision,
# 1.25 s + 1.19 s; torch with torch._dynamo 1.72 s, then torchvision 0.07 s, while pip takes 1.0 s.
WARM_UP: dict[str, tuple[str, ...]] = {"torchvision": ("torch._dynamo",)}
# pip without its upgrade notice: no query of the index for pip's own versions, which a sandbox's empty HOME
# (no pip cache to remember the last one in) made on every check, a tenth of a second or an offline timeout
PIP_QUIET = ("--quiet", "--disable-pip-version-check")
INSTALLED = "postcheck: installed"  # printed once pip has put the wheels in place (torchkiln reads it)
RESTART = "facts.py: restart"  # its answer when torch's import looked for what pip then installed
SOCKET = ".torchkiln-early"  # in the check venv: where the interpreter started during the compile waits
Listing = dict[str, "tuple[int, int, int] | None"]


def dist_infos(directories: list[str] | None = None) -> Listing:
    """Each ``.dist-info`` directory of this venv (or of ``directories``), with its RECORD's identity (device,
    inode, mtime): pip writes a new RECORD for whatever it installs, so what an install changed shows."""
    found: Listing = {}
    default = [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
    for directory in sorted(set(directories if directories is not None else default)):
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(directory):
                if entry.name.endswith(".dist-info"):
                    try:
                        st = os.stat(os.path.join(entry.path, "RECORD"))
                    except OSError:
                        found[entry.path] = None
                    else:
                        found[entry.path] = (st.st_dev, st.st_ino, st.st_mtime_ns)
    return found


def top_level_names(dist_info: str) -> set[str] | None:
    """What a distribution installed at the top of site-packages, by its RECORD: importable names (``PIL``,
    ``torchvision``, a module's name without its suffix) and ``.pth`` files as themselves. None without a
    RECORD."""
    try:
        with open(os.path.join(dist_info, "RECORD"), newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
    except OSError:
        return None
    names = set()
    for row in rows:
        first = row[0].replace("\\", "/").split("/")[0] if row and row[0] else ""
        if (
            not first
            or first.startswith("..")
            or first.endswith((".dist-info", ".data"))
            or first == "__pycache__"
        ):
            continue
        names.add(first if first.endswith(".pth") else first.split(".")[0])
    return names


def early_argv(expect: list[str]) -> list[str]:
    """The early interpreter's command for each checked ``PROJECT==VERSION``: facts.py's early start, with
    the torch modules their import reaches (:data:`WARM_UP`)."""
    warm = sorted({name for item in expect for name in WARM_UP.get(item.partition("==")[0], ())})
    return [sys.executable, str(FACTS), WAIT, *warm]


def start_early(expect: list[str]) -> subprocess.Popen[str]:
    """The early interpreter (:func:`early_argv`), its stdin open for the words; cwd=/, as a fresh one's."""
    return subprocess.Popen(
        early_argv(expect),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
    )


# The modules of pip that ``pip install`` imports, imported by the pip the server starts before it is given its
# arguments: pip 26.3 in the check venv of the real 0.21.0 tree, 0.25 s of its imports' 0.3 s (``-X importtime``
# of a check's install against these); its install of the torchvision wheel then took 0.15 s against 0.5-0.67 s.
PIP_WARM_UP = (
    "pip._internal.cli.main",
    "pip._internal.commands.install",
    "pip._internal.resolution.resolvelib.resolver",
    "pip._internal.operations.install.wheel",
    "pip._internal.metadata.importlib",
)
PIP_UNUSED = "postcheck: the pip started early cannot be used"  # warm_pip's answer (the check runs its own)
PIP_EARLY = "postcheck: installed by the pip started during the compile"


class _Looked:
    """The last finder on ``sys.meta_path``: asked only for what no other finder found, it remembers each
    module looked for and missed (its name and the path it was looked for on), so that what is there now can
    be told (:meth:`found_now`)."""

    def __init__(self) -> None:
        self.missed: set[tuple[str, tuple[str, ...] | None]] = set()

    def find_spec(self, name: str, path: Iterable[str] | None = None, target: object = None) -> None:
        self.missed.add((name, None if path is None else tuple(path)))

    def found_now(self) -> bool:
        """Whether another finder finds one of the modules missed now (or fails to say). One that was
        imported after all is not missed: a finder appended after this one found it (six's in urllib3)."""
        importlib.invalidate_caches()
        finders = [f for f in sys.meta_path if f is not self and hasattr(f, "find_spec")]
        for name, path in self.missed:
            if name in sys.modules:
                continue
            for finder in finders:
                try:
                    if finder.find_spec(name, None if path is None else list(path)) is not None:
                        return True
                except Exception:  # noqa: BLE001 - not known to be missing still
                    return True
        return False


def warm_pip() -> int:
    """The pip the server starts (:func:`start_pip`): :data:`PIP_WARM_UP` imported (:func:`warm_up`), then
    the check's request answered (:func:`run_pip`)."""
    looked, whole = warm_up(PIP_WARM_UP)
    return run_pip(looked, whole, sys.stdin.readline())


def warm_up(modules: Iterable[str]) -> tuple[_Looked, bool]:
    """Each of ``modules`` imported: what was looked for and missed meanwhile, and whether none raised (a
    module not there is missed, not raised: another pip's layout, whose pip looks for it again)."""
    looked = _Looked()
    sys.meta_path.append(looked)
    whole = True
    try:
        for name in modules:
            try:
                importlib.import_module(name)
            except ModuleNotFoundError:
                pass
            except Exception:  # noqa: BLE001 - a state a fresh pip never has: this pip is not used
                whole = False
    finally:
        sys.meta_path.remove(looked)
    return looked, whole


def run_pip(looked: _Looked, whole: bool, line: str) -> int:
    """``line``, ``{"pip": ARGS, "prefix": ...}``: ``python -m pip ARGS`` run (pip's ``__main__`` by
    :mod:`runpy`, which exits with pip's code) when the warm-up was ``whole``, this interpreter's prefix is
    the check's, and no module it missed is there now (the venv changed under it: a distribution added since,
    the venv moved aside meanwhile). Otherwise :data:`PIP_UNUSED` and 3; nothing without a request."""
    request = json.loads(line or "null")
    if not request:
        return 0
    if not whole or request.get("prefix") != sys.prefix or looked.found_now():
        print(PIP_UNUSED)
        return 3
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # as the check's own pip: nothing to read
    sys.argv = ["pip", *request["pip"]]
    runpy.run_module("pip", run_name="__main__", alter_sys=True)
    return 0


def start_pip() -> subprocess.Popen[str] | None:
    """:func:`warm_pip` in an interpreter of this venv whose ``sys.path`` starts as ``python -m pip``'s
    (this directory taken off it once this module is imported), cwd=/; None when it cannot start."""
    code = f"import sys; sys.path.insert(0, {str(HERE)!r}); import postcheck; del sys.path[0]; sys.exit(postcheck.warm_pip())"
    try:
        return subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd="/",
        )
    except OSError:  # the venv moved aside as it started (build.warmcheck's join): the check runs its own pip
        return None


def early_words(before: Listing, after: Listing) -> list[str] | None:
    """What the early interpreter is told (``go`` and the added distributions' top-level names), or None when
    it cannot be used: a distribution that was there was replaced or removed, or an added one has a ``.pth``
    file or no RECORD."""
    if any(after.get(path) != identity for path, identity in before.items()):
        return None
    names: set[str] = set()
    for path in sorted(set(after) - set(before)):
        found = top_level_names(path)
        if found is None or any(name.endswith(".pth") for name in found):
            return None
        names |= found
    return ["go", *sorted(names)]


class Served:
    """The early interpreter that ``--serve`` started during the compile, reached through its socket: what
    the check needs of a :class:`subprocess.Popen` (``communicate``, ``poll``, ``kill``, ``wait``), and the
    venv's listing when it started (:attr:`before`)."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.stream = conn.makefile("rw", encoding="utf-8", newline="\n")
        listed = json.loads(self.stream.readline())
        self.before: Listing = {path: tuple(found) if found else None for path, found in listed.items()}
        self.returncode: int | None = None

    def _ask(self, line: str, timeout: float) -> tuple[Any, str, str] | None:
        """``line`` sent to the server, its answer (return code, output, errors: as JSON gave them); None
        when none came."""
        try:
            self.conn.settimeout(timeout)
            self.stream.write(line if line.endswith("\n") else line + "\n")
            self.stream.flush()
            code, out, err = json.loads(self.stream.readline())
        except (OSError, ValueError, TypeError):
            return None
        return code, out, err

    def communicate(self, text: str, timeout: float) -> tuple[str, str]:
        """As :meth:`subprocess.Popen.communicate`; an interpreter that went away meanwhile answers
        :data:`RESTART` (a fresh one gives the facts)."""
        self.returncode, out, err = self._ask(text, timeout) or (-1, RESTART, "")
        return out, err

    def pip(self, args: list[str]) -> subprocess.CompletedProcess[str] | None:
        """``python -m pip ARGS`` run by the pip the server started (:func:`warm_pip`); None when it does not
        answer."""
        answer = self._ask(json.dumps({"pip": args, "prefix": sys.prefix}), 600)
        return None if answer is None else subprocess.CompletedProcess(args, *answer)

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.returncode = -9
        with contextlib.suppress(OSError):
            self.conn.close()

    def wait(self) -> None:
        return None


def connect() -> Served | None:
    """The interpreter waiting on :data:`SOCKET` in this venv, None when none does (or it does not answer).
    The socket is removed either way: nothing but this venv's files goes on with it (the store keeps it)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(30)
        conn.connect(_address())
        return Served(conn)
    except (OSError, ValueError):  # none there, gone, or an answer cut short: the check starts its own
        conn.close()
        return None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(_address())


@functools.cache
def _address() -> str:
    """:data:`SOCKET` in this venv by a name short enough for a socket address (107 bytes, which a work
    directory's path can pass): through a descriptor of the venv's directory, kept open."""
    return f"/proc/self/fd/{os.open(sys.prefix, os.O_RDONLY | os.O_DIRECTORY)}/{SOCKET}"


def serve(expect: list[str]) -> int:
    """``--serve``: this venv's listing taken, the early interpreter and pip (:func:`start_pip`) started, and
    all three handed to the one check that connects to :data:`SOCKET` (the socket removed once it has). It
    sends pip's arguments (a JSON object: :meth:`Served.pip`) or not, then the early interpreter's words; each
    answer goes back as one JSON line (return code, output, errors)."""
    before = dist_infos()
    if not before:  # the venv was moved aside while this started (build.warmcheck's join): nothing to serve
        return 0
    early = start_early(expect)
    pip = start_pip()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(_address())
            listener.listen(1)
            conn, _ = listener.accept()
        with contextlib.suppress(OSError):
            os.unlink(_address())
        # a check that went away (its install failed: it asks no facts) is no error of this server's
        with (
            contextlib.suppress(OSError),
            conn,
            conn.makefile("rw", encoding="utf-8", newline="\n") as stream,
        ):
            stream.write(json.dumps(before) + "\n")
            stream.flush()
            words = stream.readline()
            if words.startswith("{"):
                code, out, err = _answer(pip, words)
                stream.write(json.dumps([code, out, err]) + "\n")
                stream.flush()
                words = stream.readline()
            out, err = early.communicate(words, timeout=600)
            stream.write(json.dumps([early.returncode, out, err]) + "\n")
            stream.flush()
    finally:
        for proc in (early, pip):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    return 0


def _answer(pip: subprocess.Popen[str] | None, request: str) -> tuple[int | None, str, str]:
    """The pip started here given ``request`` (:meth:`Served.pip`'s line): its return code and output."""
    if pip is None:
        return None, "", PIP_UNUSED
    out, err = pip.communicate(request, timeout=600)
    return pip.returncode, out, err


def _facts(early: subprocess.Popen[str] | Served, words: list[str] | None) -> tuple[int, str, str, bool]:
    """The early interpreter's result when it can be used; else a fresh one's. The last item: early."""
    out, err = early.communicate(" ".join(words) + "\n" if words else "", timeout=600)
    # An interpreter started during the compile that failed is no verdict: the venv it started in was moved
    # aside and back while it started (build.warmcheck's join), which a fresh interpreter never sees.
    failed_early = isinstance(early, Served) and early.returncode != 0
    if words and out.strip() != RESTART and early.returncode is not None and not failed_early:
        return early.returncode, out, err, True
    # cwd=/: the wheels are imported from site-packages, never from a source tree next to the cwd.
    probe = subprocess.run(
        [sys.executable, str(FACTS)], check=False, capture_output=True, text=True, cwd="/", timeout=600
    )
    return probe.returncode, probe.stdout, probe.stderr, False


def _install(served: Served | None, args: list[str]) -> subprocess.CompletedProcess[str]:
    """``pip ARGS``: by the pip the server started, when there is one and the venv holds what it held when the
    server listed it, plus only distributions without a ``.pth`` file (:func:`early_words`); otherwise, or
    when that pip could not be used or failed, ``python -m pip`` run here (whose failure is the verdict)."""
    if served is not None and early_words(served.before, dist_infos()) is not None:
        done = served.pip(args)
        if done is not None and done.returncode == 0:
            print(PIP_EARLY)
            return done
    return subprocess.run([sys.executable, "-m", "pip", *args], check=False, capture_output=True, text=True)


EARLY = {
    False: "the interpreter that imported torch while pip installed",
    True: "the interpreter that imported torch during the compile",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description="install freshly built wheels and report their build facts"
    )
    parser.add_argument("--expect", action="append", default=[], metavar="PROJECT==VERSION")
    parser.add_argument("--wheelhouse", action="append", default=[], metavar="DIR")
    parser.add_argument(
        "--with",
        dest="also",
        action="append",
        default=[],
        metavar="WHEEL_OR_REQ",
        help="installed with the built wheels (the torch given with --torch)",
    )
    parser.add_argument(
        "--constraints",
        default=None,
        metavar="FILE",
        help="the build env's pins (build-env:deps), kept by this install when the file exists",
    )
    parser.add_argument(
        "--serve", action="store_true", help="wait for the check, torch imported (started during the compile)"
    )
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args.expect)

    wheels = []
    for item in args.expect:
        project, _, version = item.partition("==")
        wheel = built_wheel(project, version, args.wheelhouse)
        if wheel is None:
            found = sorted(p.name for d in args.wheelhouse for p in Path(d).glob("*.whl"))
            print(
                f"postcheck: the build wrote no {project} {version} wheel (found: {', '.join(found) or 'none'})",
                file=sys.stderr,
            )
            return 1
        wheels.append(str(wheel))
    constraint = (
        ["--constraint", args.constraints] if args.constraints and Path(args.constraints).is_file() else []
    )
    served = connect()  # the interpreter started during the compile, when one waits (see the docstring)
    early = served or start_early(args.expect)  # else one that imports torch while pip installs
    try:
        before = served.before if served is not None else dist_infos()
        # The built wheels by path; their dependencies (and nothing of theirs) from the configured index.
        result = _install(served, ["install", *PIP_QUIET, *constraint, "--", *wheels, *args.also])
        if result.returncode != 0:
            print(
                f"postcheck: installing {' '.join(wheels)} failed:\n{result.stderr[-4000:]}", file=sys.stderr
            )
            return 1
        print(INSTALLED, flush=True)  # the builder analyses the installed wheels meanwhile (build.observers)
        words = early_words(before, dist_infos())
        returncode, stdout, stderr, used = _facts(early, words)
        print("postcheck: the facts from " + (EARLY[served is not None] if used else "a fresh interpreter"))
    finally:
        if early.poll() is None:
            early.kill()
            early.wait()
    if returncode != 0:
        print(f"postcheck: importing the wheels failed:\n{stderr[-4000:]}", file=sys.stderr)
        return 1
    facts = json.loads(stdout.strip().splitlines()[-1])
    print(json.dumps(facts, sort_keys=True))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
