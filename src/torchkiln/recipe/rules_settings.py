"""Recipe rules on how the build runs: ``build.flags`` (none that a recipe field decides, each one the torch
release reads), the compiler cache (``[cache]``: consistent, usable by the plan, no secret in a URL) and
distributed compiles (``[cluster]``). Rows of :data:`torchkiln.recipe.rules.RULES`.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator

from torchkiln.errors import UsageError

from . import cmake_options
from .compat import minor, torch_release
from .model import Recipe
from .rules_violations import Violation, rule

# Flags torchkiln sets itself from recipe fields: setting them in build.flags would contradict the recipe.
MANAGED_FLAGS: dict[str, str] = {
    "USE_CUDA": "accelerator.kind",
    "USE_CUDNN": "accelerator.cudnn",
    "USE_NCCL": "accelerator.nccl",
    "USE_MKL": "blas.kind",
    "BLAS": "blas.kind",
    "USE_MAGMA": "magma",
    "BUILD_TEST": "(always 0: torchkiln builds wheels)",
}


@rule("flags", "build.flags does not override what recipe fields decide", ("build.flags",))
def _flags(r: Recipe) -> Iterator[Violation]:
    for key in r.build.flags:
        if key in MANAGED_FLAGS:
            yield (
                f"build.flags.{key}",
                f"{key} is set by torchkiln from {MANAGED_FLAGS[key]}",
                "change that field instead",
            )


@rule(
    "flags-known",
    "build.flags are options the torch release reads, with values of their type",
    ("build.flags", "torch.version"),
)
def _flags_known(r: Recipe) -> Iterator[Violation]:
    """Each flag against the CMake options table of the recipe's torch release (names and value types).

    An unknown name is an error, not a warning, although the tables are "nearest" (read from bracketing
    upstream files, not each release's own): a misspelt flag silently does nothing and is found, if ever,
    after an hour's compile, while a false alarm costs one line in data/cmake_options.toml, found in a
    second. The problem line says which table was used and how sure it is."""
    raw = r.document.get("build", {}).get("flags", {})
    flags = {k: v for k, v in raw.items() if k not in MANAGED_FLAGS}
    if not flags or torch_release(r) is None:
        return
    found = cmake_options.check_flags(str(r.torch.version), flags)
    if not found:
        return
    table = cmake_options.release(minor(r.torch.version))
    for field, message, valid in found:
        yield (
            field,
            message,
            f"{valid}; table: data/cmake_options.toml, torch {table.version}, {table.confidence}",
        )


@rule("cache", "cache settings are consistent, usable by the plan and hold no secrets", ("cache",))
def _cache(r: Recipe) -> Iterator[Violation]:
    c = r.cache
    if c.kind == "none" and (c.remote or c.dir or c.max_size):
        yield ("cache.kind", '"none" with cache settings', "ccache or sccache, or drop the other cache keys")
    if c.credentials_env and c.credentials_file:
        yield ("cache.credentials_file", "set together with cache.credentials_env", "one of the two")
    if (c.credentials_env or c.credentials_file) and not c.remote:
        yield (
            "cache.remote",
            "credentials given without a remote store",
            "a remote URL, or drop the credentials",
        )
    if c.remote:
        secret = remote_secret(c.remote, credentials=bool(c.credentials_env or c.credentials_file))
        if secret:
            yield ("cache.remote", secret, "put it in cache.credentials_env or cache.credentials_file")
            return
    if c.kind == "none" and (c.remote or c.dir or c.max_size):
        return  # reported above; the resolver would only say it again
    # One resolver: what the plan will resolve (the tool's remote schemes, its URL parameters, the size),
    # so a recipe this accepts is one the plan accepts. Imported here: the verification suite loads recipes
    # without importing the cache machinery unless a recipe has a [cache] table to resolve.
    from torchkiln.cache import resolve_cache  # noqa: PLC0415

    try:
        resolve_cache(c, environ={"HOME": "/"})
    except UsageError as exc:
        field, _, text = str(exc).partition(": ")
        message, _, valid = text.partition(" (valid: ")
        valid = valid.replace(")", "", 1) if valid.count(")") > 1 else valid.rstrip(")")
        yield (field if field.startswith("cache.") else "cache", message, valid)


def remote_secret(url: str, *, credentials: bool) -> str | None:
    """What is wrong when a remote store's URL carries a secret, else None. Any ``user:password@`` (also
    percent-encoded, ``u%3Apw@``) is one; so is a bare ``NAME@`` when no credentials source is named, since
    ccache's and sccache's redis take it as the password."""
    userinfo = url.split("://", 1)[-1].split("/", 1)[0].rpartition("@")[0]
    if not userinfo:
        return None
    if ":" in urllib.parse.unquote(userinfo):
        return "a password is written into the URL"
    if not credentials:
        return "the URL's user part is read as a password (NAME@ with no credentials source)"
    return None


@rule("cluster", "distributed compiles name a scheduler and use sccache", ("cluster", "cache.kind"))
def _cluster(r: Recipe) -> Iterator[Violation]:
    d = r.cluster
    if d is None:
        return
    if not d.scheduler_url:
        yield (
            "cluster.scheduler_url",
            "[cluster] without a scheduler",
            "http(s)://HOST[:PORT] of the sccache-dist scheduler",
        )
    if r.cache.kind != "sccache":
        yield (
            "cluster",
            f"distributed compiles need the sccache compiler cache, not {r.cache.kind}",
            'cache.kind = "sccache" (sccache is the client of sccache-dist; ccache has no distributed mode)',
        )
    if d.credentials_env and d.credentials_file:
        yield ("cluster.credentials_file", "set together with cluster.credentials_env", "one of the two")
