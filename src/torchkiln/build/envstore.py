"""Environments kept by their content, shared between work directories (issue 15).

A fresh work directory used to pay for its environments again: ``python -m venv`` (ensurepip), pip's own
upgrade, the build requirements, the ~200 MB (CPU) to ~2 GB (CUDA) torch wheel for torchvision, then the
check venv: 40 s to 80 s around a compile that the compiler cache serves in seconds. The store keeps, after
each step that makes or changes a venv (``Step.venv``), a copy of that venv under a key that says what is in
it: the step's command with the work directory and source paths taken out, the content of what it reads
(requirement files, the constraints, the torch wheel it installs), the interpreter, pip's index settings,
and the key of the step before it on the same venv. A step whose key is in the store is not run: the stored
venv is cloned into place instead, and what the step recorded (its outputs) is taken over.

A venv restored from the store is linked to its entry (:func:`link_venv`, issue 47): the directories of its
site-packages are symbolic links to the entry's, its files there hard links, and what names the venv's own
path (``bin/`` scripts' ``#!`` lines, ``activate``, ``pyvenv.cfg``) is rewritten for the new path, each as a
new file: a hundred operations instead of 27,000 hard links, so a fresh work directory's venv costs the same
whatever its size. The entry is read-only to the build (its sandbox mounts the store read-only); a step that
installs into such a venv first gets a venv of its own, cloned with hard links (:func:`materialize`), as every
copy is (``cp --archive --link``, a real copy across filesystems). Entries made by different steps share their
large identical files too (``.objects/``, torchkiln.files.shared): the torch and NVIDIA wheels that each
Python's build venv and each check venv install again are one copy on disk. Removing the store (``rm -rf``)
between builds is safe: a venv linked to one of its entries is then found damaged where a build relies on
it (:mod:`torchkiln.build.venvcheck`) and made again, as is an entry found damaged (dropped).

Why not pip's or uv's cache alone: pip's cache saves the download but not the unpacking and install
(most of the time for torch); a store of finished venvs saves both, and keeps pip and the user's pip
configuration (index URLs, constraints, certificates) as the only installer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import errno
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchkiln.errors import name_path, remember_space
from torchkiln.files import shared
from torchkiln.files.digests import digest

__all__ = [
    "EnvStore",
    "Restored",
    "LINKED",
    "clone_tree",
    "link_argv",
    "default_env_store",
    "full_clone",
    "link_venv",
    "linked_origin",
    "materialize",
    "tree_bytes",
    "relocate_venv",
    "venv_distributions",
]

META = "meta.json"
# 2: entries hold only what a run made from nothing (issue 27); those kept before may hold a hand-made venv
FORMAT = 2
# pip settings that change what an install resolves to: part of every key (hashed, never stored).
PIP_SETTINGS = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_CONSTRAINT")


def default_env_store(environ: Mapping[str, str] | None = None) -> Path:
    """``envs`` beside the compiler caches: ``$TORCHKILN_CACHE_DIR/envs`` or ``~/.cache/torchkiln/envs``
    (``--env-store`` and ``$TORCHKILN_ENV_STORE`` choose another). Hard links need the store on the work
    directory's filesystem; elsewhere the venvs are copied (slower, still correct)."""
    # here, not at the top: the check venv's clone (build.checkvenv, a process of the first checked build
    # after its compile) imports this module, and torchkiln.cache with its compiler caches is a third of it
    from torchkiln.cache.config import default_cache_dir  # noqa: PLC0415

    return default_cache_dir("envs", environ).absolute()


def interpreter_identity(python: str, environ: Mapping[str, str]) -> dict[str, str]:
    """What a venv made by ``python`` depends on outside the plan: the interpreter file it resolves to (path,
    size, mtime: a patch upgrade of the host's Python makes new venvs), the machine, and pip's index settings."""
    found = shutil.which(python, path=environ.get("PATH"))
    ident: dict[str, str] = {"python": python, "machine": platform.machine()}
    if found is not None:
        real = Path(found).resolve()
        st = real.stat()
        ident["interpreter"] = f"{real}\0{st.st_size}\0{st.st_mtime_ns}"
    for name in PIP_SETTINGS:
        if name in environ:
            ident[name] = environ[name]
    return ident


# What pip and the interpreter read as installed in a site-packages directory: a distribution's metadata
# directory, a legacy egg link, a .pth file (editable installs, setuptools' distutils-precedence.pth).
_INSTALLED = (".dist-info", ".egg-info", ".egg-link", ".pth")


def venv_distributions(venv: Path) -> list[str]:
    """What is installed in ``venv``, as its site-packages directories list it (``six-1.17.0.dist-info``,
    ...; sorted): what ``pip freeze`` reads. Each step on a venv records it; a venv whose list differs from
    the last record was changed outside the build (a ``pip install`` by hand, a venv the build did not
    make), so the build makes it again instead of taking it, or keeping it, as its own."""
    found: set[str] = set()
    for lib in ("lib", "lib64"):
        for site in sorted((venv / lib).glob("python*/site-packages")):
            with contextlib.suppress(OSError):
                found.update(p.name for p in site.iterdir() if p.name.endswith(_INSTALLED))
    return sorted(found)


def tree_bytes(root: Path) -> int:
    """The space a copy of ``root`` takes: its files' and directories' allocated blocks (what ``du`` counts)."""
    total = 0
    for directory, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
    return total


def _copy_tree(source: Path, target: Path) -> None:
    """A real copy of ``source`` at ``target`` (symlinks as symlinks, modes and times kept) that stops at the
    first file it cannot make, raising that OSError naming the file: ``shutil.copytree`` goes on past a
    full disk and raises one error per file (26,459 of them for a venv)."""
    target.mkdir()
    with os.scandir(source) as entries:
        for entry in entries:
            destination = target / entry.name
            try:
                if entry.is_symlink():
                    os.symlink(os.readlink(entry.path), destination)
                elif entry.is_dir():
                    _copy_tree(Path(entry.path), destination)
                else:
                    shutil.copy2(entry.path, destination)
            except OSError as exc:
                raise name_path(exc, destination) from None
    shutil.copystat(source, target)


def link_argv(source: Path, target: Path) -> list[str]:
    """The command that makes ``target`` (which must not exist) a tree of hard links to ``source``'s files
    (symlinks kept): cp(1) makes it faster than Python does, one process with no interpreter per file."""
    return ["cp", "--archive", "--link", "--no-target-directory", "--", str(source), str(target)]


def clone_tree(source: Path, target: Path) -> None:
    """``target`` becomes a copy of ``source`` whose files are hard links to ``source``'s (symlinks kept as
    symlinks); across filesystems, or where links are refused, a real copy. ``target`` must not exist.

    A real copy that cannot fit is refused before it starts (ENOSPC naming ``target``; the caller says how
    much was needed, :func:`tree_bytes`), and one that runs out of space anyway stops at the first file;
    either way nothing of ``target`` is left."""
    if target.exists() or target.is_symlink():
        raise FileExistsError(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    linked = subprocess.run(
        link_argv(source, target),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    if linked.returncode == 0:
        return
    shutil.rmtree(target, ignore_errors=True)
    stat = os.statvfs(target.parent)
    if tree_bytes(source) > stat.f_bavail * stat.f_frsize:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))
    try:
        _copy_tree(source, target)
    except OSError as exc:
        remember_space(exc, target)
        shutil.rmtree(target, ignore_errors=True)
        raise
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise


def _is_text_script(path: Path) -> bool:
    if path.is_symlink() or not path.is_file():
        return False
    with path.open("rb") as handle:
        head = handle.read(4096)
    return b"\0" not in head


def relocate_venv(venv: Path, old: str, new: str) -> list[Path]:
    """Rewrite the files of a cloned venv that name the venv it was copied from (``old``): ``bin/`` scripts
    (``#!`` lines, ``activate*``) and ``pyvenv.cfg``. Each is written as a new file and renamed over the link,
    so the file it was linked to (the store's) keeps its content. Returns the files rewritten."""
    if old == new:
        return []
    candidates = [venv / "pyvenv.cfg"]
    bindir = venv / "bin"
    if bindir.is_dir():
        candidates += sorted(bindir.iterdir())
    old_bytes, new_bytes = old.encode(), new.encode()
    rewritten = []
    for path in candidates:
        if not _is_text_script(path):
            continue
        data = path.read_bytes()
        if old_bytes not in data:
            continue
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data.replace(old_bytes, new_bytes))
            os.chmod(tmp, path.stat().st_mode & 0o7777)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        rewritten.append(path)
    return rewritten


# In a venv linked to a store entry (link_venv): the entry's venv and the path it was kept from, as JSON.
LINKED = ".torchkiln-linked"


def _site_packages(venv: Path) -> set[str]:
    return {str(p) for p in (venv / "lib").glob("python*/site-packages") if not p.is_symlink()}


def _link_file(source: str, target: str) -> None:
    """A hard link, or a copy where links are refused (another filesystem)."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
        shutil.copy2(source, target, follow_symlinks=False)


def _link_level(source: Path, target: Path, sites: set[str]) -> None:
    """``target`` made from ``source``: a site-packages directory's entries linked (a directory as a symbolic
    link to the entry's, a file as a hard link), anything else cloned (hard links), symlinks kept."""
    target.mkdir()
    site = str(source) in sites
    with os.scandir(source) as entries:
        for entry in entries:
            destination = os.path.join(target, entry.name)
            if entry.is_symlink():
                os.symlink(os.readlink(entry.path), destination)
            elif entry.is_dir():
                if site:
                    os.symlink(entry.path, destination, target_is_directory=True)
                else:
                    _link_level(Path(entry.path), Path(destination), sites)
            else:
                _link_file(entry.path, destination)
    shutil.copystat(source, target)


def link_venv(entry_venv: Path, target: Path, kept_from: str) -> None:
    """``target`` becomes the store entry's venv at its own path in about a hundred operations, whatever its
    number of files (issue 47: 27,000 hard links took 0.4 to 1 s): each directory of its site-packages is a
    symbolic link to the entry's, each file there a hard link, the rest (``bin/``, ``pyvenv.cfg``) a clone
    relocated to ``target``; :data:`LINKED` names the entry. Made beside ``target`` and renamed into place
    (never half there); ``target`` must not exist. The entry is read-only to the build (its sandbox mounts
    the store so); a step that writes into the venv gets a venv of its own first (:func:`materialize`)."""
    if target.exists() or target.is_symlink():
        raise FileExistsError(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    entry_venv = entry_venv.absolute()
    made = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    made.rmdir()
    try:
        _link_level(entry_venv, made, _site_packages(entry_venv))
        relocate_venv(made, kept_from, str(target))
        origin = {"entry": str(entry_venv), "kept_from": kept_from}
        (made / LINKED).write_text(json.dumps(origin) + "\n", encoding="utf-8")
        os.rename(made, target)
    except BaseException:
        shutil.rmtree(made, ignore_errors=True)
        raise


def linked_origin(venv: Path) -> tuple[Path, str] | None:
    """The store entry's venv a venv is linked to and the path that entry was kept from; None for a venv of
    its own."""
    try:
        origin = json.loads((venv / LINKED).read_text(encoding="utf-8"))
        return Path(origin["entry"]), str(origin["kept_from"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def full_clone(venv: Path, target: Path, named: str) -> None:
    """``target`` a clone of ``venv`` with files of its own (hard links), naming ``named`` where the venv named
    itself; a linked venv is cloned from its entry (a clone of its links would write into the store)."""
    origin = linked_origin(venv)
    source, kept_from = origin if origin is not None else (venv, str(venv))
    clone_tree(source, target)
    relocate_venv(target, kept_from, named)
    (target / LINKED).unlink(missing_ok=True)


def materialize(venv: Path) -> bool:
    """A linked venv made a venv of its own (its entry cloned, relocated) before a step installs into it:
    False when it was one already. Cloned beside it and swapped in by renames."""
    if linked_origin(venv) is None:
        return False
    made = Path(tempfile.mkdtemp(prefix=f".{venv.name}.", dir=venv.parent))
    made.rmdir()
    old = made.with_name(made.name + ".old")
    try:
        full_clone(venv, made, str(venv))
        os.rename(venv, old)
        os.rename(made, venv)
    except BaseException:
        shutil.rmtree(made, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return True


@dataclass(frozen=True)
class Restored:
    """A venv taken from the store: the outputs its step recorded, and how long the clone took."""

    outputs: dict[str, Any]
    seconds: float
    entry: Path
    kept_from: str  # the venv's path when it was kept: what relocation rewrites
    cloned: bool = True  # False: the venv is left for the next step's entry (only its files were copied)


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


class EnvStore:
    """``<root>/<key>/``: ``venv/`` (the venv after the step), ``files/`` (what the step left outside the venv,
    e.g. the constraints file), ``meta.json`` (the venv's path when it was kept, the step, its outputs).

    Entries are written under a temporary name and renamed into place: a reader sees a whole entry or none,
    and two builds keeping the same key leave one entry."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def objects(self) -> Path:
        """One copy of each large file the entries hold (torchkiln.files.shared): entries and work
        directories' venvs link to it."""
        return self.root / ".objects"

    def key(self, parts: Mapping[str, Any]) -> str:
        return digest({"format": FORMAT, **parts})

    def entry(self, key: str) -> Path | None:
        path = self.root / key
        return path if (path / META).is_file() and (path / "venv").is_dir() else None

    def lookup(self, key: str, files: Collection[str] = ()) -> tuple[Path, dict[str, Any]] | None:
        """The entry for ``key`` and its metadata, when it is whole (and holds ``files``); else None."""
        entry = self.entry(key)
        if entry is None:
            return None
        try:
            meta = json.loads((entry / META).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not (
            isinstance(meta, dict)
            and isinstance(meta.get("venv"), str)
            and isinstance(meta.get("outputs", {}), dict)
        ):
            return None
        if not all((entry / "files" / name).is_file() for name in files):
            return None
        return entry, meta

    def restore(
        self, key: str, venv: Path, files: Mapping[str, Path], *, clone: bool = True
    ) -> Restored | None:
        """Clone the entry for ``key`` into ``venv`` (replacing what is there) and its kept files to their
        paths (``files``: name -> path). None when the store has no such entry or it is damaged.
        ``clone=False``: the files only, for a venv the next step's entry replaces at once."""
        found = self.lookup(key, files)
        if found is None:
            return None
        entry, meta = found
        started = time.monotonic()
        for name, path in files.items():
            _remove(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(entry / "files" / name, path)
        with contextlib.suppress(OSError):
            os.utime(entry / META)  # last used: what a pruner would read
        restored = Restored(
            dict(meta.get("outputs", {})), time.monotonic() - started, entry, meta["venv"], cloned=False
        )
        return self.clone(restored, venv) if clone else restored

    def clone(self, restored: Restored, venv: Path) -> Restored:
        """The venv of an entry whose files ``restore`` put in place, linked into ``venv`` (replacing what is
        there: :func:`link_venv`)."""
        started = time.monotonic()
        _remove(venv)
        link_venv(restored.entry / "venv", venv, restored.kept_from)
        seconds = restored.seconds + time.monotonic() - started
        return dataclasses.replace(restored, seconds=seconds, cloned=True)

    def drop(self, key: str) -> None:
        """The entry of ``key`` removed (found damaged): renamed away first, so no reader sees half of it."""
        entry = self.root / key
        gone = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.dropped.", dir=self.root))
        with contextlib.suppress(OSError):
            os.rename(entry, gone / key)
        shutil.rmtree(gone, ignore_errors=True)

    def keep(
        self, key: str, venv: Path, files: Mapping[str, Path], step: str, outputs: Mapping[str, Any]
    ) -> Path | None:
        """Keep ``venv`` (and ``files``) under ``key`` unless the store has it already. Returns the entry, or
        None when there was nothing to keep."""
        staged = self.stage(key, venv)  # None: the store has the key already, or there is no venv
        return self.entry(key) if staged is None else self.commit(key, staged, venv, files, step, outputs)

    def stage(self, key: str, venv: Path) -> Path | None:
        """The first half of :meth:`keep`: ``venv`` cloned into a new temporary entry, its large files shared
        with the other entries'; None when the store has ``key`` or there is no venv. The post-build check
        stages its venv while it imports the wheels (build.wheelkinds); :meth:`commit` or :meth:`discard`
        after."""
        if self.entry(key) is not None or not venv.is_dir():
            return None
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.", dir=self.root))
        try:
            linked = linked_origin(venv) is not None  # its files are another entry's: left alone
            full_clone(venv, tmp / "venv", str(venv))
            # the same large files as other entries (torch, the NVIDIA wheels of every Python's venvs): one
            # copy, in the entry and in the work directory's venv
            self.share(tmp / "venv", also=None if linked else venv)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return tmp

    def commit(
        self,
        key: str,
        staged: Path,
        venv: Path,
        files: Mapping[str, Path],
        step: str,
        outputs: Mapping[str, Any],
    ) -> Path:
        """A staged entry completed (``files``, what the step recorded) and put in place under ``key``; a
        build that got there first keeps its own."""
        try:
            self._complete(staged, venv, files, step, outputs)
            if not self._place(staged, key):
                shutil.rmtree(staged, ignore_errors=True)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        return self.root / key

    def adopt(
        self, key: str, venv: Path, files: Mapping[str, Path], step: str, outputs: Mapping[str, Any]
    ) -> Path | None:
        """Keep ``venv`` itself under ``key``, for a venv no later step of the build writes (the post-build
        check's): moved into the store by a rename and left at its path linked to the entry
        (:func:`link_venv`), about a hundred operations where :meth:`keep`'s clone is one per file (25,000 for
        the check venv of torch 2.13 CPU and torchvision: 0.37 s on an idle machine, 0.9 s beside the check).
        None when it cannot be moved (the store on another filesystem): :meth:`keep` then. Whatever fails
        before the venv is linked puts it back where it was; the store gets the whole entry or none."""
        if (kept := self.entry(key)) is not None:
            return kept
        self.root.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.", dir=self.root))
        placed = False
        try:
            self._complete(staged, venv, files, step, outputs)
            try:
                os.rename(venv, staged / "venv")
            except OSError as exc:
                if exc.errno == errno.EXDEV:
                    return None
                raise
            placed = self._place(staged, key)
        finally:
            if not placed:
                if (staged / "venv").is_dir() and not venv.exists():
                    os.rename(staged / "venv", venv)
                shutil.rmtree(staged, ignore_errors=True)
        if not placed:  # another build kept the same key meanwhile: this venv stays as it is
            return self.entry(key)
        link_venv(self.root / key / "venv", venv, str(venv))
        return self.root / key

    def _complete(
        self, staged: Path, venv: Path, files: Mapping[str, Path], step: str, outputs: Mapping[str, Any]
    ) -> None:
        """What an entry holds beside its venv: ``files/`` and ``meta.json``."""
        (staged / "files").mkdir()
        for name, path in files.items():
            shutil.copy2(path, staged / "files" / name)
        meta = {
            "format": FORMAT,
            "venv": str(venv),
            "step": step,
            "outputs": dict(outputs),
            "kept": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
        (staged / META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")

    def _place(self, staged: Path, key: str) -> bool:
        """``staged`` renamed to the entry of ``key``; False when another build's entry is there already."""
        try:
            os.rename(staged, self.root / key)
        except OSError:
            if self.entry(key) is None:  # not another build's entry: a real failure
                raise
            return False
        return True

    def share(self, venv: Path, *, also: Path | None = None) -> None:
        """The large files of ``venv`` (a staged clone, or a venv about to be adopted: :meth:`adopt`) and of
        ``also`` linked to the store's objects, the objects no tree links to any more swept first. In place,
        beside a step that may still be running: a file is replaced by a rename, by one of the same content,
        so a reader never sees it change."""
        self.root.mkdir(parents=True, exist_ok=True)
        shared.sweep(self.objects)
        shared.share_identical(venv, self.objects, also=also)

    @staticmethod
    def discard(staged: Path | None) -> None:
        """A staged entry that will not be kept (its step failed) removed."""
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)
