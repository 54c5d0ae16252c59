"""What the host answered, kept under a key of everything the answer depends on (issue 38).

Before every build torchkiln asks the host questions whose answers rarely change: does ``c++`` compile and
link a trivial program, is ``python3.11`` a Python 3.11 with venv and its headers, what is the torch wheel pip
would install for ``--torch torch==2.13.0+cpu``. Asked on every run they cost most of a no-op rebuild (a
compile and link of two programs, a pip dry run against the index). A :class:`Records` keeps each answer as
a small JSON file named by its key: the digest of what the answer depends on (the programs' identities, the
variables they read, the recipe fields they are checked against, the code asking). An answer whose key is
unchanged is read back; a changed key is a new question, asked again. Nothing is ever looked up by name
alone, so a stale record is never read: it is just no longer found.

The records of a build live with its work directory (``<workdir>/records/``, a row of
:data:`torchkiln.build.workdir.LAYOUT`), and, when the build keeps an environment store, in the store too
(``<store>/.records/``), which the work directories of one machine share as they share its venvs: a fresh
work directory on the same host does not ask again either. Removing either directory at any time is safe;
the next build asks again. A record that cannot be written costs the next run a question, never this run.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torchkiln.files import atomic
from torchkiln.files.digests import digest

__all__ = ["PROBES_DIR", "STORE_PROBES_DIR", "Records", "file_identity"]

PROBES_DIR = "records"  # under the work directory (torchkiln.build.workdir.LAYOUT)
STORE_PROBES_DIR = ".records"  # under the environment store (beside its .objects)
FORMAT = 1


def file_identity(path: str | os.PathLike[str]) -> str | None:
    """A file as the kernel names it: its resolved path, device, inode, size and modification time (ns).
    Replacing a file (a package upgrade, a new compiler at the same path) changes it; reading it does not.
    None when there is no such file."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except (OSError, ValueError):
        return None
    return f"{real}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


class Records:
    """Answers by key, in ``dirs`` (read in order, written to all). Empty ``dirs``: nothing is kept."""

    def __init__(self, dirs: Sequence[Path], *, write: bool = True) -> None:
        self.dirs = tuple(dirs)
        self.write = write

    @classmethod
    def for_build(cls, workdir: Path, env_store: Path | None, *, write: bool = True) -> Records:
        """The records of a build in ``workdir`` (and its environment store's, shared by the machine)."""
        dirs = [Path(workdir) / PROBES_DIR]
        if env_store is not None:
            dirs.append(Path(env_store) / STORE_PROBES_DIR)
        return cls(dirs, write=write)

    @staticmethod
    def key(kind: str, parts: Mapping[str, Any]) -> str:
        """The key of an answer: ``kind`` (what was asked) and everything the answer depends on."""
        return f"{kind}-{digest({'format': FORMAT, 'kind': kind, **parts})[:40]}"

    def get(self, key: str) -> dict[str, Any] | None:
        """The answer kept under ``key``; None when none is (or it is unreadable). One found only in a later
        directory is copied to the earlier ones (the work directory then has its own)."""
        for index, directory in enumerate(self.dirs):
            try:
                found = json.loads((directory / f"{key}.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(found, dict) and isinstance(found.get("answer"), dict):
                if index and self.write:
                    self._put(self.dirs[:index], key, found)
                return dict(found["answer"])
        return None

    def put(self, key: str, answer: Mapping[str, Any]) -> None:
        """Keep ``answer`` under ``key`` in every directory."""
        if self.write:
            self._put(self.dirs, key, {"key": key, "answer": dict(answer)})

    def drop(self, key: str) -> None:
        """Forget the answer under ``key`` everywhere (it was found wrong)."""
        for directory in self.dirs if self.write else ():
            with contextlib.suppress(OSError):
                (directory / f"{key}.json").unlink()

    @staticmethod
    def _put(dirs: Sequence[Path], key: str, document: Mapping[str, Any]) -> None:
        text = json.dumps(document, indent=1, sort_keys=True) + "\n"
        for directory in dirs:
            # a record that cannot be kept costs the next run a question, never this one
            with contextlib.suppress(OSError):
                atomic.keep_text(directory, f"{key}.json", text)
