"""Preflight's answers kept by what they depend on (issue 38 items 1-2): a check whose key is unchanged is
not run again, every change a key names runs it again, a failed check is never kept, a script is never
trusted, free disk is asked on every build, a failed build gets the full diagnosis, ``torchkiln check``
always asks. Real compilers, a real Python, real git; the checks are counted by wrapping them (each still
runs whole)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kit import ROOT
from kit.dists import tiny_wheel
from kit.imagekit import require

from torchkiln.cli import main
from torchkiln.plan import preflight, preflight_findings
from torchkiln.plan.jobs import GIB, Resources
from torchkiln.plan.make import make_plan
from torchkiln.plan.model import Plan
from torchkiln.plan.preflight_records import KEYS, diagnose, remembered_preflight
from torchkiln.plan.records import Records
from torchkiln.recipe.loader import load_recipe

RECIPE = ROOT / "tests" / "data" / "ext-cpu-test.toml"  # torchvision alone: no BLAS, one Python
RUNNING = f"{sys.version_info.major}.{sys.version_info.minor}"  # the recipe's Python, made this one's
BIG = Resources(cpus=4, memory_bytes=64 * GIB)
KEYED = frozenset(KEYS)
KEPT = KEYED - {"git"}  # git: asked only when a source is fetched (here none is: a pass, trivially kept)


WRAPPER = r"""
#include <stdio.h>
#include <unistd.h>
/* A compiler driver of its own file: the host's gcc or g++ behind an exec (a copy of gcc's own driver
   would not find cc1plus), failing while BROKEN exists: a compiler that breaks without its file changing,
   what no key can see. */
int main(int argc, char **argv) {
  if (access(BROKEN, F_OK) == 0) {
    fprintf(stderr, "brittle-c++: fatal error: its runtime went away\\n");
    return 1;
  }
  argv[0] = REAL;
  execv(REAL, argv);
  return 127;
}
"""


def compiler_file(path: Path, real: str, broken: Path | None = None) -> Path:
    """``path``: a real ELF program that runs the host's ``real`` (gcc, g++), failing while ``broken``
    exists."""
    found = shutil.which(real)
    require(found is not None and shutil.which("cc") is not None, f"{real} is not installed")
    source = path.with_name(path.name + ".c")
    source.write_text(WRAPPER)
    flag = broken or path.with_name(path.name + ".never")
    subprocess.run(
        ["cc", f'-DBROKEN="{flag}"', f'-DREAL="{found}"', str(source), "-o", str(path)], check=True
    )
    return path


@pytest.fixture(scope="module")
def drivers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cc and c++ drivers of their own, compiled once for the module (each test copies them)."""
    made = tmp_path_factory.mktemp("drivers")
    compiler_file(made / "cc", "gcc")
    compiler_file(made / "c++", "g++")
    return made


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, drivers: Path) -> dict[str, Path]:
    """A PATH whose first directory holds this interpreter as python3.X (the recipe's, made this one's) and
    compiler drivers of their own (real ELF files: their identities are what the keys name) as cc and c++,
    then the system's directories (as, ld)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / f"python{RUNNING}").symlink_to(os.path.realpath(sys.executable))
    for name in ("cc", "c++"):
        shutil.copy2(drivers / name, bindir / name)
    for name in ("CC", "CXX", "CPATH", "LIBRARY_PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "TMPDIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    dist = tmp_path / "dist"
    dist.mkdir()
    tiny_wheel(dist, "torch", "2.13.0+cpu")  # the recipe's own torch: what --only torchvision builds against
    recipe = tmp_path / "recipe.toml"  # the recipe file for the CLI, made this Python's as plan_of makes it
    recipe.write_text(
        RECIPE.read_text().replace('[python]\nversion = "3.11"', f'[python]\nversion = "{RUNNING}"')
    )
    assert load_recipe(recipe).python == RUNNING
    return {
        "bin": bindir,
        "dist": dist,
        "work": tmp_path / "work",
        "store": tmp_path / "store",
        "recipe": recipe,
    }


def plan_of(host: dict[str, Path], **recipe_changes: object) -> Plan:
    recipe = dataclasses.replace(load_recipe(RECIPE), python=RUNNING)
    if recipe_changes:
        recipe = dataclasses.replace(recipe, build=dataclasses.replace(recipe.build, **recipe_changes))
    return make_plan(
        recipe, workdir=host["work"], dist=host["dist"], only="torchvision", resources=BIG, jobs=1
    )


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the checks that ran, in order (each wrapped, still run whole)."""
    ran: list[str] = []

    def wrap(name: str, check: preflight_findings.HostCheck) -> preflight_findings.HostCheck:
        def counting(plan: Plan, host: preflight_findings.Host) -> Iterator[preflight_findings.Finding]:
            ran.append(name)
            yield from check(plan, host)

        return counting

    monkeypatch.setattr(preflight, "CHECKS", tuple((n, wrap(n, c)) for n, c in preflight.CHECKS))
    yield ran


def run(
    plan: Plan, records: Records, counted: list[str]
) -> tuple[set[str], list[preflight_findings.Finding]]:
    counted.clear()
    outcome = remembered_preflight(plan, records)
    assert set(outcome.remembered) | set(counted) == {n for n, _ in preflight.CHECKS}
    return set(counted), outcome.findings


def test_an_unchanged_host_is_not_asked_again_and_free_disk_always_is(host, counted) -> None:
    records = Records.for_build(host["work"], host["store"])
    plan = plan_of(host)
    ran, findings = run(plan, records, counted)
    assert findings == [] and KEYED <= ran
    again, findings = run(plan, records, counted)
    assert findings == []
    assert again & KEYED == set(), "nothing a kept check depends on changed"
    assert {"disk", "memory", "torch-wheel", "source", "platform"} <= again, "the cheap checks every time"
    # a fresh work directory on the same machine reads the environment store's records
    fresh = Records.for_build(host["work"].with_name("work-2"), host["store"])
    other, _ = run(dataclasses.replace(plan), fresh, counted)
    assert other & KEYED == set()
    copied = {p.name.split("-")[1] for p in (host["work"].with_name("work-2") / "records").iterdir()}
    assert copied == {"toolchain", "compiler", "python", "nvcc", "git"}, "and keeps its own copy"


def replace_binary(host: dict[str, Path], name: str) -> None:
    """A new compiler at the same path (what a package upgrade does): a new file, the same bytes."""
    path = host["bin"] / name
    fresh = path.with_name(name + ".new")
    shutil.copy2(path, fresh)
    os.replace(fresh, path)


def alias(host: dict[str, Path], monkeypatch: pytest.MonkeyPatch, variable: str, name: str) -> None:
    """``$VARIABLE`` naming another real compiler file (a copy of the one the default name is)."""
    target = host["bin"] / f"{name}-other"
    shutil.copy2(host["bin"] / name, target)
    monkeypatch.setenv(variable, str(target))


COMPILING = {"toolchain", "compiler"}
# (what changes, how, the kept checks it must run again): each a thing a key names. The checks not listed
# stay read back: a change a check does not depend on never runs it.
CHANGES: list[tuple[str, Callable[[dict[str, Path], pytest.MonkeyPatch], object], set[str]]] = [
    ("the C compiler's file replaced", lambda h, m: replace_binary(h, "cc"), COMPILING),
    ("the C++ compiler's file replaced", lambda h, m: replace_binary(h, "c++"), {"toolchain"}),
    ("$CC names another compiler", lambda h, m: alias(h, m, "CC", "cc"), COMPILING),
    ("$CXX names another compiler", lambda h, m: alias(h, m, "CXX", "c++"), COMPILING),
    ("CPATH set", lambda h, m: m.setenv("CPATH", "/nonexistent/include"), COMPILING),
    ("LIBRARY_PATH set", lambda h, m: m.setenv("LIBRARY_PATH", "/nonexistent/lib"), COMPILING),
    ("GCC_COLORS set", lambda h, m: m.setenv("GCC_COLORS", ""), COMPILING),
    ("CCACHE_DIR set", lambda h, m: m.setenv("CCACHE_DIR", "/tmp/kiln-ccache"), COMPILING),
    ("PYTHONPATH set", lambda h, m: m.setenv("PYTHONPATH", "/nonexistent"), {"python", "python-headers"}),
    ("PYTHONHOME set", lambda h, m: m.setenv("PYTHONHOME", sys.base_prefix), {"python", "python-headers"}),
    ("LD_LIBRARY_PATH set", lambda h, m: m.setenv("LD_LIBRARY_PATH", "/nonexistent"), KEPT),
    ("TMPDIR set", lambda h, m: m.setenv("TMPDIR", str(h["work"].parent)), KEPT),
    ("PATH changed", lambda h, m: m.setenv("PATH", f"{h['bin']}:/usr/local/bin:/usr/bin:/bin"), KEPT),
    ("an unrelated variable", lambda h, m: m.setenv("KILN_UNRELATED", "1"), set()),
    ("the caller's cwd", lambda h, m: m.chdir(h["work"].parent), set()),
]


@pytest.mark.parametrize(("what", "change", "rerun"), CHANGES, ids=[c[0] for c in CHANGES])
def test_a_changed_key_runs_its_checks_again_and_only_those(
    host, counted, monkeypatch: pytest.MonkeyPatch, what: str, change, rerun: set[str]
) -> None:
    records = Records.for_build(host["work"], None)
    run(plan_of(host), records, counted)
    change(host, monkeypatch)
    ran, findings = run(plan_of(host), records, counted)
    assert ran & KEPT == rerun, what
    assert findings == [], what


def test_a_new_answer_is_kept(host, counted, monkeypatch: pytest.MonkeyPatch) -> None:
    records = Records.for_build(host["work"], None)
    run(plan_of(host), records, counted)
    replace_binary(host, "c++")
    assert "toolchain" in run(plan_of(host), records, counted)[0]
    assert run(plan_of(host), records, counted)[0] & KEYED == set()


def test_the_recipe_fields_a_check_reads_are_in_its_key(host, counted) -> None:
    records = Records.for_build(host["work"], None)
    run(plan_of(host), records, counted)
    gcc = int(subprocess.run(["cc", "-dumpversion"], capture_output=True, text=True).stdout.split(".")[0])
    ran, _ = run(plan_of(host, gcc=gcc), records, counted)
    # build.gcc: its version rule; and the build then runs gcc-N, so the compile is asked again too
    assert {"compiler", "toolchain"} <= ran
    assert not {"python", "python-headers"} & ran


def test_a_check_that_failed_is_asked_again(host, counted, monkeypatch: pytest.MonkeyPatch) -> None:
    records = Records.for_build(host["work"], None)
    monkeypatch.setenv("CXX", str(host["bin"] / "no-such-compiler"))
    for _ in range(2):
        ran, findings = run(plan_of(host), records, counted)
        assert "toolchain" in ran and "cxx" in {f.check for f in findings}
    assert not host["work"].exists(), "a refused build leaves nothing behind, records included"


def test_a_script_is_never_trusted(host, counted, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrapper script (a pyenv shim, ccache's or a distribution's) runs what its own file does not say:
    the checks invoking one are asked every time."""
    wrapper = host["bin"] / "cxx-wrapper"
    wrapper.write_text(f'#!/bin/sh\nexec {host["bin"] / "c++"} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    records = Records.for_build(host["work"], None)
    for _ in range(2):
        ran, findings = run(plan_of(host), records, counted)
        assert "toolchain" in ran and findings == []


def brittle_compiler(host: dict[str, Path]) -> tuple[Path, Path]:
    """A C++ compiler that fails while a flag file exists, its own file unchanged."""
    flag = host["bin"] / "broken"
    return compiler_file(host["bin"] / "brittle-c++", "g++", flag), flag


def test_a_failed_build_gets_the_full_diagnosis(
    host, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The compiler breaks after its pass was kept, in a way its key does not show: the next build reads the
    pass back and starts; when a step fails, every check is asked afresh and the error names the broken
    compiler; the pass is forgotten, so the build after that is refused at preflight. The step that fails
    here is the fetch of the recipe's (unreachable) torchvision repository: the first step, in a second."""
    exe, flag = brittle_compiler(host)
    monkeypatch.setenv("CXX", str(exe))
    argv = [
        "build",
        str(host["recipe"]),
        "--only",
        "torchvision",
        "--jobs",
        "1",
        "--env-store",
        str(host["store"]),
    ]
    argv += ["--workdir", str(host["work"]), "--dist", str(host["dist"])]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "torchvision:fetch" in err and "asked afresh" not in err, "the host passes: the failure alone"
    flag.touch()
    assert main(argv) == 1, "the kept pass is read back: preflight lets the build start"
    err = capsys.readouterr().err
    assert "preflight, asked afresh after this failure, finds 1 problem(s) of this host:" in err, err
    assert "host: cxx:" in err and "brittle-c++: fatal error: its runtime went away" in err
    assert main(argv) == 2, "the pass was forgotten: refused before anything"
    err = capsys.readouterr().err
    assert "host: cxx:" in err and "nothing was fetched or built" in err
    flag.unlink()
    assert main(argv) == 1 and "asked afresh" not in capsys.readouterr().err


def test_check_always_asks_the_host(host, counted, capsys: pytest.CaptureFixture[str]) -> None:
    """``torchkiln check`` is the diagnosis: it never reads a kept answer, whatever a build kept."""
    records = Records.for_build(host["work"], host["store"])
    run(plan_of(host), records, counted)
    counted.clear()
    argv = [
        "check",
        str(host["recipe"]),
        "--only",
        "torchvision",
        "--jobs",
        "1",
        "--env-store",
        str(host["store"]),
    ]
    assert main([*argv, "--workdir", str(host["work"]), "--dist", str(host["dist"])]) == 0
    assert KEYED <= set(counted), capsys.readouterr()


def test_diagnose_asks_everything_and_keeps_what_passes(host, counted) -> None:
    records = Records.for_build(host["work"], None)
    run(plan_of(host), records, counted)
    counted.clear()
    assert diagnose(plan_of(host), records) == []
    assert KEYED <= set(counted)
    ran, _ = run(plan_of(host), records, counted)
    assert ran & KEYED == set()
