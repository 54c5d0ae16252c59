"""Compiles killed for memory: the cgroup's limit and counters, what the logs of a killed compile say, the
peak a run reached, where a killed unit can be rebuilt alone. The build that recovers from a real kernel
OOM kill is tests/test_build.py::test_a_compile_killed_for_memory_*."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kit import ROOT
from kit.memcg import memory_cgroup

from torchkiln.build.memory import _first_input, _locate
from torchkiln.host import cgroup
from torchkiln.plan.jobs import GIB, decide_jobs, detect_resources
from torchkiln.plan.model import Step
from torchkiln.process import runner
from torchkiln.process.killed import read_kills

DATA = ROOT / "tests" / "data"
LOGS = DATA / "killed_logs"
TREES = DATA / "cgroup"
SANDBOX = "/process_api/6d284c4600f23fe125ef032884c698e4"  # hybrid-v1's memory cgroup
MIB = 2**20


# --------------------------------------------------------------------------------------------------
# The cgroup: found from /proc/self/cgroup and mountinfo, its limit (ancestors included), its counters.
# --------------------------------------------------------------------------------------------------


def tree(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    shutil.copytree(TREES / name, root)
    return root


def test_a_hybrid_host_without_a_limit_sizes_jobs_by_meminfo(tmp_path: Path) -> None:
    root = tree(tmp_path, "hybrid-v1")
    group = cgroup.find("memory", sysroot=root)
    assert group is not None and (group.version, group.path) == (1, SANDBOX)
    assert group.limit() is None, "9223372036854771712 is the kernel's 'no limit'"
    assert group.oom_kills() == 0 and group.peak() == 2222571520
    resources = detect_resources(root)
    assert resources.memory_source == "/proc/meminfo MemTotal"
    assert resources.memory_bytes == 24684084 * 1024


def test_a_limit_on_an_ancestor_of_the_cgroup_sizes_the_jobs_and_the_plan_names_it(tmp_path: Path) -> None:
    root = tree(tmp_path, "hybrid-v1")
    (root / "sys/fs/cgroup/memory/process_api/memory.limit_in_bytes").write_text(f"{6 * GIB}\n")
    resources = detect_resources(root)
    assert resources.memory_bytes == 6 * GIB
    assert resources.memory_source == "cgroup v1 memory.limit_in_bytes of /process_api"
    decision = decide_jobs("cpu", resources)
    assert (
        decision.value == 2
        and "6.0 GiB by cgroup v1 memory.limit_in_bytes of /process_api" in decision.reason
    )


def test_a_systemd_unit_on_cgroup_v2_limits_memory_and_cpus(tmp_path: Path) -> None:
    root = tree(tmp_path, "v2-host")
    group = cgroup.find("memory", sysroot=root)
    assert group is not None and (group.version, group.path) == (2, "/system.slice/torchkiln-build.service")
    assert group.oom_kills() == 3 and group.peak() == 12884418560
    resources = detect_resources(root)
    assert resources.memory_bytes == 12 * GIB and resources.cpus == 1  # cpu.max 150000/100000 -> 1.5 -> 1
    assert resources.memory_source == "cgroup v2 memory.max of /system.slice/torchkiln-build.service"
    decision = decide_jobs("cuda", resources)
    assert decision.value == 1 and "limited by cores" in decision.reason


def test_a_container_sees_its_own_cgroup_as_the_root_of_the_mount(tmp_path: Path) -> None:
    root = tree(tmp_path, "v2-container")
    group = cgroup.find("memory", sysroot=root)
    assert group is not None and group.dir == root / "sys/fs/cgroup" and group.oom_kills() == 0
    resources = detect_resources(root)
    assert resources.memory_bytes == 4 * GIB
    assert resources.memory_source == "cgroup v2 memory.max of /"


def test_a_unified_hierarchy_without_the_memory_controller_is_not_taken_for_one(tmp_path: Path) -> None:
    root = tree(tmp_path, "hybrid-v1")
    (root / "proc/self/cgroup").write_text("0::/\n")  # only the (hugetlb-only) unified hierarchy is left
    assert cgroup.find("memory", sysroot=root) is None
    assert detect_resources(root).memory_source == "/proc/meminfo MemTotal"


def test_the_kernel_counts_a_real_oom_kill_in_the_cgroup_torchkiln_finds() -> None:
    with memory_cgroup(64 * MIB) as group:
        if isinstance(group, str):
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI must allow a memory cgroup: {group}")
            pytest.skip(group)
        sleeper = subprocess.Popen(["sleep", "30"], preexec_fn=group.join)
        try:
            found = cgroup.find("memory", pid=str(sleeper.pid))
            assert found is not None and found.dir == group.dir
            limit = found.limit()
            assert limit is not None and limit.value == 64 * MIB and found.path in limit.file
            before = found.oom_kills()
            hog = subprocess.run(
                [sys.executable, "-c", "b = bytearray(256 * 2**20)\nb[::4096] = b'x' * len(b[::4096])"],
                preexec_fn=group.join,
            )
            assert hog.returncode == -9, "the kernel killed it"
            assert before is not None and found.oom_kills() == before + 1
            peak = found.peak()
            assert peak is not None and 32 * MIB < peak <= 64 * MIB
        finally:
            sleeper.kill()
            sleeper.wait()


# --------------------------------------------------------------------------------------------------
# The logs of a killed compile (tests/data/killed_logs: real tools' whole output).
# --------------------------------------------------------------------------------------------------

KILLED = "g++: fatal error: Killed signal terminated program cc1plus"


@pytest.mark.parametrize(
    ("log", "edges", "evidence"),
    [
        ("gcc-1.11-ninja.log", [("heavy.o", KILLED)], [KILLED]),
        ("gcc-1.13-ninja.log", [("heavy.o", KILLED)], [KILLED]),
        ("nvcc-1.11-ninja.log", [("small.o", "Killed"), ("kernels.o", "Killed")], ["Killed", "Killed"]),
        (
            "nvcc-1.13-ninja.log",
            [("kernels.o", "FAILED: [code=137] kernels.o"), ("small.o", "FAILED: [code=137] small.o")],
            ["FAILED: [code=137] kernels.o", "Killed", "FAILED: [code=137] small.o", "Killed"],
        ),
        (
            "oom-project-step.log",
            [
                (
                    "CMakeFiles/kiln_oom_C.dir/csrc/heavy_a.cpp.o",
                    "c++: fatal error: Killed signal terminated program cc1plus",
                )
            ],
            ["c++: fatal error: Killed signal terminated program cc1plus"],
        ),
        ("exec-1.13-ninja.log", [("a.o", "FAILED: [code=137] a.o")], ["FAILED: [code=137] a.o"]),
        ("exec-1.11-ninja.log", [], []),  # nothing in the log says so: the cgroup's counter must
        ("collect2-ld.log", [], ["collect2: fatal error: ld terminated with signal 9 [Killed]"]),
        (
            "nvcc-ccbin.log",
            [],
            ["nvcc error   : '/tmp/killed-demo/killed-host-compiler' died due to signal 9 (Kill signal)"],
        ),
        (
            "gcc-address-space.log",
            [],
            ["cc1plus: out of memory allocating 6000 bytes after a total of 55132160 bytes"],
        ),
        ("gcc-compile-error-ninja.log", [], []),
    ],
)
def test_a_killed_compile_is_read_from_what_the_tools_print(
    log: str, edges: list[tuple[str, str]], evidence: list[str]
) -> None:
    kills = read_kills((LOGS / log).read_text().splitlines())
    assert [(e.target, e.evidence) for e in kills.edges] == edges
    assert [line.rstrip() for line in kills.evidence] == evidence
    assert bool(kills) == bool(evidence)


def test_bash_as_the_shell_says_killed_with_the_pid() -> None:
    kills = read_kills((LOGS / "bash-shell.log").read_text().splitlines())
    assert len(kills.evidence) == 1 and " Killed " in kills.evidence[0] and not kills.edges


# --------------------------------------------------------------------------------------------------
# The peak a run reached (wait4), and where a killed unit is rebuilt alone (ninja -t query).
# --------------------------------------------------------------------------------------------------

ALLOCATE = "b = bytearray({n} * 2**20)\nb[::4096] = b'x' * len(b[::4096])\n"


def test_a_streamed_run_reports_the_peak_of_its_largest_process_killed_or_not(tmp_path: Path) -> None:
    # the largest is a grandchild that the child reaps, as ninja reaps a compiler
    code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {ALLOCATE.format(n=96)!r}])"
    done = runner.stream([sys.executable, "-c", code], log=tmp_path / "a.log", measure=True)
    assert done.returncode == 0 and done.peak_rss is not None and 96 * MIB <= done.peak_rss < 160 * MIB
    suicide = ALLOCATE.format(n=64) + "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    done = runner.stream([sys.executable, "-c", suicide], log=tmp_path / "b.log", measure=True)
    assert done.returncode == -9 and done.peak_rss is not None and 64 * MIB <= done.peak_rss < 128 * MIB
    assert not list(tmp_path.glob("*.peak")), "the report is gone"
    assert runner.stream(["true"], log=tmp_path / "c.log").peak_rss is None, "measured only when asked"


def test_the_peak_is_the_commands_not_the_memory_of_the_process_that_started_it(tmp_path: Path) -> None:
    """Linux counts a process's image before exec in its ru_maxrss, and a vfork'd child's is its spawner's:
    a small compile started by a torchkiln that once held 400 MiB must not be reported at 400 MiB (the CI
    failure: a unit rebuilt alone "peaked" above the cgroup limit it had just fit under)."""
    ballast = bytearray(400 * MIB)
    ballast[::4096] = b"x" * len(ballast[::4096])  # resident, so this process's high-water mark is high
    done = runner.stream([sys.executable, "-c", ALLOCATE.format(n=16)], log=tmp_path / "a.log", measure=True)
    del ballast
    assert done.returncode == 0 and done.peak_rss is not None and 16 * MIB <= done.peak_rss < 80 * MIB


def test_a_killed_unit_is_found_in_the_build_directory_whose_ninja_file_has_it(tmp_path: Path) -> None:
    """torch.utils.cpp_extension's layout: build/temp.<platform>/build.ninja naming objects by absolute path."""
    ninja = shutil.which("ninja")
    if ninja is None:
        pytest.skip("ninja is not installed")
    src = tmp_path / "src"
    temp = src / "build" / "temp.linux-x86_64-cpython-311"
    temp.mkdir(parents=True)
    (src / "csrc").mkdir()
    obj = temp / "csrc" / "heavy.o"
    (temp / "build.ninja").write_text(
        "rule cxx\n  command = c++ -c $in -o $out\n"
        f"build {obj}: cxx {src}/csrc/heavy.cpp | {src}/csrc/table.h\n"
    )
    step = Step(
        "torchvision:wheel", "compile", "torchvision", (), cwd=str(src), scratch=(str(src / "build"),)
    )
    env = {"PATH": os.environ["PATH"]}
    found = _locate(str(obj), step, env)
    assert found is not None and found.directory == temp and found.unit == "csrc/heavy.cpp"
    assert _locate(str(temp / "csrc" / "other.o"), step, env) is None
    query = runner.run([ninja, "-C", str(temp), "-t", "query", str(obj)])
    assert _first_input(query.stdout) == f"{src}/csrc/heavy.cpp", query.stdout
