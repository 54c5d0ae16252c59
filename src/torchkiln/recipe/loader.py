"""Recipes: one TOML file pins one build.

Loading a recipe is three passes, each reporting every problem it finds (never just the first):

1. parse the TOML and check the document against :data:`SCHEMA` (unknown keys, wrong types, malformed
   values): a declared table of fields, not code spread around;
2. build the typed :class:`~torchkiln.recipe.model.Recipe`, each value where its :class:`Field` says (a
   field's dotted path is spelled once, in :data:`SCHEMA`);
3. check the compatibility rules of :mod:`torchkiln.recipe.rules` (torch <-> torchvision, Python, CUDA, cuDNN,
   arch list, gcc, MAGMA, ...).

Any problem raises :class:`~torchkiln.errors.RecipeError` with one line per problem:
``FILE: field.path: what is wrong (valid: ...)``.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import re
import stat
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from torchkiln.distributed.spec import AUTH_KINDS
from torchkiln.distributed.spec import scheduler_url as normal_scheduler_url
from torchkiln.errors import Problem, RecipeError, UsageError
from torchkiln.urlreading import download_url_problem, repo_reading_problem

from .archs import ENTRY_RE as ARCH_RE
from .compat import platforms
from .cuda_libraries import MODES as CUDA_LIBRARIES
from .model import (
    UPSTREAM_TORCH_REPO,
    UPSTREAM_TORCHVISION_REPO,
    Accelerator,
    Blas,
    Build,
    CacheSpec,
    Deploy,
    DistSection,
    Magma,
    Recipe,
    SourceSpec,
    VisionFeatures,
)
from .rules import check_rules
from .spelling import flag_value

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (Ubuntu 22.04): the same parser, as a package
    import tomli as tomllib

__all__ = [
    "FIELDS",
    "SCHEMA",
    "Field",
    "load_recipe",
    "parse_recipe",
    "recipes_dir",
    "resolve_recipe_path",
]

MAX_ARCHS = 32
MAX_JOBS = 4096  # beyond any machine's cores; a larger MAX_JOBS is a typo, not a plan
MAX_MEMORY_RETRIES = 12  # halving MAX_JOBS 12 times takes 4096 jobs to 1
MAX_FLAGS = 64

# --------------------------------------------------------------------------------------------------
# Value checkers. Each returns None when the value is fine, else (message, valid-hint).
# --------------------------------------------------------------------------------------------------

Check = Callable[[Any], "tuple[str, str] | None"]

# Every pattern is ASCII-only (``re.ASCII``: ``\d`` would match other scripts' digits) and is applied with
# ``fullmatch`` (``$`` also matches before a trailing newline).
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}", re.ASCII)
SHA1_RE = re.compile(r"[0-9a-f]{40}", re.ASCII)
SHA256_RE = re.compile(r"[0-9a-f]{64}", re.ASCII)
RELEASE_RE = re.compile(r"[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}", re.ASCII)
MAJOR_MINOR_RE = re.compile(r"[0-9]{1,4}\.[0-9]{1,4}", re.ASCII)
# A Python: MAJOR.MINOR, ``t`` after it for the free-threaded build (PEP 703: ``python3.13t``, wheels ``cp313t``).
PYTHON_RE = re.compile(r"[0-9]{1,2}\.[0-9]{1,3}t?", re.ASCII)
MAX_PYTHONS = 8  # every CPython 3 minor upstream builds at once, free-threaded ones included
DOTTED_RE = re.compile(r"[0-9]{1,6}(\.[0-9]{1,6}){1,3}", re.ASCII)
LOCAL_LABEL_RE = re.compile(r"\+[a-z0-9]+(\.[a-z0-9]+)*", re.ASCII)
# USE_*/BUILD_* flags, and CMAKE_* variables; which names each release reads (CMAKE_* ones only when vetted,
# e.g. CMAKE_POLICY_VERSION_MINIMUM) is data/cmake_options.toml's, checked by the rules.
FLAG_RE = re.compile(r"(USE|BUILD|CMAKE)_[A-Z0-9_]{1,60}", re.ASCII)
FLAG_VALUE_RE = re.compile(r"[A-Za-z0-9._/:+-]{0,200}", re.ASCII)
SIZE_RE = re.compile(r"[0-9]{1,6}(\.[0-9]{1,3})?[KMGT]i?", re.ASCII)
ENV_NAME_RE = re.compile(r"[A-Z_][A-Z0-9_]{0,63}", re.ASCII)
# A git ref name as git check-ref-format accepts it, restricted further: no whitespace, no shell
# metacharacters are *needed* (we never use a shell), but refusing them catches copy-paste accidents.
# A leading '-' is an option of git fetch, a leading '+' a forced refspec (git fetch takes the ref as one).
REF_RE = re.compile(
    r"(?![-+])(?!.*\.\.)(?!.*//)(?!.*@\{)[A-Za-z0-9._/+-]{1,200}(?<!\.lock)(?<![./])", re.ASCII
)
URL_RE = re.compile(r"(https?|ssh|git|file)://[!-~]+|[\w.-]+@[\w.-]+:[!-~]+|/[!-~]+", re.ASCII)

# The string grammar every string field obeys before its own check: printable ASCII (no control
# characters, no NUL, no newline), at most MAX_STRING characters; free text (the description) may be any
# printable Unicode, at most MAX_TEXT. Messages quote at most SHOWN characters of a value.
MAX_STRING = 500
MAX_TEXT = 2000
SHOWN = 60
PLAIN_RE = re.compile(r"[ -~]*", re.ASCII)


def shown(value: Any) -> str:
    """A value as a message quotes it: repr, cut to :data:`SHOWN` characters (a 1 MB value is not echoed)."""
    text = repr(value)
    return text if len(text) <= SHOWN else f"{text[: SHOWN - 3]}...' ({len(str(value))} characters)"


def plain_string(value: str, *, text: bool = False) -> tuple[str, str] | None:
    """The grammar of :data:`PLAIN_RE`: None when ``value`` obeys it, else (what is wrong, what is valid)."""
    cap = MAX_TEXT if text else MAX_STRING
    if len(value) > cap:
        return (f"{len(value)} characters, longer than {cap}", f"at most {cap} characters")
    if text:
        if not value.isprintable():
            return (f"control character in {shown(value)}", "printable text on one line")
        return None
    if not PLAIN_RE.fullmatch(value):
        bad = next(c for c in value if not PLAIN_RE.fullmatch(c))
        what = "control character" if not bad.isprintable() else "non-ASCII character"
        return (f"{what} {bad!r} in {shown(value)}", "printable ASCII on one line")
    return None


def _match(regex: re.Pattern[str], valid: str, what: str = "malformed value") -> Check:
    def check(value: Any) -> tuple[str, str] | None:
        return None if regex.fullmatch(value) else (f"{what} {shown(value)}", valid)

    return check


REPO_VALID = "an https://, ssh://, git://, file:// URL or a path"


def repo_problem(value: Any) -> tuple[str, str] | None:
    """A repository URL or path as git takes it, and nothing git or ssh would read as an option: the value
    is the argument of ``git remote add`` (a leading ``-`` is an option there, ``--upload-pack@x:y``), and
    its host and user reach ssh as an argument (``ssh://-oProxyCommand=x/p``: ssh's option). Checked on
    git's own reading of it (torchkiln.urlreading.repo_reading_problem: git percent-decodes a URL before it
    splits it, so ``ssh://%2doProxyCommand=x/p`` is the same host). git refuses some of these itself today;
    torchkiln does not rely on that."""
    if value.startswith("-"):
        return (f"{shown(value)} begins with '-', which git reads as an option", REPO_VALID)
    if not URL_RE.fullmatch(value):
        return (f"malformed value {shown(value)}", REPO_VALID)
    problem = repo_reading_problem(value)
    if problem:
        return (f"{shown(value)}: {problem}", REPO_VALID)
    return None


def _download_url(value: Any) -> tuple[str, str] | None:
    """An https:// URL as curl reads it (torchkiln.urlreading.download_url_problem)."""
    valid = "an https:// URL of the release tarball"
    if not URL_RE.fullmatch(value):
        return (f"malformed value {shown(value)}", valid)
    problem = download_url_problem(value)
    return (f"{shown(value)}: {problem}", valid) if problem else None


def path_problem(value: Any) -> tuple[str, str] | None:
    """A local path: ``~user`` must name a user this host has (else plan could not expand it)."""
    if value.startswith("~") and os.path.expanduser(value).startswith("~"):
        user = value[1:].split("/", 1)[0]
        return (f"{shown(value)}: no user {user!r} on this host", "an absolute path, or ~/... of the user")
    if not value:
        return ("empty path", "a directory path")
    return None


def _one_of(*choices: str) -> Check:
    def check(value: Any) -> tuple[str, str] | None:
        return None if value in choices else (f"{value!r} is not allowed", ", ".join(choices))

    return check


def _scheduler_url(value: Any) -> tuple[str, str] | None:
    """The URL as sccache-dist reads it (distributed.spec.scheduler_url says why each form is refused)."""
    try:
        normal_scheduler_url(value)
    except UsageError as exc:
        return (
            str(exc).split(": ", 1)[-1].split(" (valid: ")[0][:200],
            "http://HOST[:PORT] or https://HOST[:PORT]",
        )
    return None


def _int_range(low: int, high: int) -> Check:
    """An integer within [low, high]: the bounds keep values sane where they become variables (MAX_JOBS)."""

    def check(value: Any) -> tuple[str, str] | None:
        if low <= value <= high:
            return None
        return (f"{shown(value)} is outside {low}..{high}", f"an integer from {low} to {high}")

    return check


def _pep440(value: Any) -> tuple[str, str] | None:
    """A wheel version as setuptools and pip read it: PEP 440, in its normalised form (setuptools writes
    the wheel with ``str(Version(value))``: ``2.13.0.RC1`` would be labelled ``2.13.0rc1``, and every
    record torchkiln writes from the recipe would name another version than the wheel's)."""
    valid = "for example 2.13.0 or 2.13.0+cu130.kiln1"
    try:
        normal = str(Version(value))
    except InvalidVersion:
        return (f"{value!r} is not a PEP 440 version", valid)
    if normal != value:
        return (f"{shown(value)} is read as {normal!r} by setuptools and pip", f"{normal!r}; {valid}")
    return None


def _release(valid: str) -> Check:
    """MAJOR.MINOR.PATCH, written as PEP 440 normalises it (no leading zeros: setuptools would label
    ``02.13.0`` as ``2.13.0``)."""
    pattern = _match(RELEASE_RE, valid, "malformed version")

    def check(value: Any) -> tuple[str, str] | None:
        return pattern(value) or _pep440(value)

    return check


def _local_label(value: Any) -> tuple[str, str] | None:
    """``+label.label`` as PEP 440 normalises a local version (a numeric label loses its leading zeros:
    ``+cpu.01`` is ``+cpu.1`` in the wheel's name)."""
    valid = "'+' then dot-separated lowercase labels, e.g. +cu130.kiln1"
    found = _match(LOCAL_LABEL_RE, valid, "malformed local version label")(value)
    if found:
        return found
    normal = "+" + (Version("0" + value).local or "")
    return None if normal == value else (f"{shown(value)} is read as {normal!r} by setuptools and pip", valid)


def _arch_list(value: Any) -> tuple[str, str] | None:
    if len(value) > MAX_ARCHS:
        return (f"{len(value)} entries, more than {MAX_ARCHS}", f"at most {MAX_ARCHS} compute capabilities")
    bad = [shown(a) for a in value if not isinstance(a, str) or not a.isascii() or not ARCH_RE.fullmatch(a)]
    if bad:
        return (
            f"malformed arch {', '.join(bad[:4])}",
            "compute capabilities like 8.0, 9.0a, 10.0f or 12.0+PTX",
        )
    if len(set(value)) != len(value):
        return ("arch list has duplicates", "each compute capability once")
    return None


def _python_versions(value: Any) -> tuple[str, str] | None:
    """``python.versions``: one to :data:`MAX_PYTHONS` Pythons, each MAJOR.MINOR[t], each once."""
    valid = 'Pythons such as ["3.11", "3.12", "3.13t"], each once'
    if not value:
        return ("empty list", valid)
    if len(value) > MAX_PYTHONS:
        return (f"{len(value)} Pythons, more than {MAX_PYTHONS}", valid)
    bad = [shown(v) for v in value if not isinstance(v, str) or not v.isascii() or not PYTHON_RE.fullmatch(v)]
    if bad:
        return (f"malformed Python {', '.join(bad[:4])}", valid)
    twice = sorted({v for v in value if value.count(v) > 1})
    if twice:
        return (f"{', '.join(twice)} listed more than once", valid)
    return None


# torchvision's TORCHVISION_INCLUDE / TORCHVISION_LIBRARY (torchvision.include_dirs, .library_dirs): its
# setup.py splits each at os.pathsep (":") and hands the directories to the compiler and linker, whose
# commands torch.utils.cpp_extension writes into a ninja file (run by a shell; "$" is ninja's own escape).
# Nothing expands them (no shell, no "~" or "$VAR"), so only absolute paths of plain characters.
SEARCH_DIR_RE = re.compile(r"/[A-Za-z0-9._/+-]{0,254}", re.ASCII)
MAX_SEARCH_DIRS = 16


def _search_dirs(value: Any) -> tuple[str, str] | None:
    valid = (
        "absolute directory paths of letters, digits, '.', '_', '+', '-' and '/' (no ':', spaces, '~' or "
        "'$': nothing expands them)"
    )
    if len(value) > MAX_SEARCH_DIRS:
        return (
            f"{len(value)} entries, more than {MAX_SEARCH_DIRS}",
            f"at most {MAX_SEARCH_DIRS} directories",
        )
    bad = [shown(d) for d in value if not isinstance(d, str) or not SEARCH_DIR_RE.fullmatch(d)]
    if bad:
        return (f"not an absolute directory path: {', '.join(bad[:4])}", valid)
    if len(set(value)) != len(value):
        return ("a directory is listed twice", "each directory once")
    return None


# A shared library's soname as a DT_NEEDED entry names it: a file name (no "/", no glob), "<name>.so" then
# numeric version parts (libpng16.so.16, libstdc++.so.6, ld-linux-x86-64.so.2, libcuda.so.1).
SONAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_+.-]{0,120}\.so(\.[0-9]{1,6}){0,4}", re.ASCII)
MAX_SYSTEM_LIBRARIES = 64


def _sonames(value: Any) -> tuple[str, str] | None:
    """``deploy.system_libraries``: sonames, each once."""
    valid = 'sonames as the wheels\' DT_NEEDED entries name them, e.g. ["libpng16.so.16", "libjpeg.so.62"]'
    if len(value) > MAX_SYSTEM_LIBRARIES:
        return (f"{len(value)} entries, more than {MAX_SYSTEM_LIBRARIES}", valid)
    bad = [shown(v) for v in value if not isinstance(v, str) or not SONAME_RE.fullmatch(v)]
    if bad:
        return (f"not a soname: {', '.join(bad[:4])}", valid)
    twice = sorted({v for v in value if value.count(v) > 1})
    if twice:
        return (f"{', '.join(twice)} listed more than once", valid)
    return None


def _flags(value: Any) -> tuple[str, str] | None:
    if len(value) > MAX_FLAGS:
        return (f"{len(value)} flags, more than {MAX_FLAGS}", f"at most {MAX_FLAGS}")
    for key, value_of_flag in value.items():
        if not FLAG_RE.fullmatch(key):
            return (
                f"flag name {shown(key)} is not a USE_*/BUILD_* flag or a CMAKE_* variable",
                "names like USE_FLASH_ATTENTION or CMAKE_POLICY_VERSION_MINIMUM",
            )
        if (
            not isinstance(value_of_flag, bool | int | str)
            or isinstance(value_of_flag, int)
            and not isinstance(value_of_flag, bool)
            and not -(2**31) <= value_of_flag < 2**31
            or isinstance(value_of_flag, str)
            and not FLAG_VALUE_RE.fullmatch(value_of_flag)
        ):
            return (
                f"value of {key} must be a boolean, an integer or a plain string",
                "true, false, 0, 1, ON",
            )
    return None


# --------------------------------------------------------------------------------------------------
# The schema: every field a recipe may have, its type, whether it is required and how it is checked.
# --------------------------------------------------------------------------------------------------


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
    check: Check | None = None
    doc: str = ""
    to: str | None = None
    convert: Callable[[Any], Any] | None = None
    default: Any = None
    default_from: Callable[[Mapping[str, Any]], Any] | None = None
    either: str | None = None


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
        _match(REF_RE, "a branch or tag name such as v2.13.0 or release/2.13", "malformed git ref"),
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
        _match(REF_RE, "a branch or tag name such as v0.28.0", "malformed git ref"),
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
    Field("torchvision.features.png", bool, doc="PNG decode/encode (libpng); default true", to="vision.png"),
    Field(
        "torchvision.features.jpeg",
        bool,
        doc="JPEG decode/encode (libjpeg-turbo); default true",
        to="vision.jpeg",
    ),
    Field("torchvision.features.webp", bool, doc="WebP decode (libwebp); default true", to="vision.webp"),
    Field(
        "torchvision.features.nvjpeg",
        bool,
        doc="GPU JPEG decode/encode (nvJPEG); default: CUDA recipes",
        to="vision.nvjpeg",
        default_from=lambda flat: flat.get("accelerator.kind") == "cuda",
    ),
    Field(
        "torchvision.features.video_codec",
        bool,
        doc="GPU video decoder; default false",
        to="vision.video_codec",
    ),
    Field(
        "torchvision.features.ffmpeg",
        bool,
        doc="CPU video decoder (FFmpeg); default false",
        to="vision.ffmpeg",
    ),
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
    Field(
        "accelerator.cudnn",
        str,
        check=_match(DOTTED_RE, "a dotted version such as 9.20.0.48", "malformed version"),
        convert=Version,
    ),
    Field(
        "accelerator.nccl",
        str,
        check=_match(DOTTED_RE, "a dotted version such as 2.29.7", "malformed version"),
        convert=Version,
    ),
    Field(
        "accelerator.cudnn_runtime",
        str,
        check=_match(DOTTED_RE, "a dotted version such as 9.10.2.21", "malformed version"),
        doc="the cuDNN the wheel runs with (the nvidia-cudnn-cuXX it requires), when not accelerator.cudnn",
        convert=Version,
    ),
    Field(
        "accelerator.nccl_runtime",
        str,
        check=_match(DOTTED_RE, "a dotted version such as 2.27.3", "malformed version"),
        doc="the NCCL the wheel runs with (the nvidia-nccl-cuXX it requires), when not accelerator.nccl",
        convert=Version,
    ),
    Field("blas.kind", str, True, _one_of("mkl", "openblas", "nvpl")),
    Field(
        "blas.mkl",
        str,
        check=_match(DOTTED_RE, "a dotted version such as 2024.2.0", "malformed version"),
        convert=Version,
    ),
    Field(
        "magma.version",
        str,
        check=_match(DOTTED_RE, "a dotted version such as 2.6.1", "malformed version"),
        convert=Version,
    ),
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
        "dist.scheduler_url", str, check=_scheduler_url, doc="sccache-dist scheduler, http(s)://HOST[:PORT]"
    ),
    Field("dist.auth", str, check=_one_of(*AUTH_KINDS)),
    Field(
        "dist.credentials_env",
        str,
        check=_match(ENV_NAME_RE, "an environment variable name"),
        doc="variable holding the client token (default TORCHKILN_DIST_TOKEN)",
    ),
    Field(
        "dist.credentials_file",
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
    "dist": DistSection,
    "deploy": Deploy,
}
OPTIONAL_SECTIONS = frozenset({"magma", "dist"})

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

# --------------------------------------------------------------------------------------------------
# Loading.
# --------------------------------------------------------------------------------------------------


def _flatten(doc: Mapping[str, Any]) -> dict[str, Any]:
    """recipe document -> {"table.key": value}; a declared subtable's keys become "table.sub.key", other
    nested tables below the second level stay values."""
    flat: dict[str, Any] = {}
    for table, content in doc.items():
        if isinstance(content, dict):
            for key, value in content.items():
                path = f"{table}.{key}"
                if path in SUBTABLES and isinstance(value, dict):
                    flat.update({f"{path}.{k}": v for k, v in value.items()})
                else:
                    flat[path] = value
        else:
            flat[table] = content
    return flat


_SIMPLE_KEY = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)


def display_key(key: str) -> str:
    """A key as it appears in a problem line: bare when simple, else quoted and escaped so the line stays
    ``FILE: field: message`` (no raw colon, newline or empty field)."""
    if _SIMPLE_KEY.fullmatch(key) and len(key) <= SHOWN:  # not match(): "$" also matches before "\n"
        return key
    quoted = json.dumps(key[:SHOWN], ensure_ascii=True).replace(":", "\\u003a")
    return quoted if len(key) <= SHOWN else f"{quoted}...({len(key)} characters)"


def _type_ok(value: Any, expected: type) -> bool:
    # bool is an int subclass in Python; a recipe's `jobs = true` is still a type error.
    if isinstance(value, bool) and expected is not bool:
        return False
    return isinstance(value, expected)


def check_schema(doc: Mapping[str, Any], file: str) -> list[Problem]:
    """Unknown keys, missing required fields, wrong types and malformed values."""
    return schema_problems(doc, file)[0]


def schema_problems(doc: Mapping[str, Any], file: str) -> tuple[list[Problem], set[str]]:
    """Every schema problem, and the field paths (or whole tables) they make unusable: the rules that read
    one of those are not run (they would only report consequences), every other rule is."""
    problems: list[Problem] = []
    bad: set[str] = set()
    for table, content in doc.items():
        if table not in TABLES:
            problems.append(Problem(file, display_key(table), "unknown table", ", ".join(sorted(TABLES))))
        elif not isinstance(content, dict):
            problems.append(
                Problem(file, table, f"must be a table, not {type(content).__name__}", f"[{table}]")
            )
            bad.add(table)
    for table in sorted(REQUIRED_TABLES - set(doc)):
        problems.append(Problem(file, table, "missing table", f"a [{table}] table"))
        bad.add(table)
    flat = _flatten({k: v for k, v in doc.items() if k in TABLES and isinstance(v, dict)})
    for path, value in flat.items():
        if path in SUBTABLES:  # not a table (flattening opened it otherwise)
            problems.append(Problem(file, path, f"must be a table, not {type(value).__name__}", f"[{path}]"))
            bad.add(path)
            continue
        spec = FIELDS.get(path)
        if spec is None:
            parent, key = path.rsplit(".", 1)
            if parent not in SUBTABLES:
                parent, key = path.split(".", 1)
            children = {p[len(parent) + 1 :].split(".")[0] for p in FIELDS if p.startswith(parent + ".")}
            problems.append(
                Problem(file, f"{parent}.{display_key(key)}", "unknown key", ", ".join(sorted(children)))
            )
            continue
        if not _type_ok(value, spec.type):
            expected = TYPE_NAMES.get(spec.type, str(spec.type))
            problems.append(Problem(file, path, f"wrong type {type(value).__name__}", expected))
            bad.add(path)
            continue
        outcome = plain_string(value, text=spec.path in FREE_TEXT) if isinstance(value, str) else None
        if outcome is None and spec.check is not None:
            outcome = spec.check(value)
        if outcome is not None:
            problems.append(Problem(file, path, outcome[0], outcome[1]))
            bad.add(path)
    for spec in SCHEMA:
        table = spec.path.split(".")[0]
        if not isinstance(doc.get(table), dict):
            continue
        if spec.either is not None and spec.path in flat and spec.either in flat:
            problems.append(
                Problem(
                    file, spec.either, f"given with {spec.path}", f"{spec.path} or {spec.either}, not both"
                )
            )
            bad.add(spec.either)
        elif spec.required and spec.path not in flat and spec.either not in flat:
            problems.append(
                Problem(file, spec.path, "missing required key", spec.doc or TYPE_NAMES[spec.type])
            )
            bad.add(spec.path)
    return problems, bad


def _build_recipe(doc: Mapping[str, Any], path: Path | None, digest: str) -> Recipe:
    """Typed recipe from a schema-valid document (check_schema returned no problems): every field goes
    where its :class:`Field` says, so a path is spelled once, in :data:`SCHEMA`."""
    flat = _flatten(doc)
    sections: dict[str, dict[str, Any]] = {table: {} for table in SECTIONS}
    top: dict[str, Any] = {}
    for spec in SCHEMA:
        default = spec.default_from(flat) if spec.default_from is not None else spec.default
        value = flat.get(spec.path, default)
        if value is None:
            continue
        owner, _, attr = (spec.to or spec.path).rpartition(".")
        (sections[owner] if owner else top)[attr] = spec.convert(value) if spec.convert else value
    for table, cls in SECTIONS.items():
        present = any(key.startswith(f"{table}.") for key in flat)
        if table in OPTIONAL_SECTIONS and not present:
            top[table] = None
            continue
        kwargs = sections[table]
        if "name" in {f.name for f in dataclasses.fields(cls)}:
            kwargs["name"] = table
        top[table] = cls(**kwargs)
    return Recipe(**top, path=path, sha256=digest, document=doc)


# Input limits, checked before parsing: a recipe is a few kilobytes; a document beyond these is a mistake
# (a wrong file, a generated one gone wrong), and parsing it would cost memory or the interpreter's stack.
MAX_BYTES = 256 * 1024
MAX_DEPTH = 8  # tables/arrays inside each other; a recipe needs 3 ([torchvision.features], build.flags)


def _depth(doc: Any) -> int:
    """How deeply tables and arrays nest in ``doc`` (iteratively: a deep document cannot exhaust the stack)."""
    deepest, stack = 0, [(doc, 0)]
    while stack:
        value, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        if isinstance(value, dict):
            stack += [(v, depth + 1) for v in value.values()]
        elif isinstance(value, list):
            stack += [(v, depth + 1) for v in value]
    return deepest


def _document_problem(file: str, message: str, valid: str) -> RecipeError:
    return RecipeError([Problem(file, "<document>", message, valid)])


def _unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for path, value in flat.items():
        *tables, key = path.split(".")
        node = doc
        for table in tables:
            node = node.setdefault(table, {})
        node[key] = value
    return doc


def _usable(doc: Mapping[str, Any], bad: set[str]) -> dict[str, Any]:
    """The document without its unusable fields (``bad``, unknown keys), required ones replaced by
    :data:`PLACEHOLDERS`: what the rules can still be run on while the schema's problems are reported."""
    flat = _flatten({k: v for k, v in doc.items() if k in TABLES and k not in bad and isinstance(v, dict)})
    kept = {
        path: value
        for path, value in flat.items()
        if path in FIELDS and not any(path == b or path.startswith(b + ".") for b in bad)
    }
    for path, value in PLACEHOLDERS.items():
        kept.setdefault(path, value)
    return _unflatten(kept)


def parse_recipe(data: bytes, file: str, path: Path | None = None) -> Recipe:
    """Parse and validate recipe bytes in one pass. Raises RecipeError listing every problem: the schema's,
    and those of every rule whose fields are usable (a malformed field does not hide another's problem)."""
    if len(data) > MAX_BYTES:
        raise _document_problem(
            file, f"{len(data)} bytes, larger than {MAX_BYTES}", f"a recipe under {MAX_BYTES // 1024} KiB"
        )
    digest = hashlib.sha256(data).hexdigest()
    if not data.strip():
        raise _document_problem(
            file,
            "empty recipe",
            "a TOML document with " + ", ".join(f"[{t}]" for t in sorted(REQUIRED_TABLES)),
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _document_problem(
            file, f"not UTF-8 text ({exc.reason} at byte {exc.start})", "a UTF-8 TOML file"
        ) from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _document_problem(file, f"invalid TOML: {str(exc)[:200]}", "TOML 1.0") from None
    except RecursionError:
        raise _document_problem(
            file, "arrays or tables nested too deeply", f"at most {MAX_DEPTH} levels"
        ) from None
    if _depth(doc) > MAX_DEPTH:
        raise _document_problem(file, "arrays or tables nested too deeply", f"at most {MAX_DEPTH} levels")
    problems, bad = schema_problems(doc, file)
    if not problems:
        recipe = _build_recipe(doc, path, digest)
        problems = check_rules(recipe, file)
    else:
        problems += check_rules(_build_recipe(_usable(doc, bad), path, digest), file, skip=bad)
    if problems:
        raise RecipeError(problems)
    return recipe


def read_limited(path: Path, what: str = "a recipe .toml") -> bytes:
    """The bytes of a regular file of at most :data:`MAX_BYTES` (a FIFO, a device, a directory or a huge
    file is refused before it is read: reading one would hang or exhaust memory)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise RecipeError([Problem(str(path), "<file>", "no such file", f"a path to {what}")]) from None
    except OSError as exc:
        raise RecipeError(
            [Problem(str(path), "<file>", f"cannot read: {exc.strerror}", "a readable file")]
        ) from None
    if stat.S_ISDIR(info.st_mode):
        raise RecipeError([Problem(str(path), "<file>", "is a directory", f"a path to {what}")])
    if not stat.S_ISREG(info.st_mode):
        raise RecipeError([Problem(str(path), "<file>", "not a regular file", f"a path to {what}")])
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise RecipeError(
            [Problem(str(path), "<file>", f"cannot read: {exc.strerror}", "a readable file")]
        ) from None
    return data


def load_recipe(path: str | Path) -> Recipe:
    """Load and validate a recipe file. Raises RecipeError (exit 2 in the CLI) on any problem."""
    path = Path(path)
    return parse_recipe(read_limited(path), str(path), path)


def recipes_dir() -> Path:
    """The shipped recipes: ./recipes of a checkout (or TORCHKILN_RECIPES)."""
    env = os.environ.get("TORCHKILN_RECIPES")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "recipes"
        if candidate.is_dir() and any(candidate.glob("*.toml")):
            return candidate
    return Path.cwd() / "recipes"


def shipped_names() -> list[str]:
    """The names of the shipped recipes (their file names without ``.toml``), sorted."""
    return sorted(p.stem for p in recipes_dir().glob("*.toml"))


def resolve_recipe_path(name_or_path: str) -> Path:
    """A recipe given as a path, or as the name of a shipped recipe (with or without .toml). A bare name
    that is neither is refused listing the shipped recipes, the closest to it first (a misspelt name)."""
    path = Path(name_or_path)
    if path.exists() or path.suffix == ".toml" and "/" in name_or_path:
        return path
    shipped = recipes_dir() / (name_or_path if name_or_path.endswith(".toml") else f"{name_or_path}.toml")
    if shipped.exists() or "/" in name_or_path:
        return shipped if shipped.exists() else path
    names = shipped_names()
    closest = difflib.get_close_matches(name_or_path.removesuffix(".toml"), names, n=len(names), cutoff=0.0)
    raise RecipeError(
        [
            Problem(
                name_or_path,
                "<file>",
                f"no such file, and no shipped recipe of that name (in {recipes_dir()})",
                f"a path to a recipe .toml, or a shipped recipe, closest first: {', '.join(closest) or 'none'}",
            )
        ]
    )
