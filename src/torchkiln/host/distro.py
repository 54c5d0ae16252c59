"""Which distribution this machine runs, and what it packages: so that a fix hint is true where it is printed.

A hint such as ``apt-get install python3.11-dev`` is true on Debian 12 and false on Debian 13 (which packages
Python 3.13 only), on a release torchkiln knows nothing of, and on a distribution without apt. So the hints
of ``torchkiln check`` (:mod:`torchkiln.plan.preflight`) are made here, from three things:

* ``/etc/os-release`` (else ``/usr/lib/os-release``; os-release(5)): ``ID``, ``VERSION_ID``, ``ID_LIKE``,
  ``VERSION_CODENAME``, ``UBUNTU_CODENAME``, ``PRETTY_NAME``;
* ``data/distros.toml``: per known release, the Pythons and gcc majors it packages, the pyenv it packages, and
  on Ubuntu which of the packages the hints name are in universe or -updates (a minimal root enables neither),
  each read from the release's package index (the file says where and when);
* the caller's environment, for pyenv: where its root is (``PYENV_ROOT``; Debian 13's pyenv package sets
  ``/usr/share/pyenv`` in ``/etc/profile.d/pyenv.sh``, which only root can write), whether it is installed and
  which Pythons its definitions install (:mod:`torchkiln.host.pyenv`).

The invariant (tests/test_distro.py checks it over real os-release files x every Python torchkiln supports x
every gcc; tests/test_distro_index.py against the indexes themselves): a hint names only a source that
provides the thing on that release. A known release's apt-get names only packages its index has, after the
steps that enable the universe component and the -updates pocket where a package needs them
(software-properties-common before add-apt-repository); pyenv only where its definitions have a release of that
Python; a release of an apt distribution that is not in the table gets ``apt-get install X if ... (apt-cache
policy X says)``, never a claim about what it packages; a distribution without apt (or without os-release)
gets no apt-get command at all.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from torchkiln.shipped import shipped_toml

from . import pyenv

# Where os-release(5) says the file is: /etc/os-release, else /usr/lib/os-release.
OS_RELEASE = (Path("/etc/os-release"), Path("/usr/lib/os-release"))
# Debian's pyenv package: /usr/bin/pyenv links to its libexec/pyenv here, and (pyenv 2.5.4-1, Debian 13)
# /etc/profile.d/pyenv.sh sets PYENV_ROOT to it for login shells.
DEBIAN_PYENV_ROOT = "/usr/share/pyenv"
DEBIAN_PYENV_PROFILE = Path("/etc/profile.d/pyenv.sh")
PYENV_INSTALL = "https://github.com/pyenv/pyenv#installation"
# A free-threaded CPython (PEP 703): "3.13t". Debian and Ubuntu package none under python3.13t-* names.
FREE_THREADED = "t"
APT_FAMILY = ("debian", "ubuntu")
PYENV_DOCS = "docs/build.md#a-python-the-distribution-does-not-package"


@dataclass(frozen=True)
class Release:
    """A row of data/distros.toml: what one distribution release packages."""

    key: str  # "debian:13": os-release's ID and VERSION_ID
    name: str  # "Debian 13 (trixie)"
    codename: str
    python3: str
    pythons: tuple[str, ...]
    gcc: tuple[int, ...]
    gcc_default: int
    pyenv: str | None  # the version of the pyenv it packages
    python_notes: Mapping[str, str] = field(default_factory=dict)
    ppa: str | None = None  # "deadsnakes": the PPA of Pythons an Ubuntu release takes
    universe: frozenset[str] = frozenset()  # packages of the hints in universe (Ubuntu)
    updates: frozenset[str] = frozenset()  # packages of the hints only in CODENAME-updates (Ubuntu)


@cache
def releases() -> dict[str, Release]:
    """data/distros.toml's rows, by key."""
    rows = shipped_toml("distros.toml")["release"]
    return {
        key: Release(
            key=key,
            name=row["name"],
            codename=row["codename"],
            python3=row["python3"],
            pythons=tuple(row["pythons"]),
            gcc=tuple(row["gcc"]),
            gcc_default=row["gcc_default"],
            pyenv=row.get("pyenv"),
            python_notes=dict(row.get("python_notes", {})),
            ppa=row.get("ppa"),
            universe=frozenset(row.get("universe", ())),
            updates=frozenset(row.get("updates", ())),
        )
        for key, row in rows.items()
    }


def parse_os_release(text: str) -> dict[str, str]:
    """os-release(5): ``KEY=VALUE`` lines, the value unquoted as a shell would (quotes, backslash escapes);
    comments, blank lines and lines that are not an assignment are skipped."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        key, sep, value = line.partition("=")
        if not sep or line.startswith("#") or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            continue
        try:
            words = shlex.split(value, comments=False, posix=True)
        except ValueError:
            continue
        fields[key] = " ".join(words)
    return fields


@dataclass(frozen=True)
class Distro:
    """This machine's distribution: its os-release fields and, when the table knows it, its release."""

    fields: Mapping[str, str]
    release: Release | None
    source: str = ""  # the os-release file read ("" when there was none)

    @property
    def id(self) -> str:
        return self.fields.get("ID", "").strip().lower()

    @property
    def like(self) -> tuple[str, ...]:
        return tuple(self.fields.get("ID_LIKE", "").lower().split())

    @property
    def apt(self) -> bool:
        """Debian, Ubuntu or a distribution like them (ID_LIKE): apt-get and Debian's package names."""
        return self.id in APT_FAMILY or any(x in APT_FAMILY for x in self.like)

    @property
    def name(self) -> str:
        """How a hint names it: the table's name where known (with the derivative's own name), else
        PRETTY_NAME, else NAME and VERSION_ID, else ID."""
        own = self.fields.get("PRETTY_NAME") or " ".join(
            x for x in (self.fields.get("NAME"), self.fields.get("VERSION_ID")) if x
        )
        if self.release is not None:
            if self.id == self.release.key.partition(":")[0]:
                return self.release.name
            return f"{own or self.id} (on {self.release.name}'s packages)"
        return own or self.id or "this system (it has no /etc/os-release)"


def identify(fields: Mapping[str, str]) -> Release | None:
    """The table's release for these os-release fields: ``ID:VERSION_ID`` (``ID:VERSION_CODENAME`` where there
    is no VERSION_ID: Debian testing and unstable), else, for a derivative of Ubuntu that names its base
    (``UBUNTU_CODENAME``), that Ubuntu release. None for anything else."""
    table = releases()
    version = fields.get("VERSION_ID", "").strip() or fields.get("VERSION_CODENAME", "").strip()
    key = f"{fields.get('ID', '').strip().lower()}:{version}"
    if key in table:
        return table[key]
    like = fields.get("ID_LIKE", "").lower().split()
    base = fields.get("UBUNTU_CODENAME", "").strip()
    if "ubuntu" in like and base:
        return next((r for r in table.values() if r.key.startswith("ubuntu:") and r.codename == base), None)
    return None


def read_distro(paths: Sequence[Path] = OS_RELEASE) -> Distro:
    """This machine's distribution, from the first os-release file that can be read."""
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        fields = parse_os_release(text)
        return Distro(fields, identify(fields), str(path))
    return Distro({}, None)


def this_host() -> Distro:
    """This machine's distribution (:data:`OS_RELEASE`)."""
    return read_distro(OS_RELEASE)


# ------------------------------------------------------------------------------------------------------
# The hints.
# ------------------------------------------------------------------------------------------------------


def _listed(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _gcc_range(majors: Sequence[int]) -> str:
    """``12, 13 and 14``, or ``9 to 14`` for a run of four or more."""
    if len(majors) >= 4 and list(majors) == list(range(majors[0], majors[-1] + 1)):
        return f"{majors[0]} to {majors[-1]}"
    return _listed([str(m) for m in majors])


# What enables a component or pocket of Ubuntu's archive (software-properties-common's add-apt-repository, in
# main; it runs apt-get update after each change): a minimal root has CODENAME main only.
ADD_APT_REPOSITORY = "apt-get install software-properties-common, then add-apt-repository -y"


def _enabling(distro: Distro, packages: Sequence[str]) -> str:
    """``apt-get install software-properties-common, then add-apt-repository -y universe, ... then `` where a
    known Ubuntu release has one of ``packages`` in universe or only in CODENAME-updates, which a minimal root
    does not enable ("" elsewhere)."""
    release = distro.release
    if release is None:
        return ""
    needing = [p for p in packages if p in release.universe or p in release.updates]
    if not needing:
        return ""
    places, steps = [], []
    if any(p in release.universe for p in needing):
        places.append("universe")
        steps.append("universe")
    if any(p in release.updates for p in needing):
        places.append(f"{release.codename}-updates")
        steps.append("--pocket updates")
    return (
        f"{ADD_APT_REPOSITORY} {', then add-apt-repository -y '.join(steps)} ({_listed(needing)} "
        f"{'is' if len(needing) == 1 else 'are'} in {' and '.join(places)}, which a minimal root does not "
        f"enable: its sources list has {release.codename} main only), then "
    )


def install(distro: Distro, *packages: str) -> str:
    """How to install packages named as Debian and Ubuntu name them: ``apt-get install ...`` on their
    family (after what enables universe and -updates, where a known Ubuntu release needs them), else the
    counterpart in the distribution's own packages (whose names torchkiln does not know)."""
    if distro.apt:
        return _enabling(distro, packages) + "apt-get install " + " ".join(packages)
    return f"install {distro.name}'s package(s) for what Debian calls {' '.join(packages)}"


# "apt-get install A B (why)", "apt install A, or ...", "apt-get install A if ...": the package names run to a
# parenthesis, a comma, a semicolon, a word of prose or the end.
_PACKAGE = r"(?!(?:if|or|and|where|then|else|with|for|from|on)\b)[a-z0-9][a-z0-9.+-]*"
APT_INSTALL = re.compile(rf"\bapt(?:-get)? install ({_PACKAGE}(?: {_PACKAGE})*)(?=$|[ ,;(])")


def portable(distro: Distro, text: str) -> str:
    """A hint written with Debian's ``apt-get install PACKAGES`` (data/host_tools.toml's ``provides``), as
    :func:`install` says it on ``distro``."""
    return APT_INSTALL.sub(lambda m: install(distro, *m.group(1).split()), text)


def _writable(root: str) -> bool:
    """Whether this user can create ``root`` or write in it (its nearest existing ancestor decides)."""
    probe = Path(root)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return os.access(probe, os.W_OK)


def _shims_root(environ: Mapping[str, str]) -> str | None:
    """The root of a pyenv whose ``shims`` directory is on PATH (pyenv itself need not be)."""
    for entry in environ.get("PATH", "").split(os.pathsep):
        shims = Path(entry)
        if shims.name == "shims" and any((shims.parent / d / "pyenv").exists() for d in ("bin", "libexec")):
            return str(shims.parent)
    return None


def _installed(root: str, want: str) -> str | None:
    """The version directory of ``want`` (3.12: 3.12.1; 3.13t: 3.13.0t) under ``root``/versions, if any."""
    base, free = want.rstrip(FREE_THREADED), want.endswith(FREE_THREADED)
    pattern = re.compile(rf"{re.escape(base)}(\.\d+)?{'t' if free else ''}")
    versions = Path(root) / "versions"
    found = (
        sorted(p.name for p in versions.iterdir() if pattern.fullmatch(p.name)) if versions.is_dir() else []
    )
    return found[-1] if found else None


def _profile_sets_root() -> bool:
    """Whether Debian's /etc/profile.d/pyenv.sh on this machine sets PYENV_ROOT (pyenv 2.5.4-1's does)."""
    try:
        return "PYENV_ROOT" in DEBIAN_PYENV_PROFILE.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def _unknown_upstream(want: str) -> str:
    """``; where its definitions have a Python X.Y release by now ...`` when upstream's newest pyenv read has
    none ("" when it has one)."""
    newest = pyenv.upstream()
    if want in newest.pythons:
        return ""
    return (
        f"; where its definitions have a Python {want} release by now: pyenv {newest.version}, the newest read "
        "here, has none (pyenv install --list says)"
    )


def _from_upstream(want: str, why: str = "") -> str:
    """``install pyenv (URL)``: upstream's pyenv, with why (where another is here) and what is not known of its
    definitions."""
    return f"install pyenv {'from upstream ' if why else ''}({PYENV_INSTALL}{f': {why}' if why else ''}{_unknown_upstream(want)})"


@dataclass(frozen=True)
class _Source:
    """Where the pyenv that installs Python comes from: the steps that get it, before and after PYENV_ROOT
    is set (the installer writes there), and whether Debian's profile script sets a root a user cannot write."""

    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    profile: bool = False
    replaces_debian: bool = False


def _pyenv_source(distro: Distro, want: str, found: str | None, shims_root: str | None) -> _Source:
    """The pyenv here if its definitions have a release of ``want`` (or cannot be read), else upstream's (or
    this one updated); with none here, the release's package where its pyenv has one, else upstream's."""
    profile = _profile_sets_root()
    if found is not None or shims_root is not None:
        home = pyenv.home_of(found) if found is not None else Path(str(shims_root))
        has = pyenv.installs(home)
        if has is None or want in has:
            return _Source(profile=profile)
        lacks = f"the pyenv in {home} has no definition of a Python {want} release"
        if str(home) == DEBIAN_PYENV_ROOT:
            return _Source(after=(_from_upstream(want, f"Debian's package, {lacks}"),), profile=profile,
                           replaces_debian=True)  # fmt: skip
        return _Source(
            before=(f"update pyenv ({lacks}: git -C {home} pull for a git clone{_unknown_upstream(want)})",),
            profile=profile,
        )
    release = distro.release
    packaged = pyenv.known().get(release.pyenv) if release is not None and release.pyenv else None
    if packaged is not None and want in packaged.pythons:
        return _Source(
            before=(install(distro, "pyenv"),), profile=profile or packaged.profile_root is not None
        )
    if packaged is not None:
        lacks = f"{distro.name}'s pyenv {packaged.version} has no definition of a Python {want} release"
        return _Source(after=(_from_upstream(want, lacks),), profile=profile)
    return _Source(after=(_from_upstream(want),), profile=profile)


def pyenv_steps(distro: Distro, want: str, environ: Mapping[str, str]) -> str:
    """How to get Python ``want`` from pyenv on this machine, from where it stands: a pyenv whose definitions
    have a release of ``want`` (the one installed, else the release's package where its pyenv has one, else
    upstream's), its root (Debian 13's package sets /usr/share/pyenv for login shells, which a user cannot
    write), the version installed already or not, its shims first on PATH, the version selected next to the
    system's."""
    found = shutil.which("pyenv", path=environ.get("PATH", os.defpath))
    shims_root = _shims_root(environ)
    source = _pyenv_source(distro, want, found, shims_root)
    steps = list(source.before)
    chosen = environ.get("PYENV_ROOT", "").rstrip("/") or (shims_root or "")
    root = chosen or "$HOME/.pyenv"  # pyenv's own default
    if chosen == DEBIAN_PYENV_ROOT or (source.profile and not chosen):
        why = (
            f"Debian's pyenv package sets PYENV_ROOT={DEBIAN_PYENV_ROOT} for login shells in "
            "/etc/profile.d/pyenv.sh, which only root can write"
            if source.profile
            else f"PYENV_ROOT={DEBIAN_PYENV_ROOT} is Debian's pyenv package's own directory, which only root can write"
        )
        steps.append(f"export PYENV_ROOT=$HOME/.pyenv ({why})")
        root = "$HOME/.pyenv"
    elif chosen and not _writable(chosen):
        steps.append(f"export PYENV_ROOT=$HOME/.pyenv (this user cannot write PYENV_ROOT={chosen})")
        root = "$HOME/.pyenv"
    steps.extend(source.after)
    if source.replaces_debian:
        steps.append(f"export PATH=\"{root}/bin:$PATH\" (upstream's pyenv before Debian's /usr/bin/pyenv)")
    home = environ.get("HOME", "")
    where = root.replace("$HOME", home, 1) if root.startswith("$HOME") and home else root
    installed = _installed(where, want) if not where.startswith("$") else None
    if installed is None:
        steps.append(f"pyenv install {want} (it compiles Python: {PYENV_DOCS} lists what that needs)")
    if shims_root != root:
        steps.append(f'export PATH="{root}/shims:$PATH" (pyenv\'s shims first)')
    selected = f" ({root}/versions/{installed} is installed, not selected)" if installed else ""
    steps.append(
        f"pyenv global system {want}{selected} (python3 stays the system's, python{want} runs {want})"
    )
    return "pyenv: " + ", then ".join(steps)


def _ppa(release: Release, want: str) -> str:
    """``; or the deadsnakes PPA ...`` for an Ubuntu release that takes it (not for a free-threaded Python:
    its packages are not named pythonX.Yt-*)."""
    if release.ppa != "deadsnakes" or want.endswith(FREE_THREADED):
        return ""
    return (
        f"; or the deadsnakes PPA, where it builds Python {want} for {release.codename}: "
        f"{ADD_APT_REPOSITORY} ppa:deadsnakes/ppa (apt-cache policy python{want}-dev then says)"
    )


def _ubuntu_like(distro: Distro) -> bool:
    return distro.id == "ubuntu" or "ubuntu" in distro.like


def python_fix(distro: Distro, want: str, environ: Mapping[str, str]) -> str:
    """Where Python ``want`` (a recipe's python.version) with its venv module and headers comes from here: the
    distribution's packages where it has them, else pyenv (and an Ubuntu release's PPA)."""
    release = distro.release
    if release is not None:
        if want in release.pythons:
            note = release.python_notes.get(want)
            return (
                f"{install(distro, f'python{want}-venv', f'python{want}-dev')} ({distro.name} packages Python "
                f"{_listed(release.pythons)}{f'; {want} is {note}' if note else ''})"
            )
        return (
            f"{distro.name} packages Python {_listed(release.pythons)} only, not {want}; "
            f"{pyenv_steps(distro, want, environ)}{_ppa(release, want)}"
        )
    pyenv_fix = pyenv_steps(distro, want, environ)
    if distro.apt and not want.endswith(FREE_THREADED):
        package = f"python{want}-dev"
        universe = f" with universe enabled ({ADD_APT_REPOSITORY} universe)" if _ubuntu_like(distro) else ""
        return (
            f"apt-get install python{want}-venv {package} if {distro.name} packages Python {want} "
            f"(apt-cache policy {package} says{universe}; data/distros.toml has no row for it); else {pyenv_fix}"
        )
    return (
        f"Python {want} with its venv module and C headers from {distro.name}'s packages if it has them; "
        f"else {pyenv_fix}"
    )


def python_headers_fix(distro: Distro, want: str, include: Path, interpreter: str) -> str:
    """How to get the C headers of Python ``want`` that ``interpreter`` lacks (its include directory,
    ``include``): the distribution's headers package for the distribution's own Python, else a Python
    installed with them."""
    if str(include).startswith("/usr/include/"):  # the distribution's own python3.X
        if distro.apt:
            return f"{install(distro, f'python{want}-dev')} (the headers of the distribution's python{want})"
        return f"install the C headers of {distro.name}'s Python {want} (its development package)"
    return (
        f"a Python {want} installed with its headers ({interpreter} was installed without them): "
        f"pyenv install --force {want} installs them"
    )


def gcc_fix(distro: Distro, major: int) -> str:
    """Where gcc ``major`` (``gcc-N``/``g++-N``, what the build runs for build.gcc) comes from here."""
    release = distro.release
    packages = (f"gcc-{major}", f"g++-{major}")
    if release is not None:
        if major in release.gcc:
            return f"{install(distro, *packages)} ({distro.name} packages gcc {_gcc_range(release.gcc)})"
        others = [r.name for r in releases().values() if major in r.gcc and r.key != release.key]
        elsewhere = (
            f"a distribution that packages it ({_listed(others)} do)"
            if others
            else "a build of gcc from source (no release in data/distros.toml packages it)"
        )
        return f"{distro.name} packages gcc {_gcc_range(release.gcc)} only, not {major}: gcc {major} from {elsewhere}"
    if distro.apt:
        universe = f" with universe enabled ({ADD_APT_REPOSITORY} universe)" if _ubuntu_like(distro) else ""
        return (
            f"apt-get install {' '.join(packages)} if {distro.name} packages them (apt-cache policy g++-{major} "
            f"says{universe}; data/distros.toml has no row for it)"
        )
    return f"gcc {major} as gcc-{major} and g++-{major}, from {distro.name}'s packages if it has them"
