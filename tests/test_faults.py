"""Faults end in a clear message and a state the next run recovers from (issue 14, items 5, 7, 8, 9).

Real filesystems and real processes: a full tmpfs gives a real ENOSPC and a read-only one a real EROFS (as
root; skipped with the reason otherwise), the builds are the real plan and builder restricted to the fetch
steps and publish (real git against a local repository: nothing compiles), and the "other build" sharing
dist/ is another process.
"""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from kit import ROOT
from kit.imagekit import require
from kit.smallfs import fill
from rich.console import Console
from test_build_fetch import fetch_recipe_text, git

from torchkiln import cli
from torchkiln.build.loop import BuildOptions, BuildResult, run_build
from torchkiln.cache import resolve_cache
from torchkiln.errors import TorchkilnError, describe_os_error
from torchkiln.files.atomic import PARTIAL_MARK
from torchkiln.plan.make import make_plan
from torchkiln.recipe.loader import parse_recipe

FETCH_CHAIN = [f"torch:fetch:{n}" for n in ("init", "remote", "fetch-ref", "checkout", "submodule")]


def fetch_build(work: Path, dist: Path, url: str, *, force: bool = False) -> tuple[BuildResult, str]:
    """The real plan's fetch steps and publish, run by the real builder; (result, what it printed)."""
    recipe = parse_recipe(fetch_recipe_text(url, "v1").encode(), "fetch-test.toml")
    cache = resolve_cache(recipe.cache, kind="none")
    plan = make_plan(recipe, workdir=work, dist=dist, only="torch", cache=cache)
    plan = replace(plan, steps=[s for s in plan.steps if s.kind in ("fetch", "publish")])
    out = io.StringIO()
    console = Console(file=out, width=300, force_terminal=False)
    result = run_build(plan, BuildOptions(console=console, skip_postcheck=True, force=force))
    return result, out.getvalue()


def torchkiln(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "torchkiln", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


# --------------------------------------------------------------------------------------------------
# Item 8: disk and permission faults, through the one error boundary.
# --------------------------------------------------------------------------------------------------


def test_the_error_boundary_names_path_errno_and_what_to_do() -> None:
    line = describe_os_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/d/x.whl"))
    assert line.startswith("/d/x.whl: No space left on device (ENOSPC): the filesystem at / has ")
    assert line.endswith("; completed steps are kept, a rerun continues")
    line = describe_os_error(OSError(errno.EROFS, os.strerror(errno.EROFS)), path="/d")
    assert line.startswith("/d: Read-only file system (EROFS); ") and "writable location" in line


def test_cli_turns_a_full_disk_into_one_line_not_a_traceback(tmp_path: Path, mount) -> None:
    full = mount("full", "size=256k")
    fill(full)
    recipe = tmp_path / "r.toml"
    recipe.write_text(fetch_recipe_text("file:///nonexistent", "v1"))
    done = torchkiln(
        "build", str(recipe), "--workdir", str(full / "work"), "--dist", str(tmp_path / "d"), "--no-preflight",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert (
        f"{full / 'work' / 'build.lock'}: No space left on device (ENOSPC): the filesystem at {full} has "
        in done.stderr
    )
    assert done.stderr.count("\n") == 1 and " free of 256.0 KiB; free space on that filesystem" in done.stderr


def test_read_only_dist_is_refused_before_the_first_step(tmp_path: Path, repo, mount) -> None:
    dist = mount("ro", "ro,size=64k")
    with pytest.raises(
        TorchkilnError, match=r"cannot publish into --dist: .*Read-only file system \(EROFS\)"
    ):
        fetch_build(tmp_path / "work", dist, repo["url"])
    assert not (tmp_path / "work" / "src").exists(), "refused before fetching anything"


def test_dist_that_is_a_file_or_holds_a_directory_for_the_manifest_is_refused(tmp_path: Path, repo) -> None:
    dist = tmp_path / "dist"
    dist.write_text("not a directory\n")
    with pytest.raises(TorchkilnError, match=r"dist: is a file, where the build publishes its wheels"):
        fetch_build(tmp_path / "work", dist, repo["url"])
    dist.unlink()
    (dist / "manifest.json").mkdir(parents=True)
    with pytest.raises(TorchkilnError, match=r"manifest.json: is a directory, where the build writes a file"):
        fetch_build(tmp_path / "work", dist, repo["url"])
    (dist / "manifest.json").rmdir()
    result, _ = fetch_build(tmp_path / "work", dist, repo["url"])
    assert result.manifest.is_file()


def test_full_dist_fails_naming_the_file_leaves_no_partial_and_the_rerun_publishes(
    tmp_path: Path, repo, mount
) -> None:
    dist = mount("dist", "size=256k")
    filler = fill(dist)
    with pytest.raises(OSError) as info:
        fetch_build(tmp_path / "work", dist, repo["url"])
    assert info.value.errno == errno.ENOSPC and str(dist) in str(info.value.filename)
    assert sorted(p.name for p in dist.iterdir()) == ["filler"], "no partial file is left"
    filler.unlink()
    again, _ = fetch_build(tmp_path / "work", dist, repo["url"])
    assert again.ran == [], "the fetch steps were kept: the rerun only publishes"
    assert json.loads(again.lock.read_text())["sources"]["torch"]["commit"] == repo["v1"]


def test_full_logs_disk_names_the_log(tmp_path: Path, repo, mount) -> None:
    logs = mount("logs", "size=256k")
    fill(logs)
    work = tmp_path / "work"
    work.mkdir()
    (work / "logs").symlink_to(logs)
    with pytest.raises(OSError) as info:
        fetch_build(work, tmp_path / "dist", repo["url"])
    assert info.value.errno == errno.ENOSPC and str(info.value.filename).endswith(".log")


# --------------------------------------------------------------------------------------------------
# Item 9: corrupted state files, leftovers of killed runs.
# --------------------------------------------------------------------------------------------------


def test_damaged_step_records_run_those_steps_again(tmp_path: Path, repo) -> None:
    work, dist = tmp_path / "work", tmp_path / "dist"
    fetch_build(work, dist, repo["url"])
    state = json.loads((work / "state.json").read_text())
    state["steps"]["torch:fetch:remote"] = "a string where a step record belongs"
    state["steps"]["torch:fetch:submodule"]["outputs"] = {"head": 42}
    (work / "state.json").write_text(json.dumps(state))
    again, out = fetch_build(work, dist, repo["url"])
    # a record missing in the middle of the fetch chain: the checkout starts over (`git remote add` again
    # on the old checkout would fail)
    assert again.ran == FETCH_CHAIN
    assert "the record of torch:fetch:remote is damaged" in out
    third, _ = fetch_build(work, dist, repo["url"])
    assert third.ran == []


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("state.json", "dir"),
        ("build.lock", "dir"),
        ("logs", "file"),
        ("wheelhouse", "file"),
        ("state.json", "garbage"),
    ],
)
def test_workdir_entries_of_the_wrong_type_are_repaired(tmp_path: Path, repo, name: str, make: str) -> None:
    work, dist = tmp_path / "work", tmp_path / "dist"
    fetch_build(work, dist, repo["url"])
    target = work / name
    if target.is_dir():
        import shutil

        shutil.rmtree(target)
    else:
        target.unlink(missing_ok=True)
    if make == "dir":
        (target / "inner").mkdir(parents=True)
    else:
        target.write_bytes(b"\xff{not json" if make == "garbage" else b"a file\n")
    result, out = fetch_build(work, dist, repo["url"])
    assert result.manifest.is_file()
    assert (work / "state.json").is_file() and (work / "logs").is_dir()
    if make != "garbage" and name != "build.lock":
        assert f"removed {target}: " in out


def test_partials_of_killed_writers_are_removed_from_workdir_and_dist(tmp_path: Path, repo) -> None:
    work, dist = tmp_path / "work", tmp_path / "dist"
    fetch_build(work, dist, repo["url"])
    for target in (work / "state.json", dist / "manifest.json"):
        holder = _writer(target)  # a real writer, then SIGKILLed mid-write
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    left = [p for d in (work, dist) for p in d.iterdir() if p.name.startswith(PARTIAL_MARK)]
    assert len(left) == 2
    _, out = fetch_build(work, dist, repo["url"])
    assert not [p for d in (work, dist) for p in d.iterdir() if p.name.startswith(PARTIAL_MARK)]
    assert out.count("removed a partial file left by an interrupted build") == 2


# --------------------------------------------------------------------------------------------------
# Item 7: a damaged checkout is fetched again, never taken as unchanged.
# --------------------------------------------------------------------------------------------------


def _damage(checkout: Path, how: str) -> None:
    import shutil

    if how == "no .git":
        shutil.rmtree(checkout / ".git")
    elif how == "empty dir":
        shutil.rmtree(checkout)
        checkout.mkdir()
    elif how == "no objects":
        shutil.rmtree(checkout / ".git" / "objects")
    elif how == "objects emptied":
        for child in (checkout / ".git" / "objects").iterdir():
            shutil.rmtree(child)
    elif how == "a file":
        shutil.rmtree(checkout)
        checkout.write_text("a file where the checkout was\n")


@pytest.mark.parametrize("how", ["no .git", "empty dir", "no objects", "objects emptied", "a file"])
def test_a_damaged_checkout_is_fetched_again(tmp_path: Path, repo, how: str) -> None:
    work, dist = tmp_path / "work", tmp_path / "dist"
    fetch_build(work, dist, repo["url"])
    checkout = work / "src" / "pytorch"
    _damage(checkout, how)
    again, _ = fetch_build(work, dist, repo["url"])
    assert again.ran == FETCH_CHAIN
    assert git(checkout, "rev-parse", "HEAD") == repo["v1"]
    assert (checkout / "VERSION").read_text() == "v1"
    third, _ = fetch_build(work, dist, repo["url"])
    assert third.ran == []


# --------------------------------------------------------------------------------------------------
# Item 5: a shared dist/: a build removes only its own partial files.
# --------------------------------------------------------------------------------------------------

WRITER = (
    "import sys, pathlib\n"
    "from torchkiln.files import atomic\n"
    "with atomic.replacing(pathlib.Path(sys.argv[1])) as handle:\n"
    "    handle.write(b'first half ')\n"
    "    handle.flush()\n"
    "    print('writing', flush=True)\n"
    "    sys.stdin.readline()\n"
    "    handle.write(b'second half')\n"
)


def _writer(target: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(target)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "writing\n"
    return proc


def test_a_second_build_leaves_a_first_builds_in_flight_file_in_a_shared_dist(tmp_path: Path, repo) -> None:
    dist = tmp_path / "dist"
    dist.mkdir()
    first = _writer(dist / "other-recipe.whl")  # another build, publishing into the same dist/
    try:
        result, out = fetch_build(tmp_path / "work", dist, repo["url"])
        assert result.manifest.is_file()
        assert [p for p in dist.iterdir() if p.name.startswith(PARTIAL_MARK)], (
            "the in-flight file is still there"
        )
        assert "removed a partial file" not in out
    finally:
        assert first.stdin is not None
        first.stdin.write("go\n")
        first.stdin.close()
        assert first.wait(timeout=30) == 0
    assert (dist / "other-recipe.whl").read_bytes() == b"first half second half"


def test_cli_main_is_the_boundary_for_oserror(tmp_path: Path, capsys) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_text(fetch_recipe_text("file:///nonexistent", "v1"))
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the workdir's parent belongs\n")
    code = cli.main(
        [
            "build",
            str(recipe),
            "--workdir",
            str(blocker / "work"),
            "--dist",
            str(tmp_path / "d"),
            "--no-preflight",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert f"{blocker / 'work'}: Not a directory (ENOTDIR); a file stands where a directory belongs" in err


def test_dist_this_user_cannot_write_is_refused_before_the_first_step(tmp_path: Path) -> None:
    """Mode 555 means nothing to root (CAP_DAC_OVERRIDE): as root, torchkiln runs without the capabilities
    that bypass mode bits (setpriv --bounding-set), still as root, so the checkout and its venv stay readable
    wherever they are (a newcomer's clone in /root is mode 0700: nobody could not import torchkiln there)."""
    import shutil

    prefix: list[str] = []
    if os.geteuid() == 0:
        require(shutil.which("setpriv") is not None, "needs setpriv (util-linux) to drop CAP_DAC_OVERRIDE")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    locked.chmod(0o555)
    recipe = tmp_path / "r.toml"
    recipe.write_text(fetch_recipe_text("file:///nonexistent", "v1"))
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT / "src"), "HOME": str(tmp_path)}
    done = subprocess.run(
        [*prefix, sys.executable, "-m", "torchkiln", "build", str(recipe), "--workdir", str(tmp_path / "work"),
         "--dist", str(locked / "dist"), "--no-preflight"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"cannot publish into --dist: {locked}: Permission denied (EACCES)" in done.stderr
    assert not (tmp_path / "work" / "src").exists()
    locked.chmod(0o755)


def test_a_message_built_from_per_file_failures_names_a_few_and_counts_the_rest(tmp_path: Path) -> None:
    """shutil.copytree goes on past each failure and raises one error per file: 26,459 of them for a venv on a
    full disk (issue 27 item 3). Its message is one line: how many, the first few."""
    import shutil

    from torchkiln.errors import few

    failures = [
        (f"/s/f{i}", f"/t/f{i}", f"[Errno 28] No space left on device: '/t/f{i}'") for i in range(26459)
    ]
    line = describe_os_error(shutil.Error(failures), path="/t")
    assert line.startswith(
        "/t: 26459 file(s) could not be copied: [Errno 28] No space left on device: '/t/f0', "
    )
    assert "'/t/f2' and 26456 more; " in line and "\n" not in line and len(line) < 400
    assert few(["a", "b"]) == "a, b" and few(list("abcdefg")) == "a, b, c, d, e and 2 more"
