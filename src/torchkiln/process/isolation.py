"""Processes in a sandbox (bubblewrap): they see the paths they are given and nothing else.

Why: the code a build runs (setup.py, the build dependencies pip installs and runs, whatever they start) is
the code the provenance vouches for. It must not reach what vouches for it, the signing key, nor any other
secret the build holds (SLSA Build L3: secret material is not accessible to the user-defined build steps).
This module is the mechanism; which paths a build step sees is the build's decision
(:mod:`torchkiln.build.sandbox`).

A :class:`View` says what a sandboxed process sees:

* ``read_only``: directories and files visible, read-only (the toolchain: /usr, /etc, the Pythons), unless
  a writable path holds them;
* ``writable``: visible and writable (the work directory, the source trees, the compiler cache);
* ``protected``: read-only even inside a writable path (the build's own records in its work directory);
* ``hidden``: files masked (an empty file mounted over them) even where a visible directory holds them: the
  files secrets are read from, wherever the user keeps them;
* ``home``: the HOME the process sees, an empty directory (tmpfs) at that path; paths under it in
  ``read_only``/``writable`` are mounted back on top;
* ``network``: the host's network; otherwise a network namespace of its own (loopback only).

Every path is mounted where it really is (resolved); a path given through symbolic links (a link to it, a
link among its parents, a chain: ``--source-dir torch=LINK``) reaches the same files in the sandbox as here,
its links made again there (:func:`links_through`), and a command started in it starts in its resolved
directory.

And always, whatever the view: its own PID namespace with its own ``/proc`` (torchkiln and every process
outside are not there: not their argv, not their environment), a minimal ``/dev``, a private ``/tmp`` (a
fresh directory under the host's temporary directory, on disk like the host's ``/tmp``, removed afterwards),
its own IPC namespace, no capabilities (a sandboxed root cannot mount or mknod its way out: bubblewrap run by
root keeps them otherwise), and death with the process that started it (``--die-with-parent``). Everything
not named is absent: the view is a list of what is there, not of what is hidden.

:func:`probe` says once per process whether bubblewrap can make such a sandbox here (it cannot without user
namespaces, or nested in a sandbox that forbids them): the caller then runs without one and says so.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import runner

PROBE_TIMEOUT_S = 30.0
TMP_PREFIX = "torchkiln-sandbox-"
# Top-level entries of the filesystem that are the system's toolchain. A symbolic link among them (a merged
# /usr's /bin -> usr/bin) stays a link; an absent one is skipped.
SYSTEM = ("/usr", "/etc", "/opt", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/nix", "/gnu")
# Variables naming places that do not exist in a sandbox (its /tmp is private, /run is not there).
_TEMP_VARIABLES = ("TMPDIR", "TEMP", "TMP")
_GONE_VARIABLES = ("XDG_RUNTIME_DIR",)
# Never mounted from a view: the root and /tmp would cover the sandbox's own; /proc and /dev are its own.
_NEVER = frozenset(Path(p) for p in ("/", "/tmp", "/proc", "/dev"))

# Namespaces and capabilities, the same for the probe and every sandbox (what the probe proves is what runs).
# ``--as-pid-1``: the command is the sandbox's first process, so bubblewrap itself, whose argv lists every
# mount (the paths of masked secret files among them), is not in the sandbox's /proc.
_ALWAYS = ("--die-with-parent", "--unshare-pid", "--as-pid-1", "--unshare-ipc", "--cap-drop", "ALL")


@dataclass(frozen=True)
class Availability:
    """Whether this host can sandbox: the bwrap found, or why not."""

    bwrap: str | None
    reason: str | None = None  # None: it can

    @property
    def ok(self) -> bool:
        return self.reason is None and self.bwrap is not None


_PROBED: dict[str, Availability] = {}


def probe(path: str | None = None) -> Availability:
    """Whether ``bwrap`` (found on ``path``, default this process's PATH) makes a sandbox here, with the same
    namespaces as every sandbox (PID, IPC, network, no capabilities, its own /proc): run once per bwrap and
    remembered. The reason, when not, is bubblewrap's own first line (no user namespaces, a /proc that cannot
    be mounted in a nested sandbox...)."""
    exe = shutil.which("bwrap", path=path if path is not None else os.environ.get("PATH", os.defpath))
    if exe is None:
        return Availability(None, "bubblewrap (bwrap) is not installed (apt-get install bubblewrap)")
    key = os.path.realpath(exe)
    if key not in _PROBED:
        argv = [exe, *_ALWAYS, "--unshare-net", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
        argv += ["--tmpfs", "/tmp", "--", "true"]
        try:
            done = runner.run(argv, timeout=PROBE_TIMEOUT_S)
        except runner.ProcessError as exc:
            _PROBED[key] = Availability(exe, f"{exe} does not run ({exc})")
        else:
            detail = (done.output.strip().splitlines() or [f"exit status {done.returncode}"])[0]
            _PROBED[key] = Availability(
                exe, None if done.ok else f"{exe} cannot make a sandbox here: {detail}"
            )
    return _PROBED[key]


@dataclass(frozen=True)
class View:
    """What a sandboxed process sees (see the module's docstring). Paths are absolute."""

    read_only: tuple[Path, ...] = ()
    writable: tuple[Path, ...] = ()
    protected: tuple[Path, ...] = ()
    hidden: tuple[Path, ...] = ()
    home: Path | None = None
    network: bool = False

    def extended(
        self,
        *,
        read_only: Iterable[Path] = (),
        writable: Iterable[Path] = (),
        protected: Iterable[Path] = (),
        hidden: Iterable[Path] = (),
        network: bool | None = None,
    ) -> View:
        """This view with more paths (and, when given, another network setting)."""
        return replace(
            self,
            read_only=(*self.read_only, *read_only),
            writable=(*self.writable, *writable),
            protected=(*self.protected, *protected),
            hidden=(*self.hidden, *hidden),
            network=self.network if network is None else network,
        )

    def visible(self, path: Path) -> bool:
        """Whether ``path`` would be reachable in the sandbox (under a system entry or a given path, either
        as given or resolved)."""
        given = [*self.read_only, *self.writable]
        roots = [Path(p) for p in SYSTEM] + [form for root in given for form in _forms(root)]
        if self.home is not None and _under(path, self.home):
            roots = [r for r in roots if _under(r, self.home)]
        return any(_under(path, root) for root in roots)


def _under(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def _forms(path: Path) -> list[Path]:
    """A path as given and as resolved (a process may reach it either way)."""
    path = Path(os.path.abspath(path))
    real = Path(os.path.realpath(path))
    return [path] if real == path else [path, real]


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _first_link(path: Path) -> Path | None:
    """The first component of the absolute ``path``, from the root, that is a symbolic link."""
    current = Path(path.anchor)
    for part in path.parts[1:]:
        current = current / part
        if os.path.islink(current):
            return current
    return None


def links_through(path: Path) -> list[tuple[Path, Path]]:
    """The symbolic links a process follows to reach ``path`` as given, each with where it resolves to
    (a chain of links resolved in full): a link to the path, a link among its parents, and links met again
    under what an earlier link resolves to. Empty for a path without links."""
    out: list[tuple[Path, Path]] = []
    current = Path(os.path.abspath(path))
    for _ in range(40):  # the kernel's own limit of links followed in one lookup (ELOOP)
        link = _first_link(current)
        if link is None:
            break
        target = _real(link)
        out.append((link, target))
        current = target / current.relative_to(link)
    return out


def _system_args() -> list[str]:
    args: list[str] = []
    for entry in SYSTEM:
        if os.path.islink(entry):
            args += ["--symlink", os.readlink(entry), entry]
        elif os.path.isdir(entry):
            args += ["--ro-bind", entry, entry]
    # /etc/resolv.conf may be a link out of /etc (systemd-resolved's stub under /run): its target too
    resolv = os.path.realpath("/etc/resolv.conf")
    if os.path.isfile(resolv) and not any(_under(Path(resolv), Path(e)) for e in SYSTEM):
        args += ["--ro-bind", resolv, resolv]
    return args


def _mounts(view: View, empty: Path) -> list[str]:
    """The view's mounts, parents before children (a later mount covers an earlier one at or under it), each
    path mounted where it really is (resolved); then the symbolic links a path is given through, recreated
    (:func:`_links`); then the masks over hidden files that would be reachable: ``empty``, an empty regular
    file (a device such as /dev/null cannot be opened on the sandbox's nodev mounts)."""
    ops: dict[Path, str] = {}
    writable = [_real(path) for path in view.writable]
    for path in view.read_only:
        real = _real(path)
        if not any(_under(real, w) for w in writable):  # a writable path shows it already
            ops.setdefault(real, "ro")
    for real in writable:
        ops[real] = "rw"
    for path in view.protected:
        ops[_real(path)] = "ro"
    ordered = sorted(
        ((p, op) for p, op in ops.items() if p not in _NEVER),
        key=lambda item: (len(item[0].parts), str(item[0])),
    )
    args: list[str] = []
    home_done = view.home is None
    for path, op in ordered:
        if not home_done and view.home is not None and len(path.parts) >= len(view.home.parts):
            args += ["--tmpfs", str(view.home)]
            home_done = True
        if op == "rw":  # "-try": a tree not there yet (the step fails on its own terms, not bubblewrap's)
            args += ["--bind-try", str(path), str(path)]
        else:
            args += ["--ro-bind-try", str(path), str(path)]
    if not home_done and view.home is not None:
        args += ["--tmpfs", str(view.home)]
    args += _links(view, [path for path, _ in ordered])
    for secret in view.hidden:
        real = _real(secret)  # however it is reached (a link to it, a linked parent), it is this file
        if os.path.exists(real) and view.visible(real):
            args += ["--tmpfs", str(real)] if real.is_dir() else ["--ro-bind", str(empty), str(real)]
    return args


def _links(view: View, mounted: Sequence[Path]) -> list[str]:
    """The symbolic links through which the view's paths are given (``--source-dir torch=LINK``, a link
    among a work directory's parents, a chain of links), made again in the sandbox, each to what it resolves
    to, so a path reaches there what it reaches here: a process started in it (``--chdir``) or handed it
    finds its files. Not where the link is there already (under a mounted directory or a system entry), nor
    where a mount lies under it (the directory bubblewrap made for that mount holds the place)."""
    present = [Path(p) for p in SYSTEM] + list(mounted)
    args: list[str] = []
    made: set[Path] = set()
    for path in (*view.read_only, *view.writable, *view.protected):
        for link, target in links_through(path):
            if link in made or link in _NEVER or any(_under(link, root) for root in present):
                continue
            if any(_under(m, link) for m in mounted):
                continue
            made.add(link)
            args += ["--symlink", str(target), str(link)]
    return args


def _private_tmp() -> Path:
    """A fresh directory for a sandbox's /tmp, removed also when torchkiln is killed (its watchdog)."""
    tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX))
    runner.remove_at_exit(tmp)
    return tmp


@dataclass
class Prepared:
    """A command made to run in a sandbox: its argv and environment, and the private /tmp to remove once it
    has ended (:meth:`cleanup`)."""

    argv: list[str]
    env: dict[str, str]
    tmp: Path | None = field(default=None, repr=False)

    def cleanup(self) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


@dataclass(frozen=True)
class Sandbox:
    """A view and the bwrap that makes it (see :func:`probe`)."""

    bwrap: str
    view: View

    def extended(self, **more: object) -> Sandbox:
        """This sandbox with a view extended by ``more`` (:meth:`View.extended`'s arguments)."""
        return replace(self, view=self.view.extended(**more))  # type: ignore[arg-type]

    def prepare(
        self, argv: Sequence[str], env: Mapping[str, str], *, cwd: str | Path | None = None
    ) -> Prepared:
        """``argv`` to run in the sandbox with ``env``: the bwrap command line and the environment it gets
        (HOME as the view says, the temporary directory the private /tmp, no XDG_RUNTIME_DIR). Its private
        /tmp is made now; :meth:`Prepared.cleanup` removes it."""
        tmp = _private_tmp()
        command, inner = self.command(argv, env, tmp, cwd=cwd)
        return Prepared(command, inner, tmp)

    def command(
        self, argv: Sequence[str], env: Mapping[str, str], tmp: Path, *, cwd: str | Path | None = None
    ) -> tuple[list[str], dict[str, str]]:
        """The bwrap command line and environment that run ``argv`` with ``tmp`` (see :meth:`prepare`) as
        its /tmp."""
        empty = tmp / ".masked"  # what a hidden file reads as: nothing
        if not empty.exists():
            empty.touch(mode=0o444)
        args = [self.bwrap, *_ALWAYS]
        if not self.view.network:
            args.append("--unshare-net")
        args += ["--proc", "/proc", "--dev", "/dev", *_system_args(), "--bind", str(tmp), "/tmp"]
        args += _mounts(self.view, empty)
        if cwd is not None:  # where it really is: the same directory, reached without a link
            args += ["--chdir", str(_real(Path(cwd)))]
        inner = {k: v for k, v in env.items() if k not in _GONE_VARIABLES}
        for name in _TEMP_VARIABLES:
            if name in inner:
                inner[name] = "/tmp"
        if self.view.home is not None:
            inner["HOME"] = str(self.view.home)
        return [*args, "--", *argv], inner

    @contextlib.contextmanager
    def confining(self) -> Iterator[None]:
        """Within the block, every process torchkiln starts runs in this sandbox (one private /tmp for
        all, removed when the block ends): :func:`torchkiln.process.runner.confined`."""
        tmp = _private_tmp()

        def confine(
            argv: list[str], env: Mapping[str, str] | None, cwd: str | Path | None
        ) -> tuple[list[str], dict[str, str]]:
            return self.command(argv, os.environ if env is None else env, tmp, cwd=cwd)

        try:
            with runner.confined(confine):
                yield
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @contextlib.contextmanager
    def running(
        self, argv: Sequence[str], env: Mapping[str, str], *, cwd: str | Path | None = None
    ) -> Iterator[Prepared]:
        """:meth:`prepare`, and the private /tmp removed when the block ends."""
        prepared = self.prepare(argv, env, cwd=cwd)
        try:
            yield prepared
        finally:
            prepared.cleanup()
