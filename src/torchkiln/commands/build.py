"""``torchkiln build RECIPE``: fetch the pinned sources and build torch and torchvision wheels into dist/.

Takes the same options as ``torchkiln plan`` (what is planned is what is built) plus ``--force``,
``--skip-postcheck``, ``--min-cache-hit-rate`` and the signing key of the provenance statement
(``--sign-key-file`` / ``--sign-key-env``: a path or a variable's name, never the key). Runs the plan with
:func:`torchkiln.build.loop.run_build`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import time
from pathlib import Path

from torchkiln.build.loop import BuildOptions, run_build
from torchkiln.build.progress import format_duration
from torchkiln.errors import BuildFailed, Interrupted, UsageError
from torchkiln.plan.model import Plan
from torchkiln.plan.preflight_records import diagnose, require_remembered
from torchkiln.plan.records import Records
from torchkiln.printing import make_console, say
from torchkiln.process.runner import stop_signals
from torchkiln.process.secrets import take

from . import add_renamed
from .plan import add_plan_arguments, plan_from_args


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (valid: 0 to 1, e.g. 0.9)") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is outside 0..1 (valid: e.g. 0.9 for 90 %)")
    return value


def register(parser: argparse.ArgumentParser) -> None:
    add_plan_arguments(parser)
    parser.add_argument(
        "--force",
        action="store_true",
        help="compile again from an empty in-tree build/ (and run every step after the compile); checkouts and build envs are reused while their inputs are unchanged",
    )
    parser.add_argument(
        "--no-preflight",
        action="store_true",
        help="skip the host checks of `torchkiln check` (the recipe, and each tree's version against its "
        "wheel's label, are still checked); recorded in the manifest. For stand-in projects and hosts whose "
        "toolkit lives where the checks do not look",
    )
    parser.add_argument(
        "--skip-postcheck",
        action="store_true",
        help="do not import the wheels in a clean venv afterwards (e.g. a Python the host cannot run)",
    )
    add_renamed(parser, "--skip-checks", "--skip-postcheck")
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="build and publish a fetched checkout that differs from its pinned ref (any path that is not "
        "the commit's or the build's own output: untracked, ignored, modified, removed, in submodules too): "
        "a warning, and the manifest, lock file and provenance record each path with its sha256; without it "
        "such a checkout is refused. A tree you change: --source-dir",
    )
    parser.add_argument(
        "--no-sandbox",
        action="store_true",
        help="run the build steps without a sandbox (they then see what this user sees: the signing key's "
        "file, the home directory); one warning, and the manifest and provenance record isolation: none",
    )
    parser.add_argument(
        "--allow-unisolated",
        action="store_true",
        help="sign the provenance of a build whose steps cannot run in a sandbox here (no bubblewrap, no user "
        "namespaces, --no-sandbox): the statement then says isolation: none, allow_unisolated: true; "
        "without it such a signed build is refused before its first step, naming why",
    )
    parser.add_argument(
        "--min-cache-hit-rate",
        type=_fraction,
        default=None,
        metavar="FRACTION",
        help="fail when the compiler cache's hit rate of this build is below FRACTION (0..1)",
    )
    parser.add_argument(
        "--sign-key-file",
        metavar="FILE",
        default=None,
        help="sign the provenance statement dist/<recipe>.intoto.jsonl with this PEM private key (ed25519 or "
        "ECDSA P-256); without a key no statement is written",
    )
    parser.add_argument(
        "--sign-key-env",
        metavar="NAME",
        default=None,
        help="the same, with the PEM text in the environment variable NAME (the key is never an argument)",
    )


def _absolute(args: argparse.Namespace) -> None:
    """Steps run in other working directories (the source tree): every path must be absolute."""
    args.workdir = args.workdir.absolute()
    args.dist = args.dist.absolute()
    if args.cache_dir is not None:
        args.cache_dir = args.cache_dir.absolute()
    items = []
    for item in args.source_dir:
        name, sep, path = item.partition("=")
        items.append(f"{name}={Path(path).absolute()}" if sep and path else item)
    args.source_dir = items


def interrupt(signum: int) -> BaseException:
    """What a stop signal raises in a build: Ctrl-C's KeyboardInterrupt (exit 130), else an
    :class:`Interrupted` that exits as a shell reports a process the signal killed (128 + its number:
    SIGHUP 129, SIGTERM 143)."""
    if signum == signal.SIGINT:
        return KeyboardInterrupt()
    error = Interrupted(
        f"torchkiln build: stopped by signal {signal.Signals(signum).name}; dist/ is unchanged"
    )
    error.exit_code = 128 + signum
    return error


def run(args: argparse.Namespace) -> int:
    """The build, stopped cleanly by SIGINT, SIGTERM or SIGHUP wherever it is (torchkiln.process.runner:
    what runs is stopped, nothing is published, a rerun continues)."""
    with stop_signals(interrupt):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    _absolute(args)
    # The key first: a build told to sign must not run for hours and then find it cannot. Read once: its
    # variable leaves this process's environment (artifacts.signing), its file every build step's view.
    sign_key = None
    if args.sign_key_file is not None or args.sign_key_env is not None:
        from torchkiln.artifacts.signing import load_signing_key  # noqa: PLC0415 - only a signed build

        sign_key = load_signing_key(file=args.sign_key_file, env_name=args.sign_key_env)
    secret_files = (str(Path(args.sign_key_file).expanduser().absolute()),) if args.sign_key_file else ()
    started = time.perf_counter()
    plan = plan_from_args(args, "build")  # a --torch requirement is resolved here (plan.given_torch)
    before = {"plan": round(time.perf_counter() - started, 3)}
    # The cache's and the cluster's credential variables too: the build holds them, no process inherits them.
    held = take(
        os.environ, [plan.cache.credentials_env, plan.cluster.credentials_env if plan.cluster else None]
    )
    environ = {**os.environ, **held}
    if plan.paths.dist.resolve() == plan.paths.workdir.resolve():
        raise UsageError("--dist and --workdir must be different directories")
    # Before the first step: a build that cannot succeed is refused with every reason, nothing fetched.
    # What the host answered before is read back while nothing it depends on changed
    # (torchkiln.plan.preflight_records); a failed step has every check asked afresh (_diagnosed).
    records = Records.for_build(plan.paths.workdir, plan.env_store)
    started = time.perf_counter()
    if args.no_preflight:
        plan = dataclasses.replace(plan, notes=(*plan.notes, "--no-preflight: the host was not checked"))
    else:
        require_remembered(plan, records, environ)
    before["preflight"] = round(time.perf_counter() - started, 3)
    console = make_console()
    r = plan.recipe
    say(
        console,
        ("torchkiln build", "bold"),
        f" {r.name}: {', '.join(plan.projects)} "
        f"(MAX_JOBS={plan.jobs.value}, cache {plan.cache.kind}, logs in {plan.paths.logs}/latest)",
    )
    options = BuildOptions(
        force=args.force,
        skip_postcheck=args.skip_postcheck,
        min_hit_rate=args.min_cache_hit_rate,
        allow_dirty=args.allow_dirty,
        console=console,
        environ=environ,
        sign_key=sign_key,
        secret_files=secret_files,
        isolation=not args.no_sandbox,
        allow_unisolated=args.allow_unisolated,
        before=before,
    )
    try:
        result = run_build(plan, options)
    except BuildFailed as exc:
        if args.no_preflight:
            raise
        raise _diagnosed(exc, plan, records, environ) from None
    total = sum(s.duration_s for s in result.steps)
    ran = len(result.ran)
    reused = sum(1 for s in result.steps if s.status == "reused")
    say(
        console,
        ("built", "green"),
        f" in {format_duration(total)} ({ran} step(s) ran, "
        + (f"{reused} reused from the environment store, " if reused else "")
        + f"{len(result.steps) - ran - reused} unchanged)",
    )
    for path in [
        *result.wheels,
        result.manifest,
        result.lock,
        *result.sboms,
        *([result.provenance] if result.provenance else []),
    ]:
        say(console, f"  {path}")
    return 0


def _diagnosed(failure: BuildFailed, plan: Plan, records: Records, environ: dict[str, str]) -> BuildFailed:
    """A failed step with the full preflight asked afresh: what a kept answer could not see (a compiler that
    broke without changing its file, a header removed) is named with the failure. The failure itself when
    the host checks still pass."""
    findings = diagnose(plan, records, environ)
    if not findings:
        return failure
    lines = "\n".join(str(f) for f in findings)
    error = type(failure)(
        f"{failure}\npreflight, asked afresh after this failure, finds {len(findings)} problem(s) of this "
        f"host:\n{lines}",
        step=failure.step,
        log=failure.log,
    )
    error.exit_code = failure.exit_code
    return error
