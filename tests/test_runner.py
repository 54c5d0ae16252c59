"""The one process runner: real processes, real process groups, real signals."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit import ROOT

from torchkiln.process import runner

# A child that starts a grandchild (in its own process group, the child's) and then waits.
FAMILY = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', sys.argv[1]])\n"
    "print('started', flush=True)\n"
    "time.sleep(120)\n"
)


def alive(marker: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline:
                found.append(cmdline)
    return found


def test_captured_output_is_redacted_and_the_first_error_is_named() -> None:
    script = (
        "import sys\n"
        "print('compiling with hunter22')\n"
        "print('src/a.cpp:4:18: error: x was not declared', file=sys.stderr)\n"
        "print('ninja: build stopped: subcommand failed.', file=sys.stderr)\n"
        "sys.exit(3)\n"
    )
    done = runner.run([sys.executable, "-c", script], redact=lambda t: t.replace("hunter22", "***"))
    assert done.returncode == 3 and not done.ok and not done.timed_out
    assert done.stdout == "compiling with ***\n"
    assert done.first_error() == "src/a.cpp:4:18: error: x was not declared"
    with pytest.raises(runner.ProcessError) as info:
        runner.run([sys.executable, "-c", script], check=True)
    assert "failed (exit 3): src/a.cpp:4:18: error: x was not declared" in str(info.value)
    assert info.value.result is not None and info.value.result.returncode == 3


def test_a_timeout_stops_the_whole_group(tmp_path: Path) -> None:
    marker = f"kiln-runner-timeout-{time.time_ns()}"
    done = runner.run([sys.executable, "-c", FAMILY, marker], timeout=3)
    assert done.timed_out and done.returncode is None and "started" in done.stdout
    assert "did not finish within" in done.failure()
    assert alive(marker) == [], "the grandchild went with the group"


def test_what_cannot_start_is_named() -> None:
    with pytest.raises(
        runner.ProcessError, match=r"no-such-tool-kiln not found \(is it installed and on PATH\?\)"
    ):
        runner.run(["no-such-tool-kiln", "--version"])
    with pytest.raises(runner.ProcessError, match=r"working directory /nonexistent/kiln does not exist"):
        runner.run([sys.executable, "-c", "pass"], cwd="/nonexistent/kiln")


def test_stream_logs_each_line_and_an_observer_can_stop_the_group(tmp_path: Path) -> None:
    marker = f"kiln-runner-stream-{time.time_ns()}"
    seen: list[str] = []

    def observe(line: str) -> bool:
        seen.append(line)
        return line.startswith("started")

    log = tmp_path / "logs" / "step.log"
    done = runner.stream(
        [sys.executable, "-c", FAMILY, marker],
        log=log,
        observe=observe,
        redact=lambda t: t.replace(marker, "MARKER"),
        header=f"# step: {marker}",
    )
    assert done.stopped and done.returncode is None and done.tail == ["started"]
    assert log.read_text().splitlines() == ["# step: MARKER", "started"]
    assert seen == ["started\n"]
    assert alive(marker) == []


def test_an_interrupt_while_streaming_stops_the_group_and_propagates(tmp_path: Path) -> None:
    marker = f"kiln-runner-interrupt-{time.time_ns()}"

    def interrupt(line: str) -> bool:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        runner.stream([sys.executable, "-c", FAMILY, marker], log=tmp_path / "x.log", observe=interrupt)
    assert alive(marker) == []


def test_reap_kills_stragglers_a_finished_leader_left() -> None:
    """A launcher that exits leaving its workers (a crashed torchrun) leaves nothing with reap."""
    marker = f"kiln-runner-reap-{time.time_ns()}"
    script = (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', sys.argv[1]],"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    )
    done = runner.run([sys.executable, "-c", script, marker], timeout=30, reap=True)
    assert done.ok
    deadline = time.monotonic() + 5
    while alive(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive(marker) == []


# A torchkiln that starts, under supervision, a family (child + grandchild in one group) and a daemon that
# leaves the group and session (as the sccache server does), asks for a socket to be removed, then waits to
# be SIGKILLed.
SUPERVISED = (
    "import os, subprocess, sys, time, pathlib\n"
    "from torchkiln.process import runner\n"
    "marker, sock = sys.argv[1], pathlib.Path(sys.argv[2])\n"
    "DAEMON = ('import os, sys, time\\n'\n"
    "          'if os.fork() == 0:\\n'\n"
    "          '    os.setsid()\\n'\n"
    "          '    null = os.open(os.devnull, os.O_RDWR)\\n'\n"
    "          '    [os.dup2(null, fd) for fd in (0, 1, 2)]\\n'\n"
    "          '    time.sleep(120)\\n')\n"
    "with runner.supervised():\n"
    "    runner.spawn([sys.executable, '-c', " + repr(FAMILY) + ", marker])\n"
    "    runner.run([sys.executable, '-c', DAEMON, marker + '-daemon'])\n"
    "    sock.write_text('socket')\n"
    "    runner.remove_at_exit(sock)\n"
    "    print('ready', flush=True)\n"
    "    time.sleep(120)\n"
)


def _family(marker: str, tmp_path: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-c", SUPERVISED, marker, str(tmp_path / "server.sock")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def _gone(marker: str, seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while alive(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive(marker)


def test_nothing_a_sigkilled_torchkiln_started_survives_it(tmp_path: Path) -> None:
    marker = f"kiln-runner-sigkill-{time.time_ns()}"
    proc = _family(marker, tmp_path)
    while len(alive(marker)) < 3:  # child, grandchild, daemon
        time.sleep(0.05)
    assert (tmp_path / "server.sock").exists()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _gone(marker, 5) == [], "the watchdog killed the child, the grandchild and the daemon"
    deadline = time.monotonic() + 5
    while (tmp_path / "server.sock").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (tmp_path / "server.sock").exists(), "and removed the socket"


def test_a_normal_end_of_a_supervised_run_also_stops_what_it_left(tmp_path: Path) -> None:
    marker = f"kiln-runner-end-{time.time_ns()}"
    script = (
        "import sys\nfrom torchkiln.process import runner\n"
        "with runner.supervised():\n"
        "    runner.spawn([sys.executable, '-c', 'import time; time.sleep(120)', sys.argv[1]])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    subprocess.run([sys.executable, "-c", script, marker], check=True, env=env, timeout=60)
    assert _gone(marker, 5) == []
    # outside a supervised block nothing is marked or watched
    assert runner._marked({"A": "1"}) == {"A": "1"}


def test_two_supervised_runs_in_two_threads_each_keep_their_own(tmp_path: Path) -> None:
    """Issue 48: two builds in one process, each in its thread: each run marks its own processes, and the
    end of one (its watchdog sweeping what carries its mark) leaves the other's running process alone; a
    thread the run starts through ``in_context`` marks as the run does; a block ``confined`` in one thread
    confines nothing another thread starts."""
    import threading

    first_in, first_out, second_done = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def first() -> None:
        with runner.supervised() as run_id:
            seen["first"] = run_id
            seen["first-mark"] = runner._marked({})
            first_in.set()
            second_in.wait(30)
            with runner.confined(lambda argv, env, cwd: (["false"], dict(env or {}))):
                first_out.wait(30)  # the second thread starts its process while this one confines
        seen["first-ended"] = True

    def second() -> None:
        first_in.wait(30)
        with runner.supervised() as run_id:
            seen["second"] = run_id
            helper: dict[str, object] = {}
            thread = threading.Thread(target=runner.in_context(lambda: helper.update(m=runner._marked({}))))
            thread.start()
            thread.join()
            seen["helper-mark"] = helper["m"]
            second_in.set()
            time.sleep(0.3)  # the first thread is inside confined() now
            marker = f"kiln-runner-threads-{time.time_ns()}"
            proc = runner.spawn([sys.executable, "-c", "import time, sys; time.sleep(3)", marker])
            first_out.set()
            while "first-ended" not in seen:
                time.sleep(0.02)
            time.sleep(0.5)  # the first run's watchdog swept what carries its mark
            seen["alive"] = proc.poll() is None
            proc.wait(10)
            seen["returncode"] = proc.returncode
        second_done.set()

    second_in = threading.Event()
    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert second_done.is_set(), seen
    assert seen["first"] != seen["second"], "each run its own"
    assert seen["first-mark"] == {runner.MARK: seen["first"]}
    assert seen["helper-mark"] == {runner.MARK: seen["second"]}, "a thread in the run's context: its mark"
    assert seen["alive"] and seen["returncode"] == 0, "neither confined by nor swept with the other run"
    assert runner._marked({"A": "1"}) == {"A": "1"}, "this thread is in no run"


# --------------------------------------------------------------------------------------------------
# Niceness: a process torchkiln starts is scheduled no higher than torchkiln itself, in its own session's
# scheduling group too (runner._lowered; sched(7), "The autogroup feature").
# --------------------------------------------------------------------------------------------------

AUTOGROUP = Path("/proc/self/autogroup").exists()
# The rows below start from a test process at the default priority: one that is niced itself (`nice nox -s
# tests`), or whose session's group is, passes that on to everything, the harness's "normal" process too.
NICED = pytest.mark.skipif(
    os.getpriority(os.PRIO_PROCESS, 0) > 0 or runner._group_nice(os.getpid()) > 0,
    reason="the tests run niced: the rows' niceness and the CPU share need a process at the default priority",
)

# Run in a session of its own (so its autogroup is its own to lower): its niceness and its group's set as
# the row says, then a child started by runner.spawn (asked for ``nice`` more) reports its own, its session
# and its group's. With ``hog``, the child spins on CPU 0 instead, and the harness waits.
HARNESS = r"""
import json, os, sys
from torchkiln.process import runner
own, group, hog, asked = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "hog", int(sys.argv[4])
os.nice(own)
if group:
    with open("/proc/self/autogroup", "w") as handle:
        handle.write(str(group))
report = ("import json, os; g = '/proc/self/autogroup'; "
          "print(json.dumps([os.getpriority(os.PRIO_PROCESS, 0), os.getsid(0), "
          "open(g).read().split()[-1] if os.path.exists(g) else None]))")
spin = "import os\nos.sched_setaffinity(0, {0})\nprint(os.getpid(), flush=True)\nwhile True: pass"
proc = runner.spawn([sys.executable, "-c", spin if hog else report], stdout=None if hog else -1, nice=asked)
if hog:
    proc.wait()
out, _ = proc.communicate()
print(json.dumps({"child": json.loads(out), "sid": os.getsid(0)}))
"""


def harness(own: int, group: int, hog: bool = False, asked: int = 0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", HARNESS, str(own), str(group), "hog" if hog else "report", str(asked)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )


@pytest.mark.parametrize(
    ("own", "group", "asked", "expected"),
    [
        (0, 0, 0, 0),  # the common case: nothing changes
        (5, 0, 0, 5),  # `nice -n 5 torchkiln build`: its compile's session too
        (19, 0, 0, 19),
        (1, 0, 0, 1),
        (0, 8, 0, 8),  # torchkiln in a lowered session (`renice -g`, /proc/PID/autogroup), itself not niced
        (3, 6, 0, 6),  # both: the lower priority of the two
        (12, 4, 0, 12),
        # spawn(nice=...), the work beside the compile (build.earlycheck): its group at least that low, the
        # process itself as torchkiln (a process's niceness cannot be raised again without privilege)
        (0, 0, 19, 19),
        (0, 0, 1, 1),
        (0, 0, 7, 7),
        (5, 0, 3, 5),  # its group: the highest of the three
        (4, 0, 19, 19),
        (0, 9, 4, 9),
        (2, 0, 40, 19),  # never past 19
    ],
)
@NICED
def test_a_started_process_is_scheduled_no_higher_than_torchkiln(
    own: int, group: int, asked: int, expected: int
) -> None:
    if group and not AUTOGROUP:
        pytest.skip("this kernel has no autogroups (CONFIG_SCHED_AUTOGROUP)")
    out, _ = harness(own, group, asked=asked).communicate(timeout=60)
    seen = json.loads(out)
    nice, sid, group_nice = seen["child"]
    # inherited, as every child's: never lowered further (runner.restore could not undo that)
    assert nice == own
    assert sid != seen["sid"]  # a session of its own: what start_new_session gives
    if AUTOGROUP:
        assert int(group_nice) == expected  # and so a scheduling group of its own, lowered alike
        assert int(group_nice) >= max(own, group, min(asked, 19))


# A CPU-bound loop on CPU 0 until it has used ``argv[1]`` seconds of CPU.
HOG = (
    "import os, sys, time\n"
    "os.sched_setaffinity(0, {0})\n"
    "t = time.process_time()\n"
    "while time.process_time() - t < float(sys.argv[1]): pass\n"
)


@NICED
@pytest.mark.parametrize(("own", "asked"), [(19, 0), (0, 19)], ids=["torchkiln-niced", "spawn-nice"])
def test_under_nice_what_torchkiln_starts_yields_the_core_to_another_session(own: int, asked: int) -> None:
    """The behaviour niceness is for: a command started under ``nice -n 19``, or asked to run that low (by
    runner.spawn, in a session of its own), takes little of a core that a process of another session wants.
    Without its group lowered each took half (measured here, autogroups on). CPU time, not wall time, is
    compared."""
    low = harness(own, 0, hog=True, asked=asked)
    pid = None
    try:
        pid = int(low.stdout.readline())  # the lowered hog runs (a harness that failed: ValueError, here)
        normal = runner.spawn([sys.executable, "-c", HOG, "1.0"])
        runner.finish(normal)
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        low_cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    finally:
        os.killpg(low.pid, signal.SIGKILL)
        if pid is not None:  # the hog leads a session of its own (runner.spawn), outside the harness's group
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        low.wait()
    assert low_cpu < 0.3, f"the lowered process took {low_cpu:.2f} s of CPU beside the other's 1.0 s"


# Lowers three sessions' groups by runner.spawn(nice=19) (a write each, 0.1 s apart: the kernel takes one per
# 0.1 s from an unprivileged process), then raises them back by runner.restore, one right after another.
RESTORE = r"""
import json, os, sys, time
from torchkiln.process import runner
own = int(sys.argv[1])
os.nice(own)
procs = []
for _ in range(3):
    time.sleep(runner.RETRY)  # a lowering that meets EAGAIN is left out (spawn does not wait): not here
    procs.append(runner.spawn(["sleep", "60"], stdout=-3, stderr=-3, nice=19))  # DEVNULL
lowered = [runner._group_nice(p.pid) for p in procs]
raised = [runner.restore(p.pid) for p in procs]
after = [runner._group_nice(p.pid) for p in procs]
nice = [int(open(f"/proc/{p.pid}/stat").read().rpartition(")")[2].split()[16]) for p in procs]
for p in procs:
    p.kill()
    p.wait()
print(json.dumps({"lowered": lowered, "raised": raised, "after": after, "nice": nice, "uid": os.getuid()}))
"""


@pytest.fixture
def unprivileged() -> Iterator[tuple[list[str], str]]:
    """A Python run with no privilege (no CAP_SYS_ADMIN, no CAP_SYS_NICE), as a user's build runs, and where
    it imports torchkiln from: this one and the checkout, or as root the system's, as nobody (a process that
    drops root itself stays non-dumpable: its children's /proc files are root's), with a copy of the sources
    nobody can read (a checkout under /root is not: the README's newcomer)."""
    if os.getuid() != 0:
        yield [sys.executable], str(ROOT / "src")
        return
    setpriv, python = shutil.which("setpriv"), Path("/usr/bin/python3")
    if setpriv is None or not python.exists():
        pytest.skip("as root this needs setpriv(1) and /usr/bin/python3 to run as nobody")
    copy = Path(tempfile.mkdtemp(prefix="torchkiln-src-"))
    try:
        copy.chmod(0o755)
        shutil.copytree(
            ROOT / "src" / "torchkiln", copy / "torchkiln", ignore=shutil.ignore_patterns("__pycache__")
        )
        for path in copy.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", str(python)], str(copy)
    finally:
        shutil.rmtree(copy, ignore_errors=True)


@NICED
@pytest.mark.skipif(not AUTOGROUP, reason="this kernel has no autogroups (CONFIG_SCHED_AUTOGROUP)")
@pytest.mark.parametrize("own", [0, 4])
def test_a_lowered_group_is_raised_back_without_privilege(
    own: int, unprivileged: tuple[list[str], str]
) -> None:
    """runner.restore, the way back from spawn's ``nice`` (build.earlycheck's hurry): a group lowered to 19 is
    raised to torchkiln's own level, by a process with no privilege, though the kernel refuses a second
    write within 0.1 s (EAGAIN, waited out); the processes themselves were never lowered."""
    python, source = unprivileged
    done = subprocess.run(
        [*python, "-c", RESTORE, str(own)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": source},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["uid"] != 0
    assert seen["lowered"] == [19] * 3
    assert seen["raised"] == [True] * 3 and seen["after"] == [own] * 3
    assert seen["nice"] == [own] * 3


def test_restore_of_a_process_that_ended_is_no_error() -> None:
    proc = runner.spawn(["true"], nice=19)
    proc.wait()
    assert runner.restore(proc.pid) is True
