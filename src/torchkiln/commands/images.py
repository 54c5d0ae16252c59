"""``torchkiln images``: build a recipe's devel / wheels / runtime image, or write docker-bake.json.

    torchkiln images --recipe FILE [--target devel|wheels|runtime] [--engine E] [--print] [--verify]
                     [--base-image IMAGE | --base-from debootstrap | --base-rootfs DIR|TAR]
    torchkiln images --bake [--output docker-bake.json | --check]

The build uses ``docker buildx`` when a Docker engine answers, else buildah, else podman (``--engine``
chooses; :mod:`torchkiln.images.engines` hides how each spells things). ``--print`` shows the exact command and
runs nothing. The runtime image installs the wheels of ``--dist`` as that directory's ``manifest.json``
describes them (:func:`torchkiln.artifacts.published.read_published`). Where no registry is reachable, the base
is made on this host (``--base-from debootstrap``, ``--base-rootfs``: :mod:`torchkiln.images.rootfs`).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from torchkiln.artifacts.published import MANIFEST_NAME, read_published
from torchkiln.artifacts.signing import load_public_key
from torchkiln.errors import EXIT_FAILURE, EXIT_OK, TorchkilnError, UsageError
from torchkiln.files import atomic
from torchkiln.images import rootfs
from torchkiln.images.bake import BAKE_FILE, bake_text, left_out
from torchkiln.images.engines import ENGINES, BuildRequest, Engine, Storage, select_engine
from torchkiln.images.platforms import ImagePlatform, emulation_problem, image_platform, image_platforms
from torchkiln.images.rootfs import LocalBase, plan_debootstrap, plan_rootfs
from torchkiln.images.spec import (
    CACHE_SECRET_ID,
    CLUSTER_SECRET_FILE,
    CLUSTER_SECRET_ID,
    DOCKERFILES,
    FLAVOURS,
    PIP_CONFIG_SECRET_ID,
    devel_args,
    image_labels,
    image_tag,
    plain_distro,
    provenance_args,
    runtime_args,
)
from torchkiln.recipe.compat import image_problem
from torchkiln.recipe.image_bases import TOOLKIT_SOURCES
from torchkiln.recipe.loader import load_recipe, recipes_dir, resolve_recipe_path
from torchkiln.recipe.model import Recipe

from . import add_renamed

# Where the runtime image keeps the manifest of the wheels it installed (scripts/install_wheels.sh).
IMAGE_DIR = "/opt/torchkiln"
IMAGE_MANIFEST = f"{IMAGE_DIR}/manifest.json"
IMAGE_PROVENANCE_KEY = f"{IMAGE_DIR}/provenance-key.pub"  # written by scripts/install_wheels.sh
# Where the base image comes from: a registry (the table's image, or --base-image), or debootstrap on this
# host (torchkiln.images.rootfs; --base-rootfs imports a root made elsewhere).
BASE_SOURCES = ("registry", "debootstrap")


def register(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--recipe", metavar="FILE", help="recipe to build images of (a path or a shipped name)")
    what.add_argument(
        "--bake",
        action="store_true",
        help=f"write {BAKE_FILE} for every recipe in --recipes-dir instead of building",
    )
    _image_arguments(parser.add_argument_group("what the image is: its target, tag and base"))
    _engine_arguments(parser.add_argument_group("the engine that builds it and how"))
    _secret_arguments(parser.add_argument_group("secrets the build reads: secret mounts only, never a layer"))
    _bake_arguments(parser.add_argument_group("--bake: docker-bake.json instead of a build"))


def _image_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--target",
        choices=FLAVOURS,
        default="devel",
        help="devel (toolchain), wheels (runs `torchkiln build` inside; exports the wheels to "
        "--dist) or runtime (the wheels in --dist installed); default devel",
    )
    group.add_argument(
        "--platform",
        metavar="PLATFORM",
        help="the image's platform: linux/amd64 or linux/arm64; must be the recipe's build.platform "
        "(default: the recipe's). On another kind of host the RUN steps run through qemu-user",
    )
    group.add_argument(
        "--registry", default="localhost", help="registry/namespace of the tag (default localhost)"
    )
    group.add_argument(
        "--tag",
        action="append",
        default=[],
        metavar="TAG",
        help="extra tag (repeatable); the default <registry>/torchkiln:<torch>-<accel>-<target> "
        "is always set",
    )
    group.add_argument(
        "--cuda-from",
        choices=("auto", *TOOLKIT_SOURCES),
        default="auto",
        help="where a CUDA recipe's toolkit comes from: pypi (NVIDIA's wheels on a plain distribution "
        "image; needs only a package index), nvidia (the nvidia/cuda images); default auto: pypi when "
        "torchkiln knows the recipe's CUDA on PyPI, else nvidia",
    )
    group.add_argument(
        "--base-image", metavar="IMAGE", help="override the base image torchkiln's table picks for the recipe"
    )
    _local_base_arguments(group)
    group.add_argument(
        "--dist",
        default="dist",
        metavar="DIR",
        help="wheels directory: read by --target runtime (with the manifest.json the build wrote there), "
        "written by --target wheels (default dist)",
    )


def _local_base_arguments(group: argparse._ArgumentGroup) -> None:
    """Where the base comes from when no registry is reachable (torchkiln.images.rootfs)."""
    group.add_argument(
        "--base-from",
        choices=BASE_SOURCES,
        default="registry",
        help="registry: pull the distribution image the table picks (or --base-image); debootstrap: make "
        "that distribution's root with debootstrap from its apt archive and import it as the base, so no "
        "registry is needed (root; made once per engine storage, then reused)",
    )
    group.add_argument(
        "--base-rootfs",
        metavar="DIR|TAR",
        help="import this root filesystem as the base (e.g. one made by debootstrap); no registry is needed",
    )
    group.add_argument(
        "--debootstrap-mirror",
        metavar="URL",
        help="--base-from debootstrap: the apt archive to fetch from (default: the distribution's, e.g. "
        "http://deb.debian.org/debian)",
    )
    group.add_argument(
        "--base-ca",
        action="append",
        default=[],
        metavar="FILE",
        help="with --base-from debootstrap or --base-rootfs: a PEM CA certificate the image trusts (a TLS-"
        "intercepting proxy's), added to the base's /usr/local/share/ca-certificates (repeatable)",
    )


def _engine_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--engine",
        choices=("auto", *ENGINES),
        default="auto",
        help="container engine (default: docker if its engine answers, else buildah, else podman; with "
        "--storage-root/--storage-driver only buildah or podman)",
    )
    group.add_argument(
        "--print", dest="print_only", action="store_true", help="print the build command and run nothing"
    )
    group.add_argument(
        "--context", metavar="DIR", help="build context: the torchkiln checkout (default: found)"
    )
    group.add_argument("--no-pull", action="store_true", help="use base images from local storage only")
    group.add_argument(
        "--verify",
        action="store_true",
        help="--target runtime: after building, run the verification suite inside the image",
    )
    group.add_argument("--storage-root", metavar="DIR", help="buildah, podman: private storage under DIR")
    group.add_argument(
        "--storage-driver", metavar="DRIVER", help="buildah, podman: storage driver (e.g. vfs)"
    )


def _secret_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--cache-secret",
        metavar="FILE",
        help="file holding the remote compiler cache's credential (--target wheels); it reaches "
        "the build only as a secret mount, never a layer",
    )
    group.add_argument(
        "--cluster-secret",
        metavar="FILE",
        help="file holding the build cluster's client token (--target wheels, a recipe with [cluster]); it "
        f"reaches the build only as a secret mount ({CLUSTER_SECRET_FILE}), never a layer",
    )
    # "dist" is the wheels directory (--dist): the token file's option was --dist-secret (issue 48)
    add_renamed(group, "--dist-secret", "--cluster-secret")
    group.add_argument(
        "--provenance-key",
        metavar="PUB",
        help="--target runtime: the PEM public key the build's signed provenance statement in --dist is "
        "checked against, here and by the image's sanity gate (the image keeps it beside the statement)",
    )
    group.add_argument(
        "--pip-config",
        metavar="FILE",
        help="pip configuration for the build's pip steps (e.g. a package index mirror and its credentials: "
        "[global] index-url = ...); it reaches them only as a secret mounted at /etc/pip.conf, never a layer",
    )


def _bake_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--output", metavar="FILE", help=f"--bake: where to write (default {BAKE_FILE})")
    group.add_argument(
        "--check",
        action="store_true",
        help="--bake: exit 1 if the bake file differs from what the recipes generate",
    )
    group.add_argument("--recipes-dir", metavar="DIR", help="--bake: recipes to include (default: shipped)")


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
    recipes = [load_recipe(f) for f in files]
    text = bake_text(recipes, recipes_root=_relative_or_absolute(root))
    output = Path(args.output or BAKE_FILE)
    baked = len(recipes)
    for problem in filter(None, map(left_out, recipes)):  # no targets for it in the bake file: say why
        print(f"{output}: leaves out {problem}", file=sys.stderr)
        baked -= 1
    if args.check:
        current = output.read_text("utf-8") if output.exists() else ""
        if current != text:
            print(
                f"{output}: out of date with {root}/*.toml; run `torchkiln images --bake --output {output}`",
                file=sys.stderr,
            )
            return EXIT_FAILURE
        print(f"{output}: up to date ({baked} recipes)")
        return EXIT_OK
    atomic.write_text(output, text)
    print(f"{output}: {baked} recipes x {len(FLAVOURS)} targets")
    return EXIT_OK


def _relative_or_absolute(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        return str(path.resolve())


def _secret_file(option: str, value: str, valid: str) -> Path:
    path = Path(value)
    if not path.is_file():
        raise UsageError(f"{option} {path}: no such file (valid: {valid})")
    return _no_comma(option, path.resolve())


def _no_comma(option: str, path: Path) -> Path:
    """A path the engine gets inside a comma-separated option value (``--secret id=ID,src=PATH``,
    ``--output type=local,dest=PATH``): a ',' in it would start another field there."""
    if "," in str(path):
        raise UsageError(
            f"{option} {path}: holds ',', which the engine reads as the start of another field of "
            "--secret/--output (valid: a path without ',')"
        )
    return path


def _cluster_secret(recipe: Recipe, given: str | None) -> Path | None:
    """The token file for a recipe with ``[cluster]``: the image build reads it only as a secret mount, so the
    recipe must name that mount as its credentials_file, and a build without the secret would fail."""
    if recipe.cluster is None:
        if given:
            raise UsageError(
                f"{recipe.source}: --cluster-secret given but the recipe has no [cluster] section"
            )
        return None
    if recipe.cluster.credentials_file != CLUSTER_SECRET_FILE:
        raise UsageError(
            f"{recipe.source}: cluster.credentials_file: the image build reads the client token only from "
            f"its secret mount (valid: credentials_file = {CLUSTER_SECRET_FILE!r}, with --cluster-secret FILE)"
        )
    if not given:
        raise UsageError(
            f"{recipe.source}: the recipe's [cluster] needs the client token: --cluster-secret FILE (or drop [cluster])"
        )
    return _secret_file("--cluster-secret", given, "a file holding the client token")


def local_base(args: argparse.Namespace) -> LocalBase | None:
    """The base made on this host that the command line asks for (None: a registry's, as the table or
    --base-image say); nothing is made yet."""
    debootstrap = args.base_from == "debootstrap"
    if not (debootstrap or args.base_rootfs):
        for option, given in (("--debootstrap-mirror", args.debootstrap_mirror), ("--base-ca", args.base_ca)):
            if given:
                raise UsageError(f"{option} is only used with --base-from debootstrap or --base-rootfs")
        return None
    chosen = "--base-from debootstrap" if debootstrap else "--base-rootfs"
    if args.base_image:
        raise UsageError(f"--base-image and {chosen} both name the base (valid: one of them)")
    if debootstrap and args.base_rootfs:
        raise UsageError("--base-from debootstrap and --base-rootfs both name the base (valid: one of them)")
    recipe = load_recipe(resolve_recipe_path(args.recipe))
    target = chosen_platform(recipe, args.platform)
    if args.base_rootfs:
        if args.debootstrap_mirror:
            raise UsageError("--debootstrap-mirror is only used with --base-from debootstrap")
        return plan_rootfs(args.base_rootfs, cas=args.base_ca, target=target)
    key, distro = plain_distro(recipe, args.target, args.cuda_from)
    return plan_debootstrap(key, distro, archive=args.debootstrap_mirror, cas=args.base_ca, target=target)


def chosen_platform(recipe: Recipe, given: str | None) -> ImagePlatform:
    """The recipe's image platform; ``--platform``, when given, must be that one: torchkiln builds a recipe's
    wheels for the machine it names (build.platform) and does not cross-compile."""
    target = image_platform(recipe)
    if given is not None and given != target.oci:
        raise UsageError(
            f"--platform {given}: {recipe.source} is a build.platform = {target.name!r} recipe, whose images "
            f"are {target.oci} (valid: --platform {target.oci}, or a recipe whose build.platform is the "
            "machine you want)"
        )
    return target


def build_request(args: argparse.Namespace, *, context: Path, base: LocalBase | None = None) -> BuildRequest:
    """What to build, from the command line, the recipe and (runtime) the manifest in --dist; no engine is
    needed (--print uses it too). With a ``base`` made here, the build uses it and pulls nothing."""
    recipe = load_recipe(resolve_recipe_path(args.recipe))
    machine = chosen_platform(recipe, args.platform)
    if (problem := image_problem(recipe, args.target)) is not None:
        raise UsageError(problem)
    target = args.target
    base_image = base.tag if base is not None else args.base_image
    for option, given in (("--cache-secret", args.cache_secret), ("--cluster-secret", args.cluster_secret)):
        if given and target != "wheels":
            raise UsageError(f"{option} is only used by --target wheels (the stage that compiles)")
    if args.provenance_key and target != "runtime":
        raise UsageError(
            "--provenance-key is only used by --target runtime (the image that installs the wheels)"
        )
    if args.verify and target != "runtime":
        raise UsageError("--verify needs --target runtime (the image with the verification suite)")
    dist = Path(args.dist).resolve()
    assert recipe.path is not None  # loaded from a file
    named: dict[str, Path] = {"recipe": recipe.path.resolve().parent}
    secrets: dict[str, Path] = {}
    output: Path | None = None
    if target == "runtime":
        manifest = read_published(dist)
        build_args = runtime_args(
            recipe,
            manifest,
            manifest_file=str(dist / MANIFEST_NAME),
            base_image=base_image,
            cuda_from=args.cuda_from,
        )
        key = load_public_key(Path(args.provenance_key), "--provenance-key") if args.provenance_key else None
        build_args.update(provenance_args(dist, manifest, key))
        named["dist"] = dist
    else:
        build_args = devel_args(recipe, base_image=base_image, cuda_from=args.cuda_from)
    if target == "wheels":
        output = _no_comma("--dist", dist)  # the stage's files (wheels, manifest, lock file), not an image
        if recipe.cache.credentials_file and not recipe.cache.credentials_env:
            raise UsageError(
                f"{recipe.source}: cache.credentials_file names a host file the image build "
                "cannot read; set cache.credentials_env and pass the secret with --cache-secret"
            )
        if args.cache_secret:
            secret = _secret_file("--cache-secret", args.cache_secret, "a file holding the credential")
            if not recipe.cache.credentials_env:
                raise UsageError(
                    f"{recipe.source}: --cache-secret given but the recipe sets no "
                    "cache.credentials_env (the variable the build reads the credential from)"
                )
            secrets[CACHE_SECRET_ID] = secret
        cluster_secret = _cluster_secret(recipe, args.cluster_secret)
        if cluster_secret is not None:
            secrets[CLUSTER_SECRET_ID] = cluster_secret
    if args.pip_config:
        secrets[PIP_CONFIG_SECRET_ID] = _secret_file(
            "--pip-config", args.pip_config, "a pip configuration file, e.g. ~/.config/pip/pip.conf"
        )
    return BuildRequest(
        dockerfile=context / DOCKERFILES[target],
        context=context,
        target=target,
        tags=(image_tag(recipe, target, args.registry), *args.tag),
        build_args=build_args,
        named_contexts=named,
        secrets=secrets,
        labels=image_labels(recipe, target),
        pull=not args.no_pull and base is None,
        output=output,
        platform=machine.oci,
        emulated=not machine.native,
    )


def _storage(args: argparse.Namespace) -> Storage:
    if args.storage_root:
        root = Path(args.storage_root).resolve()
        return Storage(root / "storage", root / "run", args.storage_driver)
    return Storage(driver=args.storage_driver)


def _verify(engine: Engine, image: str, statement: str, machine: ImagePlatform) -> None:
    """The verification suite inside the image, as its user, against the manifest it carries (and the
    signed provenance statement, when it carries one with its key); through qemu-user for another machine's
    image (engines.HOST_CPUS)."""
    user = engine.image_user(image)
    print(f"{image}: running the verification suite as user {user or 'root'}", file=sys.stderr, flush=True)
    argv = ["python", "-m", "torchkiln", "verify", "--manifest", IMAGE_MANIFEST]
    if statement:
        argv += ["--provenance", f"{IMAGE_DIR}/{statement}", "--key", IMAGE_PROVENANCE_KEY]
    result = engine.run(image, argv, qemu_cpu="" if machine.native else machine.qemu_cpu)
    if not result.ok:
        raise TorchkilnError(f"{image}: verification failed (exit {result.returncode})")
    print(f"{image}: verified")


def _machine_of(req: BuildRequest) -> ImagePlatform:
    """The platform of the image ``req`` builds (build_request sets one of image_platforms())."""
    return next(p for p in image_platforms() if p.oci == req.platform)


def _check_emulation(engine: Engine, machine: ImagePlatform, base: LocalBase | None) -> None:
    """Refuse, before anything runs, an image for another machine that this host cannot emulate: buildah and
    podman run its RUN steps here, and debootstrap runs its base's second stage here (a docker daemon may be
    elsewhere, with emulation of its own, so a docker build alone is left to it)."""
    runs_here = engine.builds_here or (base is not None and base.debootstrap is not None)
    if runs_here and (problem := emulation_problem(machine)) is not None:
        raise UsageError(problem)


def _build(args: argparse.Namespace) -> int:
    context = Path(args.context).resolve() if args.context else checkout_root()
    if not (context / DOCKERFILES[args.target]).is_file():
        raise UsageError(
            f"--context {context}: no {DOCKERFILES[args.target]} there (valid: a torchkiln checkout)"
        )
    base = local_base(args)
    req = build_request(args, context=context, base=base)
    engine = select_engine(args.engine, storage=_storage(args), for_print=args.print_only)
    argv = engine.build_argv(req)
    if args.print_only:
        if base is not None:
            print(base.describe())
        print(shlex.join(argv))
        return EXIT_OK
    machine = _machine_of(req)
    _check_emulation(engine, machine, base)
    if args.engine != "auto" and not type(engine).usable(engine.executable):
        # auto already passed over an engine that cannot build; a named one is refused with the reason
        # (a docker CLI without buildx fails later with a bare "unknown flag: --file")
        raise TorchkilnError(
            f"--engine {args.engine}: {engine.executable} cannot build here ({type(engine).install_hint})"
        )
    if base is not None:
        rootfs.ensure(engine, base)
    elif not req.pull and not engine.image_exists(req.build_args["BASE_IMAGE"]):
        raise UsageError(
            f"--no-pull: the base image {req.build_args['BASE_IMAGE']} is not in {engine.name}'s local "
            "storage (valid: pull it first, or drop --no-pull)"
        )
    print(f"torchkiln images: {shlex.join(argv)}", file=sys.stderr, flush=True)
    engine.build(req)
    if req.output is not None:
        wheels = sorted(p.name for p in req.output.glob("*.whl"))
        print(f"wheels: {', '.join(wheels) or 'none'} in {req.output}")
        return EXIT_OK
    image = req.tags[0]
    size = engine.image_size(image)
    print(f"{image}: built with {engine.name}" + (f", {size / 1e6:.0f} MB" if size else ""))
    if args.verify:
        keyed = req.build_args.get("KILN_PROVENANCE_KEY")
        _verify(engine, image, req.build_args.get("KILN_PROVENANCE", "") if keyed else "", machine)
    return EXIT_OK
