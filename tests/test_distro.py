"""Fix hints are true on the machine that prints them (issue 37 item 2, issue 44 item 7): torchkiln.host.distro
reads /etc/os-release and data/distros.toml. Generated over the os-release files the distributions ship
(tests/data/os-release, SOURCES.md says where each comes from) x every Python torchkiln supports (data/compat.toml)
x every gcc a recipe may ask for: a known release's hint names only packages its index has (data/distros.toml,
read from the indexes; tests/test_distro_index.py reads them again), after the steps that enable universe and
-updates where Ubuntu needs them; pyenv only where its definitions install that Python; a release of an apt
distribution torchkiln does not know gets a conditional apt-get, never a claim, and a distribution without apt
gets no apt-get at all."""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from pathlib import Path

import pytest
from kit import ROOT

from torchkiln.errors import TorchkilnError
from torchkiln.host import distro, pyenv
from torchkiln.host.distro import Distro, read_distro
from torchkiln.images.spec import devel_args
from torchkiln.plan import preflight, preflight_python
from torchkiln.plan.jobs import GIB, Resources
from torchkiln.plan.make import make_plan
from torchkiln.recipe.compat import compat, image_problem, supported_pythons
from torchkiln.recipe.image_bases import DISTROS, devel_problem
from torchkiln.recipe.loader import load_recipe, recipes_dir

OS_RELEASES = ROOT / "tests" / "data" / "os-release"
FILES = sorted(p.name for p in OS_RELEASES.iterdir() if p.name != "SOURCES.md")
# What each file is: the table's row, and whether it is of the apt family.
EXPECTED = {
    "debian-11": ("debian:11", True),
    "debian-12": ("debian:12", True),
    "debian-13": ("debian:13", True),
    "debian-forky": ("debian:forky", True),  # Debian testing (and unstable): no VERSION_ID, its codename
    "ubuntu-22.04": ("ubuntu:22.04", True),
    "ubuntu-24.04": ("ubuntu:24.04", True),
    "ubuntu-25.10": (None, True),  # an interim release the table does not have
    "fedora-42": (None, False),
    "alpine-3.23": (None, False),
}
# Every Python a recipe may pin (each torch release's Pythons in data/compat.toml: 3.9 to 3.15, the free-threaded
# ones too), and every gcc major a recipe may ask for (build.gcc of the shipped recipes, and around them).
SUPPORTED = {p for release in compat()["torch"].values() for p in supported_pythons(release)}
PYTHONS = sorted(SUPPORTED, key=lambda v: (int(v[2:].rstrip("t")), v))
GCCS = sorted(
    {9, 10, 11, 12, 13, 14, 15}
    | {r.build.gcc for r in map(load_recipe, recipes_dir().glob("*.toml")) if r.build.gcc is not None}
)
BIG = Resources(cpus=4, memory_bytes=64 * GIB)
# apt-get install's arguments: up to a word of prose ("... if Debian packages them")
PACKAGE = r"(?!(?:if|or|where|then)\b)[a-z0-9][a-z0-9.+-]*"
APT_INSTALL = re.compile(rf"apt-get install ({PACKAGE}(?: {PACKAGE})*)")
# Packages every release of the table has (Debian's names; each in the indexes data/distros.toml names).
BASE_PACKAGES = {"g++", "gcc", "ccache", "git", "libopenblas-dev", "libpng-dev", "libjpeg-dev", "libwebp-dev"}
# What enables Ubuntu's universe and -updates (software-properties-common is in main of every Ubuntu row).
ENABLER = "software-properties-common"
UNIVERSE = "add-apt-repository -y universe"
UPDATES = "add-apt-repository -y --pocket updates"


@pytest.fixture(autouse=True)
def no_debian_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's /etc/profile.d/pyenv.sh is not the one of the distribution under test."""
    monkeypatch.setattr(distro, "DEBIAN_PYENV_PROFILE", tmp_path / "no-profile.d" / "pyenv.sh")


def of(name: str) -> Distro:
    return read_distro([OS_RELEASES / name])


def true_on(found: Distro, fix: str) -> None:
    """Every source ``fix`` names provides the thing on ``found``: each apt-get install names packages its
    index has, after the steps that enable their component and pocket (software-properties-common before
    add-apt-repository); pyenv's install only where that pyenv's definitions have the Python."""
    release = found.release
    assert release is not None
    for m in APT_INSTALL.finditer(fix):
        packages = m.group(1).split()
        assert set(packages) <= allowed(found), fix
        before = fix[: m.start()]
        if set(packages) & release.universe:
            assert UNIVERSE in before, fix
        if set(packages) & release.updates:
            assert UPDATES in before and f"{release.codename}-updates" in before, fix
    for at in (i for i in range(len(fix)) if fix.startswith("add-apt-repository", i)):
        assert f"apt-get install {ENABLER}" in fix[:at], fix
    assert ("universe" in fix) == bool(set(installs(fix)) & release.universe) or "deadsnakes" in fix, fix


def test_every_file_is_known_to_the_test() -> None:
    assert sorted(EXPECTED) == FILES


@pytest.mark.parametrize("name", FILES)
def test_each_file_is_identified_as_what_it_is(name: str) -> None:
    found = of(name)
    key, apt = EXPECTED[name]
    assert (found.release.key if found.release else None, found.apt) == (key, apt)
    assert found.source == str(OS_RELEASES / name)
    if found.release is None:  # named as the file names itself, never as a release it is not
        assert found.name == found.fields["PRETTY_NAME"]


def test_os_release_values_are_read_as_a_shell_reads_them() -> None:
    fields = distro.parse_os_release(
        'A="x y"\nB=plain\n# C=comment\nD=\'single quoted\'\nE="esc\\"aped"\n  F = bad\nG="unclosed\nH=\n'
    )
    assert fields == {"A": "x y", "B": "plain", "D": "single quoted", "E": 'esc"aped', "H": ""}
    assert distro.parse_os_release((OS_RELEASES / "debian-13").read_text())["VERSION_CODENAME"] == "trixie"


def test_no_os_release_is_an_unknown_distribution(tmp_path: Path) -> None:
    found = read_distro([tmp_path / "etc-os-release", tmp_path / "usr-lib-os-release"])
    assert (found.release, found.apt, found.source) == (None, False, "")
    assert "apt" not in distro.python_fix(found, "3.12", {"PATH": ""})
    # /usr/lib/os-release when /etc has none (os-release(5))
    (tmp_path / "usr-lib-os-release").write_text((OS_RELEASES / "debian-13").read_text())
    assert read_distro([tmp_path / "etc-os-release", tmp_path / "usr-lib-os-release"]).release is not None


def test_a_derivative_naming_its_ubuntu_base_gets_that_base_under_its_own_name(tmp_path: Path) -> None:
    """A constructed case: Ubuntu 24.04's file as a derivative rewrites it (Linux Mint 22 keeps
    UBUNTU_CODENAME=noble and ID_LIKE "ubuntu debian")."""
    text = (OS_RELEASES / "ubuntu-24.04").read_text()
    text = re.sub(r"(?m)^ID=ubuntu$", "ID=linuxmint", text)
    text = re.sub(r"(?m)^ID_LIKE=debian$", 'ID_LIKE="ubuntu debian"', text)
    text = re.sub(r"(?m)^PRETTY_NAME=.*$", 'PRETTY_NAME="Linux Mint 22"', text)
    (tmp_path / "os-release").write_text(text)
    found = read_distro([tmp_path / "os-release"])
    assert found.release is not None and found.release.key == "ubuntu:24.04"
    assert found.name == "Linux Mint 22 (on Ubuntu 24.04 (noble)'s packages)"


def installs(text: str) -> list[str]:
    """Every package an ``apt-get install`` of ``text`` names."""
    return [p for m in APT_INSTALL.finditer(text) for p in m.group(1).split()]


def allowed(found: Distro) -> set[str]:
    """The packages a hint may tell ``found`` to install: what its index has, by data/distros.toml."""
    release = found.release
    assert release is not None
    names = set(BASE_PACKAGES)
    names |= {f"python{p}-{kind}" for p in release.pythons for kind in ("venv", "dev")}
    names |= {f"{tool}-{n}" for n in release.gcc for tool in ("gcc", "g++")}
    names |= {ENABLER} if release.universe or release.updates or release.ppa else set()
    return names | ({"pyenv"} if release.pyenv else set())


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("want", PYTHONS)
def test_python_hints_name_what_the_release_packages(name: str, want: str) -> None:
    found = of(name)
    fix = distro.python_fix(found, want, {"PATH": "", "HOME": "/home/u"})
    if not found.apt:
        assert "apt" not in fix and f"pyenv install {want}" in fix and found.name in fix
    elif found.release is None:  # never a claim, only a conditional and how to find out
        named = [p for p in installs(fix) if p != ENABLER]
        assert all(f" if {found.name} packages" in fix for _ in named), fix
        # free-threaded: no python3.13t-* packages anywhere, so no apt-get to try
        assert ("apt-cache policy" in fix) == (not want.endswith("t")) == bool(named), fix
        # Ubuntu keeps pythonX.Y-venv in universe: how to enable it before apt-cache policy can say
        assert (UNIVERSE in fix) == (found.id == "ubuntu" and bool(named)), fix
    else:
        true_on(found, fix)
        packaged = want in found.release.pythons
        assert (f"apt-get install python{want}-venv python{want}-dev" in fix) == packaged, fix
        assert (f"not {want}" in fix and f"pyenv install {want}" in fix) == (not packaged), fix
        assert f"packages Python {found.release.pythons[0]}" in fix
        ppa = not packaged and found.id == "ubuntu" and not want.endswith("t")
        assert ("deadsnakes" in fix) == ppa, fix


@pytest.mark.parametrize("name", [n for n in FILES if EXPECTED[n][0]])
@pytest.mark.parametrize("want", PYTHONS)
def test_pyenv_is_offered_only_where_its_definitions_install_the_python(name: str, want: str) -> None:
    """Not installed: the release's pyenv package where its version installs ``want`` (Debian 13's 2.5.4
    has no 3.14), else upstream's, said to be conditional where upstream's newest read has no release of it."""
    found = of(name)
    steps = distro.pyenv_steps(found, want, {"PATH": "", "HOME": "/home/u"})
    release = found.release
    assert release is not None
    packaged = pyenv.known()[release.pyenv] if release.pyenv else None
    assert ("apt-get install pyenv" in steps) == (packaged is not None and want in packaged.pythons), steps
    if "apt-get install pyenv" not in steps:
        assert "github.com/pyenv/pyenv#installation" in steps, steps
        if packaged is not None:
            assert f"pyenv {packaged.version} has no definition of a Python {want} release" in steps, steps
    upstream = pyenv.upstream()
    if "apt-get install pyenv" not in steps and want not in upstream.pythons:
        assert f"where its definitions have a Python {want} release by now: pyenv {upstream.version}" in steps


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("major", GCCS)
def test_gcc_hints_name_what_the_release_packages(name: str, major: int) -> None:
    found = of(name)
    fix = distro.gcc_fix(found, major)
    if not found.apt:
        assert "apt" not in fix and f"gcc-{major}" in fix
    elif found.release is None:
        assert [p for p in installs(fix) if p != ENABLER] == [f"gcc-{major}", f"g++-{major}"]
        assert f"if {found.name} packages them" in fix
    else:
        true_on(found, fix)
        packaged = major in found.release.gcc
        assert bool(installs(fix)) == packaged, fix
        if not packaged:  # where it is packaged, from the table (or from source)
            others = [r.name for r in distro.releases().values() if major in r.gcc]
            assert all(o in fix for o in others) and (others or "from source" in fix), fix


def plan_of(tmp_path: Path, recipe: str) -> object:
    return make_plan(
        load_recipe(recipes_dir() / recipe), workdir=tmp_path / "w", dist=tmp_path / "d", resources=BIG
    )


@pytest.mark.parametrize("name", FILES)
def test_every_hint_of_a_bare_host_is_true_on_each_distribution(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole check on a host with nothing (no compilers, no ccache, no git, no Python of the recipe),
    as each distribution: every apt-get names packages the release has (or is conditional, or absent)."""
    monkeypatch.setattr(distro, "OS_RELEASE", (OS_RELEASES / name,))
    found = of(name)
    for recipe in ("torch-2.13-cpu-py311.toml", "torch-2.13-cu130-py312.toml", "torch-2.6-cu124-py310.toml"):
        plan = make_plan(
            load_recipe(recipes_dir() / recipe), workdir=tmp_path / "w", dist=tmp_path / "d", resources=BIG
        )
        findings = preflight.preflight(plan, {"PATH": str(tmp_path / "empty"), "HOME": str(tmp_path)})
        assert {"python", "cxx", "cc", "cache", "git"} <= {f.check for f in findings}
        for finding in findings:
            if not found.apt:
                assert "apt" not in finding.fix, finding
            elif found.release is None:
                versioned = [p for p in installs(finding.fix) if re.search(r"\d", p)]
                assert not versioned or " if " in finding.fix, finding
            else:
                true_on(found, finding.fix)


def test_the_recipe_for_the_systems_python3_is_offered_where_the_release_supports_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Debian 13's python3 is 3.13: the CPU recipe (3.11) is offered made for it; Debian 11's 3.9 is
    outside torch 2.13's Pythons, so nothing is offered there."""
    plan = make_plan(
        load_recipe(recipes_dir() / "torch-2.13-cpu-py311.toml"), workdir=tmp_path / "w", dist=tmp_path / "d",
        resources=BIG,
    )  # fmt: skip
    for name, offered in (
        ("debian-13", True),
        ("ubuntu-24.04", True),
        ("debian-11", False),
        ("fedora-42", False),
    ):
        monkeypatch.setattr(distro, "OS_RELEASE", (OS_RELEASES / name,))
        (fix,) = [f.fix for f in preflight.preflight(plan, {"PATH": ""}) if f.check == "python"]
        assert ("torchkiln recipe new " in fix and "--python python3" in fix) == offered, (name, fix)


# ------------------------------------------------------------------------------------------------------
# pyenv: where it stands on this machine.
# ------------------------------------------------------------------------------------------------------


def debian_pyenv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Debian's pyenv package's layout (pyenv 2.5.4-1): /usr/bin/pyenv -> ../share/pyenv/libexec/pyenv, under
    ``tmp_path`` (the package's root is DEBIAN_PYENV_ROOT there)."""
    share = tmp_path / "usr" / "share" / "pyenv"
    (share / "libexec").mkdir(parents=True)
    real = share / "libexec" / "pyenv"
    real.write_text("#!/bin/sh\n")
    real.chmod(real.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "usr" / "bin").mkdir()
    (tmp_path / "usr" / "bin" / "pyenv").symlink_to("../share/pyenv/libexec/pyenv")
    monkeypatch.setattr(distro, "DEBIAN_PYENV_ROOT", str(share))
    return share


def test_pyenv_from_debians_package_gets_a_root_the_user_can_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trixie = of("debian-13")
    # not installed: Debian 13 packages it, and its profile script will set its own root
    steps = distro.pyenv_steps(trixie, "3.11", {"PATH": str(tmp_path / "nothing"), "HOME": "/home/u"})
    assert steps.startswith("pyenv: apt-get install pyenv, then export PYENV_ROOT=$HOME/.pyenv (Debian's")
    assert 'export PATH="$HOME/.pyenv/shims:$PATH"' in steps and "pyenv global system 3.11" in steps
    # not packaged by Debian 12: pyenv's own installer, and no PYENV_ROOT to change
    steps = distro.pyenv_steps(of("debian-12"), "3.12", {"PATH": str(tmp_path / "nothing")})
    assert "github.com/pyenv/pyenv#installation" in steps and "PYENV_ROOT" not in steps and "apt" not in steps
    # Debian's package installed, a login shell (PYENV_ROOT=/usr/share/pyenv): the user's own root instead
    share = debian_pyenv(tmp_path, monkeypatch)
    env = {"PATH": str(tmp_path / "usr" / "bin"), "PYENV_ROOT": str(share), "HOME": "/home/u"}
    steps = distro.pyenv_steps(trixie, "3.11", env)
    assert "apt-get install pyenv" not in steps and "export PYENV_ROOT=$HOME/.pyenv" in steps
    assert steps.index("export PYENV_ROOT") < steps.index("pyenv install 3.11") < steps.index("shims")
    # the user chose a root of their own: kept, and its shims put first
    own = tmp_path / "own-pyenv"
    steps = distro.pyenv_steps(trixie, "3.11", {**env, "PYENV_ROOT": str(own)})
    assert "export PYENV_ROOT" not in steps and f'export PATH="{own}/shims:$PATH"' in steps


def test_a_version_pyenv_has_but_does_not_select_is_selected_not_compiled_again(tmp_path: Path) -> None:
    """pyenv's shims on PATH (pyenv itself not: a git install's bin/ left off PATH), 3.12.1 in versions/ but
    not selected: its shim python3.12 does not run, and the fix is `pyenv global`, not another compile."""
    root = tmp_path / ".pyenv"
    for sub in ("bin", "shims", "versions/3.12.1", "versions/3.13.0t"):
        (root / sub).mkdir(parents=True)
    (root / "bin" / "pyenv").write_text("#!/bin/sh\n")
    env = {"PATH": f"{root / 'shims'}:/usr/bin", "HOME": str(tmp_path)}
    steps = distro.pyenv_steps(of("debian-12"), "3.12", env)
    assert steps == (
        f"pyenv: pyenv global system 3.12 ({root}/versions/3.12.1 is installed, not selected) (python3 stays the "
        "system's, python3.12 runs 3.12)"
    )
    assert f"({root}/versions/3.13.0t is installed" in distro.pyenv_steps(of("debian-12"), "3.13t", env)
    assert "pyenv install 3.13 " in distro.pyenv_steps(of("debian-12"), "3.13", env)  # 3.13t is not 3.13


def test_a_pyenv_root_the_user_cannot_write_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """os.access is the kernel's answer (root may write anywhere, so it is faked here at that boundary)."""
    locked = tmp_path / "locked"
    monkeypatch.setattr(distro.os, "access", lambda path, mode: Path(path) != locked)
    locked.mkdir()
    steps = distro.pyenv_steps(of("ubuntu-24.04"), "3.11", {"PATH": "", "PYENV_ROOT": str(locked)})
    assert f"export PYENV_ROOT=$HOME/.pyenv (this user cannot write PYENV_ROOT={locked})" in steps
    assert os.access(tmp_path, os.W_OK)


# ------------------------------------------------------------------------------------------------------
# The table against the rest of torchkiln's facts.
# ------------------------------------------------------------------------------------------------------


def test_the_image_bases_agree_with_the_table() -> None:
    """images.spec.DISTROS (the bases of the devel image) says each base's python3 and gcc majors it uses:
    the table of what the release packages agrees (its python3, a subset of its gcc)."""
    for key, base in DISTROS.items():
        row = distro.releases()[re.sub(r"^([a-z]+)(.*)$", r"\1:\2", key)]
        assert base.python == row.python3 and set(base.gcc) <= set(row.gcc), (key, base, row)


def test_every_row_is_whole_and_its_python3_among_its_pythons() -> None:
    for row in distro.releases().values():
        assert row.python3 in row.pythons and set(row.pythons) <= SUPPORTED | {"3.9"}
        assert row.gcc_default in row.gcc and list(row.gcc) == sorted(row.gcc)
        assert set(row.python_notes) <= set(row.pythons)
        assert row.pyenv is None or row.pyenv in pyenv.known()
        # universe and -updates name packages the hints name, and only on Ubuntu
        named = {f"python{p}-{k}" for p in row.pythons for k in ("venv", "dev")}
        named |= {f"{t}-{n}" for n in row.gcc for t in ("gcc", "g++")}
        named |= BASE_PACKAGES | {"ffmpeg", "libavcodec-dev", "libavformat-dev", "libavutil-dev"}
        named |= {"libswresample-dev", "libswscale-dev"}
        assert row.universe | row.updates <= named, row.key
        assert not (row.universe or row.updates) or row.key.startswith("ubuntu:"), row.key
    for release in pyenv.known().values():
        assert release.pythons <= SUPPORTED | {"3.9"}, release
    assert sum(r.upstream for r in pyenv.known().values()) == 1


# ------------------------------------------------------------------------------------------------------
# A pyenv on this machine: what its own definitions install.
# ------------------------------------------------------------------------------------------------------

# Definition names as pyenv 2.5.4 (Debian 13's package) ships them around 3.13 and 3.14 (share/python-build/).
DEFINITIONS_2_5_4 = (
    "3.13.1",
    "3.13.1t",
    "3.13.2",
    "3.13.2t",
    "3.13-dev",
    "3.14-dev",
    "3.14.0a6",
    "3.14.0a6t",
)


def pyenv_home(home: Path, names: tuple[str, ...] = DEFINITIONS_2_5_4) -> Path:
    """A pyenv's own directory as a git clone lays it out: bin/pyenv -> ../libexec/pyenv, and python-build's
    definitions (empty files named as pyenv names them)."""
    (home / "libexec").mkdir(parents=True)
    (home / "libexec" / "pyenv").write_text("#!/bin/sh\n")
    (home / "libexec" / "pyenv").chmod(0o755)
    (home / "bin").mkdir()
    (home / "bin" / "pyenv").symlink_to("../libexec/pyenv")
    definitions = home / pyenv.DEFINITIONS
    definitions.mkdir(parents=True)
    for name in names:
        (definitions / name).write_text("")
    return home


def test_a_release_is_a_definition_pyenv_install_takes() -> None:
    """pyenv-latest's choice: -dev, -src and a/b/rc prereleases are no release (3.14.0a6t neither)."""
    assert pyenv.releases_in(DEFINITIONS_2_5_4) == {"3.13", "3.13t"}
    assert pyenv.releases_in(["3.15.0b2", "3.15.0b2t", "3.14.5", "3.14.5t", "3.14.5rc1", "3.16-dev"]) == {
        "3.14",
        "3.14t",
    }


def test_an_installed_pyenv_without_the_python_is_replaced_or_updated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Debian 13's pyenv installed (2.5.4: no 3.14 release): upstream's instead, before Debian's on PATH;
    a git clone without it: updated. Where the definitions have it: that pyenv, nothing else installed."""
    share = pyenv_home(tmp_path / "usr" / "share" / "pyenv")
    (tmp_path / "usr" / "bin").mkdir()
    (tmp_path / "usr" / "bin" / "pyenv").symlink_to("../share/pyenv/libexec/pyenv")
    monkeypatch.setattr(distro, "DEBIAN_PYENV_ROOT", str(share))
    env = {"PATH": str(tmp_path / "usr" / "bin"), "HOME": "/home/u"}
    steps = distro.pyenv_steps(of("debian-13"), "3.14", env)
    assert (
        f"install pyenv from upstream (https://github.com/pyenv/pyenv#installation: Debian's package, the pyenv in {share} has no definition of a Python 3.14 release)"
        in steps
    )
    assert (
        steps.index("from upstream")
        < steps.index('export PATH="$HOME/.pyenv/bin:$PATH"')
        < steps.index("pyenv install 3.14")
    )
    assert "apt-get" not in steps
    steps = distro.pyenv_steps(of("debian-13"), "3.13t", env)  # 2.5.4 has 3.13.2t: this pyenv does
    assert "install pyenv" not in steps and "pyenv install 3.13t" in steps
    clone = pyenv_home(tmp_path / "clone")
    steps = distro.pyenv_steps(of("debian-12"), "3.14", {"PATH": str(clone / "bin"), "HOME": "/home/u"})
    assert steps.startswith(
        f"pyenv: update pyenv (the pyenv in {clone} has no definition of a Python 3.14 release: git -C {clone} pull"
    )


def test_debians_profile_script_decides_the_root_not_the_package_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyenv 2.5.4-1 (Debian 13) sets PYENV_ROOT=/usr/share/pyenv in /etc/profile.d/pyenv.sh; 2.7.1-1 (forky)
    has no such script: pyenv's own default root, nothing to export."""
    forky = distro.pyenv_steps(of("debian-forky"), "3.12", {"PATH": "", "HOME": "/home/u"})
    assert (
        forky.startswith("pyenv: apt-get install pyenv, then pyenv install 3.12")
        and "PYENV_ROOT" not in forky
    )
    profile = tmp_path / "profile.d" / "pyenv.sh"
    profile.parent.mkdir()
    profile.write_text('export PYENV_ROOT="/usr/share/pyenv"\n')  # 2.5.4-1's, on this machine
    monkeypatch.setattr(distro, "DEBIAN_PYENV_PROFILE", profile)
    assert "export PYENV_ROOT=$HOME/.pyenv (Debian's" in distro.pyenv_steps(
        of("debian-12"), "3.12", {"PATH": ""}
    )


# ------------------------------------------------------------------------------------------------------
# The devel image: offered only for a recipe it builds.
# ------------------------------------------------------------------------------------------------------

SHIPPED = sorted(recipes_dir().glob("*.toml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_the_devel_image_is_offered_exactly_where_the_images_command_makes_it(
    path: Path, tmp_path: Path
) -> None:
    """Every shipped recipe made for every Python torchkiln supports and every gcc: the python and compiler
    fixes offer the devel image iff recipe.image_bases.devel_problem finds nothing, which is iff
    the images command takes it (compat.image_problem, then images.spec.devel_args)."""
    source = load_recipe(path)
    for want in PYTHONS:
        for gcc in [None, *GCCS]:
            recipe = dataclasses.replace(
                source, python=want, pythons=(), build=dataclasses.replace(source.build, gcc=gcc)
            )
            problem = devel_problem(recipe)
            try:  # what `torchkiln images --target devel` does: image_problem refuses, else devel_args
                built = image_problem(recipe, "devel") is None and bool(devel_args(recipe))
            except TorchkilnError:
                built = False
            assert (problem is None) == built, (recipe.name, want, gcc, problem)
            plan = make_plan(recipe, workdir=tmp_path / "w", dist=tmp_path / "d", resources=BIG)
            offered = "--target devel" in preflight_python._python_fix(
                plan, want, preflight.Host({"PATH": ""}, distro=of("debian-13"))
            )
            assert offered == built, (recipe.name, want, gcc)
    several = dataclasses.replace(
        source, pythons=(source.python, "3.13" if source.python != "3.13" else "3.12")
    )
    assert devel_problem(several) is not None  # the image installs one Python: a second is never there
    if devel_problem(source) is None:
        assert "the devel image installs one Python" in str(devel_problem(several))
