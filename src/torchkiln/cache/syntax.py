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
* sccache takes ``SCCACHE_DIR`` and its other paths as written, but splits ``SCCACHE_BASEDIRS`` at ``:``
  (mozilla/sccache src/config.rs, ``config_from_env``: "multiple paths separated by ... ':' on other
  platforms").

Such a value is refused where it enters (the recipe check, the command line, the plan), naming the field
and why; every value torchkiln hands either tool passes :func:`tool_value_problem` first. The table of all
values that reach a tool is docs/values-to-tools.md.
"""

from __future__ import annotations

import re

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
