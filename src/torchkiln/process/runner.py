"""The one way torchkiln runs a process: argv lists, a process group each, timeouts, redaction, first error.

Every command torchkiln starts goes through here (the build's steps, git, the compiler-cache tools, pip, tool
version probes, the verification suite's helpers), so all of them behave alike:

* argv lists only, never a shell: recipe strings stay single arguments, never code;
* each process leads its own session and process group, so stopping it stops what it started (ninja and
  the compilers, torchrun's workers): :func:`stop_group` sends SIGTERM to the group, waits, then SIGKILL;
* each is scheduled no higher than torchkiln itself: ``nice torchkiln build`` lowers the compile too, its
  session's scheduling group included, which the niceness a process inherits does not reach (:func:`_lowered`);
* a timeout stops the whole group and says so;
* text that is shown or logged passes through the caller's ``redact`` first (compiler-cache secrets);
* a failure names the command, its exit status and the *first* error line of its output
  (:func:`torchkiln.process.logs.first_error`), not the last line of noise;
* :func:`stream` writes each line to a log file as it arrives and hands it to an observer (progress, the
  configure watcher), which may stop the run.

Standard library only (with :mod:`torchkiln.errors` and :mod:`torchkiln.process.logs`, which are too): the
verification suite runs it inside slim runtime images.

* within :func:`supervised` (a build), every process carries the run's mark and a watchdog
  (:mod:`torchkiln.process.supervisor`) kills all of them once torchkiln is gone, SIGKILL of torchkiln included.
* a stop signal (SIGINT, SIGTERM, SIGHUP: :func:`stop_signals`) ends torchkiln within 2 s, whatever runs: the
  run in flight gets SIGTERM and, :data:`STOP_GRACE_S` later, SIGKILL (not :data:`KILL_GRACE_S`); what is
  waited for afterwards is only what is still *running* (a zombie, whose reaping this machine's init may
  delay by seconds, is gone); and :func:`stopping` tells what a build started beside its steps (the
  compiler cache's server) to be killed, not asked to finish its work.

The run a process belongs to (:func:`supervised`) and the sandbox it starts in (:func:`confined`) are context
variables, never module globals: two builds in two threads of one process each mark and confine their own
processes only (issue 48). A thread a build starts runs in a copy of the build's context
(:func:`in_context`) to share them.

:func:`spawn` is the one place a process is created; :class:`Completed` / :class:`Streamed` carry the
seconds each run took.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from torchkiln.errors import Interrupted, TorchkilnError, name_path
from torchkiln.process import peak

from .logs import first_error
from .supervisor import MARK

KILL_GRACE_S = 10.0
# After a stop signal: SIGTERM, then SIGKILL this much later. A tool that cleans up on SIGTERM does it in
# milliseconds (ninja, pip, the compilers die at once); one that ignores it must not hold torchkiln's exit.
STOP_GRACE_S = 0.5
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
TAIL_KEEP = 200

Redact = Callable[[str], str]
# An observer sees each (redacted) output line of a streamed run; returning True stops the run.
Observer = Callable[[str], bool]


def _same(text: str) -> str:
    return text


class ProcessError(TorchkilnError):
    """A process could not start, timed out or failed; the message says which and why."""

    def __init__(self, message: str, result: Completed | None = None) -> None:
        super().__init__(message)
        self.result = result


@dataclass(frozen=True)
class Completed:
    """A finished run with captured output (already redacted)."""

    argv: tuple[str, ...]
    returncode: int | None  # None: stopped after its timeout
    stdout: str
    stderr: str
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    @property
    def command(self) -> str:
        return " ".join(self.argv)

    def first_error(self) -> str | None:
        """The first error line of the output, else its last non-empty line, else None."""
        lines = self.output.splitlines()
        found = first_error(lines)
        if found:
            return found.strip()
        rest = [line.strip() for line in lines if line.strip()]
        return rest[-1] if rest else None

    def failure(self) -> str:
        """One line: what ran and how it failed."""
        if self.timed_out:
            return f"{self.command} did not finish within {self.seconds:.0f} s"
        detail = self.first_error()
        return f"{self.command} failed (exit {self.returncode})" + (f": {detail}" if detail else "")

    def describe(self, tail: int = 4000) -> str:
        """What ran, how it ended, and the end of its output (for test failures and reports)."""
        state = "timed out" if self.timed_out else f"exited {self.returncode}"
        return f"{self.command} {state}\n--- output (tail) ---\n{self.output[-tail:]}"


@dataclass(frozen=True)
class Streamed:
    """A finished streamed run: its output is in ``log``, the last lines in ``tail``."""

    argv: tuple[str, ...]
    returncode: int | None  # None: stopped because the observer asked
    seconds: float
    log: Path
    tail: list[str] = field(default_factory=list)
    # With stream(measure=True): the peak resident memory (bytes) of the largest process of the run's tree
    # that was waited for: the command's own, a compiler's that ninja reaped (the kernel's ru_maxrss over
    # reaped children, measured by torchkiln.process.peak); None when not measured or the run was stopped.
    # A compile killed for memory counts with what it had reached.
    peak_rss: int | None = None

    @property
    def stopped(self) -> bool:
        return self.returncode is None


# --------------------------------------------------------------------------------------------------
# Supervision: what a run started dies with it, also when torchkiln is SIGKILLed (torchkiln.process.supervisor).
# --------------------------------------------------------------------------------------------------


@dataclass
class _Watch:
    run_id: str
    watchdog: subprocess.Popen[str] | None = None  # started with the run's first process (a no-op has none)


# The run of this thread's build (None: outside supervised()).
_WATCH: contextvars.ContextVar[_Watch | None] = contextvars.ContextVar("torchkiln_watch", default=None)


@contextlib.contextmanager
def supervised() -> Iterator[str]:
    """Within the block every process :func:`spawn` starts carries this run's mark, and a watchdog
    (:mod:`torchkiln.process.supervisor`) SIGKILLs whatever carries it once torchkiln is gone: at the block's end,
    or when torchkiln dies in any way, SIGKILL included. Yields the run's id. Nested blocks share one. The
    watchdog starts with the block's first process: a block that starts none (a no-op rebuild) needs none."""
    outer = _WATCH.get()
    if outer is not None:
        yield outer.run_id
        return
    watch = _Watch(uuid.uuid4().hex)
    token = _WATCH.set(watch)
    _STOPPING.clear()  # a run of its own: an earlier run's stop (an in-process caller's) is not this one's
    try:
        yield watch.run_id
    finally:
        _WATCH.reset(token)
        watchdog = watch.watchdog
        if watchdog is not None:
            assert watchdog.stdin is not None
            with contextlib.suppress(OSError):
                watchdog.stdin.close()  # the watchdog sweeps now, as it would if torchkiln had died
            with contextlib.suppress(subprocess.TimeoutExpired):
                watchdog.wait(timeout=30)


def _watchdog(watch: _Watch) -> subprocess.Popen[str]:
    """The run's watchdog, started now if it was not yet (before the process it is to watch)."""
    if watch.watchdog is None:
        env = {k: v for k, v in os.environ.items() if k != MARK}
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        watch.watchdog = subprocess.Popen(  # noqa: S603 - this Python, this package's module
            [sys.executable, "-m", "torchkiln.process.supervisor", watch.run_id],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,  # Ctrl-C in the terminal is torchkiln's to handle, not the watchdog's
        )
    return watch.watchdog


def remove_at_exit(path: Path) -> None:
    """Have the watchdog remove ``path`` (a file, or a directory and all it holds) when this run ends, however
    it ends (a server's socket, a sandbox's private /tmp)."""
    watch = _WATCH.get()
    watchdog = _watchdog(watch) if watch is not None else None
    if watchdog is not None and watchdog.stdin is not None:
        with contextlib.suppress(OSError):
            watchdog.stdin.write(f"file {path}\n")
            watchdog.stdin.flush()


def _marked(env: Mapping[str, str] | None) -> dict[str, str] | None:
    watch = _WATCH.get()
    if watch is None:
        return dict(env) if env is not None else None
    _watchdog(watch)  # up before the process it must be able to kill
    return {**(env if env is not None else os.environ), MARK: watch.run_id}


def in_context(target: Callable[..., Any]) -> Callable[..., Any]:
    """``target`` run in a copy of the calling thread's context: a thread a build starts marks (and
    confines) the processes it starts as the build's own thread does."""
    return functools.partial(contextvars.copy_context().run, target)


# --------------------------------------------------------------------------------------------------
# Confinement: a block whose processes all start in a sandbox (torchkiln.process.isolation).
# --------------------------------------------------------------------------------------------------

# (argv, env or None for this process's, cwd) -> the argv and env that run it confined
Confine = Callable[
    [list[str], Mapping[str, str] | None, "str | Path | None"], tuple[list[str], dict[str, str]]
]
_CONFINE: contextvars.ContextVar[Confine | None] = contextvars.ContextVar("torchkiln_confine", default=None)


@contextlib.contextmanager
def confined(confine: Confine) -> Iterator[None]:
    """Within the block, every process :func:`spawn` starts is started as ``confine`` says: torchkiln's own
    probes of what a build step installed (the build venv's python, cmake, ninja are build dependencies'
    code) run in that step's sandbox, as the step did."""
    token = _CONFINE.set(confine)
    try:
        yield
    finally:
        _CONFINE.reset(token)


# --------------------------------------------------------------------------------------------------
# Stop signals: SIGINT, SIGTERM, SIGHUP end torchkiln within 2 s, with nothing it started left running.
# --------------------------------------------------------------------------------------------------

_STOPPING: list[int] = []  # the stop signals this run received (0: an interrupt seen only as its exception)


def stopping() -> bool:
    """Whether this run is stopping on a signal: what it started is killed, not waited for (the compiler
    cache's server is not asked to finish the compiles in flight, its statistics are not read)."""
    return bool(_STOPPING)


def _note_interrupt(exc: BaseException) -> bool:
    """Remember an interrupt seen as its exception (Ctrl-C's KeyboardInterrupt, a handler's
    :class:`~torchkiln.errors.Interrupted`, whoever installed the handler); whether ``exc`` is one."""
    if isinstance(exc, KeyboardInterrupt | Interrupted):
        if not _STOPPING:
            _STOPPING.append(0)
        return True
    return False


@contextlib.contextmanager
def stop_signals(interrupt: Callable[[int], BaseException]) -> Iterator[None]:
    """Within the block, the first of SIGINT, SIGTERM, SIGHUP raises ``interrupt(signum)`` where the main
    thread is (the run in flight is stopped on the way out: :func:`finish`, :func:`stream`); later ones are
    only remembered, so they cannot break off the cleanup the first started. A signal the caller ignores
    (``nohup``'s SIGHUP, a background job's SIGINT) stays ignored. Outside the main thread: nothing."""

    fired: list[int] = []
    _STOPPING.clear()

    def handler(signum: int, frame: object) -> None:
        first = not fired and not _STOPPING  # nor an interrupt another handler raised (the build loop's)
        _STOPPING.append(signum)
        fired.append(signum)
        if first:
            raise interrupt(signum)

    previous: dict[signal.Signals, Any] = {}
    try:
        for signum in STOP_SIGNALS:
            if signal.getsignal(signum) != signal.SIG_IGN:
                previous[signum] = signal.signal(signum, handler)
    except ValueError:  # not the main thread: signals are the main thread's
        pass
    try:
        yield
    finally:
        for number, before in previous.items():
            signal.signal(number, before)


# --------------------------------------------------------------------------------------------------
# Starting and stopping.
# --------------------------------------------------------------------------------------------------


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    stdout: int | IO[bytes] | None = subprocess.PIPE,
    stderr: int | IO[bytes] | None = subprocess.PIPE,
    text: bool = True,
    errors: str = "replace",
    stdin: int | None = subprocess.DEVNULL,
    nice: int = 0,
) -> subprocess.Popen[Any]:
    """Start ``argv`` in a new session (it leads its own process group), stdin closed unless given, no
    higher in the scheduler than this process (:func:`_lowered`); with ``nice`` (1-19), for work that runs
    beside the build's critical path, its session's scheduling group at least that low, which
    :func:`restore` raises again once the build waits for that work.

    The one place torchkiln creates a process. A missing working directory or executable is a
    :class:`ProcessError` that names it.
    """
    if cwd is not None and not Path(cwd).is_dir():
        raise ProcessError(f"working directory {cwd} does not exist")
    confine = _CONFINE.get()
    if confine is not None:
        confined_argv, env = confine(list(argv), env, cwd)
        argv = confined_argv
    try:
        proc = subprocess.Popen(  # noqa: S603 - an argv list, never a shell
            list(argv),
            env=_marked(env),
            cwd=cwd,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            text=text,
            errors=errors if text else None,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise ProcessError(f"{argv[0]} not found (is it installed and on PATH?)") from None
    except PermissionError:
        raise ProcessError(f"{argv[0]} cannot be executed (permission denied)") from None
    _lowered(proc.pid, nice)
    return proc


# A new session is a new scheduling group where the kernel groups by session (``CONFIG_SCHED_AUTOGROUP``, on
# in Debian's kernels; sched(7), "The autogroup feature"): the groups share the CPUs equally, and a process's
# niceness orders it only within its own group. A process inherits its parent's niceness, but a session of its
# own starts at the group niceness 0: under ``nice -n 19 torchkiln build`` each step's command took as much of
# a core as any other session's (measured here: two CPU-bound sessions on one core, one at nice 19, each got
# half). So each session :func:`spawn` starts is given torchkiln's own niceness as its group's too:
#   a process torchkiln starts is scheduled no higher than torchkiln itself.
_AUTOGROUP = "/proc/{}/autogroup"


def _group_nice(pid: int) -> int:
    """The niceness of ``pid``'s autogroup (``/autogroup-42 nice 19``); 0 where the kernel has none."""
    try:
        with open(_AUTOGROUP.format(pid), encoding="ascii") as handle:
            return int(handle.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return 0


def _level() -> int:
    """This process's niceness or its group's, the higher: what every session it starts is given."""
    return min(19, max(os.getpriority(os.PRIO_PROCESS, 0), _group_nice(os.getpid())))


def _lowered(pid: int, nice: int = 0) -> None:
    """``pid``'s new session's group given this process's level (:func:`_level`) or ``nice``, whichever is
    higher, where that is above the default (a kernel without autogroups has no such file: the niceness
    ``pid`` inherited is what counts there). Only the group is lowered past the level, never the process:
    a group's niceness can be raised again without privilege (:func:`restore`), a process's cannot."""
    level = min(19, max(_level(), nice))
    if level > 0:
        with contextlib.suppress(OSError), open(_AUTOGROUP.format(pid), "w", encoding="ascii") as handle:
            handle.write(str(level))


RETRY = 0.11  # s: the kernel takes one write of a group's niceness per 0.1 s from an unprivileged process


def restore(pid: int, tries: int = 10) -> bool:
    """The scheduling group of ``pid``'s session (one :func:`spawn` lowered with ``nice``) raised back to this
    process's level: the build now waits for that work, which must not wait behind other sessions. Allowed
    without privilege, one write per 0.1 s across the machine (``EAGAIN`` otherwise: tried again, ``tries``
    times). Whether the group is at that level now (True where there is no group, or no process any more)."""
    level = _level()
    for attempt in range(tries):
        if _group_nice(pid) <= level:  # 0 where there is no group (or no process) to read
            return True
        try:
            with open(_AUTOGROUP.format(pid), "w", encoding="ascii") as handle:
                handle.write(str(level))
        except BlockingIOError:
            if attempt + 1 < tries:
                time.sleep(RETRY)
        except OSError:  # refused, or the process ended meanwhile: what the group reads says which
            break
    return _group_nice(pid) <= level


def _group_alive(pgid: int) -> bool:
    """Whether a member of process group ``pgid`` still runs. A zombie does not: it is dead, only not yet
    reaped, and who reaps it may take seconds (the init of this machine, for the pid-1 process of a sandbox
    whose bubblewrap died first)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return any(state not in "ZX" for state in _member_states(pgid))


def _member_states(pgid: int) -> Iterator[str]:
    """The state letter (``ps``'s STAT) of each process of group ``pgid``, read from /proc."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue  # gone meanwhile
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses, the last ')' ends it
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid:
            yield fields[0].decode("ascii", "replace")


def kill_group(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL whatever is left of ``proc``'s process group (stragglers after the leader exited)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X")


def end_group(pgid: int | None, *, pid: int | None = None, wait: float = 2.0) -> None:
    """SIGKILL process group ``pgid`` (and ``pid``, which need not lead it), without a word first: for what
    a stopping run must not wait on (the compiler cache's server and the compiles it runs). Returns once
    none of them runs, or after ``wait`` seconds."""
    for kill, target in ((os.killpg, pgid), (os.kill, pid)):
        if target is not None and target > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(target, signal.SIGKILL)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and (
        (pgid is not None and _group_alive(pgid)) or (pid is not None and _running(pid))
    ):
        time.sleep(0.01)


def stop_group(proc: subprocess.Popen[Any], *, grace: float | None = None) -> None:
    """Stop ``proc``'s whole process group: SIGTERM, then SIGKILL after ``grace`` seconds (default
    :data:`KILL_GRACE_S`, :data:`STOP_GRACE_S` once this run is :func:`stopping`). Returns once the leader and
    every other member are gone, so nothing keeps compiling."""
    if grace is None:
        grace = STOP_GRACE_S if stopping() else KILL_GRACE_S
    pgid = proc.pid  # start_new_session: the process leads its own group
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _group_alive(pgid):
        kill_group(proc)
        proc.wait()
        while _group_alive(pgid) and time.monotonic() < deadline + grace:
            time.sleep(0.05)


# --------------------------------------------------------------------------------------------------
# Running to completion with captured output.
# --------------------------------------------------------------------------------------------------


def finish(
    proc: subprocess.Popen[Any],
    *,
    timeout: float | None = None,
    redact: Redact = _same,
    reap: bool = False,
) -> Completed:
    """Wait for ``proc`` (started by :func:`spawn`) up to ``timeout`` seconds; past it, stop its group and
    report ``returncode=None``. ``reap`` also kills members of its group still running after it exited
    (workers a crashed launcher left behind). An interrupt stops the group and propagates."""
    start = time.monotonic()
    argv = tuple(str(a) for a in proc.args) if isinstance(proc.args, list | tuple) else (str(proc.args),)
    try:
        try:
            out, err = proc.communicate(timeout=timeout)
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out, err = proc.communicate()
            code = None
    except BaseException as exc:
        _note_interrupt(exc)
        stop_group(proc)
        raise
    finally:
        if reap:
            kill_group(proc)
    return Completed(argv, code, redact(out or ""), redact(err or ""), time.monotonic() - start)


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float | None = None,
    check: bool = False,
    capture: bool = True,
    redact: Redact = _same,
    reap: bool = False,
    errors: str = "replace",
) -> Completed:
    """Run ``argv`` to completion (or ``timeout``). With ``check`` a non-zero exit or a timeout raises
    :class:`ProcessError` naming the command and its first error line; otherwise the caller reads
    :class:`Completed`. ``capture=False`` lets the output go to this process's stdout/stderr; ``errors`` is
    how bytes that are not UTF-8 are decoded (``surrogateescape`` keeps them)."""
    pipe = subprocess.PIPE if capture else None
    stdin = subprocess.DEVNULL if capture else None  # an interactive child (pytest --pdb) keeps the terminal
    proc = spawn(argv, env=env, cwd=cwd, stdout=pipe, stderr=pipe, errors=errors, stdin=stdin)
    result = finish(proc, timeout=timeout, redact=redact, reap=reap)
    if check and not result.ok:
        raise ProcessError(result.failure(), result)
    return result


# --------------------------------------------------------------------------------------------------
# Streaming into a log, line by line.
# --------------------------------------------------------------------------------------------------


def stream(
    argv: Sequence[str],
    *,
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    observe: Observer | None = None,
    redact: Redact = _same,
    header: str | None = None,
    measure: bool = False,
) -> Streamed:
    """Run ``argv`` with stdout and stderr merged, each line redacted, written to ``log`` (flushed, so a
    reader sees progress) and passed to ``observe``; ``observe`` returning True stops the run (its whole
    group) with ``returncode=None``. An interrupt (Ctrl-C, or SIGTERM turned into an exception) stops the
    group before it propagates. ``measure``: the run's peak memory is measured (:mod:`torchkiln.process.peak`)."""
    start = time.monotonic()
    report = log.with_name(log.name + ".peak") if measure else None
    command = [sys.executable, "-I", "-S", peak.__file__, str(report), *argv] if report else argv
    proc = spawn(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=False)
    assert proc.stdout is not None
    tail: list[str] = []
    stopped = False
    finished = False
    measured: int | None = None
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w", encoding="utf-8") as handle:
            if header is not None:
                handle.write(redact(header) + "\n")
            for raw in proc.stdout:
                line = redact(raw.decode("utf-8", errors="replace"))
                handle.write(line)
                handle.flush()
                tail.append(line.rstrip("\n"))
                if len(tail) > TAIL_KEEP:
                    del tail[: TAIL_KEEP // 2]
                if observe is not None and observe(line):
                    stopped = True
                    break
        if not stopped:
            proc.wait()
            finished = True
            measured = _reported_peak(report) if report else None
    except OSError as exc:  # the log's disk is full or gone: say which file
        raise name_path(exc, log) from None
    except BaseException as exc:
        _note_interrupt(exc)
        raise
    finally:
        if not finished:  # stopped by the observer, Ctrl-C or a stop signal
            stop_group(proc)
        proc.stdout.close()
        if report is not None:
            report.unlink(missing_ok=True)
    return Streamed(
        tuple(argv), None if stopped else proc.returncode, time.monotonic() - start, log, tail, measured
    )


def _reported_peak(report: Path) -> int | None:
    """The peak :mod:`torchkiln.process.peak` wrote (bytes); None if it wrote none."""
    try:
        return int(report.read_text(encoding="ascii"))
    except (OSError, ValueError):
        return None
