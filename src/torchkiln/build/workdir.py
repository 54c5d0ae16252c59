"""What a build owns on disk, made usable before the first step: the work directory's lock and layout, the
leftovers of killed runs, and a dist/ that the last step will be able to write.

Faults found here end in one line and a state the next run recovers from, before hours of compiling:

* the work directory is torchkiln's own: an entry of :data:`LAYOUT` with the wrong type (``state.json`` or
  ``build.lock`` made a directory, ``logs`` or ``wheelhouse`` made a file) is removed and said so, since
  everything in it can be made again;
* dist/ is the user's: a file where dist/ belongs, a directory where the manifest or lock file goes, or a
  dist/ this user cannot write (read-only filesystem, mode 555) is an error naming the path and what to do,
  nothing is removed there;
* temporaries that killed runs left (``.torchkiln-partial-*``) are removed from both, never those a live
  build writes (:func:`torchkiln.files.atomic.clean_partials`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from torchkiln.artifacts.published import MANIFEST_NAME
from torchkiln.errors import TorchkilnError, describe_os_error, name_path
from torchkiln.files.atomic import clean_partials
from torchkiln.plan.records import PROBES_DIR

LOCK_NAME = "build.lock"
STATE_NAME = "state.json"

# Entries of the work directory torchkiln makes, and what each must be.
LAYOUT: dict[str, Literal["file", "dir"]] = {
    STATE_NAME: "file",
    LOCK_NAME: "file",
    "logs": "dir",
    "wheelhouse": "dir",
    "src": "dir",
    "launchers": "dir",
    "tree-outputs": "dir",  # what each compile step wrote into its source tree (torchkiln.build.treeguard)
    PROBES_DIR: "dir",  # what the host answered, by key (torchkiln.plan.records)
}

Note = Callable[[str], None]


def _wrong_type(path: Path, want: Literal["file", "dir"]) -> bool:
    if not os.path.lexists(path):
        return False
    return not path.is_dir() if want == "dir" else path.is_dir()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def repair_layout(workdir: Path, note: Note) -> None:
    """Remove entries of the work directory whose type is wrong (see :data:`LAYOUT`), then the temporaries
    killed runs left there."""
    for name, want in LAYOUT.items():
        path = workdir / name
        if name == LOCK_NAME:
            continue  # handled under the lock's own rules (holding_lock)
        if _wrong_type(path, want):
            _remove(path)
            found, kept = ("a file", "a directory") if want == "dir" else ("a directory", "a file")
            note(f"removed {path}: {found} where the build keeps {kept} (made again)")
    for leftover in clean_partials(workdir):
        note(f"removed a partial file left by an interrupted build: {leftover}")


def _problem(path: Path, message: str) -> TorchkilnError:
    return TorchkilnError(f"torchkiln build: {path}: {message}")


def _writable(directory: Path) -> OSError | None:
    """Why this user cannot create files in ``directory`` (or in the nearest existing parent it would be
    made in), or None."""
    probe = directory
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        return OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(probe))
    if not os.access(probe, os.W_OK | os.X_OK):
        # access(2) reports a read-only filesystem as EROFS, also for root.
        try:
            readonly = bool(os.statvfs(probe).f_flag & os.ST_RDONLY)
        except OSError:
            readonly = False
        code = errno.EROFS if readonly else errno.EACCES
        return OSError(code, os.strerror(code), str(probe))
    return None


def check_dist(dist: Path, recipe_name: str) -> None:
    """Before the build: the last step will be able to write the wheels, the lock file and the manifest into
    ``dist``. Raises TorchkilnError naming the path and what to do; changes nothing in dist/."""
    if os.path.lexists(dist) and not dist.is_dir():
        raise _problem(
            dist, "is a file, where the build publishes its wheels (remove it, or choose another --dist)"
        )
    for name in (MANIFEST_NAME, f"{recipe_name}.lock.json"):
        target = dist / name
        if target.is_dir():
            raise _problem(
                target, "is a directory, where the build writes a file (remove it, or choose another --dist)"
            )
    problem = _writable(dist)
    if problem is not None:
        raise TorchkilnError(f"torchkiln build: cannot publish into --dist: {describe_os_error(problem)}")


@contextmanager
def holding_lock(workdir: Path) -> Iterator[None]:
    """One build per workdir at a time: two would fetch into, and record state for, the same checkout.
    A lock path that is a directory (a damaged workdir) is removed: the lock is torchkiln's own."""
    path = workdir / LOCK_NAME
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise name_path(exc, path) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise TorchkilnError(
                f"another torchkiln build is running in {workdir} ({holder}); wait for it, or use another --workdir"
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
        except OSError as exc:
            raise name_path(exc, path) from None
        yield
    finally:
        os.close(fd)  # releases the flock
