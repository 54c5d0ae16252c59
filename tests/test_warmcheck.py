"""The check venv cloned while the compile runs (issue 38, torchkiln.build.warmcheck): taken by checks:venv only
when it is whole and a clone of the build venv as that venv is now. Real venvs (this Python's ``venv``), real
threads, real ``cp --link`` clones; a directory stands in for the environment store's entry."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from packaging.utils import canonicalize_name

from torchkiln.build import checkvenv, earlycheck, venvprune
from torchkiln.build.envstore import clone_tree, relocate_venv
from torchkiln.build.warmcheck import MARK, Warming, take, warm_path
from torchkiln.plan.model import Step
from torchkiln.process import runner

pytestmark = pytest.mark.integration  # real venvs with pip, clones of them

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def entry(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A store entry's venv, kept from another work directory's path (its scripts name that path)."""
    root = tmp_path_factory.mktemp("store")
    kept_from = root / "old-work" / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(kept_from)], check=True)
    (kept_from / "bin" / "tool").write_text(f"#!{kept_from}/bin/python\nprint('tool')\n")
    (kept_from / "bin" / "tool").chmod(0o755)
    entry_venv = root / "entry" / "venv"
    clone_tree(kept_from, entry_venv)
    return entry_venv, str(kept_from)


def work(tmp_path: Path, entry: tuple[Path, str]) -> tuple[Path, Path, Step]:
    """A work directory whose build venv was cloned from the entry, and its checks:venv step."""
    build_venv, check_venv = tmp_path / "work" / "venv", tmp_path / "work" / "check-venv"
    clone_tree(entry[0], build_venv)
    relocate_venv(build_venv, entry[1], str(build_venv))
    step = Step("checks:venv", "checks", "", ("true",), venv=str(check_venv), clones=str(build_venv))
    return build_venv, check_venv, step


def prefix(python: Path) -> str:
    done = subprocess.run([python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True)
    return done.stdout.strip()


def test_a_warm_clone_is_the_check_venv_relocated_to_its_path(tmp_path: Path, entry) -> None:
    build_venv, check_venv, step = work(tmp_path, entry)
    warming = Warming()
    warming.cloned(str(build_venv), *entry)
    warming.start([step, Step("torchvision:wheel", "compile", "torchvision", ("true",))])
    warming.join(step.venv)
    warm = warm_path(check_venv)
    assert (warm / MARK).read_text() == str(build_venv)
    assert take(warm, build_venv, check_venv) == () and not warm.exists()  # no prune predicted
    assert not (check_venv / MARK).exists()
    assert (check_venv / "bin" / "tool").read_text().startswith(f"#!{check_venv}/bin/python\n")
    assert prefix(check_venv / "bin" / "python") == str(check_venv)
    warming.finish()
    assert check_venv.is_dir(), "what was taken stays"


def test_a_venv_changed_after_its_clone_from_the_store_drops_its_warm_clone(tmp_path: Path, entry) -> None:
    """A whole build's torch compile warms the check venv; install-torch then puts that torch into the build
    venv: the warm clone, of the venv before, must not be taken."""
    build_venv, check_venv, step = work(tmp_path, entry)
    warming = Warming()
    warming.cloned(str(build_venv), *entry)
    warming.start([step])
    warming.changed(str(build_venv))
    assert not warm_path(check_venv).exists()
    warming.start([step])
    assert not warming.threads, "no origin any more: nothing warmed"


@pytest.mark.parametrize("damage", ["no mark", "another venv's mark", "no clone"])
def test_a_warm_clone_that_is_not_whole_or_not_of_this_venv_is_not_taken(
    tmp_path: Path, entry, damage: str
) -> None:
    build_venv, check_venv, _ = work(tmp_path, entry)
    warm = warm_path(check_venv)
    if damage != "no clone":
        clone_tree(entry[0], warm)
    if damage == "another venv's mark":
        (warm / MARK).write_text(str(tmp_path / "other" / "venv"))
    assert take(warm, build_venv, check_venv) is None
    assert not warm.exists() and not check_venv.exists()


def test_a_warm_clone_no_step_takes_is_removed(tmp_path: Path, entry) -> None:
    build_venv, check_venv, step = work(tmp_path, entry)
    warming = Warming()
    warming.cloned(str(build_venv), *entry)
    warming.start([step])
    warming.drop(step.venv)  # checks:venv reused from the store
    warming.finish()
    assert not warm_path(check_venv).exists() and not warming.threads


def test_checkvenv_takes_the_warm_clone_and_prunes_it(tmp_path: Path, entry) -> None:
    build_venv, check_venv, step = work(tmp_path, entry)
    warming = Warming()
    warming.cloned(str(build_venv), *entry)
    warming.start([step])
    warming.join(step.venv)
    argv = ["--from", str(build_venv), "--python", "python3", "--keep=torch"]
    assert checkvenv.main([*argv, "--warm", str(warm_path(check_venv)), "--", str(check_venv)]) == 0
    assert not warm_path(check_venv).exists()
    assert prefix(check_venv / "bin" / "python") == str(check_venv)
    assert (check_venv / "bin" / "tool").read_text().startswith(f"#!{check_venv}/bin/python\n")


def test_a_warm_clone_whose_predicted_prune_removed_what_the_wheels_need_is_cloned_again(
    tmp_path: Path, entry, capsys: pytest.CaptureFixture[str]
) -> None:
    """The mark lists what a prune that predicted the wheels' requirements removed (build.earlycheck); when
    the real requirements need one of them, venvprune says so and checks:venv clones the build venv again:
    the check venv holds what a check venv made without the prediction holds."""
    build_venv, check_venv, _ = work(tmp_path, entry)
    (site,) = build_venv.glob("lib/python*/site-packages")
    needed = site / "kiln_needed-1.0.dist-info"  # a distribution of the build venv the wheels require
    needed.mkdir()
    (needed / "METADATA").write_text("Metadata-Version: 2.1\nName: kiln-needed\nVersion: 1.0\n")
    (needed / "RECORD").write_text(
        "kiln_needed-1.0.dist-info/METADATA,,\nkiln_needed-1.0.dist-info/RECORD,,\n"
    )
    warm = warm_path(check_venv)
    clone_tree(entry[0], warm)  # without it, as the predicted prune left it
    relocate_venv(warm, entry[1], str(check_venv))
    (warm / MARK).write_text(f"{build_venv}\nkiln-needed")
    argv = ["--from", str(build_venv), "--python", "python3", "--keep=kiln-needed"]
    assert checkvenv.main([*argv, "--warm", str(warm), "--", str(check_venv)]) == 0
    out = capsys.readouterr().out
    assert "cloned again (the warm clone's prune removed what the wheels need)" in out, out
    assert (next(check_venv.glob("lib/python*/site-packages")) / needed.name / "METADATA").is_file()
    assert prefix(check_venv / "bin" / "python") == str(check_venv) and not warm.exists()


def test_checkvenv_and_venvprune_agree_on_the_mispredicted_status() -> None:
    """venvprune runs in the check venv with the standard library and pip only: the status is kept twice."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import venvprune; print(venvprune.MISPREDICTED)",
         str(Path(checkvenv.PRUNE).parent)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert int(done.stdout) == checkvenv.MISPREDICTED


class Started:
    """An :class:`~torchkiln.build.warmcheck.Early` whose check is a real process (``sleep``): what the
    warm clone's thread does with it, not what it starts (tests/test_postcheck_overlap.py has the server)."""

    def __init__(self, removed: tuple[str, ...] | None = (), *, foreseen: bool = True) -> None:
        self.removed, self.procs, self.saw, self.seen, self.linked = removed, [], [], foreseen, []
        self.hurried = 0

    def foreseen(self, step: Step) -> bool:
        return self.seen

    def link(self, source: Path, target: Path) -> None:
        self.linked.append(target)
        clone_tree(source, target)

    def prune(self, step: Step, warm: Path) -> tuple[str, ...] | None:
        return self.removed

    def complete(self, check: Step, venv: Path) -> None:
        self.completed = venv

    def halt(self) -> None:
        pass

    def hurry(self) -> None:
        self.hurried += 1

    def serve(self, step: Step):  # noqa: ANN201 - the protocol's stop
        self.saw.append((Path(step.venv) / MARK).read_text())  # started where the check venv will be
        proc = subprocess.Popen(["sleep", "600"])
        self.procs.append(proc)
        return lambda: (proc.kill(), proc.wait())


def check_steps(step: Step) -> list[Step]:
    check = Step("checks:import", "checks", "", ("true",), venv=step.venv, facts=True)
    return [step, Step("torchvision:wheel", "compile", "torchvision", ("true",)), check]


def test_the_check_starts_in_the_warm_clone_at_its_own_path_and_the_clone_goes_back_before_its_step(
    tmp_path: Path, entry
) -> None:
    build_venv, check_venv, step = work(tmp_path, entry)
    early = Started(removed=("setuptools", "wheel"))
    warming = Warming(early=early)
    warming.cloned(str(build_venv), *entry)
    warming.start(check_steps(step))
    warming.threads[step.venv][0].join()
    assert early.saw == [f"{build_venv}\nsetuptools\nwheel"], (
        "started in the marked clone at the check venv's path"
    )
    assert early.linked == [warm_path(check_venv)], "the clone made by the early start's link"
    assert (check_venv / MARK).is_file() and not warm_path(check_venv).exists()
    assert early.hurried == 0, "beside the compile the early work stays lowered"
    warming.join(step.venv)  # before checks:venv (or any step) decides on the check venv
    assert early.hurried == 1, "the build waits for the early work from here: no longer lowered"
    assert not check_venv.exists() and (warm_path(check_venv) / MARK).is_file()
    assert take(warm_path(check_venv), build_venv, check_venv) == ("setuptools", "wheel")
    assert prefix(check_venv / "bin" / "python") == str(check_venv)
    warming.finish()
    assert [p.poll() for p in early.procs] == [-9], "what was started is stopped when the build ends"


@pytest.mark.parametrize("case", ["check venv there", "no prediction", "no check step"])
def test_the_check_is_not_started_early_where_it_cannot_be(tmp_path: Path, entry, case: str) -> None:
    """A check venv already at its path (an earlier build's) is never replaced while the compile runs; without
    a prediction the clone is what it was before; a plan without the check has nothing to start."""
    build_venv, check_venv, step = work(tmp_path, entry)
    if case == "check venv there":
        check_venv.mkdir(parents=True)
        (check_venv / "earlier").write_text("kept")
    early = Started(removed=None if case == "no prediction" else ())
    warming = Warming(early=early)
    warming.cloned(str(build_venv), *entry)
    warming.start(check_steps(step)[:2] if case == "no check step" else check_steps(step))
    warming.join(step.venv)
    assert early.procs == [] and (warm_path(check_venv) / MARK).read_text() == str(build_venv)
    assert (
        (check_venv / "earlier").read_text() == "kept"
        if case == "check venv there"
        else not check_venv.exists()
    )
    warming.finish()


def test_a_build_venv_changed_after_the_check_started_early_drops_the_clone_at_the_check_venv_path(
    tmp_path: Path, entry
) -> None:
    build_venv, check_venv, step = work(tmp_path, entry)
    early = Started()
    warming = Warming(early=early)
    warming.cloned(str(build_venv), *entry)
    warming.start(check_steps(step))
    warming.changed(str(build_venv))
    assert not check_venv.exists() and not warm_path(check_venv).exists()
    warming.finish()
    assert [p.poll() for p in early.procs] == [-9]


# --- checks:venv's clone made outside its sandbox (Warming.settle) ---------------------------------------------


def inode(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino


@pytest.mark.parametrize(
    "case",
    ["the thread's clone failed", "the prune the wheels go beyond", "the prune the wheels stay within"],
)
def test_checks_venv_finds_a_warm_clone_made_outside_its_sandbox_where_it_would_clone_itself(
    tmp_path: Path, entry, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """In checks:venv's sandbox the store and the work directory are separate mounts: a clone made there copies
    every file. So before the step a clone the thread did not leave whole, or one whose predicted prune the
    built wheels' requirements go beyond, is made again here: unpruned, marked, its files the entry's."""
    build_venv, check_venv, step = work(tmp_path, entry)
    early = Started(removed=("setuptools",), foreseen=case != "the prune the wheels go beyond")
    warming = Warming(early=early)
    warming.cloned(str(build_venv), *entry)
    warming.start(check_steps(step))
    warming.join(step.venv)
    warm = warm_path(check_venv)
    if case == "the thread's clone failed":
        subprocess.run(["rm", "-rf", str(warm)], check=True)  # what _warm leaves where it fails
    warming.settle(step)
    expected = f"{build_venv}\nsetuptools" if case == "the prune the wheels stay within" else str(build_venv)
    assert (warm / MARK).read_text() == expected
    (pip_init,) = warm.glob("lib/python*/site-packages/pip/__init__.py")
    assert inode(pip_init) == inode(entry[0] / pip_init.relative_to(warm)), "hard links to the entry's files"
    argv = ["--from", str(build_venv), "--python", "python3", "--keep=torch"]
    assert checkvenv.main([*argv, "--warm", str(warm), "--", str(check_venv)]) == 0
    assert "made before this step" in capsys.readouterr().out
    assert prefix(check_venv / "bin" / "python") == str(check_venv)
    warming.finish()


def test_settle_leaves_alone_a_venv_no_entry_stands_for(tmp_path: Path, entry) -> None:
    """A build venv with no origin (made or changed by this run's steps): checks:venv clones it, in the work
    directory, where hard links work."""
    build_venv, check_venv, step = work(tmp_path, entry)
    warming = Warming(early=Started(foreseen=False))
    warming.settle(step)
    assert not warm_path(check_venv).exists()


def wheel_with(tmp_path: Path, requires: list[str] | None, *, metadata: bool = True) -> Path:
    """A wheel whose METADATA is upstream's, torchvision 0.21.0's as PyPI's wheel carries it
    (tests/data/wheel_metadata/), with its Requires-Dist lines replaced by ``requires`` (None: as it is)."""
    real = (DATA / "wheel_metadata" / "torchvision-0.21.0.METADATA").read_text()
    head, _, body = real.partition("\n\n")
    kept = [line for line in head.splitlines() if not line.startswith("Requires-Dist:")]
    text = (
        "\n".join([*kept, *(f"Requires-Dist: {r}" for r in requires)]) + "\n\n" + body
        if requires is not None
        else real
    )
    house = tmp_path / "wheelhouse"
    house.mkdir(exist_ok=True)
    wheel = house / "torchvision-0.21.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("torchvision/__init__.py", "")
        if metadata:
            archive.writestr("torchvision-0.21.0.dist-info/METADATA", text)
    return wheel


UPSTREAM = ["numpy", "torch (==2.6.0)", "pillow (!=8.3.*,>=5.3.0)", "gdown (>=4.7.3) ; extra == 'gdown'",
            "scipy ; extra == 'scipy'"]  # fmt: skip
# Requires-Dist lines -> whether checks:venv's prune stays within the prediction (numpy and pillow kept with torch)
FORESEEN = [
    ("upstream's 0.21.0, whole", None, True),
    ("upstream's 0.21.0 lines", UPSTREAM, True),
    ("none", [], True),
    ("another spelling", ["Pillow>=5.3", "NumPy", "Torch==2.6.0"], True),
    ("a root's extras (venvprune follows the name)", ["pillow[avif]"], True),
    ("a marker false here", [*UPSTREAM, "futures ; python_version < '3'"], True),
    ("a marker true here", [*UPSTREAM, "typing-extensions ; python_version >= '3.8'"], False),
    ("one more", [*UPSTREAM, "requests"], False),
    ("another fork of pillow", ["numpy", "pillow-simd"], False),
    ("a line no parser reads", [*UPSTREAM, "not a requirement !!"], True),
]


@pytest.mark.parametrize(("requires", "foreseen"), [r[1:] for r in FORESEEN], ids=[r[0] for r in FORESEEN])
def test_what_the_built_wheels_require_is_foreseen_only_within_the_prediction(
    tmp_path: Path, requires: list[str] | None, foreseen: bool
) -> None:
    wheel_with(tmp_path, requires)
    assert earlycheck.foreseen(prune_step(tmp_path)) is foreseen


def prune_step(tmp_path: Path) -> Step:
    argv = ("python", "-m", "torchkiln.build.checkvenv", "--keep=torch", "--drop=torchvision",
            f"--requirements-of={tmp_path / 'wheelhouse'}", "--", str(tmp_path / "check-venv"))  # fmt: skip
    return Step("checks:venv", "checks", "", argv, venv=str(tmp_path / "check-venv"))


@pytest.mark.parametrize("damage", ["not a zip", "no METADATA"])
def test_a_wheel_that_cannot_be_read_is_not_foreseen(tmp_path: Path, damage: str) -> None:
    wheel = wheel_with(tmp_path, UPSTREAM, metadata=damage != "no METADATA")
    if damage == "not a zip":
        wheel.write_bytes(b"truncated")
    assert earlycheck.foreseen(prune_step(tmp_path)) is False


def test_no_wheel_built_is_nothing_beyond_the_prediction(tmp_path: Path) -> None:
    assert earlycheck.foreseen(prune_step(tmp_path)) is True


# Requires-Dist lines from PEP 508's grammar: names in any spelling, extras, version specifiers in both forms,
# markers true and false here, extras-only markers; foreseen must read them as venvprune (the tool that prunes,
# with pip's own packaging) reads them.
NAMES = [
    "numpy",
    "NumPy",
    "pillow",
    "Pillow",
    "torch",
    "requests",
    "pillow-simd",
    "typing_extensions",
    "Typing.Extensions",
]
MARKERS = ["", " ; python_version >= '3.8'", " ; python_version < '3'", " ; extra == 'scipy'",
           ' ; sys_platform == "linux"', ' ; sys_platform == "win32"', " ; platform_machine != 'x86_64'"]  # fmt: skip
requirement = st.builds(
    lambda name, extras, spec, marker: f"{name}{extras}{spec}{marker}",
    st.sampled_from(NAMES),
    st.sampled_from(["", "[avif]", "[a,b]"]),
    st.sampled_from(["", "==2.6.0", " (==2.6.0)", " (!=8.3.*,>=5.3.0)", ">=1.0,<3"]),
    st.sampled_from(MARKERS),
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(["numpy", "torch (==2.6.0)", "pillow (!=8.3.*,>=5.3.0)", "scipy ; extra == 'scipy'"])
@example(["Typing.Extensions ; python_version >= '3.8'"])
@given(st.lists(requirement, max_size=6))
def test_foreseen_reads_requires_dist_as_venvprune_does(tmp_path: Path, lines: list[str]) -> None:
    house = tmp_path / "wheelhouse"
    subprocess.run(["rm", "-rf", str(house)], check=True)
    wheel = wheel_with(tmp_path, lines)
    pruned = {canonicalize_name(name) for name in venvprune.wheel_requirements(wheel)}
    assert earlycheck.foreseen(prune_step(tmp_path)) is (pruned <= {"torch", "numpy", "pillow"})


def test_the_warm_clone_beside_the_compile_is_made_by_hard_links_in_a_lowered_session(
    tmp_path: Path, entry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EarlyStart.link, the warm clone's cp while the compile runs: hard links to the entry's files, by a
    process of this run in a session whose scheduling group is at the lowest priority, the process itself
    not lowered (what runner.spawn's ``nice`` gives is tests/test_runner.py's; this reads what the cp itself
    ran at)."""
    seen: list[tuple[int, str | None]] = []
    real = runner.spawn

    def spawn(argv, **kwargs):  # noqa: ANN001, ANN202 - runner.spawn's own, watched
        proc = real(argv, **kwargs)
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # the cp ended, not reaped: its last state
        group = Path(f"/proc/{proc.pid}/autogroup")
        nice = int(Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()[16])
        seen.append((nice, group.read_text().split()[-1] if group.exists() else None))
        return proc

    monkeypatch.setattr(runner, "spawn", spawn)
    early = earlycheck.EarlyStart(setup=None, record=None, kinds={})  # type: ignore[arg-type]
    target = tmp_path / "work" / "check-venv.warm"
    early.link(entry[0], target)
    source_python, cloned_python = entry[0] / "bin" / "tool", target / "bin" / "tool"
    assert cloned_python.stat().st_ino == source_python.stat().st_ino, "a hard link, not a copy"
    assert sorted(p.relative_to(target) for p in target.rglob("*")) == sorted(
        p.relative_to(entry[0]) for p in entry[0].rglob("*")
    )
    assert [nice for nice, _ in seen] == [os.getpriority(os.PRIO_PROCESS, 0)], "the process: as this one"
    assert seen[0][1] in (None, str(earlycheck.LOWEST)), "its session's group lowered where there are groups"
    assert early.live == []


def groups(procs: list[subprocess.Popen[str]]) -> list[int]:
    return [runner._group_nice(proc.pid) for proc in procs]


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="this kernel has no autogroups")
def test_once_the_build_waits_nothing_of_the_early_work_stays_lowered() -> None:
    """The invariant of build.earlycheck: the build never waits on work it lowered. What runs while the
    compile runs starts in a group at LOWEST; hurry (Warming.join, where the build starts waiting) raises
    every such group still running to this process's level, and what starts after it starts there. Threads
    start work while another hurries: whatever the order, nothing started is left lowered once both end."""
    level = runner._level()
    early = earlycheck.EarlyStart(setup=None, record=None, kinds={})  # type: ignore[arg-type]
    started: list[subprocess.Popen[str]] = []
    try:
        for _ in range(2):
            time.sleep(runner.RETRY)  # one unprivileged write per 0.1 s: each lowering its own
            started.append(early._spawn(["sleep", "60"]))
        assert groups(started) == [max(level, earlycheck.LOWEST)] * 2, "lowered beside the compile"
        done = subprocess.Popen(["true"])
        done.wait()
        early.lowered.append(done)  # one that ended: nothing to raise
        early.hurry()
        assert groups(started) == [level] * 2, "raised back once the build waits"
        started.append(early._spawn(["sleep", "60"]))
        assert groups(started[-1:]) == [level], "started after: not lowered"
        for _ in range(5):  # a thread starting the next step's process while the build begins to wait
            other = earlycheck.EarlyStart(setup=None, record=None, kinds={})  # type: ignore[arg-type]
            thread = threading.Thread(target=lambda e=other: started.append(e._spawn(["sleep", "60"])))
            thread.start()
            other.hurry()
            thread.join()
            assert groups(started[-1:]) == [level]
    finally:
        for proc in started:
            proc.kill()
            proc.wait()


def test_a_stopping_build_makes_no_warm_clone(tmp_path: Path, entry) -> None:
    early = earlycheck.EarlyStart(setup=None, record=None, kinds={})  # type: ignore[arg-type]
    early.halt()
    target = tmp_path / "check-venv.warm"
    with pytest.raises(OSError, match="stopping"):
        early.link(entry[0], target)
    assert not target.exists()


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no tmpfs at /dev/shm to clone across")
def test_a_warm_clone_across_filesystems_is_a_copy(tmp_path: Path, entry) -> None:
    """Where hard links cannot be made (the entry on another filesystem), the clone is clone_tree's copy, as
    before the early start made it: the check still finds a whole warm clone."""
    shm = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        if shm.stat().st_dev == tmp_path.stat().st_dev:
            pytest.skip("/dev/shm is on the same filesystem here")
        source = shm / "venv"
        clone_tree(entry[0], source)
        early = earlycheck.EarlyStart(setup=None, record=None, kinds={})  # type: ignore[arg-type]
        target = tmp_path / "check-venv.warm"
        early.link(source, target)
        assert (target / "bin" / "tool").read_text() == (source / "bin" / "tool").read_text()
        assert (target / "bin" / "tool").stat().st_ino != (source / "bin" / "tool").stat().st_ino
    finally:
        shutil.rmtree(shm, ignore_errors=True)
