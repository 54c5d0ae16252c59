"""The recipe's schema: every field a recipe may have (:data:`SCHEMA`, one :class:`Field` row each: its type,
whether it is required, its check from :mod:`.validators`, where the typed
:class:`~torchkiln.recipe.model.Recipe` keeps it), and what follows from it (tables, sections, placeholders).

Data only: :mod:`.loader` checks a document against it and builds the recipe from it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from torchkiln.distributed.spec import AUTH_KINDS

from .compat import platforms
from .cuda_libraries import MODES as CUDA_LIBRARIES
from .model import (
    UPSTREAM_TORCH_REPO,
    UPSTREAM_TORCHVISION_REPO,
    Accelerator,
    Blas,
    Build,
    CacheSpec,
    ClusterSection,
    Deploy,
    Magma,
    SourceSpec,
    VisionFeatures,
)
from .spelling import flag_value
from .validators import (
    DOTTED_RE,
    ENV_NAME_RE,
    MAJOR_MINOR_RE,
    NAME_RE,
    PYTHON_RE,
    SHA1_RE,
    SHA256_RE,
    SIZE_RE,
    Validator,
    _arch_list,
    _download_url,
    _flags,
    _int_range,
    _local_label,
    _match,
    _one_of,
    _pep440,
    _python_versions,
    _release,
    _requirements,
    _scheduler_url,
    _search_dirs,
    _sonames,
    git_ref,
    path_problem,
    repo_problem,
)

__all__ = ["FIELDS", "SCHEMA", "Field"]

MAX_JOBS = 4096  # beyond any machine's cores; a larger MAX_JOBS is a typo, not a plan
MAX_MEMORY_RETRIES = 12  # halving MAX_JOBS 12 times takes 4096 jobs to 1


@dataclass(frozen=True)
class Field:
    """One recipe field: its dotted path in the file, its TOML type, whether it must be there, how its value
    is checked, and where the typed :class:`Recipe` keeps it (``to``: ``"table.attribute"`` of a section in
    :data:`SECTIONS`, or a plain attribute of Recipe; default: the path itself), converted by ``convert``,
    ``default`` when absent (else the dataclass's own default), or ``default_from`` the flattened document
    when the default follows from another field (nvJPEG is on by default for CUDA recipes). ``either``: the
    field that may stand in for this required one (python.versions for python.version); never both."""

    path: str
    type: type
    required: bool = False
    check: Validator | None = None
    doc: str = ""
    to: str | None = None
    convert: Callable[[Any], Any] | None = None
    default: Any = None
    default_from: Callable[[Mapping[str, Any]], Any] | None = None
    either: str | None = None


def _dotted_version(path: str, example: str, doc: str = "") -> Field:
    """A library's version (cuDNN, NCCL, MKL, MAGMA): dotted numbers such as ``example``, kept as a Version."""
    valid = f"a dotted version such as {example}"
    return Field(path, str, check=_match(DOTTED_RE, valid, "malformed version"), doc=doc, convert=Version)


def _feature(name: str, doc: str, default_from: Callable[[Mapping[str, Any]], Any] | None = None) -> Field:
    """A part of ``[torchvision.features]``, kept in the recipe's ``vision`` table under its own name."""
    return Field(
        f"torchvision.features.{name}", bool, doc=doc, to=f"vision.{name}", default_from=default_from
    )


def _flags_value(value: Any) -> dict[str, str]:
    return {k: flag_value(v) for k, v in sorted(value.items())}


SCHEMA: tuple[Field, ...] = (
    Field(
        "recipe.name",
        str,
        True,
        _match(NAME_RE, "letters, digits, '.', '_', '-'; at most 80"),
        "recipe id",
        to="name",
    ),
    Field("recipe.description", str, doc="free text", to="description", default=""),
    Field(
        "torch.repo",
        str,
        check=repo_problem,
        doc="git URL (default: upstream GitHub)",
        default=UPSTREAM_TORCH_REPO,
    ),
    Field(
        "torch.ref",
        str,
        True,
        git_ref("v2.13.0 or release/2.13"),
        doc="branch or tag",
    ),
    Field(
        "torch.commit",
        str,
        check=_match(SHA1_RE, "a full 40-character lowercase hex SHA-1"),
        doc="exact commit HEAD must equal",
    ),
    Field(
        "torch.version",
        str,
        True,
        _release("MAJOR.MINOR.PATCH such as 2.13.0"),
        doc="release version",
        convert=Version,
    ),
    Field(
        "torchvision.repo",
        str,
        check=repo_problem,
        default=UPSTREAM_TORCHVISION_REPO,
    ),
    Field(
        "torchvision.ref",
        str,
        True,
        git_ref("v0.28.0"),
    ),
    Field("torchvision.commit", str, check=_match(SHA1_RE, "a full 40-character lowercase hex SHA-1")),
    Field(
        "torchvision.include_dirs",
        list,
        check=_search_dirs,
        doc="TORCHVISION_INCLUDE: directories searched first for the parts' headers",
        to="vision.include_dirs",
        convert=tuple,
    ),
    Field(
        "torchvision.library_dirs",
        list,
        check=_search_dirs,
        doc="TORCHVISION_LIBRARY: directories the parts' libraries are linked from",
        to="vision.library_dirs",
        convert=tuple,
    ),
    Field(
        "torchvision.version",
        str,
        True,
        _release("MAJOR.MINOR.PATCH such as 0.28.0"),
        convert=Version,
    ),
    # torchvision's optional parts, each its setup.py's TORCHVISION_USE_<NAME> (torchkiln sets every one
    # explicitly, 1 or 0); the image codecs' libraries are bundled into the wheel's torchvision.libs/.
    _feature("png", "PNG decode/encode (libpng); default true"),
    _feature("jpeg", "JPEG decode/encode (libjpeg-turbo); default true"),
    _feature("webp", "WebP decode (libwebp); default true"),
    _feature(
        "nvjpeg",
        "GPU JPEG decode/encode (nvJPEG); default: CUDA recipes",
        default_from=lambda flat: flat.get("accelerator.kind") == "cuda",
    ),
    _feature("video_codec", "GPU video decoder; default false"),
    _feature("ffmpeg", "CPU video decoder (FFmpeg); default false"),
    Field(
        "python.version",
        str,
        True,
        _match(PYTHON_RE, "MAJOR.MINOR such as 3.12 (3.13t: free-threaded)", "malformed version"),
        "the Python the wheels are built for (or python.versions)",
        to="python",
        default_from=lambda flat: (flat.get("python.versions") or [None])[0],
        either="python.versions",
    ),
    Field(
        "python.versions",
        list,
        check=_python_versions,
        doc="several Pythons: one wheel per Python, one manifest, the build shared (docs/build.md)",
        to="pythons",
        convert=tuple,
    ),
    Field("accelerator.kind", str, True, _one_of("cpu", "cuda")),
    Field(
        "accelerator.cuda",
        str,
        check=_match(MAJOR_MINOR_RE, "MAJOR.MINOR such as 13.0", "malformed version"),
        convert=Version,
    ),
    Field("accelerator.arch_list", list, check=_arch_list, doc="TORCH_CUDA_ARCH_LIST entries", convert=tuple),
    _dotted_version("accelerator.cudnn", "9.20.0.48"),
    _dotted_version("accelerator.nccl", "2.29.7"),
    _dotted_version(
        "accelerator.cudnn_runtime",
        "9.10.2.21",
        "the cuDNN the wheel runs with (the nvidia-cudnn-cuXX it requires), when not accelerator.cudnn",
    ),
    _dotted_version(
        "accelerator.nccl_runtime",
        "2.27.3",
        "the NCCL the wheel runs with (the nvidia-nccl-cuXX it requires), when not accelerator.nccl",
    ),
    Field("blas.kind", str, True, _one_of("mkl", "openblas", "nvpl")),
    _dotted_version("blas.mkl", "2024.2.0"),
    _dotted_version("magma.version", "2.6.1"),
    Field("magma.sha256", str, check=_match(SHA256_RE, "64 lowercase hex characters")),
    Field("magma.url", str, check=_download_url, doc="the MAGMA tarball, fetched by curl --globoff"),
    Field("build.type", str, check=_one_of("Release", "RelWithDebInfo", "Debug")),
    Field(
        "build.local_version",
        str,
        check=_local_label,
    ),
    Field(
        "build.jobs",
        int,
        check=_int_range(1, MAX_JOBS),
        doc="MAX_JOBS; derived from cores and memory when absent",
    ),
    Field(
        "build.memory_retries",
        int,
        check=_int_range(0, MAX_MEMORY_RETRIES),
        doc="how often a compile killed for memory resumes with fewer jobs (default 3; 0: never)",
    ),
    Field("build.gcc", int, check=_int_range(1, 99), doc="host gcc major version the build uses"),
    Field(
        "build.platform",
        str,
        check=_one_of(*platforms()),
        doc="the machine the wheels are built on and run on (aarch64: SBSA, GH200/GB200); default x86_64",
    ),
    Field("build.pytorch_build_version", str, check=_pep440, doc="PYTORCH_BUILD_VERSION override"),
    Field("build.pytorch_build_number", int, check=_int_range(0, 9999), doc="PYTORCH_BUILD_NUMBER"),
    Field(
        "build.requirements",
        list,
        check=_requirements,
        doc="more requirements of the build venv, resolved with the trees' own (build-env:deps)",
        convert=tuple,
    ),
    Field(
        "build.flags",
        dict,
        check=_flags,
        doc="extra USE_*/BUILD_* flags and vetted CMAKE_* variables",
        convert=_flags_value,
    ),
    Field("cache.kind", str, check=_one_of("none", "ccache", "sccache")),
    Field("cache.dir", str, check=path_problem, doc="local cache directory"),
    Field("cache.max_size", str, check=_match(SIZE_RE, "a size such as 20G or 500M")),
    Field("cache.remote", str, doc="remote store URL: redis://, http://, s3://, gs://, memcached://, webdav"),
    Field(
        "cache.credentials_env",
        str,
        check=_match(ENV_NAME_RE, "an environment variable name"),
    ),
    Field("cache.credentials_file", str, check=path_problem, doc="file holding the remote store's secret"),
    Field(
        "deploy.system_libraries",
        list,
        check=_sonames,
        doc="sonames the target machines have, which the wheels may need unbundled (docs/portability.md)",
        convert=tuple,
    ),
    Field(
        "cluster.scheduler_url",
        str,
        check=_scheduler_url,
        doc="sccache-dist scheduler, http(s)://HOST[:PORT]",
    ),
    Field("cluster.auth", str, check=_one_of(*AUTH_KINDS)),
    Field(
        "cluster.credentials_env",
        str,
        check=_match(ENV_NAME_RE, "an environment variable name"),
        doc="variable holding the client token (default TORCHKILN_DIST_TOKEN)",
    ),
    Field(
        "cluster.credentials_file",
        str,
        check=path_problem,
        doc="file holding the client token (a BuildKit secret is a file)",
    ),
    Field(
        "deploy.cuda_libraries",
        str,
        check=_one_of(*CUDA_LIBRARIES),
        doc="a CUDA wheel's CUDA libraries: NVIDIA's PyPI wheels (pypi, default) or carried in the wheel (bundled)",
    ),
)

# The typed Recipe's sections: the table of that name becomes that dataclass (a section with a ``name``
# field gets the table's name); an optional section is None when its table is absent or empty.
SECTIONS: dict[str, type] = {
    "torch": SourceSpec,
    "torchvision": SourceSpec,
    "accelerator": Accelerator,
    "blas": Blas,
    "magma": Magma,
    "build": Build,
    "cache": CacheSpec,
    "vision": VisionFeatures,  # [torchvision.features]
    "cluster": ClusterSection,
    "deploy": Deploy,
}
OPTIONAL_SECTIONS = frozenset({"magma", "cluster"})
# Old spellings of renamed tables (issue 48: "dist" keeps one meaning, the output directory): each still loads
# as its new name, saying so once; a recipe with both spellings is refused.
RENAMED_TABLES: dict[str, str] = {"dist": "cluster"}

FIELDS: dict[str, Field] = {f.path: f for f in SCHEMA}
TABLES: frozenset[str] = frozenset(p.split(".")[0] for p in FIELDS)
# Tables inside a table whose keys SCHEMA declares one by one ([torchvision.features]); other nested
# tables (build.flags) are one field holding a table.
SUBTABLES: frozenset[str] = frozenset(p.rsplit(".", 1)[0] for p in FIELDS if p.count(".") == 2)
REQUIRED_TABLES: frozenset[str] = frozenset(f.path.split(".")[0] for f in SCHEMA if f.required)

# Fields of free text (shown, never used as a path, a ref or a command-line word): printable Unicode.
FREE_TEXT = frozenset({"recipe.description"})
# What stands in for a required field that is missing or malformed while the rules run on the rest of the
# recipe; no rule that reads such a field runs, so these values never reach a message.
PLACEHOLDERS: dict[str, Any] = {
    "recipe.name": "placeholder",
    "torch.ref": "placeholder",
    "torch.version": "0.0.0",
    "torchvision.ref": "placeholder",
    "torchvision.version": "0.0.0",
    "python.version": "3.0",
    "accelerator.kind": "cpu",
    "blas.kind": "openblas",
}
assert set(PLACEHOLDERS) == {f.path for f in SCHEMA if f.required}

TYPE_NAMES = {str: "a string", int: "an integer", list: "an array", dict: "a table", bool: "a boolean"}
