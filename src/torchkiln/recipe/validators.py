"""The recipe's value checkers: each takes a field's value (its TOML type already checked) and returns None
when it is fine, else (what is wrong, what is valid); and the grammar every string field obeys first.

:data:`~torchkiln.recipe.schema.SCHEMA` names one of these per field; :mod:`.loader` applies them. Kept apart
from both: these say what a value may be, not which fields a recipe has or how a file is read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from torchkiln.distributed.spec import scheduler_url as normal_scheduler_url
from torchkiln.errors import UsageError
from torchkiln.urlform import repo_form_problem, url_form_problem
from torchkiln.urlreading import download_url_problem, repo_reading_problem

from .archs import ENTRY_RE as ARCH_RE

MAX_ARCHS = 32
MAX_FLAGS = 64

Validator = Callable[[Any], "tuple[str, str] | None"]

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
# A ref is a branch or tag name (docs/build.md): what git check-ref-format accepts as refs/heads/NAME and
# refs/tags/NAME (git's refs.c, check_refname_component), in a narrower alphabet (no whitespace or shell
# metacharacters: no shell ever sees it, but they are copy-paste accidents), never HEAD or another symbolic
# ref (FETCH_HEAD, ORIG_HEAD: git fetch takes those as the remote's), never a full refs/... name, and without
# a leading '-' (an option of git fetch) or '+' (a forced refspec). tests/test_values_decoded.py checks this
# against the real git over a generated corpus, both ways.
REF_CHARS_RE = re.compile(r"[A-Za-z0-9_./+-]{1,200}", re.ASCII)
SYMBOLIC_REF_RE = re.compile(r"(?:[A-Z]+_)*HEAD", re.ASCII)


def ref_problem(value: str) -> str | None:
    """Why ``value`` is not a branch or tag name, or None (see REF_CHARS_RE's comment)."""
    if not REF_CHARS_RE.fullmatch(value):
        return "only letters, digits and . _ / + - may be in it (at most 200)"
    if value[0] in "-+":
        meaning = "an option" if value[0] == "-" else "a forced refspec"
        return f"it begins with {value[0]!r}, which git fetch reads as {meaning}"
    if SYMBOLIC_REF_RE.fullmatch(value):
        return f"{value} is a symbolic ref, not a branch or tag"
    if value.startswith("refs/"):
        return "it is a full ref name: give the branch or tag name alone"
    if ".." in value:
        return "it holds '..', which git refuses in a ref"
    for component in value.split("/"):
        if not component:
            return "it has an empty component (a leading, trailing or doubled '/'), which git refuses"
        if component.startswith("."):
            return f"its component {component!r} begins with '.', which git refuses"
        if component.endswith(".lock"):
            return f"its component {component!r} ends with '.lock', which git refuses"
    if value.endswith("."):
        return "it ends with '.', which git refuses"
    return None


def git_ref(example: str) -> Validator:
    valid = f"a branch or tag name such as {example}"

    def check(value: Any) -> tuple[str, str] | None:
        problem = ref_problem(value)
        return None if problem is None else (f"malformed git ref {shown(value)}: {problem}", valid)

    return check


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


def _match(regex: re.Pattern[str], valid: str, what: str = "malformed value") -> Validator:
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
    torchkiln does not rely on that. And written in its one form (torchkiln.urlform.repo_form_problem: no
    ``%``, query, fragment or dot-segment, a canonical host), so the lock file and the provenance hold the
    string git was given and it means one repository."""
    if value.startswith("-"):
        return (f"{shown(value)} begins with '-', which git reads as an option", REPO_VALID)
    if not URL_RE.fullmatch(value):
        return (f"malformed value {shown(value)}", REPO_VALID)
    problem = repo_reading_problem(value) or repo_form_problem(value)
    if problem:
        return (f"{shown(value)}: {problem}", REPO_VALID)
    return None


def _download_url(value: Any) -> tuple[str, str] | None:
    """An https:// URL as curl reads it (torchkiln.urlreading.download_url_problem), in its one form
    (torchkiln.urlform: a query passes, curl sends it as written)."""
    valid = "an https:// URL of the release tarball"
    if not URL_RE.fullmatch(value):
        return (f"malformed value {shown(value)}", valid)
    problem = url_form_problem(value, query=True) or download_url_problem(value)
    return (f"{shown(value)}: {problem}", valid) if problem else None


def path_problem(value: Any) -> tuple[str, str] | None:
    """A local path: ``~user`` must name a user this host has (else plan could not expand it)."""
    if value.startswith("~") and os.path.expanduser(value).startswith("~"):
        user = value[1:].split("/", 1)[0]
        return (f"{shown(value)}: no user {user!r} on this host", "an absolute path, or ~/... of the user")
    if not value:
        return ("empty path", "a directory path")
    return None


def _one_of(*choices: str) -> Validator:
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


def _int_range(low: int, high: int) -> Validator:
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


def _release(valid: str) -> Validator:
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


MAX_REQUIREMENTS = 64
# A requirement whose name ends like an archive is a file to pip, relative to where it runs, not a project
# (pip 26: pip/_internal/utils/filetypes.py ARCHIVE_EXTENSIONS, req/constructors.py _get_url_from_path).
PIP_ARCHIVES = (
    *(".zip", ".whl", ".tar.bz2", ".tbz", ".tar.gz", ".tgz"),
    *(".tar", ".tar.xz", ".txz", ".tlz", ".tar.lz", ".tar.lzma"),
)


def _requirements(value: Any) -> tuple[str, str] | None:
    """``build.requirements``: PEP 508 requirements, each as pip will be handed it (packaging's normal form,
    which reads back as itself), of a project from the index (no direct URL, no name pip reads as a file),
    each project once."""
    valid = 'PEP 508 requirements from the index, e.g. ["pyyaml>=6", "ninja==1.11.1.4"]'
    if len(value) > MAX_REQUIREMENTS:
        return (f"{len(value)} entries, more than {MAX_REQUIREMENTS}", valid)
    names: list[str] = []
    for item in value:
        if not isinstance(item, str):
            return (f"not a requirement: {shown(item)}", valid)
        if (
            not item.isascii() or not item.isprintable()
        ):  # "torch===２.13.0": === takes any text, no index has it
            return (f"{shown(item)} has characters outside printable ASCII", valid)
        try:
            requirement = Requirement(item)
        except InvalidRequirement:
            return (f"{shown(item)} is not a PEP 508 requirement", valid)
        if requirement.url is not None:
            return (f"{shown(item)} names a URL", f"a requirement the index resolves; {valid}")
        if requirement.name.lower().endswith(PIP_ARCHIVES):
            return (f"{shown(item)} is read by pip as a file to install", f"a project's name; {valid}")
        if str(requirement) != item:
            return (f"{shown(item)} is read by pip as {str(requirement)!r}", f"{str(requirement)!r}")
        names.append(canonicalize_name(requirement.name))
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        return (f"{', '.join(twice)} listed more than once", f"each project once; {valid}")
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
