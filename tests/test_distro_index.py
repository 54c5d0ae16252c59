"""data/distros.toml against the package indexes themselves (issue 44 item 7; integration: the network).

Each suite's index is fetched with apt into a scratch configuration (``apt-get update`` with ``Dir::`` options
in a temporary directory; nothing on this machine changes), and then:

* every package a hint names on a release (python, gcc, the bare host's whole check over the shipped recipes)
  has a candidate in ``apt-cache policy`` from what a minimal root enables (SUITE main: debootstrap's sources
  list) plus what the hint itself enables before it (Ubuntu's universe, SUITE-updates): the suggestion applied;
* the row says what the index has: its Pythons (pythonX.Y-venv and -dev), gcc majors (gcc-N and g++-N),
  python3, gcc, pyenv, and on Ubuntu which of the named packages need universe or -updates;
* each Debian pyenv package installs what ``[pyenv."VERSION"]`` says: its definitions, and its own
  ``pyenv latest -k X.Y`` taking a release exactly for those Pythons.

Debian forky and sid share one os-release file (``forky/sid``): the row holds what both indexes have. The
indexes of testing and unstable move; a failure here after one moved means the row needs reading again.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kit.imagekit import need, require
from test_distro import GCCS, OS_RELEASES, PYTHONS, installs, of

from torchkiln.host import distro, pyenv
from torchkiln.host.distro import Distro
from torchkiln.plan import preflight
from torchkiln.plan.jobs import GIB, Resources
from torchkiln.plan.make import make_plan
from torchkiln.recipe.loader import load_recipe, recipes_dir

pytestmark = pytest.mark.integration

DEBIAN = "http://deb.debian.org/debian"
DEBIAN_SECURITY = "http://deb.debian.org/debian-security"
UBUNTU = "http://archive.ubuntu.com/ubuntu"
DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
# os-release file -> the suites whose index its row describes
SUITES = {
    "debian-11": ("bullseye",),
    "debian-12": ("bookworm",),
    "debian-13": ("trixie",),
    "debian-forky": ("forky", "sid"),
    "ubuntu-22.04": ("jammy",),
    "ubuntu-24.04": ("noble",),
}
STABLE = {"bullseye", "bookworm", "trixie"}
BIG = Resources(cpus=4, memory_bytes=64 * GIB)
# "     500 http://deb.debian.org/debian trixie/main amd64 Packages": a candidate's origin
ORIGIN = re.compile(r"^\s+\d+\s+\S+\s+([a-z-]+)/([a-z]+)\s+\S+\s+Packages$")


@dataclass(frozen=True)
class Index:
    """One suite's amd64 index in a scratch apt configuration."""

    suite: str
    config: Path

    def origins(self, package: str) -> set[tuple[str, str]]:
        """(pocket, component) of every version of ``package`` apt-cache policy lists (exactly that name:
        apt-cache takes a name with a '.' as a pattern when no package has it)."""
        out = apt(self.config, "apt-cache", "policy", package)
        section = re.split(r"(?m)^(\S+):$", out)
        found: set[tuple[str, str]] = set()
        for name, body in zip(section[1::2], section[2::2], strict=True):
            if name == package:
                found |= {(m.group(1), m.group(2)) for line in body.splitlines() if (m := ORIGIN.match(line))}
        return found

    def candidate(self, package: str) -> str | None:
        out = apt(self.config, "apt-cache", "policy", package)
        m = re.search(rf"(?m)^{re.escape(package)}:\n\s+Installed: .*\n\s+Candidate: (\S+)", out)
        return m.group(1) if m and m.group(1) != "(none)" else None


def apt(config: Path, *argv: str) -> str:
    done = subprocess.run(
        argv, env={**os.environ, "APT_CONFIG": str(config)}, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, (argv, done.stderr[-2000:])
    return done.stdout


def configure(root: Path, suite: str, keyring: Path) -> Path:
    """An apt configuration of ``suite`` under ``root``: every pocket and component the rows are read from."""
    for sub in ("lists/partial", "cache/archives/partial", "etc/apt.conf.d", "etc/preferences.d"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "status").write_text("")
    if keyring.name.startswith("ubuntu"):
        lines = [f"deb {UBUNTU} {suite}{p} main universe" for p in ("", "-updates", "-security")]
    elif suite in STABLE:
        lines = [f"deb {DEBIAN} {suite} main", f"deb {DEBIAN} {suite}-updates main"]
        lines.append(f"deb {DEBIAN_SECURITY} {suite}-security main")
    else:
        lines = [f"deb {DEBIAN} {suite} main"]
    (root / "sources.list").write_text("\n".join(lines) + "\n")
    parts = root / "keyrings"
    parts.mkdir(exist_ok=True)
    shutil.copy(keyring, parts / keyring.name)
    config = root / "apt.conf"
    config.write_text(
        f'Dir::State "{root}";\nDir::State::Lists "{root}/lists";\nDir::State::status "{root}/status";\n'
        f'Dir::Cache "{root}/cache";\nDir::Etc "{root}/etc";\nDir::Etc::sourcelist "{root}/sources.list";\n'
        f'Dir::Etc::sourceparts "{root}/etc/sources.list.d";\nDir::Etc::Trusted "{parts / keyring.name}";\n'
        f'Dir::Etc::TrustedParts "{parts}";\nAPT::Architecture "amd64";\nAPT::Architectures {{ "amd64"; }};\n'
        # a mirror's snapshot of testing/unstable may be days past Valid-Until: the signature is still checked
        'Acquire::Languages "none";\nAcquire::Check-Valid-Until "false";\n'
    )
    return config


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Index]]:
    need("apt-get")
    need("dpkg-deb")
    require(DEBIAN_KEYRING.is_file(), f"no {DEBIAN_KEYRING} (apt-get install debian-archive-keyring)")
    base = tmp_path_factory.mktemp("indexes")
    out: dict[str, Index] = {}
    for suite in ("bullseye", "bookworm", "trixie", "forky", "sid"):
        config = configure(base / suite, suite, DEBIAN_KEYRING)
        done = subprocess.run(
            ["apt-get", "update"],
            env={**os.environ, "APT_CONFIG": str(config)},
            capture_output=True,
            text=True,
        )
        require(done.returncode == 0 and "Err:" not in done.stdout, f"deb.debian.org: {done.stdout[-500:]}")
        out[suite] = Index(suite, config)
    # Ubuntu's keyring, from Debian's ubuntu-keyring package (unpacked here, not installed)
    work = base / "ubuntu-keyring"
    work.mkdir()
    subprocess.run(["apt-get", "download", "ubuntu-keyring"], cwd=work, check=True, capture_output=True,
                   env={**os.environ, "APT_CONFIG": str(out["trixie"].config)})  # fmt: skip
    (deb,) = work.glob("ubuntu-keyring_*.deb")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(work / "root")], check=True)
    keyring = work / "root" / "usr" / "share" / "keyrings" / "ubuntu-archive-keyring.gpg"
    for suite in ("jammy", "noble"):
        config = configure(base / suite, suite, keyring)
        done = subprocess.run(
            ["apt-get", "update"],
            env={**os.environ, "APT_CONFIG": str(config)},
            capture_output=True,
            text=True,
        )
        if done.returncode == 0 and "Err:" not in done.stdout:
            out[suite] = Index(suite, config)
    yield out


def hints(name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """Every fix a host of ``name`` can be told: python and gcc for every Python and gcc, the headers of its
    own Pythons, and a bare host's whole check of each shipped recipe."""
    found = of(name)
    env = {"PATH": str(tmp_path / "empty"), "HOME": str(tmp_path)}
    fixes = [distro.python_fix(found, p, env) for p in PYTHONS] + [distro.gcc_fix(found, g) for g in GCCS]
    assert found.release is not None
    fixes += [
        distro.python_headers_fix(found, p, Path(f"/usr/include/python{p}"), f"/usr/bin/python{p}")
        for p in found.release.pythons
    ]
    monkeypatch.setattr(distro, "OS_RELEASE", (OS_RELEASES / name,))
    monkeypatch.setattr(distro, "DEBIAN_PYENV_PROFILE", tmp_path / "no-profile")
    for recipe in sorted(recipes_dir().glob("*.toml")):
        plan = make_plan(load_recipe(recipe), workdir=tmp_path / "w", dist=tmp_path / "d", resources=BIG)
        fixes += [f.fix for f in preflight.preflight(plan, env)]
    return fixes


def enabled_by(index: Index, before: str) -> set[tuple[str, str]]:
    """What a minimal root has (SUITE main) and what the hint's steps before an apt-get enable."""
    components = {"main"} | ({"universe"} if distro.ADD_APT_REPOSITORY + " universe" in before else set())
    pockets = {index.suite} | ({f"{index.suite}-updates"} if "--pocket updates" in before else set())
    return {(p, c) for p in pockets for c in components}


def rows() -> list[str]:
    return list(SUITES)


@pytest.mark.parametrize("name", rows())
def test_every_package_a_hint_names_installs_from_what_the_hint_enables(
    name: str, indexes: dict[str, Index], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    suites = [indexes[s] for s in SUITES[name] if s in indexes]
    if not suites:
        pytest.skip(f"{name}: its archive was not reachable (not a registry this workplace promises)")
    checked = 0
    for fix in hints(name, monkeypatch, tmp_path):
        for m in distro.APT_INSTALL.finditer(fix):
            for index in suites:
                enabled = enabled_by(index, fix[: m.start()])
                for package in m.group(1).split():
                    assert index.origins(package) & enabled, (index.suite, package, fix)
                    checked += 1
    assert checked


def named(found: Distro, fixes: list[str]) -> set[str]:
    release = found.release
    assert release is not None
    names = {f"python{p}-{k}" for p in release.pythons for k in ("venv", "dev")}
    names |= {f"{t}-{n}" for n in release.gcc for t in ("gcc", "g++")}
    return names | {p for fix in fixes for p in installs(fix)}


@pytest.mark.parametrize("name", rows())
def test_the_row_says_what_the_index_has(
    name: str, indexes: dict[str, Index], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    suites = [indexes[s] for s in SUITES[name] if s in indexes]
    if len(suites) != len(SUITES[name]):
        pytest.skip(f"{name}: its archive was not reachable (not a registry this workplace promises)")
    found = of(name)
    row = found.release
    assert row is not None

    def has(index: Index, package: str) -> bool:
        return bool(index.origins(package))

    pythons = [{p for p in PYTHONS if all(has(i, f"python{p}-{k}") for k in ("venv", "dev"))} for i in suites]
    assert set(row.pythons) == set.intersection(*pythons), pythons
    gccs = [{n for n in range(4, 30) if has(i, f"gcc-{n}") and has(i, f"g++-{n}")} for i in suites]
    assert set(row.gcc) == set.intersection(*gccs), gccs
    for index in suites:
        python3 = index.candidate("python3") or ""
        assert re.match(rf"{re.escape(row.python3)}\.", python3), (index.suite, python3)
        gcc = (index.candidate("gcc") or "").partition(":")[2]
        assert gcc.startswith(f"{row.gcc_default}."), (index.suite, gcc)
        packaged = index.candidate("pyenv")
        assert (packaged.split("-")[0] if packaged else None) == row.pyenv, (index.suite, packaged)
    if not name.startswith("ubuntu"):
        return
    (index,) = suites
    suite, updates = index.suite, f"{index.suite}-updates"
    # what the hints name here, and what the row lists (host_tools' ffmpeg line, which no shipped recipe needs)
    names = named(found, hints(name, monkeypatch, tmp_path)) | row.universe | row.updates
    origins = {p: index.origins(p) for p in names}
    universe = {
        p
        for p, o in origins.items()
        if (suite, "main") not in o and {(suite, "universe"), (updates, "universe")} & o
    }
    only_updates = {p for p, o in origins.items() if o and not any(pocket == suite for pocket, _ in o)}
    assert row.universe == universe and row.updates == only_updates, (universe, only_updates)


@pytest.mark.parametrize("suite", ["trixie", "forky", "sid"])
def test_debians_pyenv_installs_what_the_table_says(
    suite: str, indexes: dict[str, Index], tmp_path: Path
) -> None:
    """The package's definitions, and its own pyenv-latest (what `pyenv install X.Y` runs to pick one)
    taking a release for exactly the table's Pythons."""
    index = indexes[suite]
    version = (index.candidate("pyenv") or "").split("-")[0]
    release = pyenv.known()[version]
    packages = ["pyenv"] + (["pyenv-runtime"] if index.candidate("pyenv-runtime") else [])
    apt_download = ["apt-get", "download", *packages]
    subprocess.run(
        apt_download,
        cwd=tmp_path,
        check=True,
        capture_output=True,
        env={**os.environ, "APT_CONFIG": str(index.config)},
    )
    for deb in tmp_path.glob("*.deb"):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path / "root")], check=True)
    home = tmp_path / "root" / "usr" / "share" / "pyenv"
    names = [p.name for p in (home / pyenv.DEFINITIONS).iterdir()]
    assert {p for p in pyenv.releases_in(names) if p in PYTHONS or p == "3.9"} == release.pythons
    assert pyenv.installs(home) is not None and release.pythons <= pyenv.installs(home)  # type: ignore[operator]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYENV_ROOT": str(tmp_path / "pyenv-root")}
    for want in PYTHONS:
        done = subprocess.run(
            ["bash", str(home / "libexec" / "pyenv"), "latest", "-k", want],
            env=env,
            capture_output=True,
            text=True,
        )
        took = done.stdout.strip()
        assert (done.returncode == 0 and bool(pyenv.RELEASE.fullmatch(took))) == (want in release.pythons), (
            version,
            want,
            took,
            done.stderr,
        )
