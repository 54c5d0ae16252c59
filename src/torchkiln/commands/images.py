"""``torchkiln images``: build a recipe's devel / wheels / runtime image, or write docker-bake.hcl.

    torchkiln images --recipe FILE [--target devel|wheels|runtime] [--print] [--verify]
    torchkiln images --bake [--output docker-bake.hcl | --check]

The build uses ``docker buildx`` when a Docker engine answers, else ``buildah`` (``--engine`` forces one);
``--print`` shows the exact command and runs nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from ..container import (
    Buildah,
    BuildRequest,
    Docker,
    Engine,
    Storage,
    image_user,
    run_in_image,
    select_engine,
)
from ..errors import EXIT_FAILURE, EXIT_OK, TorchkilnError, UsageError
from ..images import (
    CACHE_SECRET_ID,
    DOCKERFILES,
    FLAVOURS,
    PIP_CONFIG_SECRET_ID,
    TOOLKIT_SOURCES,
    bake_file,
    devel_args,
    find_wheels,
    image_labels,
    image_tag,
    runtime_args,
)
from ..recipe import load_recipe, recipes_dir, resolve_recipe_path


def register(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--recipe", metavar="FILE", help="recipe to build images of (a path or a shipped name)")
    what.add_argument(
        "--bake",
        action="store_true",
        help="write docker-bake.hcl for every recipe in --recipes-dir instead of building",
    )
    parser.add_argument(
        "--target",
        choices=FLAVOURS,
        default="devel",
        help="devel (toolchain), wheels (runs `torchkiln build` inside; exports the wheels to "
        "--dist) or runtime (the wheels in --dist installed); default devel",
    )
    parser.add_argument(
        "--engine",
        choices=("auto", "docker", "buildah"),
        default="auto",
        help="container engine (default: docker if its engine answers, else buildah)",
    )
    parser.add_argument(
        "--print", dest="print_only", action="store_true", help="print the build command and run nothing"
    )
    parser.add_argument(
        "--registry", default="localhost", help="registry/namespace of the tag (default localhost)"
    )
    parser.add_argument(
        "--tag",
        action="append",
        default=[],
        metavar="TAG",
        help="extra tag (repeatable); the default <registry>/torchkiln:<torch>-<accel>-<target> "
        "is always set",
    )
    parser.add_argument(
        "--dist",
        default="dist",
        metavar="DIR",
        help="wheels directory: read by --target runtime, written by --target wheels (default dist)",
    )
    parser.add_argument(
        "--cuda-from",
        choices=("auto", *TOOLKIT_SOURCES),
        default="auto",
        help="where a CUDA recipe's toolkit comes from: pypi (NVIDIA's wheels on a plain distribution "
        "image; needs only a package index), nvidia (the nvidia/cuda images); default auto: pypi when "
        "torchkiln knows the recipe's CUDA on PyPI, else nvidia",
    )
    parser.add_argument(
        "--base-image", metavar="IMAGE", help="override the base image torchkiln's table picks for the recipe"
    )
    parser.add_argument(
        "--cache-secret",
        metavar="FILE",
        help="file holding the remote compiler cache's credential (--target wheels); it reaches "
        "the build only as a secret mount, never a layer",
    )
    parser.add_argument(
        "--pip-config",
        metavar="FILE",
        help="pip configuration for the build's pip steps (e.g. a package index mirror and its credentials: "
        "[global] index-url = ...); it reaches them only as a secret mounted at /etc/pip.conf, never a layer",
    )
    parser.add_argument(
        "--context", metavar="DIR", help="build context: the torchkiln checkout (default: found)"
    )
    parser.add_argument("--no-pull", action="store_true", help="use base images from local storage only")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="--target runtime: after building, run the verification suite inside the image",
    )
    parser.add_argument("--storage-root", metavar="DIR", help="buildah: private storage under DIR")
    parser.add_argument("--storage-driver", metavar="DRIVER", help="buildah: storage driver (e.g. vfs)")
    parser.add_argument("--output", metavar="FILE", help="--bake: where to write (default docker-bake.hcl)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="--bake: exit 1 if the bake file differs from what the recipes generate",
    )
    parser.add_argument("--recipes-dir", metavar="DIR", help="--bake: recipes to include (default: shipped)")


def checkout_root() -> Path:
    """The torchkiln checkout holding docker/ (the build context)."""
    for parent in Path(__file__).resolve().parents:
        if (parent / DOCKERFILES["devel"]).is_file() and (parent / "scripts").is_dir():
            return parent
    cwd = Path.cwd()
    if (cwd / DOCKERFILES["devel"]).is_file():
        return cwd
    raise UsageError("cannot find the torchkiln checkout (docker/Dockerfile.devel); pass --context DIR")


def run(args: argparse.Namespace) -> int:
    if args.bake:
        return _bake(args)
    return _build(args)


def _bake(args: argparse.Namespace) -> int:
    root = Path(args.recipes_dir) if args.recipes_dir else recipes_dir()
    files = sorted(root.glob("*.toml"))
    if not files:
        raise UsageError(f"--recipes-dir {root}: no *.toml recipes there")
    text = bake_file([load_recipe(f) for f in files], recipes_root=_relative_or_absolute(root))
    output = Path(args.output or "docker-bake.hcl")
    if args.check:
        current = output.read_text("utf-8") if output.exists() else ""
        if current != text:
            print(
                f"{output}: out of date with {root}/*.toml; run `torchkiln images --bake --output {output}`",
                file=sys.stderr,
            )
            return EXIT_FAILURE
        print(f"{output}: up to date ({len(files)} recipes)")
        return EXIT_OK
    _write_atomic(output, text)
    print(f"{output}: {len(files)} recipes x {len(FLAVOURS)} targets")
    return EXIT_OK


def _relative_or_absolute(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        return str(path.resolve())


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def build_request(args: argparse.Namespace, *, context: Path) -> BuildRequest:
    """What to build, from the command line and the recipe (no engine needed: --print uses it too)."""
    recipe = load_recipe(resolve_recipe_path(args.recipe))
    target = args.target
    if args.cache_secret and target != "wheels":
        raise UsageError("--cache-secret is only used by --target wheels (the stage that compiles)")
    if args.verify and target != "runtime":
        raise UsageError("--verify needs --target runtime (the image with the verification suite)")
    named: dict[str, Path] = {}
    secrets: dict[str, Path] = {}
    dist = Path(args.dist).resolve()
    assert recipe.path is not None  # loaded from a file
    named["recipe"] = recipe.path.resolve().parent
    if target == "runtime":
        build_args = runtime_args(
            recipe, find_wheels(dist, recipe), base_image=args.base_image, cuda_from=args.cuda_from
        )
        named["dist"] = dist
    else:
        build_args = devel_args(recipe, base_image=args.base_image, cuda_from=args.cuda_from)
        if target == "wheels":
            if recipe.cache.credentials_file and not recipe.cache.credentials_env:
                raise UsageError(
                    f"{recipe.source}: cache.credentials_file names a host file the image build "
                    "cannot read; set cache.credentials_env and pass the secret with --cache-secret"
                )
            if args.cache_secret:
                secret = Path(args.cache_secret)
                if not secret.is_file():
                    raise UsageError(
                        f"--cache-secret {secret}: no such file (valid: a file holding the credential)"
                    )
                if not recipe.cache.credentials_env:
                    raise UsageError(
                        f"{recipe.source}: --cache-secret given but the recipe sets no "
                        "cache.credentials_env (the variable the build reads the credential from)"
                    )
                secrets[CACHE_SECRET_ID] = secret.resolve()
    if args.pip_config:
        pip_config = Path(args.pip_config)
        if not pip_config.is_file():
            raise UsageError(
                f"--pip-config {pip_config}: no such file (valid: a pip configuration file, e.g. "
                "~/.config/pip/pip.conf)"
            )
        secrets[PIP_CONFIG_SECRET_ID] = pip_config.resolve()
    tags = (image_tag(recipe, target, args.registry), *args.tag)
    return BuildRequest(
        dockerfile=context / DOCKERFILES[target],
        context=context,
        target=target,
        tags=tags,
        build_args=build_args,
        named_contexts=named,
        secrets=secrets,
        labels=image_labels(recipe, target),
        pull=not args.no_pull,
    )


def build_argv(engine: Engine, req: BuildRequest, *, dist: Path) -> list[str]:
    """The engine's argv; the wheels target exports its files to ``dist`` instead of making an image."""
    argv = engine.build_argv(req)
    if req.target == "wheels":
        ctx = argv.pop()
        if isinstance(engine, Docker):
            argv.remove("--load")
        argv += ["--output", f"type=local,dest={dist}", ctx]
    return argv


def image_size(engine: Engine, image: str) -> int | None:
    """Bytes of the image as stored (uncompressed layers); None when the engine does not say."""
    if isinstance(engine, Docker):
        argv = [engine.executable, "image", "inspect", "--format", "{{.Size}}", image]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        return int(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip().isdigit() else None
    assert isinstance(engine, Buildah)
    done = subprocess.run(
        engine.storage_argv("images", "--json", image), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return None
    entries = json.loads(done.stdout or "[]")
    return _parse_size(str(entries[0].get("size", ""))) if entries else None


_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
}


def _parse_size(text: str) -> int | None:
    """buildah prints sizes for people ('1.27 GB', decimal units); bytes back (to 3 digits)."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", text)
    if not match:
        return None
    unit = _UNITS.get((match.group(2) or "B").upper())
    return int(float(match.group(1)) * unit) if unit else None


def _storage(args: argparse.Namespace) -> Storage:
    if args.storage_root:
        root = Path(args.storage_root).resolve()
        return Storage(root / "storage", root / "run", args.storage_driver)
    return Storage(driver=args.storage_driver)


def _build(args: argparse.Namespace) -> int:
    context = Path(args.context).resolve() if args.context else checkout_root()
    if not (context / DOCKERFILES[args.target]).is_file():
        raise UsageError(
            f"--context {context}: no {DOCKERFILES[args.target]} there (valid: a torchkiln checkout)"
        )
    req = build_request(args, context=context)
    engine = select_engine(args.engine, storage=_storage(args), for_print=args.print_only)
    dist = Path(args.dist).resolve()
    argv = build_argv(engine, req, dist=dist)
    if args.print_only:
        print(shlex.join(argv))
        return EXIT_OK
    print(f"torchkiln images: {shlex.join(argv)}", file=sys.stderr, flush=True)
    try:
        done = subprocess.run(argv, check=False)
    except OSError as exc:
        raise TorchkilnError(f"cannot run {argv[0]}: {exc.strerror}") from None
    if done.returncode != 0:
        raise TorchkilnError(
            f"image build failed ({engine.name} exit {done.returncode}); its output is above"
        )
    if req.target == "wheels":
        print(f"wheels: {', '.join(sorted(p.name for p in dist.glob('*.whl'))) or 'none'} in {dist}")
        return EXIT_OK
    image = req.tags[0]
    size = image_size(engine, image)
    print(f"{image}: built with {engine.name}" + (f", {size / 1e6:.0f} MB" if size else ""))
    if args.verify:
        user = image_user(engine, image)
        print(
            f"{image}: running the verification suite as user {user or 'root'}", file=sys.stderr, flush=True
        )
        result = run_in_image(engine, image, ["python", "-m", "torchkiln", "verify"])
        if result.returncode != 0:
            raise TorchkilnError(f"{image}: verification failed (exit {result.returncode})")
        print(f"{image}: verified")
    return EXIT_OK
