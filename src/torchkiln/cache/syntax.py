"""What ccache and sccache read into the values torchkiln hands them, and which values are refused for it.

A path or URL torchkiln puts into a compiler-cache variable is not always taken as written:

* ccache 4.7 replaces ``$NAME`` and ``${NAME}`` (NAME: letters, digits, ``_``) with the variable's value,
  and fails when it is unset, in its path and command settings: ``base_dir``, ``cache_dir``,
  ``extra_files_to_hash``, ``ignore_headers_in_manifest``, ``ignore_options``, ``log_file``,
  ``msvc_dep_prefix``, ``namespace``, ``path``, ``prefix_command``, ``prefix_command_cpp``,
  ``remote_storage``, ``stats_log``, ``temporary_dir``, whether they come from ``CCACHE_*`` variables or a
  config file (ccache v4.7.5 src/Config.cpp ``Config::set_item``, src/Util.cpp
  ``expand_environment_variables``; there is no escape). So ``cache.dir = "/tmp/c$HOME"`` puts the cache
  in ``/tmp/c/root``, and ``${IFS}`` fails every compile with ``ccache: error: CCACHE_DIR: environment
  variable "IFS" not set``.
* ccache's ``remote_storage`` is a list: a space separates two stores, ``|`` starts a store's attributes
  (``|read-only``, ``|shards=...``) (v4.7.5 src/storage/Storage.cpp ``parse_storage_configs``,
  ``parse_storage_config``).
* ccache reads its remote storage URL with a URL parser of its own that percent-decodes the user info, host
  and path, lower-cases the scheme and host and drops ``.`` and ``..`` path segments (v4.7.5
  src/third_party/url.cpp): ``redis://h:6379/%2e%2e`` is database ``""`` to it, and every compile fails
  with ``invalid unsigned integer: ""``. :func:`ccache_remote_reading_problem` checks the URL as ccache
  reads it.
* sccache takes ``SCCACHE_DIR`` and its other paths as written, but splits ``SCCACHE_BASEDIRS`` at ``:``
  (mozilla/sccache src/config.rs, ``config_from_env``: "multiple paths separated by ... ':' on other
  platforms").

Such a value is refused where it enters (the recipe check, the command line, the plan), naming the field
and why; every value torchkiln hands either tool passes :func:`tool_value_problem` first. The table of all
values that reach a tool is docs/values-to-tools.md.
"""

from __future__ import annotations

import re

from torchkiln.urlreading import ccache_redis_database, ccache_url, host_problem, printable_problem

# ccache's expansion: a ``$`` followed by a name character or ``{`` (a lone ``$`` stays); refused as a
# whole ('$' anywhere): a path that means one thing to ccache and another to every other tool is a mistake.
CCACHE_EXPANSION = re.compile(r"\$")
WHY_DOLLAR = "ccache expands $VAR and ${VAR} in it (the cache would land elsewhere, or every compile fails on an unset variable)"
WHY_REMOTE_SPACE = "ccache reads a space in its remote storage as the start of another store"
WHY_REMOTE_BAR = "ccache reads '|' in its remote storage as the start of the store's attributes"
WHY_COLON = "sccache splits SCCACHE_BASEDIRS at ':' (and PATH is split there too)"


def path_problem(value: str, kind: str) -> str | None:
    """Why ``value``, a path that reaches the cache tool ``kind`` as a setting, cannot be handed to it as
    written; None when it can."""
    if kind == "ccache" and CCACHE_EXPANSION.search(value):
        return f"{value!r} holds '$': {WHY_DOLLAR}"
    return None


def basedir_problem(value: str, kind: str) -> str | None:
    """The basedir (CCACHE_BASEDIR, SCCACHE_BASEDIRS): a path for ccache, one entry of a list for sccache."""
    if kind == "sccache" and ":" in value:
        return f"{value!r} holds ':': {WHY_COLON}"
    return path_problem(value, kind)


def remote_problem(url: str, kind: str) -> str | None:
    """Why a remote store URL cannot be handed to ``kind`` as written (ccache takes it whole)."""
    if kind != "ccache":
        return None
    if CCACHE_EXPANSION.search(url):
        return f"holds '$': {WHY_DOLLAR}"
    if any(c.isspace() for c in url):
        return f"holds a space: {WHY_REMOTE_SPACE}"
    if "|" in url:
        return f"holds '|': {WHY_REMOTE_BAR}"
    return None


# ccache's own reading of a remote storage URL (torchkiln.urlreading.ccache_url: a port of v4.7.5
# src/third_party/url.cpp), and what its storages then take from it (src/storage/remote/RedisStorage.cpp
# ``select_database``: the path after its '/' is the database, util::parse_unsigned 0..UINT32_MAX;
# HttpStorage.cpp: the path is the request's).
CCACHE_REMOTE_VALID = (
    "redis://HOST[:PORT][/DB] with DB a number from 0 to 4294967295, or http://HOST[:PORT][/PATH]"
)
REDIS_DB_MAX = 2**32 - 1


def ccache_remote_reading_problem(url: str) -> str | None:
    """Why ccache, reading ``url`` as its remote storage (after its own percent-decoding, lower-casing and
    path normalisation), would not reach the store the URL's text names; None when it would. A scheme
    ccache has no storage for is left to the caller (it names the valid ones)."""
    try:
        reading = ccache_url(url)
    except ValueError as exc:
        return f"ccache cannot read it as a URL: {exc}"
    if reading.scheme not in ("redis", "http"):
        return None
    problem = host_problem(reading.host)
    if problem:
        return f"as ccache reads it, {problem}"
    if reading.has_query or reading.fragment:
        return f"ccache's {reading.scheme} storage takes no '?' query or '#' fragment"
    problem = printable_problem("user info", reading.user_info)
    if problem:
        return f"as ccache reads it (it decodes %XX), {problem}"
    if reading.scheme == "redis":
        database = ccache_redis_database(reading)
        if database is not None and not (
            database.isascii() and database.isdigit() and int(database) <= REDIS_DB_MAX
        ):
            return (
                f"ccache reads its redis database as {database!r} (it decodes %XX and drops '.' and '..' "
                "path segments), which is not a number"
            )
    else:
        problem = printable_problem("path", reading.path)
        if problem:
            return f"as ccache reads it (it decodes %XX), {problem}"
    written = _written_path(url)
    if reading.path != written:
        return (
            f"ccache reads its path {written!r} as {reading.path!r} (it decodes %XX and drops '.', '..' and "
            "empty segments): write it as ccache reads it"
        )
    return None


def _written_path(url: str) -> str:
    """The path of ``url`` as written: after the authority, before a query or fragment."""
    rest = url.split("://", 1)[1] if "://" in url else url
    slash = rest.find("/")
    path = rest[slash:] if slash >= 0 else ""
    return re.split(r"[?#]", path, maxsplit=1)[0]
