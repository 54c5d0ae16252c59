"""``torchkiln plan RECIPE [--json]``: the resolved build plan, without running anything."""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from torchkiln.build.envstore import default_env_store
from torchkiln.cache import resolve_cache
from torchkiln.distributed.spec import ClusterSpec, resolve_cluster
from torchkiln.errors import RecipeError, TorchkilnError, UsageError
from torchkiln.plan.environment import ENV_TABLE
from torchkiln.plan.given_torch import resolve_given_torch
from torchkiln.plan.labels import require_labels
from torchkiln.plan.make import make_plan
from torchkiln.plan.model import PROJECTS, Plan
from torchkiln.plan.records import Records
from torchkiln.plan.source_adoption import adopt_source_versions, adopted_rule_problems
from torchkiln.printing import Console, LiteralTable, make_console, say, show
from torchkiln.recipe.loader import load_recipe, resolve_recipe_path
from torchkiln.recipe.model import Recipe
from torchkiln.recipe.rules_settings import remote_secret
from torchkiln.recipe.validators import path_problem, plain_string

from . import add_renamed


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``plan`` and ``build``: what is planned is what is built."""
    parser.add_argument("recipe", nargs="?", help="recipe file, or the name of a shipped recipe")
    parser.add_argument("--recipe", dest="recipe_opt", metavar="RECIPE", help="same as the positional RECIPE")
    parser.add_argument(
        "--jobs", "-j", type=int, default=None, help="MAX_JOBS (default: from cores and memory)"
    )
    parser.add_argument(
        "--memory-retries",
        type=int,
        default=None,
        metavar="N",
        help="how often a compile step whose compiles the kernel killed for memory resumes with half the jobs "
        "(default: the recipe's build.memory_retries, else 3; 0: never)",
    )
    parser.add_argument(
        "--workdir", type=Path, default=Path(".torchkiln"), help="sources, venv, logs (.torchkiln)"
    )
    parser.add_argument(
        "--dist", type=Path, default=Path("dist"), help="where wheels and manifest land (dist)"
    )
    parser.add_argument(
        "--source-dir",
        action="append",
        default=[],
        metavar="PROJECT=PATH",
        help="use an existing checkout for torch or torchvision instead of fetching",
    )
    parser.add_argument(
        "--accept-source-version",
        action="append",
        choices=("torch", "torchvision"),
        default=[],
        metavar="PROJECT",
        help="build a --source-dir tree whose version.txt differs from the recipe at the tree's own version "
        "(recorded in the manifest); without it such a tree is refused",
    )
    parser.add_argument(
        "--only", choices=("torch", "torchvision"), default=None, help="build one project only"
    )
    parser.add_argument(
        "--cache",
        choices=("none", "ccache", "sccache"),
        default=None,
        help="compiler cache (default: the recipe's, else ccache)",
    )
    parser.add_argument(
        "--torch",
        dest="given_torch",
        default=None,
        metavar="WHEEL|REQ",
        help="with --only torchvision: build against this torch (a wheel file, or torch==VERSION) instead "
        "of the recipe's own build; checked to pair with the recipe's torchvision, recorded in the manifest",
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="local compiler-cache directory")
    parser.add_argument(
        "--cache-remote", default=None, help="remote cache store URL (credentials: see README)"
    )
    parser.add_argument(
        "--env-store",
        default=None,
        metavar="DIR|off",
        help="where build and check venvs are kept by their content and shared between work directories "
        "(default: $TORCHKILN_ENV_STORE, else envs/ beside the compiler caches; off: keep none)",
    )
    parser.add_argument(
        "--cluster-scheduler",
        default=None,
        metavar="URL|off",
        help="send compiles to this sccache-dist scheduler (default: the recipe's [cluster]; off: compile locally)",
    )
    parser.add_argument(
        "--cluster-token-env",
        default=None,
        metavar="NAME",
        help="environment variable holding the build cluster's client token (default TORCHKILN_DIST_TOKEN)",
    )
    parser.add_argument(
        "--cluster-token-file", default=None, metavar="FILE", help="file holding the client token"
    )
    # "dist" is the output directory (--dist): the cluster's options were --dist-* (issue 48)
    for old in ("--dist-scheduler", "--dist-token-env", "--dist-token-file"):
        add_renamed(parser, old, old.replace("--dist-", "--cluster-"))


def register(parser: argparse.ArgumentParser) -> None:
    add_plan_arguments(parser)
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (keys: recipe, sources, steps)"
    )


def parse_source_dirs(items: list[str]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not path:
            raise UsageError(
                f"--source-dir {item!r}: expected PROJECT=PATH (valid projects: torch, torchvision)"
            )
        if name not in PROJECTS:
            raise UsageError(f"--source-dir {name}=...: unknown project (valid: {', '.join(PROJECTS)})")
        if not Path(path).is_dir():
            raise UsageError(f"--source-dir {item!r}: {path} is not a directory")
        out[name] = Path(path)
    return out


def check_cache_arguments(
    args: argparse.Namespace, *, credentials: bool = False, environ: Mapping[str, str] | None = None
) -> None:
    """The command line's cache settings under the recipe's grammar: a directory must expand (``~user``),
    and a password never goes on the command line, where ``ps`` shows it to every user of the machine."""
    environ = os.environ if environ is None else environ
    for what, value in (
        ("--cache-dir", None if args.cache_dir is None else str(args.cache_dir)),
        ("TORCHKILN_CACHE_DIR", environ.get("TORCHKILN_CACHE_DIR")),
    ):
        if value is None:
            continue
        problem = plain_string(value) or path_problem(value)
        if problem:
            raise UsageError(f"{what}: {problem[0]} (valid: {problem[1]})")
    if args.cache_remote:
        problem = plain_string(args.cache_remote)
        if problem:
            raise UsageError(f"--cache-remote: {problem[0]} (valid: {problem[1]})")
        secret = remote_secret(args.cache_remote, credentials=credentials)
        if secret:
            raise UsageError(
                f"--cache-remote: {secret}; a command line is visible to every user (ps) (valid: the URL "
                "without it, and the secret in the recipe's cache.credentials_env or cache.credentials_file)"
            )


def recipe_from_args(args: argparse.Namespace, command: str) -> Recipe:
    """The recipe named by RECIPE or --recipe (a file, or a shipped recipe's name), loaded and checked."""
    name = args.recipe_opt or args.recipe
    if not name:
        nox = (
            "; through nox: nox -s build-wheel -- --recipe RECIPE (nox hands what follows -- to torchkiln "
            "build; without the -- nox reads --recipe itself and refuses it)"
            if command == "build"
            else ""
        )
        raise UsageError(
            f"a recipe is required: torchkiln {command} RECIPE (a .toml file or a shipped recipe name){nox}"
        )
    if args.recipe_opt and args.recipe and args.recipe_opt != args.recipe:
        raise UsageError("give the recipe once: either RECIPE or --recipe RECIPE")
    return load_recipe(resolve_recipe_path(name))


def env_store_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Path | None:
    """``--env-store DIR|off``, else ``$TORCHKILN_ENV_STORE`` (also DIR or off), else the default store."""
    environ = os.environ if environ is None else environ
    for what, value in (
        ("--env-store", args.env_store),
        ("TORCHKILN_ENV_STORE", environ.get("TORCHKILN_ENV_STORE")),
    ):
        if value is None:
            continue
        if value == "off":
            return None
        problem = plain_string(value) or path_problem(value)
        if problem:
            raise UsageError(f"{what}: {problem[0]} (valid: a directory, or off)")
        return Path(value).expanduser().absolute()
    return default_env_store(environ)


def plan_from_args(args: argparse.Namespace, command: str = "plan") -> Plan:
    """:func:`_plan_from_args`; refused, it leaves no work directory behind that it made (``build`` keeps
    what ``--torch``'s resolution found there: torchkiln.plan.records)."""
    workdir = Path(args.workdir).absolute()
    made = not workdir.exists()
    try:
        return _plan_from_args(args, command)
    except TorchkilnError:
        if made:
            shutil.rmtree(workdir, ignore_errors=True)
        raise


def _plan_from_args(args: argparse.Namespace, command: str) -> Plan:
    """The plan of ``torchkiln plan|check|build``. ``--torch``'s resolution reads what an earlier run found
    (torchkiln.plan.records: the same requirement, index configuration and wheel) for ``plan`` and
    ``build``, and only ``build`` records it; ``check``, the diagnosis, asks pip every time."""
    recipe = recipe_from_args(args, command)
    check_cache_arguments(
        args, credentials=bool(recipe.cache.credentials_env or recipe.cache.credentials_file)
    )
    cache = resolve_cache(recipe.cache, kind=args.cache, dir=args.cache_dir, remote=args.cache_remote)
    source_dirs = parse_source_dirs(args.source_dir)
    accepted = frozenset(args.accept_source_version)
    for project in sorted(accepted - set(source_dirs)):
        raise UsageError(f"--accept-source-version {project}: needs --source-dir {project}=PATH")
    recipe, notes = adopt_source_versions(recipe, source_dirs, accepted)
    # The rules see the adopted version here, for plan, check and build alike (--no-preflight too).
    adopted_problems = adopted_rule_problems(recipe, source_dirs, notes)
    if adopted_problems:
        raise RecipeError(adopted_problems)
    torch = None
    if args.given_torch:
        # install-torch's pip looks in these too (plan.make._install_torch_step): so does the resolution
        wheelhouse = Path(args.workdir).absolute() / "wheelhouse" / "torch"
        find_links = (wheelhouse, Path(args.dist).absolute())
        records = None
        if command != "check":
            store = env_store_from_args(args)
            records = Records.for_build(Path(args.workdir).absolute(), store, write=command == "build")
        torch = resolve_given_torch(args.given_torch, recipe, args.only, find_links, records)
    plan = make_plan(
        recipe,
        workdir=args.workdir,
        dist=args.dist,
        jobs=args.jobs,
        source_dirs=source_dirs,
        only=args.only,
        cache=cache,
        notes=notes,
        torch=torch,
        cluster=cluster_from_args(args, recipe, cache.kind),
        env_store=env_store_from_args(args),
        memory_retries=args.memory_retries,
    )
    if command != "check":  # check reports it with every host finding (preflight's "source")
        require_labels(plan)  # whatever else is skipped: the label is the tree's own version
    return plan


def cluster_from_args(args: argparse.Namespace, recipe: Recipe, cache_kind: str) -> ClusterSpec | None:
    """The recipe's ``[cluster]`` with ``--cluster-scheduler`` / ``--cluster-token-env`` / ``--cluster-token-file`` over it."""
    url = args.cluster_scheduler
    if url is not None and url.strip().lower() in ("off", ""):
        return None
    return resolve_cluster(
        recipe.cluster,
        cache_kind=cache_kind,
        scheduler_url_override=url,
        credentials_env=args.cluster_token_env,
        credentials_file=args.cluster_token_file,
    )


def run(args: argparse.Namespace) -> int:
    plan = plan_from_args(args)
    if args.json:
        print(plan.to_json())
        return 0
    print_plan(plan)
    return 0


def print_plan(plan: Plan, console: Console | None = None) -> None:
    console = console or make_console(width=160)
    r = plan.recipe
    say(
        console,
        (r.name, "bold"),
        f"  torch {r.torch_wheel_version} + torchvision {r.torchvision_wheel_version}"
        f"  (Python {', '.join(r.python_versions)}, {r.accelerator.kind})",
    )
    say(
        console,
        f"torch front-end: {plan.frontend}; MAX_JOBS={plan.jobs.value} ({plan.jobs.source}: "
        f"{plan.jobs.reason}); a compile killed for memory resumes with half the jobs, up to "
        f"{plan.memory_retries} time(s)",
    )
    if plan.cluster is not None:
        say(
            console,
            f"distributed compiles: sccache-dist scheduler {plan.cluster.scheduler_url} (checked before the "
            "first compile; unreachable or refused: one warning, compiles run locally)",
        )
    sources = LiteralTable("project", "repo", "ref", "commit", "path", title="sources")
    for s in plan.sources:
        cells = (
            s.name,
            s.repo,
            s.ref,
            s.commit or "(resolved at fetch)",
            f"{s.path}" + (" (given)" * s.provided),
        )
        sources.add_row(*cells)
    show(console, sources)
    why = {row.name: row.why for row in ENV_TABLE}
    why["VIRTUAL_ENV"] = "the build venv is the active environment of the build"
    why.update({key: "recipe build.flags" for key in r.build.flags})
    for project in plan.projects:
        env = LiteralTable("variable", "value", "why", title=f"{project} build environment")
        wheel = next(s for s in plan.steps if s.kind == "compile" and s.project == project)
        if wheel.path_prepend:
            env.add_row("PATH", ":".join(wheel.path_prepend) + ":$PATH", "the build venv's cmake, ninja")
        for key, value in wheel.env.items():
            env.add_row(key, value, why.get(key, ""))
        for key, value in wheel.cache_env.items():
            env.add_row(key, value, f"compiler cache ({plan.cache.kind})")
        secret = _secret_source(plan)
        if secret:
            env.add_row("(secrets)", secret, "remote cache credentials: set at run time, never shown")
        if plan.cluster is not None:
            env.add_row(
                "SCCACHE_CONF",
                "(a private file, written at run time)",
                f"compiles sent to {plan.cluster.scheduler_url}; client token {_cluster_token_source(plan.cluster)}",
            )
        show(console, env)
    steps = LiteralTable("#", "step", "command", title="steps")
    for i, step in enumerate(plan.steps, 1):
        steps.add_row(str(i), step.name, step.command())
    show(console, steps)


def _cluster_token_source(cluster: ClusterSpec) -> str:
    return (
        f"read from ${cluster.credentials_env}"
        if cluster.credentials_env
        else f"read from {cluster.credentials_file}"
    )


def _secret_source(plan: Plan) -> str | None:
    """Where the compile steps' secret variables come from, when the remote store takes credentials."""
    cache = plan.cache
    if not cache.has_credentials:
        return None
    if cache.credentials_env:
        return f"read from ${cache.credentials_env}"
    if cache.credentials_file:
        return f"read from {cache.credentials_file}"
    return "the password in cache.remote"
