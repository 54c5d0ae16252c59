"""docs/values-to-tools.md, row by row, generated: each value checked as its tool will read it (issue 35 item 4).

For every row, hypothesis changes the row's valid values the ways a value can say one thing and mean another
to its tool: a character percent-encoded (either hex case), replaced by a Unicode look-alike (raw, or
percent-encoded as UTF-8), a whitespace or control character inserted (raw or encoded), a character the tool
reads as syntax inserted (raw or encoded), the scheme's case changed. The property of every row: what
torchkiln accepts, the tool reads as what its text says (read by the real tool where it prints its reading:
``git fetch-pack --diag-url``, ``git check-ref-format``, ``ccache -k``; else by the port of its parser in
torchkiln.urlreading, whose sources docs/values-to-tools.md names); what it does not, it refuses naming the
field or option. ``test_cache_remote_ccache_port_matches_real_ccache`` (integration) holds the ccache port
to real ccache against a real redis-server.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import shutil
import subprocess
import urllib.parse
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st
from kit import ROOT, urlkit
from kit.imagekit import examples, need
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from test_values_to_tools import problems

from torchkiln.cache import resolve_cache
from torchkiln.cache.ccache import Ccache, storage_url
from torchkiln.cache.remote import parse_remote
from torchkiln.cache.sccache import Sccache, sccache_size
from torchkiln.errors import TorchkilnError, UsageError
from torchkiln.recipe.schema import FIELDS
from torchkiln.urlreading import (
    ccache_redis_database,
    ccache_url,
    download_url_problem,
    git_reading,
    host_problem,
    inet_aton,
)

SETTINGS = settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))
PRINTABLE = re.compile(r"[!-~]*", re.ASCII)

LOOKALIKES: dict[str, tuple[str, ...]] = {
    "a": ("а", "ａ", "ɑ"), "c": ("с", "ｃ"), "e": ("е", "ｅ"), "h": ("һ",), "i": ("і", "ı"),
    "o": ("о", "ο", "ｏ"), "p": ("р",), "s": ("ѕ",), "x": ("х",), "y": ("у",),
    "0": ("０", "٠"), "1": ("１", "١", "¹"), "2": ("２", "²"), "3": ("３", "³"),
    "-": ("‐", "‑", "−", "－"), ".": ("․", "．", "。"), "/": ("∕", "⁄", "／"), ":": ("꞉", "：", "∶"),
    "@": ("＠",), "=": ("＝",), "_": ("＿",),
}  # fmt: skip
CONTROLS = (
    "\t",
    "\n",
    "\r",
    "\x00",
    "\x0b",
    "\x0c",
    "\x1b",
    "\x7f",
    "\x85",
    "\xa0",
    "\u2028",
    "\u200b",
    "\ufeff",
    " ",
)
OPS = (
    "encode",
    "lookalike",
    "encoded-lookalike",
    "control",
    "encoded-control",
    "syntax",
    "encoded-syntax",
    "case",
)


def percent(text: str, upper: bool) -> str:
    return "".join((f"%{b:02X}" if upper else f"%{b:02x}") for b in text.encode("utf-8"))


@st.composite
def changed(draw: st.DrawFn, base: str, syntax: str = "") -> str:
    """``base`` changed one to three times (see the module's docstring)."""
    text = base
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(OPS))
        at = draw(st.integers(0, max(len(text) - 1, 0)))
        upper = draw(st.booleans())
        if op == "encode" and text:
            text = text[:at] + percent(text[at], upper) + text[at + 1 :]
        elif op in ("lookalike", "encoded-lookalike"):
            spots = [i for i, c in enumerate(text) if c.lower() in LOOKALIKES]
            if spots:
                i = draw(st.sampled_from(spots))
                alike = draw(st.sampled_from(LOOKALIKES[text[i].lower()]))
                text = (
                    text[:i] + (percent(alike, upper) if op == "encoded-lookalike" else alike) + text[i + 1 :]
                )
        elif op in ("control", "encoded-control"):
            char = draw(st.sampled_from(CONTROLS))
            text = text[:at] + (percent(char, upper) if op == "encoded-control" else char) + text[at:]
        elif op in ("syntax", "encoded-syntax") and syntax:
            char = draw(st.sampled_from(syntax))
            text = text[:at] + (percent(char, upper) if op == "encoded-syntax" else char) + text[at:]
        elif op == "case" and "://" in text:
            scheme, rest = text.split("://", 1)
            flips = draw(st.lists(st.booleans(), min_size=len(scheme), max_size=len(scheme)))
            text = "".join(c.upper() if f else c for c, f in zip(scheme, flips, strict=True)) + "://" + rest
    return text


def printable(text: str) -> bool:
    return PRINTABLE.fullmatch(text) is not None


# --------------------------------------------------------------------------------------------------
# git
# --------------------------------------------------------------------------------------------------

REPOS = (
    "ssh://git@git.example.com:22/pytorch/pytorch.git",
    "ssh://git.example.com/pytorch",
    "git://git.example.com/pytorch.git",
    "file:///srv/mirror/pytorch",
    "https://git.example.com/pytorch/pytorch.git",
    "git@git.example.com:pytorch/pytorch.git",
    "/srv/mirror/pytorch",
)


@pytest.fixture(scope="module")
def diag_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty repository: ``git fetch-pack --diag-url`` wants one to run in."""
    repo = tmp_path_factory.mktemp("diag")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    return repo


def git_diag(repo: Path, url: str) -> dict[str, str] | None:
    """git's own reading of ``url`` (``git fetch-pack --diag-url``): host (``userandhost`` or
    ``hostandport``), port and path; None where git refuses the URL or reads it through a remote helper.
    A part holding a line break cannot be told apart in the output: it is returned as ``"\\n"``."""
    if "\x00" in url:
        return None  # no argv item can hold it: no tool ever reads it
    done = subprocess.run(
        ["git", "-C", str(repo), "fetch-pack", "--diag-url", url],  # no `--`: fetch-pack takes none
        capture_output=True, text=True, errors="surrogateescape", check=False,
        env={"PATH": os.environ["PATH"], "HOME": str(repo)},
    )  # fmt: skip
    if done.returncode != 0 or "Diag: protocol=" not in done.stdout:
        return None
    lines = done.stdout.splitlines()
    if sum(line.startswith("Diag: ") for line in lines) != len(lines):
        return {"host": "\n", "port": "NONE", "path": "\n"}  # a part broke a line
    found = dict(line[6:].split("=", 1) for line in lines)
    return {"host": found.get("userandhost", found.get("hostandport", "")), "port": found.get("port", "NONE"),
            "path": found.get("path", "")}  # fmt: skip


def dangerous(diag: dict[str, str]) -> bool:
    """A reading git would hand on as an option, or with characters the URL's text hid."""
    host, path = diag["host"], diag["path"]
    name = host.rpartition("@")[2]
    return any(
        (
            host.startswith("-"),
            name.startswith("-"),
            path.startswith("-"),
            not printable(host) or not printable(path) or not printable(diag["port"]),
        )
    )


@SETTINGS
@given(value=st.sampled_from(REPOS).flatmap(lambda base: changed(base, "-@:/[]%~ ") | st.just(base)))
@example(value="ssh://%2doProxyCommand=touch%20%2ftmp%2fx/p")
@example(value="ssh://[%2dfoo]/p")
@example(value="ssh://%5B-foo%5d/p")
@example(
    value="s@sh://git@git.example.com:22/pytorch/pytorch.git"
)  # no URL: git's own transport, no such protocol
def test_repo_decoded(diag_repo: Path, value: str) -> None:
    said = problems(torch__repo=value)
    diag = git_diag(diag_repo, value)
    event("refused" if said else "accepted")
    if said:
        assert said.startswith("r.toml: torch.repo: "), said
        return
    reading = git_reading(value)
    if value.startswith(("https://", "http://")):
        assert diag is None  # a remote helper's: curl reads it
        assert host_problem(reading.hostname or "") is None and printable(reading.path)
        return
    assert diag is not None, f"git cannot read {value!r}, torchkiln accepted it"
    assert not dangerous(diag), (value, diag)
    host = diag["host"] if reading.transport != "git" else diag["host"].split(":")[0]
    assert (host, diag["path"]) == (
        (reading.host or "") if reading.transport != "file" else diag["host"],
        reading.path,
    )
    assert diag["port"] in ("NONE", reading.port) or reading.transport != "ssh"


@SETTINGS
@given(value=st.sampled_from(REPOS[:4]).flatmap(lambda base: changed(base, "-%")))
def test_repo_refused_whenever_git_reads_an_option(diag_repo: Path, value: str) -> None:
    """The other direction, over git's own reading: every value git reads as a host, user or path
    beginning with '-' (or with hidden characters) is refused."""
    diag = git_diag(diag_repo, value)
    assume(diag is not None and dangerous(diag))
    assert problems(torch__repo=value).startswith("r.toml: torch.repo: ")


@SETTINGS
@given(
    value=st.sampled_from(("v2.6.0", "release/2.6", "main", "v0.21.0-rc1")).flatmap(
        lambda b: changed(b, "-+:*^.@{}~%/ \\")
    )
)
def test_ref_decoded(value: str) -> None:
    """git decodes nothing in a ref: what is accepted is a ref name to git as written."""
    said = problems(torch__ref=value)
    if said:
        assert "r.toml: torch.ref: " in said
        return
    assert printable(value) and "%" not in value and not value.startswith(("-", "+"))
    checked = subprocess.run(["git", "check-ref-format", "--allow-onelevel", value], check=False)
    assert checked.returncode == 0, value


def git_accepts_ref(value: str) -> bool:
    """Real git's own judgement: a name it accepts as a branch (``check-ref-format --branch``) and as a tag
    (``check-ref-format refs/tags/NAME``)."""
    runs = (["--branch", value], [f"refs/tags/{value}"])
    return all(
        subprocess.run(["git", "check-ref-format", *args], capture_output=True, check=False).returncode == 0
        for args in runs
    )


# Ref names from the pieces git's ref grammar turns on (check-ref-format(1) and refs.c): dots leading a
# component, '..', '.lock' ending a component, '@{' and a lone '@', slashes leading, trailing and doubled,
# control characters, the characters git forbids, symbolic refs and full ref names, option-like starts.
REF_PIECES = (
    "v2",
    ".6",
    "0",
    "release",
    "main",
    "rc1",
    "_x",
    ".",
    "..",
    ".lock",
    "lock",
    "/",
    "//",
    "@",
    "@{",
    "{",
    "}",
    "-",
    "+",
    "~",
    "^",
    ":",
    "?",
    "*",
    "[",
    "\\",
    " ",
    "\t",
    "\x7f",
    "\x01",
    "HEAD",
    "FETCH_HEAD",
    "refs/",
    "heads/",
    "tags/",
    "é",
)
REFS = st.lists(st.sampled_from(REF_PIECES), min_size=1, max_size=6).map("".join)
# what torchkiln narrows git's grammar to on purpose (validators.REF_CHARS_RE's comment): its alphabet, no
# leading '-' or '+', no symbolic ref, no full refs/ name
NARROWED = re.compile(r"(?![-+])(?!refs/)(?!(?:[A-Z]+_)*HEAD$)[A-Za-z0-9_./+-]{1,200}", re.ASCII)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=list(HealthCheck))
@given(value=REFS)
@example(".v2.6.0")  # git refuses a component beginning with '.': a newcomer's machine found it (issue 44)
@example("release/.2.6")
@example("v2.6.0.lock/x")
@example("/v2.6.0")
@example("v2.6.0/")
@example("v2.6.0.")
@example("HEAD")
@example("refs/heads/main")
@example("FETCH_HEAD")
@example("fix_build")
@example("@")
def test_a_ref_is_what_git_takes_as_a_branch_or_tag_name(value: str) -> None:
    """The recipe's ref against real git over a generated corpus, both ways: what torchkiln accepts, git
    accepts as a branch name and as a tag name, and it is neither a symbolic ref nor a full ref name (docs:
    'a branch or tag name'); what git accepts within torchkiln's narrower alphabet, torchkiln accepts. Any
    disagreement fails, naming the value."""
    said = problems(torch__ref=value)
    accepted = not said
    assert accepted or "r.toml: torch.ref: " in said, said
    if accepted:
        assert git_accepts_ref(value), f"torchkiln accepts {value!r}, git refuses it"
        assert NARROWED.fullmatch(value), f"torchkiln accepts {value!r}, outside its documented alphabet"
    elif NARROWED.fullmatch(value) and git_accepts_ref(value):
        raise AssertionError(f"git takes {value!r} as a branch and a tag, torchkiln refuses it: {said}")


@SETTINGS
@given(value=changed("0123456789abcdef0123456789abcdef01234567", "ABCDEF-:^~"))
def test_commit_decoded(value: str) -> None:
    """Compared with the HEAD git prints (40 lowercase hex digits): nothing else is accepted."""
    said = problems(torch__commit=value)
    assert said.startswith("r.toml: ") or re.fullmatch(r"[0-9a-f]{40}", value, re.ASCII), (value, said)
    if not re.fullmatch(r"[0-9a-f]{40}", value, re.ASCII):
        assert "torch.commit" in said


# --------------------------------------------------------------------------------------------------
# ccache and sccache
# --------------------------------------------------------------------------------------------------


def ccache_reads(key: str, env: dict[str, str]) -> str:
    """What real ccache reads a setting as (``ccache -k KEY``)."""
    done = subprocess.run(
        [need("ccache"), "-k", key], env={"PATH": os.environ["PATH"], "HOME": "/nonexistent", **env},
        capture_output=True, text=True, check=False, errors="surrogateescape",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.rstrip("\n")


@SETTINGS
@given(value=changed("/srv/kiln-cache/ccache", "$}{:~%"))
def test_cache_dir_decoded(value: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    said = problems(cache__dir=value)
    if said:
        assert "cache.dir" in said
        return
    config = resolve_cache(None, kind="ccache", dir=value)
    handed = Ccache().public_env(config)["CCACHE_DIR"]
    assert ccache_reads("cache_dir", {"CCACHE_DIR": handed, "CCACHE_CONFIGPATH": "/dev/null"}) == handed


REMOTES_CCACHE = (
    "redis://cache.example:6379/3",
    "redis://cache.example:6379",
    "redis://10.0.0.7:6379/0",
    "http://cache.example:8080/ccache",
)
SEGMENTS = ("/..", "/.", "//", "/%2e%2e", "/%2E.", "/", "/+1", "/%20", "/4294967296", "/07", "?db=1", "#x")


@st.composite
def ccache_remotes(draw: st.DrawFn) -> str:
    """A store's URL, changed or not, with one of the path forms ccache normalises (or none); hosts in
    either case, ports, user info written as ccache decodes it."""
    base = draw(st.sampled_from(REMOTES_CCACHE))
    if draw(st.booleans()):
        base = draw(changed(base, "/.%@:+[]?#"))
    else:
        base = base.replace(
            "cache.example", draw(st.sampled_from(("cache.example", "Cache.EXAMPLE", "10.1.2.3")))
        )
    if draw(st.booleans()):
        base += draw(st.sampled_from((*SEGMENTS, "/5", "/0", "/4294967295")))
    return base


def ccache_meaning(value: str) -> tuple[str, str, str, str | None]:
    """(scheme, host, port, redis database) as ccache reads ``value`` (the port of its parser)."""
    reading = ccache_url(value)
    return reading.scheme, reading.host, reading.port, ccache_redis_database(reading)


@SETTINGS
@given(value=ccache_remotes())
@example(value="redis://127.0.0.1:6379/%2e%2e")
@example(value="REDIS://Cache.Example:6379/3")
def test_cache_remote_ccache_decoded(value: str) -> None:
    said = problems(cache__remote=value)
    event("refused" if said else "accepted")
    if said:
        assert said.startswith("r.toml: cache.remote: "), said
        return
    scheme, host, port, database = ccache_meaning(value)
    assert scheme in ("redis", "http") and host_problem(host) is None
    if scheme == "redis":
        assert database is None or (database.isdigit() and database.isascii() and int(database) < 2**32)
    # what torchkiln hands ccache reads as what it checked
    handed = Ccache().public_env(resolve_cache(None, kind="ccache", remote=value))["CCACHE_REMOTE_STORAGE"]
    assert ccache_meaning(handed) == (scheme, host, port, database)
    assert printable(ccache_url(handed).path)


REMOTES_SCCACHE = (
    "s3://kiln-bucket/prefix?region=eu-west-1",
    "redis://cache.example:6379/2",
    "gs://kiln_bucket/cache",
    "webdav+https://dav.example/cache",
    "memcached://mc.example:11211",
)


@SETTINGS
@given(value=st.sampled_from(REMOTES_SCCACHE).flatmap(lambda b: changed(b, "/.%@:?=&#")))
def test_cache_remote_sccache_decoded(value: str) -> None:
    """sccache reads each variable as written: every one torchkiln hands is what it means as written."""
    said = problems(cache__remote=value, cache__kind="sccache")
    if said:
        assert "cache.remote" in said, said
        return
    env = Sccache().public_env(resolve_cache(None, kind="sccache", remote=value))
    derived = {k: v for k, v in env.items() if k.startswith(("SCCACHE_REDIS", "SCCACHE_BUCKET", "SCCACHE_S3",
               "SCCACHE_GCS_BUCKET", "SCCACHE_GCS_KEY", "SCCACHE_REGION", "SCCACHE_ENDPOINT", "SCCACHE_MEMCACHED",
               "SCCACHE_WEBDAV"))}  # fmt: skip
    assert derived, env
    for variable, text in derived.items():
        assert printable(text) and "%" not in text, (variable, text)
    if "SCCACHE_REDIS_DB" in derived:
        assert derived["SCCACHE_REDIS_DB"].isdigit() and int(derived["SCCACHE_REDIS_DB"]) < 2**32
    for variable in ("SCCACHE_BUCKET", "SCCACHE_GCS_BUCKET"):
        if variable in derived:
            assert re.fullmatch(r"[a-z0-9][a-z0-9._-]*", derived[variable], re.ASCII), derived[variable]


@SETTINGS
@given(
    secret=st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=24)
    | changed("s3cr3t-Value.x", "%$@:/ |")
)
def test_cache_secret_decoded(secret: str) -> None:
    """ccache decodes the user info of its URL: a secret is handed only when ccache reads back exactly it."""
    remote = parse_remote("redis://cache.example:6379", kind="ccache", schemes=("redis",))
    try:
        url = storage_url(remote, None, secret)
    except UsageError as exc:
        assert str(exc).startswith("cache.credentials: ")
        return
    assert "$" not in url and ccache_url(url).user_info == secret


SIZES = ("20G", "1.5G", "500M", "20Gi", "1.5Ti", "3K", "100Mi")


def ccache_size_bytes(size: str) -> int:
    """ccache v4.7.5 src/Util.cpp ``parse_size`` (the grammar torchkiln accepts)."""
    number, unit = size.rstrip("KMGTi"), size[len(size.rstrip("KMGTi")) :]
    base = 1024 if unit.endswith("i") else 1000
    return int(Decimal(number) * base ** ("KMGT".index(unit[0]) + 1))


def sccache_size_bytes(text: str) -> int | None:
    """sccache src/config.rs ``parse_size``: an integer, a last K/M/G/T (either case) as powers of 1024."""
    multiplier = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}.get(text[-1:].upper(), 1)
    digits = text[:-1] if multiplier > 1 else text
    return int(digits) * multiplier if digits.isascii() and digits.isdigit() else None


@SETTINGS
@given(value=st.sampled_from(SIZES).flatmap(lambda b: changed(b, "KMGTi.kg ")) | st.sampled_from(SIZES))
def test_cache_max_size_decoded(value: str) -> None:
    """Both tools read the same number of bytes out of what each is handed (or torchkiln refuses it)."""
    said = problems(cache__max_size=value)
    if said:
        assert "cache.max_size" in said
        return
    config = resolve_cache(None, kind="sccache", max_size=value)
    handed = Sccache().public_env(config)["SCCACHE_CACHE_SIZE"]
    assert sccache_size_bytes(handed) == ccache_size_bytes(value), (value, handed)
    assert Ccache().public_env(resolve_cache(None, kind="ccache", max_size=value))["CCACHE_MAXSIZE"] == value
    assert ccache_reads("max_size", {"CCACHE_MAXSIZE": value, "CCACHE_DIR": "/tmp/kiln-k"})


def test_sccache_reads_a_ccache_size_as_no_size() -> None:
    """Why the byte count: sccache's parse_size takes '20Gi' and '1.5G' as nothing at all, and '20G' as
    20 GiB where ccache reads 20 GB."""
    assert sccache_size_bytes("20Gi") is None and sccache_size_bytes("1.5G") is None
    assert sccache_size_bytes("20G") == 20 * 1024**3 != ccache_size_bytes("20G")
    assert sccache_size("20G") == str(20 * 1000**3) and sccache_size("1.5Gi") == str(int(1.5 * 1024**3))


# --------------------------------------------------------------------------------------------------
# Paths in lists, paths as arguments.
# --------------------------------------------------------------------------------------------------


def plan_at(workdir: str, kind: str = "ccache"):  # type: ignore[no-untyped-def]
    from test_values_to_tools import recipe_with

    from torchkiln.plan.make import make_plan
    from torchkiln.recipe.loader import parse_recipe

    recipe = parse_recipe(recipe_with(), "r.toml")
    return make_plan(recipe, workdir=Path(workdir), dist=Path("/tmp/kiln-dist"), only="torch",
                     cache=resolve_cache(None, kind=kind, dir="/tmp/kiln-cache"))  # fmt: skip


@SETTINGS
@given(value=changed("/work/kiln-builds", "$:{}%"), kind=st.sampled_from(("ccache", "sccache")))
def test_basedir_decoded(value: str, kind: str) -> None:
    try:
        plan = plan_at(value, kind)
    except UsageError as exc:
        assert str(exc).startswith("--workdir"), exc
        return
    env = plan.env_for("torch")
    if kind == "ccache":
        assert "$" not in env["CCACHE_BASEDIR"]
    else:
        assert env["SCCACHE_BASEDIRS"].split(":") == [env["SCCACHE_BASEDIRS"]]


@SETTINGS
@given(value=changed("/work/kiln-builds", ":;%"))
def test_workdir_decoded(value: str) -> None:
    try:
        plan = plan_at(value)
    except UsageError as exc:
        assert str(exc).startswith("--workdir"), exc
        return
    wheel = next(s for s in plan.steps if s.kind == "compile")
    assert all(entry.split(":") == [entry] for entry in wheel.path_prepend)


@SETTINGS
@given(value=changed("-work", "-/ "))
def test_paths_decoded(value: str) -> None:
    """Relative, beginning with '-': every path a step gets after `--` is absolute."""
    assume("\x00" not in value and ":" not in value and "$" not in value)
    try:
        plan = plan_at(value)
    except (UsageError, ValueError):
        return
    for step in plan.steps:
        if "--" in step.argv:
            after = step.argv[step.argv.index("--") + 1 :]
            assert all(not a.startswith("-") for a in after), step.argv


# --------------------------------------------------------------------------------------------------
# pip, versions, the recipe's other values.
# --------------------------------------------------------------------------------------------------


@SETTINGS
@given(
    value=st.sampled_from(("torch==2.13.0", "torch==2.13.0+cpu", "TORCH == 2.13.0")).flatmap(
        lambda b: changed(b, " =<>!~;@[],%-_.")
    )
)
@example(value="torch===2.13.0")
@example(value="torch===%32.13.0")  # found by the newcomer run on Debian 12: === takes any string
def test_torch_requirement_decoded(value: str) -> None:
    from torchkiln.plan.given_torch import _version

    try:
        install, version, _ = _version(value)
    except UsageError as exc:
        assert str(exc).startswith("--torch ")
        return
    req = Requirement(install)
    assert printable(install.replace(" ", "")) and canonicalize_name(req.name) == "torch"
    # one exact pin: == (a local label matches it too) or === (only this very string: upstream's CUDA build
    # where a local +cpu wheel would also match ==)
    assert [s.operator for s in req.specifier] in (["=="], ["==="]) and not req.url and not req.marker
    assert str(version).isascii()


@SETTINGS
@given(lines=st.lists(st.sampled_from(("setuptools>=77", "numpy", "-e .", "--index-url x", "typing_extensions"))
                      .flatmap(lambda b: changed(b, " =<>!~;@[],%-_.#")), min_size=1, max_size=4))  # fmt: skip
def test_build_requirements_decoded(lines: list[str], tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each requirement pip gets from a tree's file is the normalised PEP 508 text, which reads back as
    itself; option lines are no requirements."""
    from torchkiln.build.buildreqs import _read_requirement_file

    assume(all("\n" not in line and "\r" not in line for line in lines))
    path = tmp_path_factory.mktemp("reqs") / "requirements.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for req in _read_requirement_file(path, "torch", set()):
        text = str(req.requirement)
        assert str(Requirement(text)) == text and not text.startswith("-")


@SETTINGS
@given(value=st.sampled_from(("numpy>=2", "torch==2.13.0", "pyyaml", "ninja==1.11.1.4")).flatmap(
    lambda b: changed(b, " =<>!~;@[],%-_./:#")))  # fmt: skip
@example(value="torch.whl")  # pip reads a name ending like an archive as a file (relative to its cwd)
@example(value="tinydep-1.0-py3-none-any.whl")
@example(value="tinydep @ https://x.invalid/tinydep-1.0-py3-none-any.whl")
@example(value="torch == 2.13.0")
@example(value="tоrch==2.13.0")  # a Cyrillic о: no project of the index's grammar
@example(
    value="torch===２.13.0"
)  # a fullwidth ２: === (arbitrary equality) takes any text (CI's profile drew it)
def test_recipe_build_requirements_decoded(value: str) -> None:
    """What ``build.requirements`` accepts, pip reads as itself: its own reading of a requirement argument
    (``install_req_from_line``, what ``pip install -- REQ`` does) is a project from the index, no file or
    URL, whose text is the value; what it refuses is named."""
    from pip._internal.req.constructors import install_req_from_line

    said = problems(build__requirements=[value])
    if said:
        assert "build.requirements" in said, said
        return
    read = install_req_from_line(value)
    assert read.link is None and str(read.req) == value, (value, read.link, read.req)
    assert value.isascii() and printable(value.replace(" ", "")), value


@SETTINGS
@given(value=changed("3.11", ".t0123"))
def test_python_version_decoded(value: str) -> None:
    said = problems(python__version=value)
    assert bool(said) or re.fullmatch(r"[0-9]{1,2}\.[0-9]{1,3}t?", value, re.ASCII), value


@SETTINGS
@given(value=changed("torch-2.13-cpu", "/.-_ "))
def test_recipe_name_decoded(value: str) -> None:
    said = problems(recipe__name=value)
    if not said:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value, re.ASCII) and "/" not in value


@SETTINGS
@given(value=changed("/opt/kiln", ";${} :"))
def test_build_flags_decoded(value: str) -> None:
    said = problems(build__flags={"USE_DISTRIBUTED": value})
    if not said:
        assert printable(value) and not set(value) & set(";${} ")


@SETTINGS
@given(entries=st.lists(changed("8.0", ";+ PTXa"), min_size=1, max_size=3))
def test_arch_list_decoded(entries: list[str]) -> None:
    said = problems(accelerator__arch_list=entries)
    if not said:
        assert ";".join(entries).split(";") == entries and not any(" " in e for e in entries)


@SETTINGS
@given(
    value=st.sampled_from(("2.13.0", "2.13.0rc1", "2.13.0+cpu.kiln1", "2.13.0.post1")).flatmap(
        lambda b: changed(b, "RCrcPOST.+-_0")
    )
)
@example(value="2.13.0.RC1")
@example(value="02.13.0")
def test_versions_decoded(value: str) -> None:
    """setuptools writes the wheel's version normalised: an accepted version is its own normal form."""
    said = problems(build__pytorch_build_version=value)
    if said:
        assert "build.pytorch_build_version" in said
        return
    assert str(Version(value)) == value


@SETTINGS
@given(value=st.sampled_from(("+cpu", "+cu130.kiln1")).flatmap(lambda b: changed(b, ".+-_0")))
@example(value="+cpu.01")
def test_local_version_decoded(value: str) -> None:
    said = problems(build__local_version=value)
    if not said:
        assert "+" + (Version("0" + value).local or "") == value


@SETTINGS
@given(value=st.one_of(st.integers(-5, 5000), changed("8", "-+ .e")))
def test_jobs_decoded(value: object) -> None:
    said = problems(build__jobs=value)
    if not said:
        assert isinstance(value, int) and 1 <= value <= 4096


@SETTINGS
@given(value=changed("http://sched.example:10600", "%@:/.[]"))
def test_cluster_scheduler_decoded(value: str) -> None:
    from torchkiln.distributed.spec import scheduler_url

    try:
        normal = scheduler_url(value)
    except UsageError as exc:
        assert str(exc).startswith("cluster.scheduler_url: ")
        return
    parts = urllib.parse.urlsplit(normal)
    assert printable(normal) and "%" not in normal and "@" not in normal
    assert parts.hostname is not None and host_problem(parts.hostname) is None


@SETTINGS
@given(value=changed("https://icl.utk.edu/projectsfiles/magma/downloads/magma-2.6.1.tar.gz", "%@:/[]{} "))
def test_magma_url_decoded(value: str) -> None:
    from torchkiln.recipe.schema import FIELDS

    check = FIELDS["magma.url"].check
    assert check is not None
    if check(value) is None:
        parts = urllib.parse.urlsplit(value)
        assert parts.scheme == "https" and "@" not in parts.netloc and "%" not in parts.netloc
        assert host_problem(parts.hostname or "") is None and download_url_problem(value) is None


# --------------------------------------------------------------------------------------------------
# Container engines, the verify suite, TMPDIR.
# --------------------------------------------------------------------------------------------------


@SETTINGS
@given(tag=changed("localhost/torchkiln:2.13.0-cpu-devel", "- :@,\n"))
def test_image_names_decoded(tag: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Whatever a tag holds, the engine gets it as one item after --tag (it parses it with its own
    reference grammar, and refuses what it cannot read)."""
    from torchkiln.images.engines import Buildah, BuildRequest, Docker, Podman, Storage

    root = tmp_path_factory.mktemp("engine")
    storage = Storage(root / "s", root / "r", "vfs")
    req = BuildRequest(root / "Dockerfile", root / "ctx", "", (tag,), {})
    for engine in (Docker("docker"), Podman("podman", storage), Buildah("buildah", storage)):
        argv = engine.build_argv(req)
        assert argv[argv.index("--tag") + 1] == tag and argv[-2:] == ["--", str(root / "ctx")]


@SETTINGS
@given(path=changed("/srv/kiln/pip.conf", ',:="'), target=changed("/data", ",:"))
def test_engine_fields_decoded(path: str, target: str) -> None:
    """An accepted path is one field of --secret/--output (the engine splits at ','), and one part of
    --volume (split at ':')."""
    from torchkiln.commands.images import _no_comma
    from torchkiln.images.engines import _run_options

    assume("\x00" not in path and "\x00" not in target)
    try:
        _no_comma("--pip-config", Path(path))
        assert f"id=pip,src={path}".split(",") == ["id=pip", f"src={path}"]
    except UsageError as exc:
        assert str(exc).startswith("--pip-config ") and "," in path
    try:
        argv = _run_options(None, None, {Path(path): target})
        parts = argv[1].split(":")
        assert len(parts) == 3 and parts[1:] == [target, "ro"] and Path(parts[0]).is_absolute()
    except UsageError:
        assert ":" in path + target or "," in path


@SETTINGS
@given(value=changed("3.11", " \n'\"$;=&|"))
def test_build_args_decoded(value: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    from torchkiln.images.engines import BuildRequest

    root = tmp_path_factory.mktemp("args")
    argv = BuildRequest(root / "D", root / "c", "devel", (), {"KILN_PYTHON": value}).args()
    assert argv[argv.index("--build-arg") + 1] == f"KILN_PYTHON={value}"


@SETTINGS
@given(value=changed("/tmp/kiln-tmp", "${}"))
def test_tmpdir_decoded(value: str, monkeypatch_module: pytest.MonkeyPatch) -> None:
    assume("\x00" not in value)
    monkeypatch_module.setenv("TMPDIR", value)
    import tempfile

    tempfile.tempdir = None
    try:
        env = Ccache().run_env(resolve_cache(None, kind="ccache", dir="/tmp/kiln-cache"))
    except UsageError as exc:
        assert str(exc).startswith("TMPDIR: ") and "$" in value
        return
    finally:
        tempfile.tempdir = None
    log = env["CCACHE_STATSLOG"]
    assert "$" not in log
    if printable(log) and os.path.isdir(os.path.dirname(log)):
        assert ccache_reads("stats_log", {"CCACHE_STATSLOG": log, "CCACHE_DIR": "/tmp/kiln-k"}) == log


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@SETTINGS
@given(area=st.sampled_from(("ddp", "gpu", "release")).flatmap(lambda b: changed(b, " -or()")))
def test_verify_options_decoded(area: str) -> None:
    """pytest reads -m as a marker expression: only the fixed area names reach it."""
    from torchkiln.commands.verify import AREAS, register

    parser = argparse.ArgumentParser()
    register(parser)
    try:
        args = parser.parse_args(["--area", area])
    except SystemExit:
        assert area not in AREAS
        return
    assert args.area in AREAS or area in AREAS


# --------------------------------------------------------------------------------------------------
# The port of ccache's URL reading, held to real ccache with a real redis-server.
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    from test_cache_redis import start_redis

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    server = start_redis(None, tmp_path_factory.mktemp("redis"))
    yield server.port
    server.process.terminate()
    server.process.wait(timeout=10)


@pytest.mark.integration
@settings(max_examples=examples(30), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    path=st.lists(
        st.sampled_from(("1", "2", "07", ".", "..", "%2e", "%2E%2e", "", "+3", "%33", "%20")), max_size=3
    )
)
@example(path=["%2e%2e"])
@example(path=[""])
@example(path=["07"])  # CI drew it: ccache selects 7; torchkiln asks for /7, the one form
def test_cache_remote_ccache_port_matches_real_ccache(
    path: list[str], redis_port: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """For redis URLs whose path is drawn from what ccache decodes and normalises: the database the port
    reads is the one real ccache selects (its log's ``Redis SELECT N``), and where the port reads no number,
    real ccache fails the compile with its own message; torchkiln refuses exactly the latter and the URLs
    whose reading differs from their text."""
    url = f"redis://127.0.0.1:{redis_port}" + "".join(f"/{segment}" for segment in path)
    work = tmp_path_factory.mktemp("cc")
    (work / "x.c").write_text("int x(void) { return 1; }\n")
    log = work / "ccache.log"
    env = {"PATH": os.environ["PATH"], "HOME": str(work), "CCACHE_DIR": str(work / "cache"),
           "CCACHE_REMOTE_STORAGE": url, "CCACHE_LOGFILE": str(log), "CCACHE_CONFIGPATH": "/dev/null"}  # fmt: skip
    done = subprocess.run([need("ccache"), "gcc", "-c", "x.c", "-o", "x.o"], cwd=work, env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    database = ccache_redis_database(ccache_url(url))
    number = None if database is None else ccache_parse_unsigned(database)
    if database is None or number is not None:
        assert done.returncode == 0, done.stderr
        selected = re.findall(r"Redis SELECT (\d+)", log.read_text())
        assert selected == ([str(number)] if number else []), (url, selected)
    else:
        assert done.returncode != 0, (url, done.stderr)
        assert "invalid unsigned integer" in done.stderr or "db number must be between" in done.stderr
    try:
        resolve_cache(None, kind="ccache", remote=url)
        refused = False
    except (UsageError, TorchkilnError):
        refused = True
    plain = database is None or (  # one form: decimal digits, no leading zero (ccache reads '07' as 7)
        database.isascii() and database.isdigit() and int(database) < 2**32 and str(int(database)) == database
    )
    written = url.split(str(redis_port), 1)[1]
    assert refused == (not plain or written != ccache_url(url).path), (url, database)


def ccache_parse_unsigned(text: str) -> int | None:
    """ccache v4.7.5 src/util/string.cpp ``parse_unsigned`` (base 10, 0..UINT32_MAX for a database):
    whitespace stripped, no '-', ``std::stoull`` (a '+' sign allowed), all of it consumed."""
    stripped = text.strip(" \t\n\r\f\v")
    if stripped.startswith("-") or not re.fullmatch(r"\+?[0-9]+", stripped, re.ASCII):
        return None
    value = int(stripped)
    return value if value <= 2**32 - 1 else None


# --------------------------------------------------------------------------------------------------
# One meaning for every value (issue 45 item 4): URLs through their real consumers. A generated corpus of
# URL spellings (tests/kit/urlkit.py: numeric, hex, octal and short IPv4 hosts, IPv4-mapped IPv6, case, a
# trailing dot, percent-encoding, dot-segments, empty segments, queries, fragments, ports with leading zeros)
# goes to the tool that reads it; what the tool used (the address it connected to, the request it sent, the
# repository it opened, the redis database it wrote) must be what the value says as torchkiln records it,
# or torchkiln refuses the value naming the field and the valid form. And the other way: the consumer's own
# reading, written in its one form, is accepted.
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loopback(tmp_path_factory: pytest.TempPathFactory) -> Iterator[urlkit.Recorder]:
    with urlkit.recorder(tmp_path_factory.mktemp("recorder")) as rec:
        yield rec


SSH = "ssh -F /dev/null -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectTimeout=5"


def refused_naming(said: str, field: str) -> None:
    """A refusal names the field and what would be valid."""
    assert said.startswith(f"r.toml: {field}: ") and "(valid: " in said, said


def authority(url: str) -> tuple[str, str]:
    """(host as written, brackets kept; ':PORT' as written or '') of a URL."""
    netloc = url.split("://", 1)[1].split("/", 1)[0].rpartition("@")[2]
    host, _, port = netloc.rpartition(":") if not netloc.endswith("]") else (netloc, "", "")
    return host, f":{port}" if port else ""


def git_consumes(url: str, rec: urlkit.Recorder, home: Path) -> list[urlkit.Hit]:
    """``git ls-remote URL`` (https through git-remote-https and curl, ssh through real ssh): the
    connections it made to the recorder."""
    rec.clear()
    urlkit.run_tool(
        ["git", "ls-remote", "--", url], str(home), GIT_SSL_CAINFO=str(rec.ca), GIT_SSH_COMMAND=SSH
    )
    return rec.settled()


@st.composite
def one_changed(
    draw: st.DrawFn, **parts: tuple[st.SearchStrategy[str], st.SearchStrategy[str]]
) -> dict[str, str]:
    """Each part in its one form (the first strategy), except at most one drawn from its variants (the
    second): a corpus where the accepted half exercises the consumer as much as the refused half."""
    changed = draw(st.sampled_from((None, *parts)))
    return {name: draw(variants if name == changed else plain) for name, (plain, variants) in parts.items()}


def plain_path(path: str) -> bool:
    """A path written in its one form as docs/values-to-tools.md states it: from '/', no '%', '?' or '#',
    every segment neither empty nor '.' nor '..' (the test's own reading, not torchkiln's)."""
    segments = path.split("/")
    return (
        segments[0] == ""
        and len(path) > 1
        and not set(path) & set("%?#")
        and all(s not in ("", ".", "..") for s in segments[1:])
    )


def one_form(scheme: str, address: str, port: int, path: str) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{port}{path}"


@settings(max_examples=examples(80), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    scheme=st.sampled_from(("https", "http", "git", "ssh")),
    parts=one_changed(
        host=(
            st.sampled_from(("127.0.0.1", "127.0.0.2", "localhost", "127.1.2.3", "[::1]")),
            urlkit.host_spelling(),
        ),
        port=(st.just(""), st.sampled_from(("0", "00"))),
    ),
)
@example(
    scheme="https", parts={"host": "2130706433", "port": ""}
)  # the issue's: git and curl connect to 127.0.0.1
@example(scheme="https", parts={"host": "0x7f.1", "port": ""})
@example(scheme="git", parts={"host": "0177.0.0.1", "port": ""})
@example(scheme="ssh", parts={"host": "127.1", "port": ""})
@example(scheme="https", parts={"host": "[::ffff:127.0.0.2]", "port": ""})
@example(scheme="git", parts={"host": "localhost.", "port": ""})
@example(scheme="https", parts={"host": "127.0.0.1", "port": "0"})
def test_repo_host_means_where_git_connects(
    scheme: str, parts: dict[str, str], loopback: urlkit.Recorder, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """torch.repo's host through real git (https and http through curl, git:// itself, ssh through ssh):
    an accepted URL's host is written as the one address git reached, and its request names the URL's own
    path and host; every other spelling is refused naming the field."""
    url = f"{scheme}://{parts['host']}:{parts['port']}{loopback.port}/p.git"
    if scheme == "ssh":
        need("ssh")
    said = problems(torch__repo=url)
    hits = git_consumes(url, loopback, tmp_path_factory.mktemp("home"))
    event(f"{scheme} {'refused' if said else 'accepted'}")
    reached = {hit.address for hit in hits}
    if said:
        refused_naming(said, "torch.repo")
    else:
        written, _ = authority(url)
        assert reached and reached <= urlkit.reaches(written), (url, reached)
        for hit in hits:
            request = urlkit.http_request(hit) if scheme.startswith("http") else urlkit.git_request(hit)
            if scheme == "ssh":
                continue  # ssh's own protocol: the address is what it says
            assert request is not None, (url, hit.data[:80])
            asked = "/p.git/info/refs?service=git-upload-pack" if scheme.startswith("http") else "/p.git"
            assert request == (asked, f"{written}:{loopback.port}"), (url, request)
    for address in reached:  # the other way: what git reached, written in its one form, is accepted
        assert problems(torch__repo=one_form(scheme, address, loopback.port, "/p.git")) == ""


@settings(max_examples=examples(50), deadline=None, suppress_health_check=list(HealthCheck))
@given(scheme=st.sampled_from(("https", "http")), path=urlkit.path_spelling())
@example(scheme="https", path="/p?x=1")  # the issue's: git asks for /p?x=1/info/refs
@example(scheme="https", path="/p#frag")  # git (curl) asks for /p
@example(scheme="http", path="/a/../p")  # curl removes the dot-segment
@example(scheme="http", path="/a/%2e%2e/p")
@example(scheme="http", path="/p/")
def test_repo_path_means_what_git_asks_for(
    scheme: str, path: str, loopback: urlkit.Recorder, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """torch.repo's path through real git over http(s): an accepted URL's path is the one git asks the
    server for (before its /info/refs), and that path, written as git asked for it, is accepted."""
    url = f"{scheme}://127.0.0.1:{loopback.port}{path}"
    said = problems(torch__repo=url)
    hits = git_consumes(url, loopback, tmp_path_factory.mktemp("home"))
    requests = {urlkit.http_request(hit) for hit in hits} - {None}
    event("refused" if said else "accepted")
    if said:
        refused_naming(said, "torch.repo")
    else:
        assert requests == {(f"{path}/info/refs?service=git-upload-pack", f"127.0.0.1:{loopback.port}")}, url
    for request in requests:
        assert request is not None
        asked = request[0].removesuffix("/info/refs?service=git-upload-pack")
        if asked != request[0] and plain_path(asked):
            assert problems(torch__repo=f"{scheme}://127.0.0.1:{loopback.port}{asked}") == "", asked


# Repositories under one root, each with a branch naming where it is: which one git opened shows.
LOCAL_REPOS = ("r", "a/r", "a", "a/b/r")


@pytest.fixture(scope="module")
def local_repos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repos")
    for relative in LOCAL_REPOS:
        path = root / relative
        path.mkdir(parents=True, exist_ok=True)
        git = ["git", "-C", str(path), "-c", "user.name=k", "-c", "user.email=k@k"]
        subprocess.run(["git", "init", "-q", "-b", "at-" + relative.replace("/", "-"), str(path)], check=True)
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", relative], check=True)
    return root


@settings(max_examples=examples(80), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    form=st.sampled_from(("file://", "", "file://localhost")),
    segments=st.lists(
        st.sampled_from(("r", "a", "b", "r", "a", ".", "..", "", "%2e", "%2E%2e", "%2f", "%61", "%72")),
        min_size=1,
        max_size=4,
    ),  # fmt: skip
)
@example(form="file://", segments=["a", "%2e%2e", "r"])  # the issue's: git opens <root>/r
@example(form="file://", segments=["a", "..", "r"])
@example(form="", segments=["a", "", "r"])
@example(form="file://", segments=["%61", "r"])
def test_repo_local_path_means_the_repository_git_opens(
    form: str, segments: list[str], local_repos: Path
) -> None:
    """torch.repo as a file:// URL or a path through real ``git ls-remote``: an accepted value opens the
    repository at exactly the path it spells (the lock file and provenance record that text), and the
    repository git opened, written as its path, is accepted."""
    path = f"{local_repos}/" + "/".join(segments)
    url = form + path
    said = problems(torch__repo=url)
    done = urlkit.run_tool(["git", "ls-remote", "--", url], str(local_repos))
    opened = re.findall(r"refs/heads/at-(\S+)", done.stdout)
    event("refused" if said else "accepted")
    if said:
        refused_naming(said, "torch.repo")
    else:
        written = path.removeprefix(f"{local_repos}/")
        here = written.replace("/", "-") if written in LOCAL_REPOS else None
        assert opened == ([here] if here else []), (url, opened)
    for name in opened:
        relative = next(r for r in LOCAL_REPOS if r.replace("/", "-") == name)
        assert problems(torch__repo=f"{form if form == 'file://' else ''}{local_repos}/{relative}") == ""


def curl_consumes(url: str, rec: urlkit.Recorder, tmp: Path) -> list[urlkit.Hit]:
    """scripts/install_magma.sh, the devel image's consumer of magma.url, run as the image runs it: its curl
    fetches the URL (the recorder answers 404: the script stops before any build)."""
    rec.clear()
    env = {"KILN_MAGMA_VERSION": "2.6.1", "KILN_MAGMA_URL": url, "KILN_MAGMA_SHA256": "0" * 64,
           "KILN_CUDA_ARCH_LIST": "8.0", "MAGMA_PREFIX": str(tmp / "m"), "CURL_CA_BUNDLE": str(rec.ca)}  # fmt: skip
    done = urlkit.run_tool(["bash", str(ROOT / "scripts" / "install_magma.sh")], str(tmp), **env)
    assert done.returncode != 0 and not (tmp / "m").exists(), done.stderr
    return rec.settled()


@settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    parts=one_changed(
        host=(
            st.sampled_from(("127.0.0.1", "127.0.0.2", "localhost", "127.1.2.3", "[::1]")),
            urlkit.host_spelling(),
        ),
        port=(st.just(""), st.just("0")),
        path=(st.sampled_from(("/m.tar.gz", "/d/m.tar.gz", "/m.tar.gz?raw=1")), urlkit.path_spelling()),
    )
)
@example(parts={"host": "2130706433", "port": "", "path": "/m.tar.gz"})
@example(parts={"host": "127.0.0.1", "port": "", "path": "/m.tar.gz#frag"})  # curl drops the fragment
@example(parts={"host": "127.0.0.1", "port": "", "path": "/d/%2e%2e/m.tar.gz"})
@example(parts={"host": "127.0.0.1", "port": "", "path": "/d/../m.tar.gz"})  # curl asks for /m.tar.gz
@example(parts={"host": "127.0.0.1", "port": "", "path": "/m.tar.gz?raw=1"})
def test_magma_url_means_what_curl_fetches(
    parts: dict[str, str], loopback: urlkit.Recorder, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """magma.url through install_magma.sh's curl (real TLS, the recorder's certificate trusted): an accepted
    URL reaches the address its host is and asks for its own path and query, as written."""
    need("curl")
    path = parts["path"]
    url = f"https://{parts['host']}:{parts['port']}{loopback.port}{path}"
    check = FIELDS["magma.url"].check
    assert check is not None
    said = check(url)
    event("refused" if said else "accepted")
    if said:
        assert said[1] == "an https:// URL of the release tarball", said
        # the other way: where curl (the script's own parser, without its --retry) goes, written in its
        # one form, is accepted
        loopback.clear()
        urlkit.run_tool(
            ["curl", "--globoff", "--silent", "--url", url], "/nonexistent", CURL_CA_BUNDLE=str(loopback.ca)
        )
        for hit in loopback.settled():
            request = urlkit.http_request(hit)
            if request and plain_path(request[0].partition("?")[0]) and "+" not in request[0]:
                assert check(one_form("https", hit.address, loopback.port, request[0])) is None, (
                    url,
                    request,
                )
        return
    hits = curl_consumes(url, loopback, tmp_path_factory.mktemp("magma"))
    written, _ = authority(url)
    assert {hit.address for hit in hits} <= urlkit.reaches(written) and hits, url
    assert {urlkit.http_request(hit) for hit in hits} == {(path, f"{written}:{loopback.port}")}, url


@settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    host=urlkit.host_spelling(),
    port=st.sampled_from(("", "", "0")),
    tail=st.sampled_from(("", "/", "/x", "#f", "?a")),
)
@example(host="2130706433", port="", tail="/")
@example(host="[::ffff:127.0.0.1]", port="", tail="")
def test_scheduler_url_means_where_the_client_connects(
    host: str, port: str, tail: str, loopback: urlkit.Recorder
) -> None:
    """cluster.scheduler_url through torchkiln's scheduler client (urllib, as `torchkiln build` asks for the
    scheduler's status): the URL recorded in the plan and the manifest is the URL written (a '/' added), and
    it names the address the client reached."""
    from torchkiln.distributed.client import SchedulerUnavailable, fetch_status
    from torchkiln.distributed.spec import ClusterSpec, scheduler_url

    url = f"http://{host}:{port}{loopback.port}{tail}"
    try:
        normal = scheduler_url(url)
    except UsageError as exc:
        event("refused")
        assert str(exc).startswith("cluster.scheduler_url: ") and "(valid: " in str(exc), exc
        return
    event("accepted")
    assert normal == url.removesuffix("/") + "/", (url, normal)
    loopback.clear()
    with pytest.raises(SchedulerUnavailable):
        fetch_status(ClusterSpec(normal), timeout=5)
    hits = loopback.settled()
    written, _ = authority(normal)
    assert hits and {hit.address for hit in hits} <= urlkit.reaches(written), (url, hits)
    assert {urlkit.http_request(hit) for hit in hits} == {
        ("/api/v1/scheduler/status", f"{written}:{loopback.port}")
    }


# The cache remote through ccache and sccache against real redis-servers: one at 127.0.0.1 and one at
# 127.0.0.2 on the same port, so the server that holds the keys shows where the tool connected, and the
# database that holds them which database it selected.
REDIS_PATHS = ("/03", "/%33", "/3/", "/./3", "//3", "/3/..", "/+3", "/3#x", "/3?db=5")


@pytest.fixture(scope="module")
def two_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    from test_cache_redis import free_port

    need("redis-server")
    port = free_port()
    servers = []
    for address in urlkit.LOOPBACK[:2]:
        argv = ["redis-server", "--port", str(port), "--bind", address, "--save", "", "--appendonly", "no",
                "--dir", str(tmp_path_factory.mktemp("redis"))]  # fmt: skip
        servers.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for address in urlkit.LOOPBACK[:2]:
        redis_command(address, port, "PING")
    yield port
    for server in servers:
        server.terminate()
        server.wait(timeout=10)


def redis_command(address: str, port: int, *words: str) -> bytes:
    """One command in RESP, its whole reply (waits for the server to listen)."""
    import socket
    import time

    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection((address, port), timeout=5) as sock:
                sock.sendall(
                    b"".join(
                        [f"*{len(words)}\r\n".encode(), *(f"${len(w)}\r\n{w}\r\n".encode() for w in words)]
                    )
                )
                time.sleep(0.02)
                return sock.recv(65536)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def keyspaces(port: int) -> set[tuple[str, int]]:
    """(server address, database) of every database holding a key, on both servers."""
    found = set()
    for address in urlkit.LOOPBACK[:2]:
        for db in re.findall(rb"db(\d+):keys=[1-9]", redis_command(address, port, "INFO", "keyspace")):
            found.add((address, int(db)))
    return found


def cache_consumes(kind: str, env: dict[str, str], tmp: Path) -> subprocess.CompletedProcess[str]:
    """One compile through the real tool with the variables torchkiln hands it (sccache: its own server on a
    port of its own, stopped after)."""
    from test_cache_redis import free_port

    (tmp / "x.c").write_text("int x(void) { return 1; }\n")
    if kind == "ccache":
        run = {"CCACHE_DIR": str(tmp / "cc"), "CCACHE_CONFIGPATH": "/dev/null", **env}
        return urlkit.run_tool(
            [need("ccache"), "gcc", "-c", str(tmp / "x.c"), "-o", str(tmp / "x.o")], str(tmp), **run
        )
    sccache = need("sccache")
    run = {
        "SCCACHE_DIR": str(tmp / "sc"),
        "SCCACHE_SERVER_PORT": str(free_port()),
        "SCCACHE_IDLE_TIMEOUT": "0",
        **env,
    }
    try:
        return urlkit.run_tool(
            [sccache, "gcc", "-c", str(tmp / "x.c"), "-o", str(tmp / "x.o")], str(tmp), **run
        )
    finally:
        urlkit.run_tool([sccache, "--stop-server"], str(tmp), **run)


@pytest.mark.integration
@settings(max_examples=examples(40), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    kind=st.sampled_from(("ccache", "sccache")),
    parts=one_changed(
        host=(
            st.sampled_from(("127.0.0.1", "127.0.0.2", "localhost", "127.1.2.3", "[::1]")),
            urlkit.host_spelling(),
        ),
        port=(st.just(""), st.sampled_from(("0", "00"))),
        path=(st.sampled_from(("", "/0", "/3", "/5")), st.sampled_from(REDIS_PATHS)),
    ),
)
@example(
    kind="sccache", parts={"host": "127.0.0.1", "port": "", "path": "/3#x"}
)  # the issue's: sccache dropped the fragment
@example(kind="ccache", parts={"host": "127.0.0.1", "port": "", "path": "/3#x"})
@example(kind="ccache", parts={"host": "2130706433", "port": "", "path": "/3"})
@example(kind="sccache", parts={"host": "0x7f.2", "port": "", "path": "/3"})
@example(kind="ccache", parts={"host": "127.0.0.1", "port": "", "path": "/%33"})
@example(kind="sccache", parts={"host": "127.0.0.2", "port": "", "path": "/03"})
@example(
    kind="ccache", parts={"host": "[::1]", "port": "", "path": "/3"}
)  # ccache was given redis://::1:PORT/3
def test_cache_remote_means_the_redis_database_the_tool_writes(
    kind: str, parts: dict[str, str], two_redis: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """cache.remote through real ccache and real sccache, each given the variables torchkiln hands it: an
    accepted URL's keys land on the server its host is and in the database its path is, the record (the
    manifest's cache.remote) holds the URL ccache was given, and sccache's endpoint and database are that
    URL's own parts; every other spelling is refused by both kinds alike, naming cache.remote."""
    host, port, path = parts["host"], parts["port"], parts["path"]
    url = f"redis://{host}:{port}{two_redis}{path}"
    said = {k: problems(cache__remote=url, cache__kind=k) for k in ("ccache", "sccache")}
    event(f"{kind} {'refused' if said[kind] else 'accepted'}")
    if said[kind]:
        for text in said.values():
            refused_naming(text, "cache.remote")
        return
    assert said == {"ccache": "", "sccache": ""}, said  # one meaning: both kinds take the same URLs
    config = resolve_cache(None, kind=kind, remote=url, dir="/tmp/kiln-unused")
    record = config.to_dict()["remote"]
    handed = (Ccache() if kind == "ccache" else Sccache()).public_env(config)
    handed = {k: v for k, v in handed.items() if k.startswith(("CCACHE_REMOTE", "SCCACHE_REDIS"))}
    written, _ = authority(url)
    database = int(path[1:] or 0)
    if kind == "ccache":
        assert handed == {"CCACHE_REMOTE_STORAGE": record} and record == url
    else:
        expected = {"SCCACHE_REDIS_ENDPOINT": record.removesuffix(path)}
        assert {k: v for k, v in handed.items() if k != "SCCACHE_REDIS_DB"} == expected, handed
        assert int(handed.get("SCCACHE_REDIS_DB", "0")) == database, handed
    reached = urlkit.reaches(written) & set(urlkit.LOOPBACK[:2])
    if kind == "sccache" and not reached:
        return  # no server there: sccache's server would not start (ccache carries on without the store)
    for address in urlkit.LOOPBACK[:2]:
        redis_command(address, two_redis, "FLUSHALL")
    done = cache_consumes(kind, handed, tmp_path_factory.mktemp(kind))
    assert done.returncode == 0, done.stderr
    assert keyspaces(two_redis) == {(a, database) for a in reached}, (url, keyspaces(two_redis))


@settings(max_examples=examples(300), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    host=st.integers(0, 2**32 - 1).map(lambda n: str(ipaddress.IPv4Address(n))).flatmap(urlkit.ipv4_spelling)
    | st.lists(
        st.sampled_from(
            (
                "0",
                "00",
                "08",
                "0x",
                "0X1f",
                "0xg",
                "1",
                "255",
                "256",
                "4294967295",
                "4294967296",
                "0377",
                "0400",
                "0xff",
                "0x100",
                "-1",
                "+1",
                "1a",
                "",
                " 1",
            )
        ),
        min_size=1,
        max_size=5,
    ).map(".".join)  # fmt: skip
)
@example(host="2130706433")
@example(host="0x7f.1")
@example(host="127.0.0.1.")
@example(host="0x")
def test_inet_aton_port_reads_as_glibc(host: str) -> None:
    """urlreading.inet_aton (what host_problem names as the address a spelling is) against glibc's own
    reading: getaddrinfo with AI_NUMERICHOST, which git, ssh, curl and ccache's hiredis go through."""
    import socket

    try:
        glibc = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)[
            0
        ][4][0]
    except (socket.gaierror, UnicodeError):
        glibc = None
    assert inet_aton(host) == glibc, host
    said = host_problem(host)
    if glibc is not None:  # an address to glibc: accepted only as its decimal dotted quad
        assert (said is None) == (glibc == host), (host, said)
        assert said is None or f"write {glibc}" in said, said
    # the WHATWG URL parser (sccache) takes a host ending in a number as an IPv4 address, glibc maybe not
    if (
        re.fullmatch(r"(?:.*\.)?(?:[0-9]+|0[xX][0-9A-Fa-f]*)\.?", host, re.ASCII | re.DOTALL)
        and glibc != host
    ):
        assert said is not None, host
