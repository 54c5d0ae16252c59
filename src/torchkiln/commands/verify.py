"""``torchkiln verify``: run the verification suite against the torch this interpreter imports.

The suite is a plain pytest suite (``verify/``); this command finds it, checks the inputs a user can get
wrong (the recipe, the report directory, whether torch and pytest are importable) before anything runs,
and starts ``python -m pytest <verify dir>`` with the current interpreter (an argv list, no shell).

Where the suite is: ``$TORCHKILN_VERIFY_DIR`` (the runtime image copies ``verify/`` to a fixed path and
sets it), else ``verify/`` of the checkout torchkiln is installed from, else the copy inside the installed
wheel (``torchkiln/verify_suite``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

from torchkiln.artifacts.manifest import load_manifest
from torchkiln.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, UsageError
from torchkiln.process import runner
from torchkiln.recipe.loader import load_recipe, resolve_recipe_path
from torchkiln.verify import hang, refenv, report
from torchkiln.verify.proc import scratch_environment, scratch_parent, worker_environment

ENV_DIR = "TORCHKILN_VERIFY_DIR"
AREAS = tuple(report.AREAS)
# pytest exit status -> torchkiln exit status: usage problems (4) and an empty selection (5) are exit 2.
PYTEST_EXIT = {0: EXIT_OK, 1: EXIT_FAILURE, 4: EXIT_USAGE, 5: EXIT_USAGE}


def register(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Arguments after -- go to pytest, e.g. `torchkiln verify --report out -- -x -k scaler`. "
        f"The suite is found through ${ENV_DIR} or the checkout's verify/ directory."
    )
    parser.add_argument(
        "--recipe",
        metavar="FILE",
        help="also check the build against this recipe (a path or a shipped recipe name)",
    )
    parser.add_argument(
        "--manifest",
        metavar="FILE",
        help="also check that the installed wheels are the ones a build's manifest.json lists (versions, "
        "commits, sha256)",
    )
    parser.add_argument(
        "--provenance",
        metavar="FILE",
        help="also check the signed provenance statement torchkiln build wrote (dist/<recipe>.intoto.jsonl): "
        "its signature by --key, and that the installed wheels are its subjects (sha256, versions, commits)",
    )
    parser.add_argument(
        "--key", metavar="PUB", help="with --provenance: the PEM public key the statement must be signed with"
    )
    cuda = parser.add_mutually_exclusive_group()
    cuda.add_argument(
        "--require-cuda",
        action="store_true",
        default=None,
        help="fail every CUDA-only check that would be skipped (default: when torch is a CUDA build and this "
        "machine has an NVIDIA GPU: /dev/nvidia<N>, /proc/driver/nvidia/gpus or nvidia-smi -L)",
    )
    cuda.add_argument(
        "--no-require-cuda",
        action="store_false",
        dest="require_cuda",
        help="let CUDA-only checks that cannot run skip, even on a machine with an NVIDIA GPU",
    )
    parser.add_argument(
        "--report", metavar="DIR", help="write junit.xml, summary.json and summary.md into DIR"
    )
    parser.add_argument(
        "--compare-with",
        metavar="REQ",
        help="also compare this build's numerics with upstream's wheel REQ (a requirement such as torch===2.13.0, "
        "or a wheel file), installed into a cached venv: the parity area",
    )
    parser.add_argument(
        "--area",
        action="append",
        choices=AREAS,
        default=[],
        help="run only this area (repeatable); default: all",
    )
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def find_suite() -> Path:
    """The verify/ directory: $TORCHKILN_VERIFY_DIR, else the checkout's verify/ next to src/, else the copy an
    installed wheel carries (torchkiln/verify_suite: pyproject.toml's package-dir)."""
    env = os.environ.get(ENV_DIR)
    if env:
        path = Path(env)
        if not (path / "conftest.py").is_file():
            raise UsageError(
                f"${ENV_DIR}={env}: not a verification suite (no conftest.py there) "
                "(valid: the directory holding verify/conftest.py)"
            )
        return path
    package = Path(__file__).resolve().parents[1]
    for candidate in (*(parent / "verify" for parent in package.parents), package / "verify_suite"):
        if (candidate / "conftest.py").is_file() and (candidate / "test_build_config.py").is_file():
            return candidate
    raise UsageError(
        f"cannot find the verification suite: set ${ENV_DIR} to the directory holding "
        "verify/conftest.py (the runtime image sets it)"
    )


def build_argv(args: argparse.Namespace, suite: Path) -> list[str]:
    """The pytest command line. Paths are made absolute so pytest's rootdir cannot change their meaning."""
    argv = [sys.executable, "-m", "pytest", str(suite)]
    if args.recipe:
        path = resolve_recipe_path(args.recipe)
        load_recipe(path)  # RecipeError -> exit 2 with one line per problem, before anything runs
        argv += ["--recipe", str(path.resolve())]
    if args.manifest:
        manifest = Path(args.manifest)
        load_manifest(manifest)  # DocumentError -> exit 2 naming the file and field, before anything runs
        argv += ["--manifest", str(manifest.resolve())]
    if args.provenance or args.key:
        if not (args.provenance and args.key):
            raise UsageError(
                "--provenance FILE and --key PUB go together (the statement and its signer's key)"
            )
        statement, key = Path(args.provenance), Path(args.key)
        # the signing machinery only where an attestation is checked (issue 38: imports by need)
        from torchkiln.artifacts.signing import load_envelope, load_public_key  # noqa: PLC0415

        load_envelope(statement)  # UsageError -> exit 2 naming the file, before anything runs
        load_public_key(key)
        argv += ["--provenance", str(statement.resolve()), "--key", str(key.resolve())]
    if args.require_cuda is not None:
        argv.append("--require-cuda" if args.require_cuda else "--no-require-cuda")
    if args.report:
        report = Path(args.report)
        if report.exists() and not report.is_dir():
            raise UsageError(
                f"--report {args.report}: exists and is not a directory (valid: a directory path)"
            )
        argv += ["--report", str(report.resolve())]
    if args.compare_with:
        refenv.check_requirement(args.compare_with)
    if args.area:
        if "parity" in args.area and not args.compare_with:
            raise UsageError("--area parity needs --compare-with REQ (the upstream wheel to compare with)")
        argv += ["-m", " or ".join(args.area)]
    extra = list(args.pytest_args)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    return argv + extra


def _upstream_battery(requirement: str, scratch: Path, environ: dict[str, str]) -> Path:
    """The parity battery's result in a (cached) venv holding ``requirement`` (torchkiln.verify.refenv)."""
    started = time.monotonic()
    python = refenv.reference_python(requirement)
    out = scratch / "upstream.json"
    refenv.run_battery(python, out, isolated=True, environ=environ)
    print(
        f"torchkiln verify: --compare-with {requirement}: {python.parent.parent} "
        f"({time.monotonic() - started:.0f} s with the battery)",
        file=sys.stderr,
    )
    return out


def _require_importable(module: str, hint: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise UsageError(f"{module} is not importable by {sys.executable} (valid: {hint})")


def run(args: argparse.Namespace) -> int:
    suite = find_suite()
    argv = build_argv(args, suite)
    try:  # the DDP launches' deadline and rendezvous port: named before anything runs
        hang.launch_deadline(os.environ)
        hang.launch_port(os.environ)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    _require_importable("pytest", "pip install pytest pytest-timeout")
    _require_importable("torch", "install the torch to verify, e.g. the wheels in dist/ (nox -s verify)")
    started = time.time()
    # One temp directory of its own for everything the run writes besides its report (the parity battery's
    # result, every temp file and cache of pytest and its processes: proc.scratch_environment), removed after.
    try:  # where a socket's name fits under it (proc.scratch_parent)
        parent = scratch_parent("torchkiln-verify-")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    with tempfile.TemporaryDirectory(prefix="torchkiln-verify-", dir=parent) as scratch:
        # pytest runs under the suite's environment policy too: a caller's TORCH_DISTRIBUTED_DEBUG=garbage
        # would otherwise fail the import of torch.distributed before any check ran.
        env = {**worker_environment(os.environ), **scratch_environment(Path(scratch) / "suite")}
        if args.compare_with:
            argv += ["--parity-reference", str(_upstream_battery(args.compare_with, Path(scratch), env))]
        status = runner.run(argv, env=env, capture=False).returncode
    if args.report:
        summary = Path(args.report).resolve() / "summary.md"
        if summary.is_file() and summary.stat().st_mtime >= started - 1:  # this run's, not an older one
            print(f"torchkiln verify: report in {summary}", file=sys.stderr)
        else:
            print(f"torchkiln verify: no report was written (pytest exit {status})", file=sys.stderr)
    return EXIT_FAILURE if status is None else PYTEST_EXIT.get(status, EXIT_FAILURE)
