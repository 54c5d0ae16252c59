"""Whether an installed distribution's shared objects find their libraries on the machines it is deployed to,
not only on this one.

Upstream's ``.ci/pytorch/check_binary.sh`` starts with ``unset LD_LIBRARY_PATH`` ("linked libraries should
be found from RPATH") and then imports torch. A source build that works only because ``LD_LIBRARY_PATH``
points at the CUDA toolkit, or because this machine happens to have ``/usr/lib/x86_64-linux-gnu/libpng16.so.16``,
passes every other check here and fails on the next machine. Importing with the variable unset would prove
it for the libraries one import loads, but not for those loaded later (``libtorch_cuda_linalg.so`` on the
first linear-algebra call), it cannot say which entry is missing, and it still counts whatever this machine's
system directories hold. So this module answers it statically, from the ELF files: every ``NEEDED`` entry of
every shared object the distribution installs is resolved the way :mod:`torchkiln.artifacts.abi` resolves it for
the portability record (bundled, from a declared distribution, a system library a manylinux policy allows,
the NVIDIA driver's, or one the recipe's ``[deploy] system_libraries`` promises), never through this machine's
loader cache or system directories. Those are read only to say, of an entry nothing accounts for, that this
machine has it (and so the wheel works here only).

The NVIDIA driver's own libraries (``libcuda.so.1``, which upstream's ``libcaffe2_nvrtc.so`` needs; the list
is libnvidia-container's, :data:`torchkiln.artifacts.portability.DRIVER_LIBRARIES`) come with the driver
wherever a GPU is, never from a wheel: they pass on a machine without a GPU too.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torchkiln.artifacts.abi import analyse_installed, mismatch_words, soname_stem
from torchkiln.artifacts.elf import ElfDynamic, dynamic_strings, read_elf
from torchkiln.artifacts.installed import (
    Distribution,
    declared_dependencies,
    installed,
    missing_requirements,
    name_of,
    provided_libraries,
    shared_objects,
    unsatisfied_requirements,
)
from torchkiln.artifacts.portability import Portability, one_line, system_libraries_fix
from torchkiln.errors import few
from torchkiln.host.loader import ldconfig_cache, system_search_path

__all__ = [
    "Distribution",
    "ElfDynamic",
    "Linkage",
    "Resolved",
    "System",
    "check_distribution",
    "declared_dependencies",
    "dynamic_strings",
    "installed",
    "library_facts",
    "provided_libraries",
    "read_elf",
    "shared_objects",
]

DRIVER = "the NVIDIA driver's"


@dataclass(frozen=True)
class Resolved:
    """One ``NEEDED`` entry of one object: how it resolves on the target (``kind``: the portability record's,
    ``via``: how), and where inside the installation (``path``: site-packages relative; None: on the machine,
    or nowhere)."""

    obj: str
    needed: str
    path: str | None
    via: str
    kind: str = "unresolved"


@dataclass(frozen=True)
class System:
    """This machine's loader: its cache (soname -> paths) and default directories. Only to say where this
    machine has a library the target is not known to have; never to resolve one."""

    cache: Mapping[str, Sequence[str]]
    directories: tuple[str, ...]

    @classmethod
    def of_this_machine(cls) -> System:
        interpreter = read_elf(Path(sys.executable).resolve())
        return cls(ldconfig_cache(), system_search_path(interpreter.interpreter if interpreter else None))

    def where(self, name: str) -> str | None:
        """Where this machine's loader would find ``name`` (its cache, then its directories), or None."""
        for path in self.cache.get(name, ()):
            if Path(path).is_file():
                return path
        return next((str(Path(d) / name) for d in self.directories if (Path(d) / name).is_file()), None)

    def other_versions(self, name: str) -> list[str]:
        """Where this machine's loader cache has another version of the library ``name`` (``libcudnn.so.8``
        where ``libcudnn.so.9`` is needed), each as ``soname at path``."""
        stem = soname_stem(name)
        return [
            f"{other} at {path}"
            for other, paths in sorted(self.cache.items())
            if other != name and soname_stem(other) == stem
            for path in paths[:1]
        ]


@dataclass(frozen=True)
class Linkage:
    """Every NEEDED entry of every shared object of one distribution, resolved for the target (or not)."""

    distribution: str
    objects: tuple[str, ...]
    entries: tuple[Resolved, ...]
    record: Portability | None = None
    here: Mapping[str, str] = field(default_factory=dict)  # unresolved name -> where this machine has it
    # unresolved name -> the other versions of it this machine has (where it has not that one)
    here_other: Mapping[str, Sequence[str]] = field(default_factory=dict)
    # required distributions installed at another version -> (the requirement: what pip must install, how an
    # entry's ``via`` names it: :func:`torchkiln.artifacts.abi.mismatch_words`)
    mismatched: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    target: tuple[str, ...] = ()  # the recipe's [deploy] system_libraries it was judged against
    missing: Mapping[str, str] = field(
        default_factory=dict
    )  # required distributions not installed -> requirement

    @property
    def unresolved(self) -> tuple[Resolved, ...]:
        return tuple(e for e in self.entries if e.kind == "unresolved")

    @property
    def driver(self) -> tuple[Resolved, ...]:
        """Entries for the NVIDIA driver's libraries (on the target's driver, whatever this machine has)."""
        return tuple(e for e in self.entries if e.kind == "driver")

    def routes(self) -> dict[str, int]:
        """How many entries each kind resolved (bundled, declared, policy, driver, target)."""
        counts: dict[str, int] = {}
        for entry in self.entries:
            if entry.kind != "unresolved":
                counts[entry.kind] = counts.get(entry.kind, 0) + 1
        return counts

    def message(self) -> str:
        record = f"; {one_line(self.record)}" if self.record is not None else ""
        if self.unresolved:
            listed = "; ".join(self._named(e) for e in self.unresolved)
            return (
                f"{self.distribution}: {len(self.unresolved)} NEEDED entries do not resolve on the target machines "
                "(through the wheel's own files, a declared distribution's at the version it requires, a system "
                "library a manylinux policy allows, the NVIDIA driver's, the recipe's [deploy] system_libraries; "
                f"never this machine's system directories); cause: {listed}{self._not_installed()}\n"
                f"fix: {self.fix()}"
            )
        routes = ", ".join(f"{n} {kind}" for kind, n in sorted(self.routes().items()))
        return (
            f"{self.distribution}: {len(self.entries)} NEEDED entries of {len(self.objects)} shared objects resolve "
            f"on the target without LD_LIBRARY_PATH ({routes or 'none needed'}){record}"
        )

    def _not_installed(self) -> str:
        if not self.missing:
            return ""
        return (
            f"; {self.distribution} requires what is not installed at all, whose libraries these may be: "
            + ", ".join(sorted(self.missing.values()))
        )

    def fix(self) -> str:
        """The way out of every unresolved entry at once: what it requires at the version it requires (one pip
        command naming every distribution installed at another version or not at all), then, for the rest, the
        complete recipe line."""
        wrong = {
            req: words
            for req, words in self.mismatched.values()
            if any(words in e.via for e in self.unresolved)
        }
        rest = sorted({e.needed for e in self.unresolved if not any(w in e.via for w in wrong.values())})
        install = sorted({*wrong, *self.missing.values()})
        parts = []
        if install:
            parts.append("install what it requires: pip install " + " ".join(f"'{r}'" for r in install))
        if rest:
            then = "of what that leaves unresolved: " if self.missing else ""
            parts.append(then + system_libraries_fix(self.target, rest))
        return "; ".join(parts)

    def _named(self, entry: Resolved) -> str:
        here = self.here.get(entry.needed)
        others = self.here_other.get(entry.needed)
        if here:
            real = Path(here).resolve().name  # the file a soname link names says its full version
            full = f" ({real})" if real != Path(here).name else ""
            where = f" (this machine has it at {here}{full}: the wheel works here only)"
        elif others:
            where = f" (this machine has only another version of it: {few(list(others), 3)})"
        else:
            where = ""
        return f"{entry.obj} needs {entry.needed}: {entry.via}{where}"


def check_distribution(
    dist: Distribution,
    index: Mapping[str, Distribution],
    system: System | None = None,
    *,
    target: Iterable[str] = (),
    label: str | None = None,
) -> Linkage:
    """Resolve every NEEDED entry of every shared object ``dist`` installed, for a target that has the installation,
    the policy's libraries, the NVIDIA driver's and ``target`` (a recipe's ``[deploy] system_libraries``) and
    nothing of this machine; ``system`` (this machine's loader) only says where it has an unresolved one."""
    label = label or f"{dist.metadata['Name']} {dist.version}"
    target = tuple(target)
    record = analyse_installed(dist, index, target=target, analysed=f"installed here ({label})")
    entries = tuple(Resolved(n.file, n.needed, n.path, n.via, n.kind) for n in record.needs)
    objects = tuple(sorted({n.file for n in record.needs}))
    here, here_other = {}, {}
    if system is not None:
        for entry in entries:
            if entry.kind != "unresolved":
                continue
            if found := system.where(entry.needed):
                here[entry.needed] = found
            elif others := system.other_versions(entry.needed):
                here_other[entry.needed] = others
    wheel = name_of(dist)
    mismatched = {
        name: (req, mismatch_words(name, index[name].version, req, wheel))
        for name, req in unsatisfied_requirements(dist, index).items()
    }
    missing = missing_requirements(dist, index)
    return Linkage(label, objects, entries, record, here, here_other, mismatched, target, missing)


# --- what torch's CUDA libraries link: NCCL and MAGMA (buildconfig's self-checks) ---------------------


def library_facts(dist: Distribution, linkage: Linkage) -> dict[str, object]:
    """``BuildFacts`` fields read from torch's ELF files: libtorch_cuda.so's NEEDED libnccl entry and where
    it resolves, and how MAGMA is linked into the library that holds CUDA linear algebra
    (``libtorch_cuda_linalg.so``, loaded on the first call; ``libtorch_cuda.so`` in builds without it)."""
    by_name = {relative.rsplit("/", 1)[-1]: relative for relative in linkage.objects}
    facts: dict[str, object] = {"libraries_read": True, "nccl_needed": None, "nccl_path": None}
    for entry in linkage.entries:
        if entry.obj == by_name.get("libtorch_cuda.so") and entry.needed.startswith("libnccl"):
            promised = f"the target machines' ({entry.via})" if entry.kind == "target" else None
            facts["nccl_needed"], facts["nccl_path"] = entry.needed, entry.path or promised
    facts["magma_linkage"] = None
    holder = by_name.get("libtorch_cuda_linalg.so") or by_name.get("libtorch_cuda.so")
    if holder is not None:
        needs = [e.needed for e in linkage.entries if e.obj == holder and "magma" in e.needed]
        if needs:
            facts["magma_linkage"] = f"{', '.join(needs)} (NEEDED by {holder})"
        elif b"\0magma_" in dynamic_strings(Path(str(dist.locate_file(holder)))):
            facts["magma_linkage"] = f"static in {holder}"
    return facts
