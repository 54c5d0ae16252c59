"""The portability record of a wheel: where it runs, read from the wheel itself (issue 34).

One record per wheel (its shared objects: the ``*.so`` files ``import`` loads, as upstream's ``check_binary.sh``
and verify read them), in the manifest (:class:`~torchkiln.artifacts.manifest.WheelRecord` ``portability``),
made by :mod:`torchkiln.artifacts.abi` (the analysis: auditwheel's policies, pyelftools) and judged here: which
``NEEDED`` entries nothing on the target provides (the post-build check refuses the wheel naming each, and
``verify``'s release area fails on them), and what a recipe's ``[deploy] system_libraries`` changes.

The invariant: a library counts as reachable on the target only through what travels with the wheel or is
promised for the target, never through the machine that built it. Each ``NEEDED`` entry of every shared
object of the wheel is one of :data:`KINDS`:

* ``bundled``: a file of the wheel itself, reached through the object's RPATH/RUNPATH (``$ORIGIN/...``); a file
  of the wheel that no search entry reaches is not (the wheel's own modules load in no promised order: a
  torchvision ``_C.so`` that needs ``libpng16.so.16`` does not find the copy its ``image.so`` brings);
* ``declared``: a file of a distribution the wheel requires (Requires-Dist, followed transitively), reached
  through RPATH/RUNPATH into it (``$ORIGIN/../../nvidia/cu13/lib``) or loaded first by it (torchvision's
  ``libc10.so`` from torch, which ``import torch`` loads);
* ``policy``: a system library the manylinux/musllinux policies allow (auditwheel's ``lib_whitelist``:
  libc, libm, libstdc++, libgcc_s, ...) at symbol versions the newest policy allows (which policy the versions
  make it is the record's ``policy``; a version newer than any policy's, GLIBCXX_3.4.35 of a gcc newer than
  every policy's, is on no machine a policy describes: unresolved), and the dynamic loader itself;
* ``driver``: a library of the NVIDIA driver (:data:`DRIVER_LIBRARIES`), present wherever a GPU is;
* ``target``: named by the recipe's ``[deploy] system_libraries`` as present on the target machines;
* ``unresolved``: none of these. It may well be on the build machine (``/usr/lib/x86_64-linux-gnu``): that is
  exactly what is not counted.

Standard library only: the build's display and verify's messages read records without pyelftools.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

KINDS = ("bundled", "declared", "policy", "driver", "target", "unresolved")
# What must already be on the machine (not brought by the wheel or by pip): these kinds' libraries.
ON_THE_MACHINE = ("policy", "driver", "target")

# The NVIDIA driver's libraries a CUDA program links or the CUDA runtime loads, by name up to ".so": the
# "utility", "compute" and "video" libraries NVIDIA's container toolkit mounts from the host's driver
# (libnvidia-container, src/nvc_info.c: utility_libs, compute_libs, video_libs; it matches a library's
# file name by this prefix). No wheel ships them; a GPU node has them with its driver.
DRIVER_LIBRARIES = (
    # utility
    "libnvidia-ml.so",
    "libnvidia-cfg.so",
    "libnvidia-nscq.so",
    # compute
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-opencl.so",
    "libnvidia-gpucomp.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-fatbinaryloader.so",
    "libnvidia-allocator.so",
    "libnvidia-compiler.so",
    "libnvidia-pkcs11.so",
    "libnvidia-pkcs11-openssl3.so",
    "libnvidia-nvvm.so",
    "libnvidia-tileiras.so",
    # video
    "libvdpau_nvidia.so",
    "libnvidia-encode.so",
    "libnvidia-opticalflow.so",
    "libnvcuvid.so",
)


def is_driver_library(soname: str) -> bool:
    """Whether ``soname`` (``libcuda.so.1``) is one of :data:`DRIVER_LIBRARIES`."""
    return any(soname == stem or soname.startswith(stem + ".") for stem in DRIVER_LIBRARIES)


@dataclass(frozen=True)
class Need:
    """One ``NEEDED`` entry of one shared object of the wheel and how it resolves on the target."""

    file: str  # the wheel's file that needs it, as its RECORD names it (torchvision/_C.so)
    needed: str  # the DT_NEEDED entry (libpng16.so.16)
    kind: str  # one of KINDS
    via: str  # how: "RUNPATH $ORIGIN/../torchvision.libs", "loaded first by torch", "manylinux_2_28_x86_64"
    path: str | None = None  # where it resolves, relative to site-packages (bundled, declared)
    distribution: str | None = None  # the declared distribution that provides it

    def __str__(self) -> str:
        return f"{self.file} needs {self.needed}"


@dataclass(frozen=True)
class Portability:
    """Where a wheel runs, as read from the wheel (and the distributions it declares) installed."""

    analysed: str  # what was read: the installed wheel and which distributions it was resolved against
    tags: list[str] = field(default_factory=list)  # the platform tags the wheel carries (linux_x86_64)
    # The most compatible manylinux/musllinux policy the wheel satisfies (manylinux_2_28_x86_64); None: none
    # (a pure wheel, or one that needs what no policy allows). ``why``: what keeps it from a more compatible one.
    policy: str | None = None
    why: list[str] = field(default_factory=list)
    glibc: str | None = None  # the oldest glibc it runs on: its highest GLIBC_x.y symbol version
    versions: dict[str, str] = field(default_factory=dict)  # highest version needed per family (GLIBCXX ...)
    needs: list[Need] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # RPATHs of the build machine, bundled files loaded first
    pip_brings: list[str] = field(default_factory=list)  # declared distributions its libraries come from
    on_the_machine: list[str] = field(default_factory=list)  # libraries the target must already have
    unresolved: list[str] = field(default_factory=list)  # "FILE needs LIB" for each unresolved entry

    def of_kind(self, kind: str) -> list[Need]:
        return [n for n in self.needs if n.kind == kind]


def summarise(record: Portability) -> Portability:
    """``record`` with its derived lists (``on_the_machine``, ``unresolved``) made from its entries."""
    machine = sorted({n.needed for n in record.needs if n.kind in ON_THE_MACHINE})
    return replace(
        record, on_the_machine=machine, unresolved=[str(n) for n in record.needs if n.kind == "unresolved"]
    )


TARGET_VIA = "[deploy] system_libraries: the recipe says the target machines have it"


def retarget(record: Portability, system_libraries: Iterable[str], unresolved_via: str) -> Portability:
    """``record`` judged against another recipe's ``[deploy] system_libraries``: an entry that only the old list
    accounted for is unresolved again (``unresolved_via`` says why), one the new list names is ``target``."""
    wanted = frozenset(system_libraries)
    needs = []
    for need in record.needs:
        if need.kind == "unresolved" and need.needed in wanted:
            need = replace(need, kind="target", via=TARGET_VIA)
        elif need.kind == "target" and need.needed not in wanted:
            need = replace(need, kind="unresolved", via=unresolved_via)
        needs.append(need)
    return summarise(replace(record, needs=needs))


def refusal(wheel: str, record: Portability) -> str | None:
    """Why the post-build check refuses ``wheel``, naming each library and the file that needs it and how it
    fails to resolve; None when every entry is accounted for. The recipe line that would account for them
    all is :func:`system_libraries_fix`'s (one for every refused wheel)."""
    missing = record.of_kind("unresolved")
    if not missing:
        return None
    names = sorted({n.needed for n in missing})
    listed = "; ".join(f"{n} ({n.via})" for n in missing)
    return (
        f"{wheel} needs {', '.join(names)}, which the target machines are not known to have: not bundled in "
        f"the wheel, not in a distribution it declares, not allowed by a manylinux policy, not the NVIDIA "
        f"driver's: {listed}"
    )


def unresolved_names(records: Iterable[Portability]) -> list[str]:
    """Every library the records leave unresolved, each once, sorted."""
    return sorted({n.needed for record in records for n in record.of_kind("unresolved")})


def system_libraries_line(declared: Iterable[str], needed: Iterable[str]) -> str:
    """The recipe's ``[deploy] system_libraries`` with ``needed`` added, as a TOML line under its table: what
    the recipe says once it lists everything (the entries it has first, in their order, then the new ones
    sorted; each once). A suggestion that named only the new ones would drop the old ones when followed."""
    names = list(dict.fromkeys([*declared, *sorted(set(needed))]))
    return "[deploy] system_libraries = [" + ", ".join(json.dumps(n) for n in names) + "]"


def system_libraries_fix(declared: Iterable[str], needed: Iterable[str]) -> str:
    """The way out of a refusal (every refused wheel's libraries ``needed`` at once): bundle, declare, or, when
    every target machine has them, the complete recipe line (:func:`system_libraries_line`)."""
    wanted = sorted(set(needed))
    them = "it" if len(wanted) == 1 else "them"
    return (
        f"bundle {them}, declare the distribution that ships {them}, or, when every target machine has "
        f"{them}, list {them} in the recipe: {system_libraries_line(declared, wanted)}"
    )


def one_line(record: Portability) -> str:
    """The record in one line (the build's display, docs): policy, glibc, what pip brings, what must be there."""
    policy = record.policy or "no manylinux policy"
    glibc = f"glibc >= {record.glibc}" if record.glibc else "no glibc symbol versions"
    brings = ", ".join(record.pip_brings) or "nothing"
    machine = ", ".join(record.on_the_machine) or "nothing"
    return f"{policy}; {glibc}; pip brings {brings}; the machine must have {machine}"
