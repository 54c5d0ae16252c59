"""Whether an installed distribution's shared objects find their libraries without the build host's help.

Upstream's ``.ci/pytorch/check_binary.sh`` starts with ``unset LD_LIBRARY_PATH`` ("linked libraries should
be found from RPATH") and then imports torch. A source build that works only because ``LD_LIBRARY_PATH``
points at the CUDA toolkit (or a conda env) passes every other check on the machine that built it and
fails on the next one. Importing with the variable unset would prove it for the libraries one import loads,
but not for those loaded later (``libtorch_cuda_linalg.so`` on the first linear-algebra call), and it
cannot say which entry is missing. So this module answers it statically, from the ELF files, the way
glibc's loader searches (``elf/dl-load.c``: ``_dl_map_object``), for every ``NEEDED`` entry of every
shared object the distribution installs:

1. the object's own ``DT_RPATH`` (when it has no ``DT_RUNPATH``), else its ``DT_RUNPATH``, with
   ``$ORIGIN`` expanded to the object's directory (``LD_LIBRARY_PATH``, between the two, is left out:
   that is the point);
2. a library installed by a distribution it declares (``Requires-Dist``, followed transitively with the
   extras and markers it names): already loaded by the time this one is, as torch's libraries are when
   torchvision's load, and as ``torch/__init__.py`` preloads the ``nvidia/*/lib`` libraries of its
   dependencies when its own RPATH does not reach them;
3. the system: the loader's cache (``ldconfig -p``) and its default directories (``ld.so --help``).

A candidate counts only when it is an ELF object of the requiring object's class and machine (the loader
skips the others). The NVIDIA driver's own libraries (:data:`DRIVER_LIBRARIES`: ``libcuda.so.1``, which
upstream's ``libcaffe2_nvrtc.so`` needs) come from the host's driver installation, never from a wheel: where
the system has them they must resolve like any other; where it has none (a machine without a GPU) they are
listed as the driver's, not as unresolved. Nothing is loaded (no dlopen): the files are read with pyelftools. ``$LIB`` and
``$PLATFORM`` are not expanded (upstream's wheels use neither): a path using them finds nothing.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSegment
from elftools.elf.elffile import ELFFile
from elftools.elf.segments import InterpSegment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from torchkiln.host.loader import ldconfig_cache, system_search_path

Distribution = importlib.metadata.Distribution
# Libraries only the NVIDIA driver installs (CUDA's driver API and NVML); no wheel ships them, and auditwheel
# repairs never bundle them.
DRIVER_LIBRARIES = frozenset({"libcuda.so.1", "libnvidia-ml.so.1"})
DRIVER = "the NVIDIA driver's (not on this machine)"


@dataclass(frozen=True)
class ElfDynamic:
    """What the loader reads of one ELF object: its dynamic entries, class and machine."""

    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    soname: str | None
    elfclass: int
    machine: str
    interpreter: str | None = None


# The dynamic tags the loader reads, and the attribute pyelftools gives each one's string under.
_TAGS = {"DT_NEEDED": "needed", "DT_RPATH": "rpath", "DT_RUNPATH": "runpath", "DT_SONAME": "soname"}


def read_elf(path: Path) -> ElfDynamic | None:
    """The dynamic entries of ``path``; None when it is not an ELF file (or not a readable one)."""
    try:
        with path.open("rb") as stream:
            if stream.read(4) != b"\x7fELF":
                return None
            stream.seek(0)
            elf = ELFFile(stream)
            found: dict[str, list[str]] = {attr: [] for attr in _TAGS.values()}
            interpreter = None
            for segment in elf.iter_segments():
                if isinstance(segment, InterpSegment):
                    interpreter = segment.get_interp_name()
                if isinstance(segment, DynamicSegment):
                    for tag in segment.iter_tags():
                        attr = _TAGS.get(tag.entry.d_tag)
                        if attr is not None:
                            found[attr].append(str(getattr(tag, attr)))
            return ElfDynamic(
                needed=tuple(found["needed"]),
                rpath=tuple(p for entry in found["rpath"] for p in entry.split(":") if p),
                runpath=tuple(p for entry in found["runpath"] for p in entry.split(":") if p),
                soname=found["soname"][0] if found["soname"] else None,
                elfclass=elf.elfclass,
                machine=str(elf["e_machine"]),
                interpreter=interpreter,
            )
    except (ELFError, OSError, ValueError, KeyError):
        return None


def dynamic_strings(path: Path) -> bytes:
    """The ``.dynstr`` section of an ELF object (the names of the symbols it defines and imports)."""
    try:
        with path.open("rb") as stream:
            section = ELFFile(stream).get_section_by_name(".dynstr")
            return bytes(section.data()) if section is not None else b""
    except (ELFError, OSError, ValueError):
        return b""


@dataclass(frozen=True)
class Resolved:
    """One ``NEEDED`` entry of one object: where the loader finds it without LD_LIBRARY_PATH, and how
    (``RPATH``, ``RUNPATH``, ``dependency <name>``, ``system``); ``path`` None: nowhere."""

    obj: str
    needed: str
    path: str | None
    via: str


@dataclass(frozen=True)
class System:
    """The loader's own search: its cache (soname -> paths) and default directories."""

    cache: Mapping[str, Sequence[str]]
    directories: tuple[str, ...]

    @classmethod
    def of_this_machine(cls) -> System:
        interpreter = read_elf(Path(sys.executable).resolve())
        return cls(ldconfig_cache(), system_search_path(interpreter.interpreter if interpreter else None))


def _compatible(path: Path, want: ElfDynamic) -> bool:
    found = _elf_cached(str(path))
    return found is not None and (found.elfclass, found.machine) == (want.elfclass, want.machine)


@functools.lru_cache(maxsize=4096)
def _elf_cached(path: str) -> ElfDynamic | None:
    return read_elf(Path(path)) if Path(path).is_file() else None


def _expand(entry: str, origin: Path) -> Path:
    return Path(entry.replace("${ORIGIN}", str(origin)).replace("$ORIGIN", str(origin)))


def _search(directories: Iterable[Path], name: str, want: ElfDynamic) -> str | None:
    for directory in directories:
        candidate = directory / name
        if _compatible(candidate, want):
            return os.path.normpath(candidate)
    return None


def resolve(
    obj: Path, info: ElfDynamic, name: str, provided: Mapping[str, tuple[str, str]], system: System
) -> tuple[str | None, str]:
    """Where ``name`` (a NEEDED entry of ``obj``) is found, and how. ``provided``: file name or soname ->
    (path, distribution) of the libraries the declared dependencies install."""
    if "/" in name:  # a path, not a name: used as it is (relative to the working directory)
        return (name, "path") if _compatible(Path(name), info) else (None, "")
    origin = obj.parent
    own = info.rpath if not info.runpath else info.runpath
    found = _search((_expand(e, origin) for e in own), name, info)
    if found:
        return found, "RUNPATH" if info.runpath else "RPATH"
    if name in provided:
        path, dist = provided[name]
        if _compatible(Path(path), info):
            return path, f"dependency {dist}"
    for cached in system.cache.get(name, ()):
        if _compatible(Path(cached), info):
            return cached, "system"
    found = _search((Path(d) for d in system.directories), name, info)
    if found:
        return found, "system"
    return None, DRIVER if name in DRIVER_LIBRARIES else ""


# --- distributions -------------------------------------------------------------------------------------


def installed(paths: Sequence[str] | None = None) -> dict[str, Distribution]:
    """The installed distributions by canonical name (first on the path wins, as for imports)."""
    found: dict[str, Distribution] = {}
    for dist in importlib.metadata.distributions(path=list(paths) if paths is not None else sys.path):
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonicalize_name(name), dist)
    return found


def declared_dependencies(dist: Distribution, index: Mapping[str, Distribution]) -> dict[str, Distribution]:
    """The installed distributions ``dist`` requires, transitively, with the extras each requirement names
    (``cuda-toolkit[cudart,...]`` brings ``nvidia-cuda-runtime``) and markers evaluated for this machine."""
    seen: set[tuple[str, frozenset[str]]] = set()
    out: dict[str, Distribution] = {}
    todo: list[tuple[Distribution, frozenset[str]]] = [(dist, frozenset())]
    while todo:
        current, extras = todo.pop()
        for text in current.requires or ():
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if req.marker is not None and not any(
                req.marker.evaluate({"extra": extra}) for extra in (extras or {""})
            ):
                continue
            name = canonicalize_name(req.name)
            key = (name, frozenset(req.extras))
            if name not in index or key in seen:
                continue
            seen.add(key)
            out[name] = index[name]
            todo.append((index[name], frozenset(req.extras)))
    return out


def _is_shared_object(relative: str) -> bool:
    name = relative.rsplit("/", 1)[-1]
    return name.endswith(".so") or ".so." in name


def shared_objects(dist: Distribution) -> list[tuple[str, Path]]:
    """(path as RECORD lists it, installed path) of every ELF shared object ``dist`` installed."""
    found = []
    for entry in dist.files or ():
        relative = str(entry)
        if _is_shared_object(relative):
            path = Path(str(dist.locate_file(entry)))
            if _elf_cached(str(path)) is not None:
                found.append((relative, path))
    return sorted(found)


def provided_libraries(dependencies: Mapping[str, Distribution]) -> dict[str, tuple[str, str]]:
    """File name and soname -> (path, distribution) of the shared objects the dependencies install."""
    provided: dict[str, tuple[str, str]] = {}
    for name, dist in sorted(dependencies.items()):
        for _, path in shared_objects(dist):
            info = _elf_cached(str(path))
            for key in (path.name, info.soname if info else None):
                if key:
                    provided.setdefault(key, (str(path), name))
    return provided


@dataclass(frozen=True)
class Linkage:
    """Every NEEDED entry of every shared object of one distribution, resolved (or not)."""

    distribution: str
    objects: tuple[str, ...]
    entries: tuple[Resolved, ...]

    @property
    def unresolved(self) -> tuple[Resolved, ...]:
        return tuple(e for e in self.entries if e.path is None and e.via != DRIVER)

    @property
    def driver(self) -> tuple[Resolved, ...]:
        """Entries for the NVIDIA driver's libraries on a machine that has no driver."""
        return tuple(e for e in self.entries if e.via == DRIVER)

    def routes(self) -> dict[str, int]:
        """How many entries each route resolved (dependencies counted together)."""
        counts: dict[str, int] = {}
        for entry in self.entries:
            if entry.path is not None:
                route = "dependency" if entry.via.startswith("dependency") else entry.via
                counts[route] = counts.get(route, 0) + 1
        return counts

    def message(self) -> str:
        driver = "; ".join(f"{e.obj} needs {e.needed}" for e in self.driver)
        host = f"; left to the host's NVIDIA driver, which this machine lacks: {driver}" if driver else ""
        if self.unresolved:
            listed = "; ".join(f"{e.obj} needs {e.needed}" for e in self.unresolved)
            return (
                f"{self.distribution}: {len(self.unresolved)} NEEDED entries resolve through none of RPATH/"
                f"RUNPATH, a declared dependency's libraries or the system's (LD_LIBRARY_PATH unset): "
                f"{listed}{host}"
            )
        routes = ", ".join(f"{n} via {route}" for route, n in sorted(self.routes().items()))
        return (
            f"{self.distribution}: {len(self.entries) - len(self.driver)} NEEDED entries of "
            f"{len(self.objects)} shared objects resolve without LD_LIBRARY_PATH ({routes or 'none needed'})"
            f"{host}"
        )


def check_distribution(dist: Distribution, index: Mapping[str, Distribution], system: System) -> Linkage:
    """Resolve every NEEDED entry of every shared object ``dist`` installed (see the module docstring)."""
    provided = provided_libraries(declared_dependencies(dist, index))
    objects = shared_objects(dist)
    entries = []
    for relative, path in objects:
        info = _elf_cached(str(path))
        assert info is not None  # shared_objects keeps ELF files only
        for name in info.needed:
            found, via = resolve(path, info, name, provided, system)
            entries.append(Resolved(relative, name, found, via))
    label = f"{dist.metadata['Name']} {dist.version}"
    return Linkage(label, tuple(r for r, _ in objects), tuple(entries))


# --- what torch's CUDA libraries link: NCCL and MAGMA (buildconfig's self-checks) ---------------------


def library_facts(dist: Distribution, linkage: Linkage) -> dict[str, object]:
    """``BuildFacts`` fields read from torch's ELF files: libtorch_cuda.so's NEEDED libnccl entry and where
    it resolves, and how MAGMA is linked into the library that holds CUDA linear algebra
    (``libtorch_cuda_linalg.so``, loaded on the first call; ``libtorch_cuda.so`` in builds without it)."""
    by_name = {relative.rsplit("/", 1)[-1]: relative for relative in linkage.objects}
    facts: dict[str, object] = {"libraries_read": True, "nccl_needed": None, "nccl_path": None}
    for entry in linkage.entries:
        if entry.obj == by_name.get("libtorch_cuda.so") and entry.needed.startswith("libnccl"):
            facts["nccl_needed"], facts["nccl_path"] = entry.needed, entry.path
    facts["magma_linkage"] = None
    holder = by_name.get("libtorch_cuda_linalg.so") or by_name.get("libtorch_cuda.so")
    if holder is not None:
        needs = [e.needed for e in linkage.entries if e.obj == holder and "magma" in e.needed]
        if needs:
            facts["magma_linkage"] = f"{', '.join(needs)} (NEEDED by {holder})"
        elif b"\0magma_" in dynamic_strings(Path(str(dist.locate_file(holder)))):
            facts["magma_linkage"] = f"static in {holder}"
    return facts
