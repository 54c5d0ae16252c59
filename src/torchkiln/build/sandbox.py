"""Which steps of a build run in a sandbox, what each one sees, and what the manifest says about it.

The build steps are the steps that run code from the source trees or from their build dependencies: ``env``
(pip runs build backends and the setup.py of what it builds from source), ``compile`` (the tree's setup.py,
CMake, ninja, the compilers), ``package`` and ``checks`` (the built wheels, imported). Each runs in a
bubblewrap sandbox (:mod:`torchkiln.process.isolation`) that shows it:

* writable: the work directory (but its records, ``state.json``, ``build.lock`` and ``logs/``, read-only)
  and the source trees (but their ``.git``, read-only: :mod:`torchkiln.build.treewatch` fails a step that
  changes a tracked file); for a compile step, what the compiler cache needs
  (:meth:`torchkiln.cache.CacheSession.step_paths`: ccache's directory and statistics log, the socket of
  the sccache server or of the Redis broker);
* read-only: the environment store (a venv restored from it links to its entry: issue 47), the system's
  toolchain (/usr, /etc, /opt, /bin, /lib...), torchkiln's own Python and package
  (the build's helper scripts run from it), the Python a step runs and its venv's base interpreter, every
  directory on the step's PATH, the toolchain directories the plan names (``CUDA_HOME``, ``NCCL_*``,
  ``MAGMA_HOME``, ``TORCHVISION_INCLUDE``/``_LIBRARY``, ``CC``...), absolute paths the step's command names
  (a given torch wheel), and for pip's steps pip's own configuration files and the local indexes they name;
* HOME: an empty directory at the same path (pip's configuration mounted back);
* not there: the files secrets are read from (the signing key's, the cache's and the cluster's credential
  files: masked even inside a visible directory), everything else under the user's home, the host's /tmp
  (a private one instead), /run, every process outside the sandbox (its own PID namespace and /proc: not
  torchkiln's argv or environment), and for compile and package steps the network (pip's steps, ``env`` and
  ``checks``, reach the index; compiles need none, unless ccache itself reaches an HTTP store).

Whether or not the host can sandbox, a build step's environment is without the variables secrets came from
(taken out of torchkiln's own by :class:`~torchkiln.build.context.Context`) and without the caller's cloud
and agent credentials (:data:`torchkiln.process.environ.CREDENTIAL_NAMES`). Fetch steps run unsandboxed: git
runs no code of the tree (hooks and filters are not cloned), and reaching a private repository may take the
user's ssh keys or credential helper.

Where bubblewrap cannot sandbox (not installed, no user namespaces), the build says so once and every build
step runs as it did before; each step records how it ran (``isolation`` in its ``state.json`` entry, kept
with a venv in the environment store), and the manifest and the provenance say ``isolation: none`` with
the reason when any step of the build (this run's or an earlier run's whose result is used) ran without one.
"""

from __future__ import annotations

import configparser
import contextlib
import os
import shutil
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torchkiln
from torchkiln.artifacts.manifest import Isolation
from torchkiln.errors import UsageError
from torchkiln.plan.model import Step
from torchkiln.process import isolation
from torchkiln.process.environ import without_credentials
from torchkiln.process.isolation import Availability, Sandbox, View

from .envstore import linked_origin
from .workdir import LOCK_NAME, STATE_NAME

if TYPE_CHECKING:
    from .context import BuildRecord, BuildSetup

SANDBOXED_KINDS = frozenset({"env", "compile", "package", "checks"})
NETWORK_KINDS = frozenset({"env", "checks"})  # pip reaches the index; a compile or packaging needs none
BUBBLEWRAP = "bubblewrap"
NONE = "none"
# Variables of a step naming toolchain directories or files (the plan's ENV_TABLE and the caller's CC/CXX).
TOOLCHAIN_VARIABLES = (
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDACXX",
    "CUDAHOSTCXX",
    "NCCL_ROOT",
    "NCCL_INCLUDE_DIR",
    "NCCL_LIB_DIR",
    "CUDNN_ROOT",
    "CUDNN_INCLUDE_DIR",
    "CUDNN_LIB_DIR",
    "CUDNN_LIBRARY",
    "MAGMA_HOME",
    "TORCHVISION_INCLUDE",
    "TORCHVISION_LIBRARY",
    "CMAKE_INCLUDE_PATH",
    "CMAKE_LIBRARY_PATH",
    "CC",
    "CXX",
)
# pip's settings that name where it reads distributions (a local directory or file:// index).
PIP_LOCATIONS = ("find-links", "index-url", "extra-index-url")
PIP_SECTIONS = ("global", "install", "download", "wheel")


@dataclass
class Isolating:
    """A build's sandboxing: whether the host can, probed before the first step of a signed build, else at
    the first build step that runs (with the one warning when it cannot). Each step's run keeps how its
    command ran (:func:`how`)."""

    availability: Availability | None = None
    warned: bool = False


def is_build_step(step: Step) -> bool:
    return step.kind in SANDBOXED_KINDS


def _home(environ: Mapping[str, str]) -> Path:
    """The HOME a sandboxed step sees (empty): the caller's own path, unless it is no place for a mount."""
    home = environ.get("HOME", "")
    path = Path(home)
    if not home or not path.is_absolute() or path == Path("/") or Path("/tmp") == path:
        return Path("/tmp/home")
    if any(path == Path(entry) or path.is_relative_to(entry) for entry in isolation.SYSTEM):
        return Path("/tmp/home")
    return path


def _derived(paths: Iterable[Path], home: Path) -> list[Path]:
    """Paths found in a step's command and variables, fit to mount: absolute, existing, and not the root, the
    home directory or one of its parents (they would show the whole home)."""
    out = []
    for path in paths:
        if not path.is_absolute() or not path.exists() or path == Path("/"):
            continue
        if home == path or home.is_relative_to(path):
            continue
        out.append(path)
    return out


def _prefixes(exe: str, search: str) -> list[Path]:
    """The installation a program belongs to: its ``bin/``'s parent, as named and resolved, and a venv's base
    interpreter's (``home`` in pyvenv.cfg)."""
    found = exe if os.path.isabs(exe) else shutil.which(exe, path=search)
    if not found:
        return []
    path = Path(found)
    out = [path.parent.parent, Path(os.path.realpath(path)).parent.parent]
    cfg = path.parent.parent / "pyvenv.cfg"
    with contextlib.suppress(OSError):
        for line in cfg.read_text(encoding="utf-8").splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() == "home":
                out.append(Path(os.path.realpath(value.strip())).parent)
    return out


def shim_roots(search: str, env: Mapping[str, str]) -> list[Path]:
    """The roots of the version managers whose shims are on PATH: a ``shims`` directory's parent (pyenv's
    ``~/.pyenv``, rbenv's, asdf's) and ``$PYENV_ROOT``. A shim is a script that runs the manager's own
    ``libexec`` and reads its ``version`` files: the directory on PATH alone is not enough to run
    ``python3.11`` where pyenv provides it (a recipe's Python on Debian 13, docs/build.md)."""
    roots = [Path(p).parent for p in search.split(os.pathsep) if p and Path(p).name == "shims"]
    if env.get("PYENV_ROOT"):
        roots.append(Path(env["PYENV_ROOT"]))
    return roots


def _argument_paths(argv: Sequence[str]) -> list[Path]:
    """Absolute paths a command names (as an argument, or after ``=`` in one: ``--source torch=/src``)."""
    out = []
    for arg in argv[1:]:
        for text in (arg, arg.partition("=")[2]):
            if text.startswith("/"):
                out.append(Path(text))
    return out


def _pip_config_files(environ: Mapping[str, str]) -> list[Path]:
    """pip's per-user configuration files and ``PIP_CONFIG_FILE`` (pip's "Configuration" documentation)."""
    home = Path(environ.get("HOME", "/nonexistent"))
    config_home = Path(environ.get("XDG_CONFIG_HOME") or home / ".config")
    files = [config_home / "pip" / "pip.conf", home / ".pip" / "pip.conf"]
    if environ.get("PIP_CONFIG_FILE") and environ["PIP_CONFIG_FILE"] != os.devnull:
        files.append(Path(environ["PIP_CONFIG_FILE"]))
    return [f for f in files if f.is_file()]


def _local(value: str) -> Iterator[Path]:
    for word in value.split():
        if word.startswith("file://"):
            yield Path(word.removeprefix("file://"))
        elif word.startswith("/"):
            yield Path(word)


def _pip_locations(environ: Mapping[str, str], files: Sequence[Path]) -> list[Path]:
    """Local directories pip is told to read distributions from, in its variables and configuration."""
    out: list[Path] = []
    for name in PIP_LOCATIONS:
        out += _local(environ.get("PIP_" + name.upper().replace("-", "_"), ""))
    for file in [Path("/etc/pip.conf"), *files]:
        parser = configparser.RawConfigParser()
        with contextlib.suppress(OSError, configparser.Error):
            parser.read(file, encoding="utf-8")
        for section in PIP_SECTIONS:
            for name in PIP_LOCATIONS:
                if parser.has_option(section, name):
                    out += _local(parser.get(section, name))
    return out


def linked_entries(setup: BuildSetup) -> list[Path]:
    """The store entries the plan's venvs are linked to now (:func:`torchkiln.build.envstore.link_venv`)."""
    venvs = {Path(v) for step in setup.plan.steps for v in (step.venv, step.clones) if v}
    origins = (linked_origin(venv) for venv in sorted(venvs))
    return sorted({origin[0].absolute() for origin in origins if origin is not None})


def _entries(directory: Path) -> list[Path]:
    try:
        return list(directory.iterdir())
    except OSError:
        return []


def secret_files(setup: BuildSetup) -> list[Path]:
    """The files this build read a secret from (masked in every sandbox): the signing key's, the cache's
    and the cluster's credentials, the cluster's client configuration (it holds the token)."""
    plan, client = setup.plan, setup.cache.client
    names = [*setup.options.secret_files, plan.cache.credentials_file]
    if plan.cluster is not None:
        names.append(plan.cluster.credentials_file)
    if client is not None and client.conf_path is not None:
        names.append(str(client.conf_path))
    return [Path(os.path.expanduser(n)).absolute() for n in names if n]


def base_view(setup: BuildSetup) -> View:
    """What every build step of this build sees (see the module's docstring)."""
    paths = setup.plan.paths
    home = _home(setup.environ)
    own = [Path(sys.prefix), Path(sys.base_prefix), Path(torchkiln.__file__).resolve().parents[1]]
    own += _prefixes(sys.executable, "")
    records = [paths.workdir / STATE_NAME, paths.workdir / LOCK_NAME, paths.logs]
    # git's own data about each tree (its config, hooks, refs, its submodules' under .git/modules): what a step
    # wrote there could make git lie about the tree to torchkiln (build.treewatch checks it after each step)
    records += [s.path / ".git" for s in setup.plan.sources if os.path.lexists(s.path / ".git")]
    # entries of the work directory linked elsewhere (a wheelhouse or venv on another disk): their targets
    linked = [e.resolve() for e in _entries(paths.workdir) if e.is_symlink() and e.resolve().is_dir()]
    # the environment store: a venv restored from it links to its entry, which no step may change; and the
    # entry of each of the plan's venvs an earlier run linked, whatever this run's store (--env-store off, a
    # library caller's setup without one): without it the venv's site-packages would dangle in the sandbox
    store = _derived([setup.env_store.root.absolute()], home) if setup.env_store is not None else []
    store += _derived(linked_entries(setup), home)
    return View(
        read_only=(*_derived(own, home), *store),
        writable=(paths.workdir, *(s.path for s in setup.plan.sources), *linked),
        protected=(*records, *store),
        hidden=tuple(secret_files(setup)),
        home=home,
    )


def step_view(step: Step, setup: BuildSetup, env: Mapping[str, str], argv: Sequence[str]) -> View:
    """What ``step`` sees, running ``argv`` with ``env``: the build's view, and what this step names."""
    view = base_view(setup)
    assert view.home is not None
    search = env.get("PATH", os.defpath)
    named: list[Path] = [*_prefixes(argv[0], search)]
    for path in _argument_paths(
        argv
    ):  # a program named as an argument (buildreqs' --python): its install too
        named += [path, *(_prefixes(str(path), search) if path.is_file() else [])]
    named += [Path(p) for p in search.split(os.pathsep) if p]
    named += shim_roots(search, env)
    for name in TOOLCHAIN_VARIABLES:
        for part in env.get(name, "").split(os.pathsep):
            named += [Path(w) for w in part.split() if w.startswith("/")]
    if step.cwd:
        named.append(Path(step.cwd))
    pip_files: list[Path] = []
    if step.kind in NETWORK_KINDS:
        pip_files = _pip_config_files(env)
        named += _pip_locations(env, pip_files)
    writable: list[Path] = []
    network = step.kind in NETWORK_KINDS
    session = setup.cache.session
    if step.kind == "compile" and session is not None:
        writable += session.step_paths()
        network = network or session.step_network()
    return view.extended(
        read_only=[*_derived(named, view.home), *pip_files], writable=writable, network=network
    )


def server_sandbox(setup: BuildSetup, record: BuildRecord) -> Sandbox | None:
    """Where the compiler cache's server runs (sccache: it runs the compiles it is sent), when this build
    sandboxes: the build steps' view, with the network and the distributed-compile toolchain directory."""
    availability = _available(setup, record)
    if not availability.ok:
        return None
    assert availability.bwrap is not None
    view = base_view(setup)
    extra: list[Path] = []
    client = setup.cache.client
    if client is not None and client.spec is not None:  # distributed compiles in use (preflight passed)
        from torchkiln.distributed.client import default_toolchain_dir  # noqa: PLC0415 - HTTP: only with a cluster

        extra.append(default_toolchain_dir(setup.plan.cache.dir))
        if client.conf_path is not None:  # the one sandbox that reads the client config: the server's
            conf = client.conf_path.absolute()
            view = replace(view, hidden=tuple(p for p in view.hidden if p != conf))
    return Sandbox(availability.bwrap, view.extended(writable=extra, network=True))


def _probed(setup: BuildSetup) -> Availability:
    """Whether this build sandboxes: probed once (``--no-sandbox``: it does not)."""
    state = setup.isolating
    if state.availability is None and not setup.options.isolation:
        state.availability = Availability(None, "--no-sandbox: the build was told not to sandbox its steps")
    if state.availability is None:
        state.availability = isolation.probe(setup.environ.get("PATH", os.defpath))
    return state.availability


def _available(setup: BuildSetup, record: BuildRecord) -> Availability:
    """:func:`_probed`, and one warning, at the first build step, when it cannot."""
    availability = _probed(setup)
    if not availability.ok and not setup.isolating.warned:
        setup.isolating.warned = True
        record.warn(
            f"build steps run without isolation: {availability.reason}; the setup.py of the trees "
            "and their build dependencies can read what this user can (the manifest and provenance "
            "record isolation: none)"
        )
    return availability


UNISOLATED_WAYS = (
    "ways out: let bubblewrap make its namespaces here (install it: apt-get install bubblewrap; an "
    "unprivileged user needs user namespaces: sysctl kernel.unprivileged_userns_clone=1 where the kernel has "
    "it, kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu 24.04, and a container that allows them), "
    "build without a signing key, or sign all the same with --allow-unisolated (the manifest and the "
    "provenance then say isolation: none, allow_unisolated: true)"
)


def require_isolation_to_sign(setup: BuildSetup) -> None:
    """A signed statement vouches for build steps that could not reach the key (SLSA Build L3's isolation):
    a signed build whose steps cannot run in a sandbox here is refused before its first step, naming why,
    unless the signer says ``--allow-unisolated``."""
    if setup.options.sign_key is None or setup.options.allow_unisolated:
        return
    availability = _probed(setup)
    if not availability.ok:
        raise UsageError(
            f"refusing to sign a build whose steps cannot run in a sandbox: {availability.reason}; its setup.py "
            "and build dependencies could read the signing key and change torchkiln itself, so a statement "
            f"signed over them would vouch for nothing (nothing was built)\n{UNISOLATED_WAYS}"
        )


def environment(step: Step, env: Mapping[str, str]) -> dict[str, str]:
    """A step's environment: a build step's without the caller's cloud and agent credentials."""
    return without_credentials(env) if is_build_step(step) else dict(env)


@contextlib.contextmanager
def isolated(
    step: Step,
    setup: BuildSetup,
    record: BuildRecord,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str | Path | None = None,
) -> Iterator[tuple[list[str], dict[str, str]]]:
    """``argv`` and ``env`` as ``step`` runs them: a build step in its sandbox (its private /tmp removed when
    the block ends), or as it is where the host cannot sandbox; fetch steps as they are."""
    env = environment(step, env)
    if not is_build_step(step):
        yield list(argv), env
        return
    availability = _available(setup, record)
    if not availability.ok:
        yield list(argv), env
        return
    assert availability.bwrap is not None
    sandbox = Sandbox(availability.bwrap, step_view(step, setup, env, argv))
    with sandbox.running(argv, env, cwd=cwd) as prepared:
        yield prepared.argv, prepared.env


@contextlib.contextmanager
def probing(step: Step, setup: BuildSetup, record: BuildRecord, env: Mapping[str, str]) -> Iterator[None]:
    """torchkiln's own probes of what ``step`` installed or built (the build venv's python, cmake and ninja
    are build dependencies' code: the toolchain record, ninja's queries of a compile killed for memory) run
    in the step's sandbox, as the step did; as they are where the step ran unsandboxed."""
    availability = _available(setup, record) if is_build_step(step) else None
    if availability is None or not availability.ok or availability.bwrap is None:
        yield
        return
    with Sandbox(availability.bwrap, step_view(step, setup, env, step.argv)).confining():
        yield


def how(step: Step, setup: BuildSetup, record: BuildRecord) -> str | None:
    """How ``step``'s command runs in this build (its ``state.json`` entry keeps it): in bubblewrap, or
    without a sandbox (none); None for a step that is not a build step."""
    if not is_build_step(step):
        return None
    return BUBBLEWRAP if _available(setup, record).ok else NONE


def summary(setup: BuildSetup) -> Isolation:
    """How this build's build steps ran, from their records (this run's, or an earlier one's whose result
    is used): bubblewrap when every one ran sandboxed, else none with the reason and the steps."""
    skipped = setup.options.skip_postcheck
    steps = [s for s in setup.plan.steps if is_build_step(s) and not (s.kind == "checks" and skipped)]
    outside = [step.name for step in steps if _how(setup, step) != BUBBLEWRAP]
    if not outside:
        return Isolation(BUBBLEWRAP, None, [])
    availability = setup.isolating.availability
    if availability is not None and not availability.ok:
        reason = availability.reason
    else:
        reason = "ran without a sandbox in an earlier run, whose result this build used"
    return Isolation(NONE, reason, outside, setup.options.allow_unisolated)


def _how(setup: BuildSetup, step: Step) -> str | None:
    """How a build step's recorded result was made: its record's ``isolation``; for a record with no
    outputs of its own (its venv came with a later step's store entry), that later step's."""
    names = setup.plan.venv_steps(step.venv) if step.venv is not None else [step.name]
    for name in names[names.index(step.name) :]:
        outputs = (setup.state.get(name) or {}).get("outputs") or {}
        if outputs:
            found = outputs.get("isolation")
            return found if isinstance(found, str) else None
    return None


def sandboxes(setup: BuildSetup) -> bool:
    """Whether this build runs its build steps in a sandbox (probed once)."""
    return _probed(setup).ok


def ran_unsandboxed(step: Step, outputs: Mapping[str, Any]) -> bool:
    """Whether a build step's recorded result (``state.json``, an environment store entry) was made without
    a sandbox (or before that was recorded): a build that sandboxes runs it again rather than vouch for it.
    A record with no outputs of its own is not the step's: its venv came with the next step's store entry,
    whose record says how that was made."""
    return is_build_step(step) and bool(outputs) and outputs.get("isolation") != BUBBLEWRAP
