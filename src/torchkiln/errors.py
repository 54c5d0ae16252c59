"""Errors a user can act on.

Every problem torchkiln reports about user input is a :class:`Problem`: the file, the dotted field path,
what is wrong and what would be valid. The CLI prints them one per line and exits 2; nothing that comes
from a recipe ever surfaces as a traceback.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

EXIT_OK = 0
SHOWN = 5  # items a message built from a list names; the rest are counted (few)
EXIT_FAILURE = 1
EXIT_USAGE = 2


def few(items: Sequence[object], shown: int = SHOWN) -> str:
    """The first ``shown`` items of a list and a count of the rest (``a, b, c and 26456 more``): a message
    built from per-file failures stays one readable line, whatever the number of files."""
    head = ", ".join(str(item) for item in items[:shown])
    more = len(items) - shown
    return head + (f" and {more} more" if more > 0 else "")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one field of one input file."""

    file: str
    field: str
    message: str
    valid: str = ""

    def __str__(self) -> str:
        hint = f" (valid: {self.valid})" if self.valid else ""
        return f"{self.file}: {self.field}: {self.message}{hint}"


class TorchkilnError(Exception):
    """Base class: an error with a message meant for the user, never a traceback."""

    exit_code = EXIT_FAILURE


class ProblemsError(TorchkilnError):
    """Input that cannot be used. Carries every problem found, not just the first (exit status 2)."""

    exit_code = EXIT_USAGE

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class RecipeError(ProblemsError):
    """A recipe that cannot be used."""


class DocumentError(ProblemsError):
    """A lock file or manifest that cannot be read (missing, not JSON, another format, a wrong field)."""


class UsageError(TorchkilnError):
    """Bad command-line input (a flag value, a missing file)."""

    exit_code = EXIT_USAGE


class BuildFailed(TorchkilnError):
    """A step failed: the message carries the first error, the log tail and the log path."""

    def __init__(self, message: str, *, step: str, log: Path | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.log = log


class ConfigureMismatch(BuildFailed):
    """CMake's configuration summary contradicts the recipe: stopped before compiling."""


class Interrupted(TorchkilnError):
    """Ctrl-C or SIGTERM: the running step was stopped, dist/ is unchanged."""

    exit_code = 130


# --------------------------------------------------------------------------------------------------
# The one error boundary for the filesystem: an OSError becomes one line a user can act on.
# --------------------------------------------------------------------------------------------------

# errno name -> what to do. Every OSError torchkiln does not handle itself reaches cli.main, which prints
# ``path: what failed (ERRNO) and what to do`` and exits 1; a table, so a new case is a row.
OS_ADVICE: dict[str, str] = {
    "ENOSPC": "free space on that filesystem (df -h), or point --workdir/--dist/--cache-dir/--env-store "
    "elsewhere; completed steps are kept, a rerun continues",
    "EDQUOT": "the disk quota is exhausted: free space or raise the quota; completed steps are kept, a rerun "
    "continues",
    "EROFS": "the filesystem is mounted read-only: choose a writable location (--workdir, --dist, --cache-dir)",
    "EACCES": "this user lacks the permission: fix its permissions or choose another location",
    "EPERM": "this user may not change it: fix its owner or permissions or choose another location",
    "ENOTDIR": "a file stands where a directory belongs: remove or rename that file",
    "EISDIR": "a directory stands where a file belongs: remove or rename that directory",
    "EEXIST": "something else already has that name: remove or rename it",
    "ENOENT": "it does not exist (removed while torchkiln ran?): check the path and run again",
    "ENAMETOOLONG": "the path is too long: choose a shorter --workdir/--dist",
    "EMFILE": "too many open files: raise the limit (ulimit -n) and run again",
    "EIO": "the device reported an I/O error: check the disk (dmesg) before running again",
}
DEFAULT_OS_ADVICE = "check the path and its filesystem, then run again"


SPACE_ERRORS = frozenset({"ENOSPC", "EDQUOT"})


def describe_os_error(exc: OSError, *, path: str | Path | None = None, needed: int | None = None) -> str:
    """``path: what failed (ERRNO) and what to do`` for an OSError (``path`` when the error names none), on
    one line. Out of space, it names the filesystem, its free space (against ``needed`` bytes when known);
    an error of many files (``shutil.Error``: one per file a copy could not make) names the first few and
    counts the rest, never all of them."""
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list):
        return _describe_copy_errors(exc.args[0], path)
    name = errno.errorcode.get(exc.errno or 0, "") if exc.errno else ""
    where = exc.filename if exc.filename is not None else path
    what = exc.strerror or str(exc) or type(exc).__name__
    if exc.filename2 is not None:
        what += f" (with {exc.filename2})"
    head = f"{where}: {what}" if where is not None else what
    code = f" ({name})" if name else ""
    if name in SPACE_ERRORS and where is not None:
        seen = getattr(exc, "space_seen", None)  # taken when it failed, before a cleanup freed space
        code += f": {seen if seen else space_on(Path(where))}"
        if needed is not None:
            code += f", {human_bytes(needed)} needed"
    return f"{head}{code}; {OS_ADVICE.get(name, DEFAULT_OS_ADVICE)}"


def _describe_copy_errors(failures: list[object], path: str | Path | None) -> str:
    """``shutil.Error``'s list of (source, target, why) as one line: how many, the first few."""
    whys = [str(item[2]) if isinstance(item, tuple) and len(item) == 3 else str(item) for item in failures]
    where = f"{path}: " if path is not None else ""
    return f"{where}{len(whys)} file(s) could not be copied: {few(whys, 3)}; {DEFAULT_OS_ADVICE}"


def human_bytes(count: int) -> str:
    """``1.5 MiB``: sizes in messages."""
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def mount_point(path: Path) -> Path:
    """The mount point of the filesystem that holds ``path`` (or would: its nearest existing parent)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path.parent != path:
        path = path.parent
    path = path.resolve()  # through symlinks: the filesystem the data really goes to
    device = path.stat().st_dev
    while path.parent != path and path.parent.stat().st_dev == device:
        path = path.parent
    return path


def remember_space(exc: OSError, path: Path) -> None:
    """Out of space: what the filesystem holding ``path`` has left, taken now (before a cleanup frees some
    and the message would no longer say what filled up), for :func:`describe_os_error`."""
    if errno.errorcode.get(exc.errno or 0) in SPACE_ERRORS:
        exc.space_seen = space_on(path)  # type: ignore[attr-defined]


def space_on(path: Path) -> str:
    """``the filesystem at /mnt has 12.0 KiB free of 256.0 KiB``: which filesystem is full and what it has
    left (and when its inodes ran out, that)."""
    try:
        mount = mount_point(path)
        stat = os.statvfs(mount)
    except OSError:
        return "its filesystem is full"
    free, total = stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize
    inodes = f" and no free inodes (of {stat.f_files})" if stat.f_files and not stat.f_favail else ""
    return f"the filesystem at {mount} has {human_bytes(free)} free of {human_bytes(total)}{inodes}"


def name_path(exc: OSError, path: str | Path) -> OSError:
    """``exc`` naming ``path`` when it names none (a failed write() only says "No space left on device")."""
    if exc.filename is None:
        exc.filename = str(path)
    return exc
