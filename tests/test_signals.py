"""A stop signal at any step ends torchkiln cleanly, whatever the compiler cache (issue 47 item 3).

The invariant: SIGINT, SIGTERM and SIGHUP, wherever a build is, end torchkiln with 128 + the signal's number
(Ctrl-C's 130), with nothing it started left running (no compiler, no pip, no cache server: what is in flight
is killed, never waited for) and a state the same command continues from to the wheel an uninterrupted
build gives, byte for byte. How long the exit takes is measured by bench/interrupts.py (tests time nothing).

The unit part checks the mechanism's pieces on real processes: the stop-signal handlers (the first signal
raises, later ones do not break off the cleanup, an ignored one stays ignored) and what counts as a process
group still running (a zombie does not: a sandbox's pid 1 is reaped by this machine's init, which may take
seconds). The integration part signals real builds (tests/kit/signalkit.py: the real plan of a torchvision
build with ``--torch``, pip installing torch in its environment step, a compile with a unit in flight), one
cell per cache kind with a compile in flight and one per signal with pip in flight; sccache-dist's cell is
in tests/test_cluster.py (it needs a loopback cluster). The wheel of a rerun is compared with a build of the same
tree at the same path from an empty work directory (the tree's path is in the wheel's bytes).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from kit.imagekit import need
from kit.signalkit import (
    EXIT_CODES,
    Cell,
    check_stopped,
    make_tree,
    settled,
    survivors,
    unlowered,
    wait_in_flight,
    write_recipe,
)

from torchkiln.build import postcheck
from torchkiln.errors import Interrupted
from torchkiln.process import runner


def interrupt(signum: int) -> BaseException:
    error = Interrupted(f"stopped by {signal.Signals(signum).name}")
    error.exit_code = 128 + signum
    return error


# --------------------------------------------------------------------------------------------------
# The mechanism's pieces.
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", runner.STOP_SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_the_first_stop_signal_raises_and_later_ones_only_count(signum: int) -> None:
    before = signal.getsignal(signum)
    with runner.stop_signals(interrupt):
        try:
            os.kill(os.getpid(), signum)
            time.sleep(5)  # the handler runs before this returns
            pytest.fail("the signal raised nothing")
        except Interrupted as exc:
            code = exc.exit_code
            for again in runner.STOP_SIGNALS:  # would raise here, breaking off the cleanup the first started
                os.kill(os.getpid(), again)
            time.sleep(0.1)
    assert code == 128 + signum and runner.stopping()
    assert signal.getsignal(signum) == before, "the handlers are put back"
    with runner.supervised():
        assert not runner.stopping(), "a run of its own starts without an earlier run's stop"


def test_a_signal_the_caller_ignores_stays_ignored() -> None:
    """``nohup torchkiln build`` keeps running when its terminal closes."""
    script = (
        "import os, signal, sys, time\n"
        "from torchkiln.process import runner\n"
        "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        "with runner.stop_signals(lambda s: SystemExit(128 + s)):\n"
        "    os.kill(os.getpid(), signal.SIGHUP)\n"
        "    time.sleep(0.2)\n"
        "    print('still here', runner.stopping())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout == "still here False\n", done.stderr


def test_a_group_left_with_zombies_only_is_not_running() -> None:
    """A killed process not yet reaped still answers ``kill(0)``; it runs nothing. stop_group and
    end_group wait for what runs, so an init that reaps a sandbox's pid 1 late does not hold the exit."""
    script = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os._exit(0)\n"  # a zombie: its parent never waits for it
        "print('forked', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = runner.spawn([sys.executable, "-c", script])
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "forked\n"
        assert runner._group_alive(proc.pid), "the parent runs"
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while runner._running(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.killpg(proc.pid, 0)  # the group is still there: its leader is a zombie until reaped
        assert not runner._group_alive(proc.pid)
    finally:
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------------------------------
# Real builds, signalled with a step in flight.
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    for tool in ("ccache", "sccache", "ninja", "c++", "python3.11"):
        need(tool)
    root = tmp_path_factory.mktemp("signals")
    yield {"root": root, "recipe": write_recipe(root / "signals.toml"), "store": root / "envs"}
    shutil.rmtree(root, ignore_errors=True)  # venvs and trees: gigabytes


@pytest.fixture(scope="module")
def store(world: dict[str, Path]) -> Path:
    """The environment store the compile cells start from (their environment steps are reused from it):
    filled by one uninterrupted build."""
    cell = Cell(world["root"] / "first", world["recipe"], "none", env_store=str(world["store"]))
    make_tree(cell.tree)
    done = cell.build()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return world["store"]


# Each cache kind with a compile in flight (the signals shared out among them), and each signal with pip
# in flight (whatever the cache: its server starts with the first compile). sccache-dist: tests/test_cluster.py.
COMPILE_CELLS = [
    ("none", signal.SIGINT, True),
    ("ccache", signal.SIGHUP, True),
    ("sccache", signal.SIGTERM, True),  # the server in the build's sandbox (torchkiln's child)
    ("sccache", signal.SIGINT, False),  # --no-sandbox: the server a daemon, found by its socket
]
ENV_CELLS = [("none", signal.SIGHUP), ("ccache", signal.SIGTERM), ("sccache", signal.SIGINT)]


@pytest.mark.integration
@pytest.mark.parametrize(
    ("kind", "signum", "sandbox"),
    COMPILE_CELLS,
    ids=[f"{k}-{signal.Signals(s).name}{'' if b else '-no-sandbox'}" for k, s, b in COMPILE_CELLS],
)
def test_a_signal_with_a_compile_in_flight(
    world: dict[str, Path], store: Path, kind: str, signum: int, sandbox: bool
) -> None:
    name = f"compile-{kind}-{signal.Signals(signum).name}-{'sandbox' if sandbox else 'open'}"
    cell = Cell(world["root"] / name, world["recipe"], kind, env_store=str(store), sandbox=sandbox)
    check_stopped(cell, "compile", signum)


@pytest.mark.integration
def test_a_signal_while_the_check_waits_in_the_warm_clone(world: dict[str, Path], store: Path) -> None:
    """Issue 47: a checked build whose build venv comes from the store starts the check's interpreter while
    the compile runs (torchkiln.build.earlycheck: the warm clone pruned, pillow installed into it, then
    ``postcheck.py --serve`` waiting on its socket). Signalled then, nothing of that runs on, the clone at the
    check venv's path is gone, and the same command without the check (the stand-in's wheel is not named
    torchvision) builds the wheel an uninterrupted build gives."""
    cell = Cell(world["root"] / "early-SIGTERM", world["recipe"], "ccache", env_store=str(store), checks=True)
    make_tree(cell.tree)
    proc = cell.start()
    served = cell.work / "check-venv" / postcheck.SOCKET
    try:
        snapshot = wait_in_flight(cell, "compile", proc)
        for tick in range(6000):  # the spin unit keeps the compile in flight: until the check waits
            if served.exists() or proc.poll() is not None:
                break
            if tick % 10 == 0:
                unlowered(proc.pid)  # the early work, lowered beside the compile, runs under any load
            time.sleep(0.05)
        assert served.exists(), "the check's interpreter never waited in the warm clone"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == EXIT_CODES[signal.SIGTERM] and "Traceback" not in output, output[-3000:]
    assert settled(lambda: survivors(cell, snapshot)) == [], "nothing runs on"
    assert not (cell.work / "check-venv").exists() and not (cell.work / "check-venv.warm").exists()
    assert cell.spun() == [], "the compile in flight was killed, not waited for"
    unchecked = replace(cell, checks=False)
    again = unchecked.build()
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    fresh = replace(unchecked, run="-fresh")
    make_tree(fresh.tree)
    assert fresh.build().returncode == 0 and cell.wheel_sha256() == fresh.wheel_sha256()


@pytest.mark.integration
@pytest.mark.parametrize(
    ("kind", "signum"), ENV_CELLS, ids=[f"{k}-{signal.Signals(s).name}" for k, s in ENV_CELLS]
)
def test_a_signal_with_pip_in_flight(world: dict[str, Path], kind: str, signum: int) -> None:
    """The environment store off: every environment step runs pip, and the rerun runs the one stopped."""
    cell = Cell(world["root"] / f"env-{kind}-{signal.Signals(signum).name}", world["recipe"], kind)
    check_stopped(cell, "env", signum)


@pytest.mark.integration
def test_what_lies_in_the_build_directory_is_never_the_wheels_epoch(
    world: dict[str, Path], store: Path
) -> None:
    """A file the build did not record in its scratch build/ (a cache server's depfile, written after a
    stopped build recorded its outputs; an earlier build's by hand) is nothing the wheel is built from: the
    next build's SOURCE_DATE_EPOCH, and so its wheel, is what it was. (An ``*.egg-info`` file is no such
    thing: setuptools copies it into the wheel's .dist-info.)"""
    cell = Cell(world["root"] / "epoch", world["recipe"], "none", env_store=str(store))
    make_tree(cell.tree)
    first = cell.build()
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    before = cell.wheel_sha256()
    late = next(cell.tree.glob("build/temp.*/csrc")) / "late.o.d"
    late.write_text("late.o: csrc/late.cpp\n")  # written now: newer than every file of the tree
    again = cell.build()
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "torchvision:wheel" in again.stdout + again.stderr, "the compile ran again (its tree changed)"
    assert cell.wheel_sha256() == before
