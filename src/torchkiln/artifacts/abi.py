"""The analysis behind a wheel's portability record (:mod:`torchkiln.artifacts.portability`): every ``NEEDED``
entry of every shared object of an installed wheel resolved from the wheel's own point of view, and the manylinux or
musllinux policy it satisfies, from the policy data auditwheel ships (its ``manylinux-policy.json``: which
libraries and which symbol versions each policy allows; its ELF readers for symbol versions, the C library and
the instruction set). Analysis only: nothing here repairs or retags a wheel.

Resolution never asks the machine it runs on. The loader's search (glibc's ``elf/dl-load.c``) is followed only
where it stays inside the installation: the object's RUNPATH (else its RPATH) with ``$ORIGIN`` expanded to its
directory *inside site-packages*, looked up among the files the wheel and the distributions installed beside it
list in their RECORD. An entry that leaves site-packages (an absolute ``/usr/local/cuda/lib64``, a build
machine's ``/__w/_temp/.../lib``) is a note, never a resolution: the target need not have it. What the
loader's cache and default directories would give is replaced by what is promised for every target: the
policy's libraries, the NVIDIA driver's, and the recipe's ``[deploy] system_libraries``.

Where the wheel is read (:func:`analyse_installed`): the post-build check's venv, which pip filled from the
wheel and its Requires-Dist; or, when that check is skipped, the wheel unpacked beside the distributions of
another directory (:func:`analyse_wheel`: the build venv). ``analysed`` says which.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import posixpath
import re
import tempfile
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elftools.common.exceptions import ELFError

from torchkiln.errors import few

from .elf import ElfDynamic, elf_cached
from .installed import (
    Distribution,
    declared_dependencies,
    installed,
    library_layout,
    name_of,
    provided_libraries,
    shared_objects,
    unsatisfied_requirements,
)
from .portability import TARGET_VIA, Need, Portability, is_driver_library, summarise

# The dynamic loader is part of the C library the policies allow (auditwheel leaves it out of its checks).
LOADER = re.compile(r"^(ld-linux[-\w.]*\.so\.\d+|ld64\.so\.[12]|ld-musl-[\w-]+\.so\.1)$")
UNRESOLVED = (
    "not bundled, not in a declared distribution, not allowed by a manylinux policy, not the NVIDIA driver's, "
    "not in [deploy] system_libraries"
)


# --- resolving one NEEDED entry --------------------------------------------------------------------------


@dataclass(frozen=True)
class Installation:
    """What the wheel meets once installed: its name, every shared object of it and of the distributions
    beside it by RECORD path (``layout``: path -> (distribution, ELF); a mapping that may read lazily), the
    distributions it declares, the libraries they hold by name (``loaded``: soname or file name -> (RECORD
    path, distribution): what ``import`` of a dependency loads before the wheel's own modules) and the wheel's
    own (``own``: soname or file name -> RECORD path), the names the newest policy allows, and the recipe's
    ``system_libraries``."""

    wheel: str
    layout: Mapping[str, tuple[str, ElfDynamic | None]]
    declared: frozenset[str]
    loaded: Mapping[str, tuple[str, str]]
    own: Mapping[str, str]
    allowed: frozenset[str]
    target: frozenset[str]
    policy: str = "a manylinux policy"  # the newest policy for the wheel's machine ('allowed' is its)
    # family -> versions the newest policy allows (GLIBCXX -> 3.4 ... 3.4.34): a system library counts at those
    versions: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # distributions the wheel requires that are installed at another version -> what is there and what is
    # required (:func:`mismatch_words`), and their libraries by name -> (RECORD path, distribution)
    mismatched: Mapping[str, str] = field(default_factory=dict)
    mismatched_libraries: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    installed_versions: Mapping[str, str] = field(default_factory=dict)  # distribution -> its version


def site_relative(entry: str, obj: str) -> str | None:
    """An RPATH/RUNPATH entry of the file at RECORD path ``obj``, as a RECORD path of a directory; None when it
    leaves site-packages (absolute, relative to the working directory, above site-packages, ``$LIB``)."""
    for origin in ("$ORIGIN", "${ORIGIN}"):
        if entry == origin or entry.startswith(origin + "/"):
            rest = entry[len(origin) :]
            where = posixpath.normpath(posixpath.dirname(obj) + rest) if posixpath.dirname(obj) else None
            if where is None:
                where = posixpath.normpath("." + rest)
            if where == ".." or where.startswith("../") or "$" in where:
                return None
            return "" if where == "." else where
    return None


def _same_machine(found: ElfDynamic | None, want: ElfDynamic) -> bool:
    return found is not None and (found.elfclass, found.machine) == (want.elfclass, want.machine)


def resolve(obj: str, info: ElfDynamic, name: str, inst: Installation) -> Need:
    """How ``name``, a NEEDED entry of ``obj`` (RECORD path; ``info`` its ELF), resolves on a target that has
    the installation and nothing of the build machine (see the module docstring, and the kinds in
    :mod:`torchkiln.artifacts.portability`)."""
    if "/" in name:
        return Need(obj, name, "unresolved", "a path, not a name: the loader opens it as it is")
    tag, entries = info.search
    elsewhere: tuple[str, str] | None = None
    for entry in entries:
        where = site_relative(entry, obj)
        if where is None:
            continue
        candidate = posixpath.normpath(posixpath.join(where, name))
        dist, found = inst.layout.get(candidate, ("", None))
        if not _same_machine(found, info):
            continue
        if dist == inst.wheel:
            return Need(obj, name, "bundled", f"{tag} {entry}", candidate)
        if dist in inst.declared:
            return Need(obj, name, "declared", f"{tag} {entry}", candidate, dist)
        elsewhere = elsewhere or (candidate, dist)
    reach = f"no {tag} entry of {obj} reaches it" if entries else f"{obj} has no RPATH/RUNPATH"
    if name in inst.loaded:
        path, dist = inst.loaded[name]
        if _same_machine(inst.layout.get(path, ("", None))[1], info):
            return Need(obj, name, "declared", f"loaded first by {dist} ({reach})", path, dist)
    if LOADER.match(name):
        return Need(obj, name, "policy", "the dynamic loader")
    if name in inst.allowed:
        newer = too_new(info, name, inst.versions)
        if not newer:
            return Need(obj, name, "policy", f"a system library {inst.policy} allows")
        if name in inst.target:
            return Need(obj, name, "target", TARGET_VIA)
        newest = f"{', '.join(newer)} of it, which no manylinux policy allows ({inst.policy} is the newest)"
        return Need(obj, name, "unresolved", f"needs {newest}")
    if is_driver_library(name):
        return Need(obj, name, "driver", "the NVIDIA driver's (libnvidia-container's list)")
    if name in inst.target:
        return Need(obj, name, "target", TARGET_VIA)
    if (
        name in inst.own
    ):  # the wheel has it, but this file cannot reach it: found only if loaded first, by chance
        return Need(obj, name, "unresolved", f"the wheel has it at {inst.own[name]}, but {reach}")
    if elsewhere is not None:
        path, dist = elsewhere
        if dist in inst.mismatched:
            return Need(obj, name, "unresolved", f"{tag} reaches {path} of {inst.mismatched[dist]}")
        return Need(
            obj, name, "unresolved", f"{tag} reaches {path} of {dist}, which {inst.wheel} does not declare"
        )
    if name in inst.mismatched_libraries:
        path, dist = inst.mismatched_libraries[name]
        return Need(obj, name, "unresolved", f"{inst.mismatched[dist]}; it has {name} at {path}")
    others = other_versions(name, inst)
    if others:
        return Need(obj, name, "unresolved", f"{UNRESOLVED}; {others}")
    return Need(obj, name, "unresolved", UNRESOLVED)


def mismatch_words(dist: str, found: str, requirement: str, wheel: str) -> str:
    """``dist`` installed at ``found`` where ``wheel`` requires ``requirement``: found and needed, named."""
    return f"{dist} {found}, which {wheel} does not run with: it requires {requirement} (found {found})"


def soname_stem(name: str) -> str:
    """``libcudnn.so`` of ``libcudnn.so.9`` (and of ``libcudnn.so``): what every version of the library shares."""
    head, dot_so, _ = name.partition(".so")
    return head + dot_so


def other_versions(name: str, inst: Installation) -> str:
    """Where the installation has another version of the library ``name`` (``libcudnn.so.8`` where
    ``libcudnn.so.9`` is needed: the loader opens the name NEEDED says, nothing else), in words; "" when it
    has none."""
    stem = soname_stem(name)
    found = sorted(
        (path, dist)
        for path, dist in _names(inst.layout)
        if soname_stem(posixpath.basename(path)) == stem and posixpath.basename(path) != name
    )
    if not found:
        return ""
    shown = [
        f"{posixpath.basename(p)} at {p} of {d} {inst.installed_versions.get(d, '')}".rstrip()
        for p, d in found
    ]
    return f"the installation has only another version of it: {few(shown, 3)} (needs {name})"


def _names(layout: Mapping[str, tuple[str, Any]]) -> Iterable[tuple[str, str]]:
    """(RECORD path, distribution) of a layout's files, without reading any ELF file."""
    files: Mapping[str, tuple[str, Any]] = getattr(layout, "files", layout)
    return ((path, dist) for path, (dist, _) in files.items())


def too_new(info: ElfDynamic, name: str, allowed: Mapping[str, frozenset[str]]) -> list[str]:
    """The symbol versions ``info`` needs of the library ``name`` that the newest policy does not allow (of a
    family it lists: GLIBC, GLIBCXX, CXXABI, GCC, ...): GLIBCXX_3.4.35 of libstdc++.so.6 from a gcc newer
    than any policy's is on no machine a policy describes."""
    found = []
    for library, version in info.versions:
        family, _, number = version.partition("_")
        if library == name and family in allowed and number not in allowed[family]:
            found.append(version)
    return sorted(found)


def outside_notes(objects: Iterable[tuple[str, ElfDynamic]]) -> list[str]:
    """One note per RPATH/RUNPATH entry that leaves the installation (never counted), with the files that
    have it."""
    files: dict[str, list[str]] = {}
    for obj, info in objects:
        tag, entries = info.search
        for entry in entries:
            if site_relative(entry, obj) is None:
                files.setdefault(f"{tag} {entry}", []).append(obj)
    return [
        f"{entry} of {few(objs)} is outside the installation (a directory of the build machine, or of no "
        "machine): not counted"
        for entry, objs in sorted(files.items())
    ]


# --- the policies (auditwheel's data) ----------------------------------------------------------------------


@dataclass(frozen=True)
class Platform:
    """The wheel's machine and C library as auditwheel reads them from its ELF files."""

    arch: Any  # auditwheel.architecture.Architecture (the baseline: x86_64, aarch64)
    libc: Any  # auditwheel.libc.Libc
    extended: dict[str, str]  # RECORD path -> instruction set beyond the baseline (x86_64_v3)


def read_platform(files: Sequence[tuple[str, Path]]) -> Platform | None:
    """auditwheel's reading of each file (``lddtree.ldd`` with no search path at all: nothing of this
    machine is looked at, every NEEDED entry excluded): the baseline machine, the C library, and any
    instruction-set level a file needs beyond the baseline."""
    from auditwheel.lddtree import ldd
    from auditwheel.libc import Libc

    arch, libc, extended = None, None, {}
    for relative, path in files:
        try:
            tree = ldd(path, ldpaths={"conf": [], "env": [], "interp": []}, exclude=frozenset({"*"}))
            base, ext = tree.platform.baseline_architecture, tree.platform.extended_architecture
        except (ValueError, OSError, ELFError):  # a machine auditwheel does not know, an unreadable file
            continue
        arch = arch or base
        libc = libc or tree.libc
        if ext is not None and not base.is_superset(ext):
            extended[relative] = ext.value
    if arch is None:
        return None
    return Platform(arch, libc or Libc.GLIBC, extended)


@functools.lru_cache(maxsize=16)
def policies_for(arch: Any, libc: Any) -> tuple[Any, ...]:
    """auditwheel's policies (:class:`auditwheel.policy.Policy`) for the machine and C library, without the
    plain ``linux`` one, most compatible first (manylinux_2_5 before manylinux_2_41)."""
    from auditwheel.libc import Libc
    from auditwheel.policy import WheelPolicies

    if libc == Libc.MUSL:
        data = json.loads(
            importlib.resources.files("auditwheel.policy").joinpath("musllinux-policy.json").read_text()
        )
        sets = [
            WheelPolicies(libc=libc, arch=arch, musl_policy=p["name"]) for p in data if p["name"] != "linux"
        ]
    else:
        sets = [WheelPolicies(libc=libc, arch=arch)]
    found = {p.name: p for s in sets for p in s if p.priority > 0}
    return tuple(sorted(found.values(), key=lambda p: -p.priority))


def _version_key(text: str) -> tuple[int, ...] | None:
    parts = text.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None


def highest_versions(objects: Iterable[tuple[str, ElfDynamic]]) -> dict[str, str]:
    """Per symbol-version family (GLIBC, GLIBCXX, CXXABI, GCC, ...), the highest numeric version needed."""
    best: dict[str, tuple[tuple[int, ...], str]] = {}
    for _, info in objects:
        for _, version in info.versions:
            family, _, number = version.partition("_")
            key = _version_key(number)
            if key is not None and (family not in best or key > best[family][0]):
                best[family] = (key, number)
    return {family: number for family, (_, number) in sorted(best.items())}


def _symbol_problems(policy: Any, objects: Sequence[tuple[str, ElfDynamic]]) -> list[str]:
    """The symbol versions ``policy`` does not allow, each with the file that needs it (auditwheel's rule:
    a version of a family the policy lists must be one it lists)."""
    problems = []
    for relative, info in objects:
        bad = sorted(
            version
            for _, version in info.versions
            if version.partition("_")[0] in policy.symbol_versions
            and version.partition("_")[2] not in policy.symbol_versions[version.partition("_")[0]]
        )
        if bad:
            problems.append(f"{relative} needs {', '.join(bad)}")
    return problems


def _blacklisted(policy: Any, objects: Sequence[tuple[str, ElfDynamic, Path]]) -> list[str]:
    from auditwheel.elfutils import filter_undefined_symbols

    problems = []
    for relative, info, path in objects:
        listed = {lib: policy.blacklist[lib] for lib in info.needed if lib in policy.blacklist}
        for lib, symbols in filter_undefined_symbols(path, listed).items() if listed else ():
            problems.append(f"{relative} uses {', '.join(symbols)} of {lib}, which {policy.name} forbids")
    return problems


def policy_problems(
    policy: Any, objects: Sequence[tuple[str, ElfDynamic, Path]], needs: Sequence[Need], platform: Platform
) -> list[str]:
    """Why the wheel does not satisfy ``policy`` (empty: it does): symbol versions, libraries the policy does
    not allow (declared, bundled and the driver's are not the policy's business, as ``auditwheel repair
    --exclude`` treats them), instruction sets beyond the baseline, symbols it forbids."""
    problems = _symbol_problems(policy, [(r, i) for r, i, _ in objects])
    for need in needs:
        if need.kind in ("target", "unresolved") or (
            need.kind == "policy" and not LOADER.match(need.needed) and need.needed not in policy.whitelist
        ):
            problems.append(f"{need} which {policy.name} does not allow")
    problems += [f"{r} needs the {isa} instruction set" for r, isa in sorted(platform.extended.items())]
    return problems or _blacklisted(policy, objects)


def best_policy(
    objects: Sequence[tuple[str, ElfDynamic, Path]], needs: Sequence[Need], platform: Platform
) -> tuple[str | None, list[str]]:
    """The most compatible policy the wheel satisfies, and what keeps it from the next more compatible one
    (or, satisfying none, from the newest)."""
    candidates = policies_for(platform.arch, platform.libc)
    for more, policy in zip((None, *candidates), candidates, strict=False):
        if not policy_problems(policy, objects, needs, platform):
            why = policy_problems(more, objects, needs, platform) if more is not None else []
            return policy.name, [f"not {more.name}: {w}" for w in why] if more is not None else []
    newest = candidates[-1] if candidates else None
    if newest is None:
        return None, [f"auditwheel has no policy for {platform.arch}"]
    return None, [f"not even {newest.name}: {w}" for w in policy_problems(newest, objects, needs, platform)]


# --- the whole wheel ---------------------------------------------------------------------------------------


class _Layout(Mapping[str, tuple[str, ElfDynamic | None]]):
    """RECORD path -> (distribution, ELF), the ELF read when first asked for."""

    def __init__(self, files: Mapping[str, tuple[str, Path]]) -> None:
        self._files = files

    @property
    def files(self) -> Mapping[str, tuple[str, Path]]:
        """RECORD path -> (distribution, installed path), nothing read."""
        return self._files

    def __getitem__(self, key: str) -> tuple[str, ElfDynamic | None]:
        dist, path = self._files[key]
        return dist, elf_cached(str(path))

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)


def _tags(dist: Distribution) -> list[str]:
    text = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]
    return sorted({tag.split("-", 2)[2] for tag in tags if tag.count("-") >= 2})


def analyse_installed(
    dist: Distribution, index: Mapping[str, Distribution], *, target: Iterable[str] = (), analysed: str
) -> Portability:
    """The portability record of the installed ``dist`` among the distributions ``index`` (by canonical
    name), judged against ``target`` (the recipe's ``[deploy] system_libraries``)."""
    wheel = name_of(dist)
    files = shared_objects(dist)
    if not files:
        why = ["no shared objects: it runs wherever its Python and its dependencies do"]
        return Portability(analysed, _tags(dist), None, why)
    objects = [(r, elf_cached(str(p), True), p) for r, p in files]
    read = [(r, info, p) for r, info, p in objects if info is not None]
    platform = read_platform(files)
    candidates = policies_for(platform.arch, platform.libc) if platform else ()
    deps = declared_dependencies(dist, index)
    other = unsatisfied_requirements(dist, index)
    layout = library_layout(index)
    layout.update({r: (wheel, p) for r, p in files})
    mismatched = {n: mismatch_words(n, index[n].version, req, wheel) for n, req in other.items()}
    inst = Installation(
        wheel,
        _Layout(layout),
        frozenset(deps),
        _loaded(deps),
        _own(files),
        frozenset(candidates[-1].whitelist) if candidates else frozenset(),
        frozenset(target),
        candidates[-1].name if candidates else "a manylinux policy",
        dict(candidates[-1].symbol_versions) if candidates else {},
        mismatched,
        _loaded({n: index[n] for n in other}),
        {n: d.version for n, d in index.items()},
    )
    needs = [resolve(r, info, name, inst) for r, info, _ in read for name in info.needed]
    notes = outside_notes((r, info) for r, info, _ in read)
    policy, why = best_policy(read, needs, platform) if platform else (None, ["no ELF file auditwheel reads"])
    versions = highest_versions((r, i) for r, i, _ in read)
    brings = sorted({f"{n.distribution} {deps[n.distribution].version}" for n in needs if n.distribution})
    record = Portability(
        analysed, _tags(dist), policy, why, versions.get("GLIBC"), versions, needs, notes, brings
    )
    return summarise(record)


def _own(files: Sequence[tuple[str, Path]]) -> dict[str, str]:
    """Soname and file name -> RECORD path of the wheel's own shared objects."""
    found: dict[str, str] = {}
    for relative, path in files:
        info = elf_cached(str(path))
        for key in (path.name, info.soname if info else None):
            if key:
                found.setdefault(key, relative)
    return found


def _loaded(deps: Mapping[str, Distribution]) -> dict[str, tuple[str, str]]:
    """Soname and file name -> (RECORD path, distribution) of the declared dependencies' shared objects."""
    found: dict[str, tuple[str, str]] = {}
    for key, (path, dist) in provided_libraries(deps).items():
        site = Path(str(deps[dist].locate_file("")))
        found[key] = (posixpath.normpath(Path(path).relative_to(site).as_posix()), dist)
    return found


def analyse_wheel(
    wheel: Path, sites: Sequence[Path], *, target: Iterable[str] = (), analysed: str
) -> Portability:
    """The record of a wheel file that is not installed anywhere: unpacked beside the distributions of
    ``sites`` (the first of each name winning), its files where pip puts them (a wheel's ``.data/`` directories
    stay as they are: torch's and torchvision's libraries are not there)."""
    with tempfile.TemporaryDirectory(prefix="kiln-abi-") as tmp:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(tmp)
        index = installed([tmp, *map(str, sites)])
        dist = next((d for d in installed([tmp]).values()), None)
        if dist is None:
            return Portability(analysed, why=[f"{wheel.name}: no .dist-info in the wheel"])
        return analyse_installed(dist, index, target=target, analysed=analysed)
