"""The sandbox of build steps (torchkiln.process.isolation) with real bubblewrap: what a view shows, hides,
lets write; its own /proc, network, /tmp, HOME; no capabilities; and the probe's answer where bubblewrap
cannot sandbox.

Each view property is a row of a table (a path, where it lies, what the process inside must find there),
checked by one real sandboxed Python that reports on every row; milliseconds each.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import textwrap
from pathlib import Path

import pytest
from kit.imagekit import require

from torchkiln.process import isolation, runner
from torchkiln.process.isolation import Sandbox, View

REPORT = textwrap.dedent(
    """
    import json, os, sys
    out = {}
    for path in json.loads(sys.argv[1]):
        row = {"exists": os.path.lexists(path)}
        try:
            with open(path) as handle:
                row["content"] = handle.read()
        except OSError as exc:
            row["content"] = type(exc).__name__
        try:
            with open(path, "a"):
                row["writable"] = True
        except OSError:
            row["writable"] = False
        out[path] = row
    print(json.dumps(out))
    """
)


def bwrap() -> str:
    found = isolation.probe()
    require(found.ok, f"bubblewrap cannot sandbox here: {found.reason}")
    assert found.bwrap is not None
    return found.bwrap


def run_in(sandbox: Sandbox, argv: list[str], env: dict[str, str] | None = None) -> runner.Completed:
    environ = {**os.environ, **(env or {})}
    with sandbox.running(argv, environ) as prepared:
        return runner.run(prepared.argv, env=prepared.env, timeout=60)


def python_view(tmp_path: Path, **view: object) -> View:
    """A view holding this Python (its prefix and the test's own files are not: only what the rows add)."""
    prefixes = {Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable)).parent.parent}
    base = View(read_only=tuple(prefixes))
    return base.extended(**view)  # type: ignore[arg-type]


def test_a_view_shows_hides_and_protects_as_its_table_says(tmp_path: Path) -> None:
    exe = bwrap()
    work, tools, home, outside = (
        tmp_path / "work",
        tmp_path / "tools",
        tmp_path / "home",
        tmp_path / "outside",
    )
    for directory in (work, tools, home / ".config" / "pip", outside):
        directory.mkdir(parents=True)
    files = {
        "work file": (work / "a.txt", "work"),
        "record in work": (work / "state.json", "record"),
        "secret in work": (work / "kiln.key", "KEY-IN-WORK"),
        "tool": (tools / "tool.txt", "tool"),
        "secret in tools": (tools / "kiln.key", "KEY-IN-TOOLS"),
        "secret outside": (outside / "kiln.key", "KEY-OUTSIDE"),
        "home file": (home / ".netrc", "HOME-SECRET"),
        "home, mounted back": (home / ".config" / "pip" / "pip.conf", "pip"),
        "system file": (Path("/etc/hostname"), None),
        "link to a secret": (work / "key-link", None),
    }
    for path, text in files.values():
        if text is not None:
            path.write_text(text)
    (work / "key-link").symlink_to(tools / "kiln.key")  # hidden as given: the link, masked at its target
    view = python_view(
        tmp_path,
        read_only=[tools, home / ".config" / "pip" / "pip.conf"],
        writable=[work],
        protected=[work / "state.json"],
        hidden=[work / "kiln.key", work / "key-link", outside / "kiln.key"],
    )
    view = View(view.read_only, view.writable, view.protected, view.hidden, home=home)
    done = run_in(
        Sandbox(exe, view), [sys.executable, "-c", REPORT, json.dumps([str(p) for p, _ in files.values()])]
    )
    assert done.ok, done.describe()
    seen = {name: json.loads(done.stdout)[str(path)] for name, (path, _) in files.items()}
    # name -> (there, what it reads as, writable)
    expected = {
        "work file": (True, "work", True),
        "record in work": (True, "record", False),  # protected: read-only inside a writable directory
        "secret in work": (True, "", False),  # masked: an empty file over it
        "tool": (True, "tool", False),
        "secret in tools": (True, "", False),
        "secret outside": (False, "FileNotFoundError", False),  # never mounted: not there at all
        "home file": (False, "FileNotFoundError", True),  # HOME is empty (a fresh tmpfs: writable)
        "home, mounted back": (True, "pip", False),
        "system file": (True, Path("/etc/hostname").read_text(), False),
        "link to a secret": (True, "", False),
    }
    for name, (there, content, writable) in expected.items():
        assert (seen[name]["exists"], seen[name]["content"], seen[name]["writable"]) == (
            there,
            content,
            writable,
        ), name


def test_its_own_processes_tmp_home_and_environment(tmp_path: Path) -> None:
    """Only its own processes in /proc (not this one, not bubblewrap, whose argv lists the mounts), a private
    /tmp that is gone afterwards, TMPDIR pointing at it, an empty HOME, no XDG_RUNTIME_DIR, no capabilities."""
    exe = bwrap()
    script = textwrap.dedent(
        """
        import json, os
        procs = {p: open(f"/proc/{p}/cmdline", "rb").read().decode().replace("\\0", " ")
                 for p in os.listdir("/proc") if p.isdigit()}
        caps = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0]
        open("/tmp/mine", "w").write("x")
        print(json.dumps({"procs": procs, "tmp": sorted(os.listdir("/tmp")), "home": os.listdir(os.environ["HOME"]),
                          "TMPDIR": os.environ.get("TMPDIR"), "xdg": os.environ.get("XDG_RUNTIME_DIR"),
                          "caps": caps, "parent": os.getppid()}))
        """
    )
    home = tmp_path / "home"
    home.mkdir()
    (home / ".netrc").write_text("secret")
    sandbox = Sandbox(exe, View(read_only=python_view(tmp_path).read_only, home=home))
    env = {**os.environ, "TMPDIR": str(tmp_path), "XDG_RUNTIME_DIR": "/run/user/0", "KILN_MARK": "outside"}
    with sandbox.running([sys.executable, "-c", script], env) as prepared:
        assert prepared.tmp is not None and prepared.tmp.is_dir()
        done = runner.run(prepared.argv, env=prepared.env, timeout=60)
        private = prepared.tmp
    assert done.ok, done.describe()
    got = json.loads(done.stdout)
    assert list(got["procs"]) == ["1"] and got["procs"]["1"].startswith(sys.executable), got["procs"]
    assert got["parent"] == 0, "the command is the sandbox's first process: nothing above it is visible"
    assert "mine" in got["tmp"] and not private.exists(), "a private /tmp, removed afterwards"
    assert (got["TMPDIR"], got["xdg"], got["home"]) == ("/tmp", None, [])
    assert int(got["caps"], 16) == 0, "no capabilities, for root too"


@pytest.mark.parametrize("network", [False, True])
def test_network_only_when_the_view_says_so(tmp_path: Path, network: bool) -> None:
    exe = bwrap()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        script = (
            "import socket, sys\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=5).close(); print('reached')\n"
            "except OSError as exc:\n"
            "    print('refused', exc)\n"
        )
        view = python_view(tmp_path).extended(network=network)
        done = run_in(Sandbox(exe, view), [sys.executable, "-c", script])
    assert done.ok, done.describe()
    assert done.stdout.startswith("reached" if network else "refused"), done.stdout


def test_the_probe_says_why_a_host_cannot_sandbox(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "bwrap").write_text(
        "#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n"
    )
    (fake / "bwrap").chmod(0o755)
    found = isolation.probe(str(fake))
    assert not found.ok
    assert (
        found.reason
        == f"{fake / 'bwrap'} cannot make a sandbox here: bwrap: setting up uid map: Permission denied"
    )
    missing = isolation.probe(str(tmp_path / "nothing"))
    assert missing.reason == "bubblewrap (bwrap) is not installed (apt-get install bubblewrap)"


def test_a_real_bwrap_refused_user_namespaces_is_reported(tmp_path: Path) -> None:
    """A real bubblewrap inside a sandbox made with --disable-userns, as an unprivileged user: the inner one
    cannot make its namespaces, and the probe says so in bubblewrap's own words."""
    exe = bwrap()
    if os.geteuid() != 0:
        pytest.skip("runs the outer sandbox as root, the inner probe as nobody")
    script = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from torchkiln.process import isolation; "
        "found = isolation.probe(); print(json.dumps([found.ok, found.reason]))"
    )
    src = str(Path(isolation.__file__).resolve().parents[2])
    argv = [
        exe,
        "--unshare-user",
        "--uid",
        "65534",
        "--gid",
        "65534",
        "--disable-userns",
        "--ro-bind",
        "/",
        "/",
    ]
    argv += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    # this interpreter and its venv may live under /tmp, which the sandbox replaces
    for prefix in sorted({sys.prefix, sys.base_prefix, src}):
        argv += ["--ro-bind", prefix, prefix]
    argv += ["--", sys.executable, "-c", script, src]
    done = runner.run(argv, timeout=60)
    if not done.ok and "disable-userns" in done.output:
        pytest.skip(f"this bubblewrap cannot --disable-userns: {done.output.strip()}")
    assert done.ok, done.describe()
    ok, reason = json.loads(done.stdout)
    assert not ok and "cannot make a sandbox here: bwrap:" in reason, reason


# --------------------------------------------------------------------------------------------------
# The build's policy (torchkiln.build.sandbox): what each step sees, what the record says.
# --------------------------------------------------------------------------------------------------


def build_context(tmp_path: Path, environ: dict[str, str], **options: object):  # type: ignore[no-untyped-def]
    """A build's setup and record (build.context) for the test recipe's plan, as run_build makes them."""
    import io

    from rich.console import Console

    from torchkiln.build.context import BuildRecord, BuildSetup, Options
    from torchkiln.build.display import Display
    from torchkiln.build.fingerprint import State
    from torchkiln.cache import resolve_cache
    from torchkiln.plan.make import make_plan
    from torchkiln.recipe.loader import load_recipe

    recipe = load_recipe(Path(__file__).parent / "data" / "ext-cpu-test.toml")
    home = Path(environ["HOME"])
    (home / ".config" / "kiln").mkdir(parents=True, exist_ok=True)
    secret = home / ".config" / "kiln" / "cache.secret"
    secret.write_text("builder:pw\n")
    cache = resolve_cache(
        recipe.cache,
        kind="ccache",
        dir=tmp_path / "cc",
        remote="redis://127.0.0.1:1",
        credentials_file=str(secret),
    )
    src = tmp_path / "src"
    src.mkdir(parents=True, exist_ok=True)
    plan = make_plan(recipe, workdir=tmp_path / "work", source_dirs={"torch": src}, only="torch", cache=cache)
    plan.paths.workdir.mkdir(parents=True, exist_ok=True)
    display = Display(Console(file=io.StringIO()))
    state = State(plan.paths.workdir / "state.json")
    setup = BuildSetup.make(plan, Options(**options), environ, state, display)  # type: ignore[arg-type]
    return setup, BuildRecord(show=display.warn)


def test_what_a_build_step_sees_is_the_plans_not_the_users(tmp_path: Path) -> None:
    from torchkiln.build import sandbox

    home = tmp_path / "home"
    tools = home / ".local" / "bin"
    tools.mkdir(parents=True)
    key = tmp_path / "work" / "kiln.key"  # inside the work directory, which the steps see: masked
    environ = {"HOME": str(home), "PATH": f"{tools}:{home}:/usr/bin", "CUDA_HOME": "/usr/local/cuda"}
    ctx, _ = build_context(tmp_path, environ, secret_files=(str(key),))
    steps = {s.kind: s for s in ctx.plan.steps}
    env = {**environ, "PIP_FIND_LINKS": f"{tmp_path / 'wheels'} https://example.org/simple"}
    (tmp_path / "wheels").mkdir()
    for kind, network in (("env", True), ("compile", False), ("checks", True)):
        step = steps[kind]
        view = sandbox.step_view(step, ctx, env, step.argv)
        assert view.network is network, kind
        assert view.home == home
        assert {ctx.plan.paths.workdir, tmp_path / "src"} <= set(view.writable)
        assert ctx.plan.paths.workdir / "state.json" in view.protected
        assert key in view.hidden and home / ".config" / "kiln" / "cache.secret" in view.hidden
        assert tools in view.read_only, "a PATH directory under the home is the toolchain"
        assert home not in view.read_only and Path("/") not in view.read_only, "never the whole home"
        assert (tmp_path / "wheels" in view.read_only) is network, "pip's local index, for pip's steps"


def test_the_record_says_none_when_any_build_step_ran_without_a_sandbox(tmp_path: Path) -> None:
    from torchkiln.artifacts.manifest import Isolation
    from torchkiln.build import sandbox

    ctx, _ = build_context(tmp_path, {"HOME": str(tmp_path / "home")})
    built = [s for s in ctx.plan.steps if sandbox.is_build_step(s)]
    assert [s.kind for s in ctx.plan.steps if not sandbox.is_build_step(s)] == ["publish"]
    for step in built:
        ctx.state.record(step.name, {"fingerprint": "f", "outputs": {"isolation": "bubblewrap"}})
    assert sandbox.summary(ctx) == Isolation("bubblewrap", None, [])
    older = {"fingerprint": "f", "outputs": {"venv": {}}}  # a record from before isolation was: unknown
    ctx.state.record(built[1].name, older)
    ctx.state.record(built[2].name, {"fingerprint": "f", "outputs": {"isolation": "none"}})
    found = sandbox.summary(ctx)
    assert (found.mode, found.steps) == ("none", [built[1].name, built[2].name])
    # a record with no outputs of its own (its venv came with the next step's store entry) is that step's
    ctx.state.record(built[1].name, {"fingerprint": "f", "outputs": {}})
    assert sandbox.summary(ctx).steps == [built[1].name, built[2].name], "covered by a step that says none"
    ctx.state.record(built[2].name, {"fingerprint": "f", "outputs": {"isolation": "bubblewrap"}})
    assert built[1].venv is not None and built[1].venv == built[2].venv  # build-env:pip, build-env:deps
    assert sandbox.summary(ctx).steps == []
    ctx.state.record(built[1].name, older)
    assert found.reason == "ran without a sandbox in an earlier run, whose result this build used"
    off, record = build_context(tmp_path / "off", {"HOME": str(tmp_path / "home")}, isolation=False)
    with sandbox.isolated(built[0], off, record, ["true"], {}) as (argv, _):
        assert argv == ["true"]
    assert sandbox.how(built[0], off, record) == "none", "what the step's record says of it"
    assert sandbox.summary(off).reason == "--no-sandbox: the build was told not to sandbox its steps"


def test_build_steps_get_no_cloud_or_agent_credentials_fetch_steps_keep_them(tmp_path: Path) -> None:
    from torchkiln.build import sandbox
    from torchkiln.plan.model import Step

    env = {"PATH": "/usr/bin", "AWS_SECRET_ACCESS_KEY": "k", "SSH_AUTH_SOCK": "/tmp/agent", "KEEP": "1"}
    for kind in ("env", "compile", "package", "checks"):
        assert sandbox.environment(Step("s", kind, "", ("x",)), env) == {"PATH": "/usr/bin", "KEEP": "1"}
    assert sandbox.environment(Step("s", "fetch", "torch", ("git",)), env) == env


def test_the_variables_secrets_come_from_leave_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signing key's variable leaves torchkiln's own environment once read; a build's setup holds the
    cache's credential variable apart from the environment every step composes its own from."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from torchkiln.artifacts.signing import load_signing_key
    from torchkiln.process.secrets import take

    pem = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    monkeypatch.setenv("KILN_KEY", pem.decode())
    assert load_signing_key(file=None, env_name="KILN_KEY") is not None
    assert "KILN_KEY" not in os.environ
    given = {"KILN_KEY": pem.decode()}
    assert load_signing_key(file=None, env_name="KILN_KEY", environ=given) is not None
    assert "KILN_KEY" in given, "a mapping the caller passes is the caller's"
    environ = {"A": "1", "PW": "s", "TOKEN": "t"}
    assert take(environ, ["PW", None, "TOKEN", "MISSING"]) == {"PW": "s", "TOKEN": "t"} and environ == {
        "A": "1"
    }


def test_within_confining_every_process_torchkiln_starts_is_sandboxed(tmp_path: Path) -> None:
    """torchkiln's own probes of a build venv (its python, cmake, ninja) run in the step's sandbox: within
    ``confining()`` every process :mod:`torchkiln.process.runner` starts does, and none after it."""
    exe = bwrap()
    secret = tmp_path / "kiln.key"
    secret.write_text("KEY")
    sandbox = Sandbox(exe, python_view(tmp_path))
    script = "import os, sys; print([p for p in os.listdir('/proc') if p.isdigit()] == ['1'], os.path.exists(sys.argv[1]))"
    with sandbox.confining():
        inside = runner.run([sys.executable, "-c", script, str(secret)], timeout=60)
    outside = runner.run([sys.executable, "-c", script, str(secret)], timeout=60)
    assert inside.ok and outside.ok, inside.describe() + outside.describe()
    assert inside.stdout.split() == ["True", "False"], "its own /proc, and no key"
    assert outside.stdout.split()[1] == "True"


def test_nested_in_a_root_sandbox_as_the_cuda_tests_run_torchkiln(tmp_path: Path) -> None:
    """tests/kit/cudakit.py runs torchkiln in ``bwrap --unshare-pid --bind / / --dev /dev --proc /proc`` as root: a
    build step's sandbox still works in there (the probe says so, and a sandboxed command runs)."""
    exe = bwrap()
    if os.geteuid() != 0:
        pytest.skip("the CUDA tests' outer sandbox runs as root")
    src = str(Path(isolation.__file__).resolve().parents[2])
    script = textwrap.dedent(
        """
        import json, os, sys
        from pathlib import Path
        sys.path.insert(0, sys.argv[1])
        from torchkiln.process import isolation, runner
        found = isolation.probe()
        view = isolation.View(read_only=(Path(sys.prefix), Path(sys.base_prefix),
                                         Path(os.path.realpath(sys.executable)).parent.parent))
        with isolation.Sandbox(found.bwrap, view).running([sys.executable, "-c", "print('inside')"], os.environ) as p:
            done = runner.run(p.argv, env=p.env, timeout=60)
        print(json.dumps([found.ok, found.reason, done.stdout.strip()]))
        """
    )
    outer = [
        exe,
        "--unshare-pid",
        "--die-with-parent",
        "--bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
    ]
    done = runner.run([*outer, "--", sys.executable, "-c", script, src], timeout=60)
    assert done.ok, done.describe()
    assert json.loads(done.stdout.splitlines()[-1]) == [True, None, "inside"]


# A version manager's shims on PATH, as pyenv lays them out (pyenv 2.x: a shim is a bash script that execs
# "$PYENV_ROOT/libexec/pyenv" exec <program>, which reads $PYENV_ROOT/version): where the recipe's Python is a
# pyenv one under the home (Debian 13's way to 3.11), every sandboxed step that runs it must see that root.
SHIM = '#!/usr/bin/env bash\nset -e\nexport PYENV_ROOT="{root}"\nexec "{root}/libexec/pyenv" exec "${{0##*/}}" "$@"\n'
LIBEXEC = '#!/usr/bin/env bash\nshift\nprogram="$1"; shift\nexec "$(cat "$PYENV_ROOT/version")" "$@"\n'


@pytest.mark.parametrize(
    "layout",
    ["pyenv-in-home", "pyenv-root-variable", "asdf-like", "shims-beside-real-bin"],
)
def test_a_python_behind_shims_on_path_runs_in_every_build_step(tmp_path: Path, layout: str) -> None:
    """The build's view of a step (sandbox.step_view) shows the root a ``shims`` directory on PATH belongs
    to (and $PYENV_ROOT), so ``python3.11`` that is a shim runs in the real sandbox, in each kind of build
    step; the rest of the home stays hidden."""
    from torchkiln.build import sandbox

    exe = bwrap()
    home = tmp_path / "home"
    root = {"pyenv-in-home": home / ".pyenv", "pyenv-root-variable": home / "tools" / "pyenv"}.get(
        layout, home / (".asdf" if layout == "asdf-like" else ".local")
    )
    shims = root / "shims"
    (root / "libexec").mkdir(parents=True)
    shims.mkdir()
    (root / "version").write_text(os.path.realpath(sys.executable))
    (root / "libexec" / "pyenv").write_text(LIBEXEC)
    (shims / "python3.11").write_text(SHIM.format(root=root))
    for script in (root / "libexec" / "pyenv", shims / "python3.11"):
        script.chmod(0o755)
    (home / ".netrc").write_text("HOME-SECRET")
    environ = {"HOME": str(home), "PATH": f"{shims}:/usr/bin:/bin"}
    if layout == "pyenv-root-variable":
        environ["PYENV_ROOT"] = str(root)
    ctx, _ = build_context(tmp_path, environ)
    for step in (s for s in ctx.plan.steps if s.kind in ("env", "compile", "checks")):
        view = sandbox.step_view(step, ctx, environ, step.argv)
        assert root in view.read_only, (layout, step.kind)
        assert home not in view.read_only
        box = Sandbox(exe, view)  # the step's own view, as the build runs it
        probe = "import sys, os; print(sys.version_info[:2], os.path.exists(os.path.expanduser('~/.netrc')))"
        done = run_in(box, ["python3.11", "-c", probe], {"PATH": environ["PATH"], "HOME": str(home)})
        assert done.ok, (layout, step.kind, done.output)
        assert "False" in done.output, "the rest of the home is still hidden"


# --------------------------------------------------------------------------------------------------
# Issue 45 item 2: a path given through symbolic links (``--source-dir torch=LINK``, a linked parent, a chain)
# is in the sandbox where it is here, and a process started there (bubblewrap's --chdir) finds its files.
# Each shape is laid out under ``root``; ``given`` is the path a view names, ``real`` the tree it reaches.
# --------------------------------------------------------------------------------------------------


def _link(at: Path, target: str | Path) -> None:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(target)


def _to_the_tree(root: Path) -> Path:
    _link(root / "given", root / "real" / "tree")
    return root / "given"


def _relative(root: Path) -> Path:
    _link(root / "given", "real/tree")
    return root / "given"


def _chain(root: Path) -> Path:
    _link(root / "first", "second")  # relative, to an absolute one, to the tree
    _link(root / "second", root / "real" / "tree")
    return root / "first"


def _linked_parent(root: Path) -> Path:
    _link(root / "a" / "parent", "../real")
    return root / "a" / "parent" / "tree"


def _linked_parent_then_link(root: Path) -> Path:
    _link(root / "a" / "parent", root / "elsewhere")
    _link(root / "elsewhere" / "inner", "../real/tree")
    return root / "a" / "parent" / "inner"


def _into_a_linked_directory(root: Path) -> Path:
    _link(root / "real" / "shortcut", "tree")  # a link inside a directory the view also names (present)
    return root / "real" / "shortcut"


def _in_the_home(root: Path) -> Path:
    _link(root / "home" / "src", root / "real" / "tree")  # HOME is an empty tmpfs: the link is made there
    return root / "home" / "src"


LINK_SHAPES = {
    "absolute link to the tree": _to_the_tree,
    "relative link to the tree": _relative,
    "chain of links (relative to absolute)": _chain,
    "a link among its parents": _linked_parent,
    "a linked parent, then a link under its target": _linked_parent_then_link,
    "a link inside a directory the view names": _into_a_linked_directory,
    "a link in the home": _in_the_home,
}
WHERE = ("writable", "read_only")

REPORT_TREE = textwrap.dedent(
    """
    import json, os, sys
    given = sys.argv[1]
    out = {"cwd": sorted(os.listdir(".")), "file": open(os.path.join(given, "f.txt")).read(),
           "key": open(os.path.join(given, "kiln.key")).read()}
    try:
        open(os.path.join(given, "new.txt"), "w").write("x")
        out["wrote"] = True
    except OSError:
        out["wrote"] = False
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("shape", LINK_SHAPES, ids=list(LINK_SHAPES))
def test_a_path_given_through_links_is_there_and_a_command_starts_in_it(
    tmp_path: Path, shape: str, where: str
) -> None:
    """Each shape, as a writable and a read-only path of the view: the sandboxed command starts in it
    (``cwd``: bwrap --chdir, which failed with "Can't chdir to" before), reads its files through the path as
    given, writes only where the view says, and a secret reached through the link is still masked."""
    exe = bwrap()
    real = tmp_path / "real" / "tree"
    real.mkdir(parents=True)
    (real / "f.txt").write_text("in the tree")
    (real / "kiln.key").write_text("KEY")
    given = LINK_SHAPES[shape](tmp_path)
    assert given != real and os.path.realpath(given) == str(real), "the shape reaches the tree"
    view = python_view(tmp_path, hidden=[given / "kiln.key"], **{where: [given]})
    if shape == "a link inside a directory the view names":
        view = view.extended(**{where: [real.parent]})
    view = View(view.read_only, view.writable, view.protected, view.hidden, home=tmp_path / "home")
    environ = {**os.environ}
    with Sandbox(exe, view).running([sys.executable, "-c", REPORT_TREE, str(given)], environ, cwd=given) as p:
        done = runner.run(p.argv, env=p.env, timeout=60)
    assert done.ok, done.describe()
    got = json.loads(done.stdout)
    assert got["cwd"] == ["f.txt", "kiln.key"] and got["file"] == "in the tree", got
    assert got["key"] == "", "the secret file is masked however it is reached"
    assert got["wrote"] is (where == "writable")
    assert (real / "new.txt").exists() is (where == "writable")


def test_links_through_names_each_link_a_lookup_follows(tmp_path: Path) -> None:
    """links_through against the kernel's own lookup: following each link it names, in order, from the path as
    given ends where os.path.realpath does, through links only, for every shape of the table."""
    for name, make in LINK_SHAPES.items():
        root = tmp_path / name.replace(" ", "-")
        (root / "real" / "tree").mkdir(parents=True)
        given = make(root)
        found = isolation.links_through(given)
        assert found and all(os.path.islink(link) for link, _ in found), name
        current = given
        for link, target in found:
            current = target / current.relative_to(link)
        assert current == Path(os.path.realpath(given)), name
    assert isolation.links_through(tmp_path) == [] or os.path.realpath(tmp_path) != str(tmp_path)


# --------------------------------------------------------------------------------------------------
# Issue 45 item 6: signing states the isolation it vouches for.
# --------------------------------------------------------------------------------------------------

NO_USERNS = "bwrap: No permissions to creating new namespace, likely because the kernel does not allow non-privileged user namespaces."


def _host(tmp_path: Path, host: str) -> dict[str, str]:
    """PATH for a host whose bubblewrap: works (the real one), is missing, or cannot make namespaces (a bwrap
    answering as one does on a kernel without unprivileged user namespaces); the HOME beside it."""
    fake = tmp_path / f"bin-{host}"
    fake.mkdir(exist_ok=True)
    for tool in ("git", "python3"):
        found = shutil.which(tool)
        if found and host == "missing":
            (fake / tool).symlink_to(found)
    if host == "no user namespaces":
        (fake / "bwrap").write_text(f"#!/bin/sh\necho '{NO_USERNS}' >&2\nexit 1\n")
        (fake / "bwrap").chmod(0o755)
    path = str(fake) if host == "missing" else f"{fake}:{os.environ['PATH']}"
    return {"HOME": str(tmp_path / "home"), "PATH": path}


HOSTS = ("sandboxes", "missing", "no user namespaces", "--no-sandbox")


@pytest.mark.parametrize("allow", [False, True], ids=["", "--allow-unisolated"])
@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
@pytest.mark.parametrize("host", HOSTS)
def test_a_signed_build_that_cannot_sandbox_is_refused_before_its_first_step(
    tmp_path: Path, host: str, signed: bool, allow: bool
) -> None:
    """Refused exactly when it is signed, its steps cannot be sandboxed and the signer did not say
    --allow-unisolated; the refusal names bubblewrap's own reason and the ways out."""
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from torchkiln.build import sandbox
    from torchkiln.errors import UsageError

    if host == "sandboxes":
        bwrap()
    isolation._PROBED.clear()  # each fake bwrap is probed anew
    key = ed25519.Ed25519PrivateKey.generate() if signed else None
    environ = _host(tmp_path, host)
    setup, record = build_context(
        tmp_path, environ, sign_key=key, allow_unisolated=allow, isolation=host != "--no-sandbox"
    )
    refused = signed and not allow and host != "sandboxes"
    if not refused:
        sandbox.require_isolation_to_sign(setup)
        return
    with pytest.raises(UsageError) as caught:
        sandbox.require_isolation_to_sign(setup)
    message = str(caught.value)
    reason = {
        "missing": "bubblewrap (bwrap) is not installed",
        "no user namespaces": NO_USERNS,
        "--no-sandbox": "--no-sandbox: the build was told not to sandbox its steps",
    }[host]
    assert (
        message.startswith("refusing to sign a build whose steps cannot run in a sandbox: ")
        and reason in message
    )
    assert "--allow-unisolated" in message and "nothing was built" in message
    assert not record.warnings, "refused, not warned"


def test_steps_made_without_a_sandbox_run_again_once_the_build_can_sandbox(tmp_path: Path) -> None:
    """A build that could not sandbox (unsigned: it ran, recording isolation none), then the same build
    where bubblewrap works: the build steps run again rather than being vouched for, and the record says
    bubblewrap; a third run changes nothing."""
    import io

    from kit.dists import tiny_wheel
    from rich.console import Console
    from test_tree_exact import plain_tree, stand_in_compile

    from torchkiln.build.loop import BuildOptions, run_build
    from torchkiln.cache import resolve_cache
    from torchkiln.plan.make import make_plan
    from torchkiln.recipe.loader import load_recipe

    bwrap()
    tree = plain_tree(tmp_path)
    plan = make_plan(
        load_recipe(Path(__file__).parent / "data" / "ext-cpu-test.toml"), workdir=tmp_path / "w",
        dist=tmp_path / "d", only="torch", source_dirs={"torch": tree}, cache=resolve_cache(None, kind="none"),
    )  # fmt: skip
    (tmp_path / "made").mkdir()
    wheel = tiny_wheel(tmp_path / "made", "torch", "2.13.0+cpu")
    compile_step = next(s for s in plan.steps if s.kind == "compile")
    from dataclasses import replace

    plan = replace(plan, steps=[stand_in_compile(compile_step, tree, wheel), plan.steps[-1]])
    runs = []
    for host in ("no user namespaces", "sandboxes", "sandboxes"):
        isolation._PROBED.clear()
        environ = {**os.environ, **_host(tmp_path, host)}
        options = BuildOptions(console=Console(file=io.StringIO()), skip_postcheck=True, environ=environ)
        result = run_build(plan, options)
        runs.append((result.ran, json.loads(result.manifest.read_text())["isolation"]["mode"]))
    compiled = [("torch:wheel" in ran, mode) for ran, mode in runs]
    assert compiled == [(True, "none"), (True, "bubblewrap"), (False, "bubblewrap")], runs


def test_the_command_line_refuses_a_signed_build_it_cannot_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``torchkiln build --sign-key-env`` where bubblewrap cannot make namespaces: exit 2 before any step
    (no venv made, no dist/), naming bubblewrap's reason."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from test_tree_exact import plain_tree

    from torchkiln.cli import main

    pem = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    isolation._PROBED.clear()
    monkeypatch.setenv("PATH", _host(tmp_path, "no user namespaces")["PATH"])
    monkeypatch.setenv("KILN_KEY", pem.decode())
    tree = plain_tree(tmp_path)
    argv = [
        "build",
        str(Path(__file__).parent / "data" / "ext-cpu-test.toml"),
        "--source-dir",
        f"torch={tree}",
    ]
    argv += ["--only", "torch", "--workdir", str(tmp_path / "w"), "--dist", str(tmp_path / "d")]
    argv += ["--no-preflight", "--skip-postcheck", "--cache", "none", "--sign-key-env", "KILN_KEY"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "refusing to sign a build whose steps cannot run in a sandbox" in err and NO_USERNS in err, err
    assert not (tmp_path / "w" / "venv").exists() and not (tmp_path / "d").exists()


def test_a_program_started_from_a_sealed_copy_is_unreadable_to_its_sandboxs_other_processes(
    tmp_path: Path,
) -> None:
    """The mechanism under the sccache server (torchkiln.cache.sccache.sealed): a copy its user may execute
    but not read makes a non-dumpable process; another process of the same sandbox (the same user, no
    capabilities) gets EACCES for its environ, maps, mem and fds, while it reads the same program started
    from the readable original. (A wrapper calling prctl(PR_SET_DUMPABLE, 0) before exec would not do:
    exec makes the new program dumpable again.)"""
    from torchkiln.cache.sccache import SEALED_PREFIX, sealed

    exe = bwrap()
    copy = sealed("sleep")
    assert copy.parent.name.startswith(SEALED_PREFIX) and (copy.stat().st_mode & 0o777) == 0o111
    script = textwrap.dedent(
        """
        import json, os, subprocess, sys, time
        out = {}
        for name, program in (("sealed", sys.argv[1]), ("plain", "sleep")):
            child = subprocess.Popen([program, "30"])
            time.sleep(0.2)
            row = {}
            for entry in ("environ", "maps", "mem"):
                try:
                    with open(f"/proc/{child.pid}/{entry}", "rb") as handle:
                        handle.read(1) if entry != "mem" else None
                    row[entry] = "read"
                except OSError as exc:
                    row[entry] = exc.strerror
            try:
                row["fd"] = [os.readlink(f"/proc/{child.pid}/fd/{n}") for n in os.listdir(f"/proc/{child.pid}/fd")] and "read"
            except OSError as exc:
                row["fd"] = exc.strerror
            child.kill()
            out[name] = row
        print(json.dumps(out))
        """
    )
    view = python_view(tmp_path, read_only=[copy.parent])
    done = run_in(Sandbox(exe, view), [sys.executable, "-c", script, str(copy)])
    shutil.rmtree(copy.parent)
    assert done.ok, done.describe()
    got = json.loads(done.stdout)
    assert got["plain"] == {"environ": "read", "maps": "read", "mem": "read", "fd": "read"}
    assert got["sealed"] == dict.fromkeys(("environ", "maps", "mem", "fd"), "Permission denied")
