"""Property-based: random and mutated recipe documents either load or are refused with the documented
error (RecipeError, one ``FILE: field: message`` line per problem), never with any other exception; and a
recipe that loads is one the plan accepts (one resolver: whatever ``recipe check`` accepts, ``plan`` does).

The strategies include what found issue 14's items 1-2: non-ASCII digits, control characters and a
trailing newline in pattern-checked fields, NUL bytes, deep nesting. Together the tests run more than
2,000 documents (the ``max_examples`` below: 600 + 1,000 + 200 + 150 + 300 + 300)."""

from __future__ import annotations

import re
from pathlib import Path

import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kit import ROOT
from kit.imagekit import examples

from torchkiln.errors import RecipeError
from torchkiln.plan.jobs import Resources
from torchkiln.plan.make import make_plan
from torchkiln.recipe.loader import parse_recipe
from torchkiln.recipe.model import Recipe
from torchkiln.recipe.schema import FIELDS
from torchkiln.recipe.validators import PLAIN_RE
from torchkiln.shipped import tomllib

BASES = [tomllib.loads(p.read_text()) for p in sorted((ROOT / "recipes").glob("*.toml"))]
LINE = re.compile(r"^fuzz\.toml: [^:]+: .+")

# Characters that slipped through before: other scripts' digits (\d matched them), control characters,
# NUL, newline, non-ASCII letters.
tricky_chars = st.sampled_from(["\u0661", "\u0969", "\n", "\x00", "\x1b", "\t", "\u00e9", "\u202e", "~"])
tricky = st.builds(
    lambda base, char, at_end: base + char if at_end else char + base,
    st.sampled_from(["2.13.0", "3.11", "13.0", "v2.13.0", "x", "9.20.0.48", "/tmp/c", "redis://h:1"]),
    tricky_chars,
    st.booleans(),
)
scalars = st.one_of(
    st.text(max_size=20),
    tricky,
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.booleans(),
    st.floats(allow_nan=False),
    st.sampled_from(
        [
            "2.13.0",
            "13.0",
            "9.0",
            "12.0+PTX",
            "cpu",
            "cuda",
            "mkl",
            "+cpu.kiln1",
            "3.12",
            "0.28.0",
            "v2.13.0",
            "a" * 40,
            "0" * 64,
            "redis://127.0.0.1:1",
            "USE_FOO",
            "~nosuchuser/c",
            "redis://KilnSecretPw@host:6379",
            "redis://u%3Apw@h",
            "file:/tmp/c",
            "redis+unix:/s",
        ]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(min_size=1, max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)
known_paths = sorted(FIELDS)


RESOURCES = Resources(cpus=8, memory_bytes=64 * 2**30)
STRING_FIELDS = [f.path for f in FIELDS.values() if f.type is str and f.path != "recipe.description"]


def check(doc_text: bytes, tmp: Path = Path("/nonexistent-fuzz")) -> None:
    try:
        recipe = parse_recipe(doc_text, "fuzz.toml")
    except RecipeError as exc:
        assert exc.problems, "RecipeError without problems"
        for line in str(exc).splitlines():
            assert LINE.match(line), line
            assert len(line) < 2000, "a message echoes a whole value"
    else:
        assert isinstance(recipe, Recipe)
        flat = {
            f"{t}.{k}": v for t, c in recipe.document.items() if isinstance(c, dict) for k, v in c.items()
        }
        for path in STRING_FIELDS:
            if isinstance(flat.get(path), str):
                assert PLAIN_RE.fullmatch(flat[path]), (path, flat[path])
        # One resolver: the plan takes every recipe the check accepts.
        make_plan(recipe, workdir=tmp / "w", dist=tmp / "d", resources=RESOURCES)


@settings(max_examples=examples(600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "recipe",
                "torch",
                "torchvision",
                "python",
                "accelerator",
                "blas",
                "magma",
                "build",
                "cache",
                "other",
            ]
        )
        | st.text(min_size=1, max_size=6),
        st.dictionaries(
            st.sampled_from([p.split(".")[1] for p in known_paths]) | st.text(max_size=6), values, max_size=6
        )
        | scalars,
        max_size=10,
    )
)
def test_random_documents(doc: dict) -> None:
    check(tomli_w.dumps(doc).encode())


@settings(max_examples=examples(1000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(range(len(BASES))),
    st.lists(
        st.tuples(
            st.sampled_from(known_paths + ["build.flags.USE_X", "torch.extra"]), st.one_of(st.none(), values)
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_mutated_shipped_recipes(index: int, mutations: list[tuple[str, object]]) -> None:
    doc = tomllib.loads(tomli_w.dumps(BASES[index]))
    for dotted, value in mutations:
        *tables, key = dotted.split(".")
        node = doc
        for table in tables:
            child = node.get(table)
            if not isinstance(child, dict):
                child = node[table] = {}
            node = child
        if value is None:
            node.pop(key, None)
        else:
            node[key] = value
    check(tomli_w.dumps(doc).encode())


@settings(max_examples=examples(200), deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes(data: bytes) -> None:
    check(data)


@settings(max_examples=examples(150), deadline=None)
@given(st.integers(min_value=1, max_value=3000), st.sampled_from(["[", "{a = "]), st.booleans())
def test_deep_nesting(depth: int, opener: str, in_field: bool) -> None:
    closer = "]" if opener == "[" else "}"
    value = opener * depth + "1" + closer * depth
    text = f"[build]\nflags = {{USE_X = {value}}}\n" if in_field else f"x = {value}\n"
    check(text.encode())


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(range(len(BASES))),
    st.sampled_from(STRING_FIELDS),
    st.one_of(tricky, st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=30)),
)
def test_tricky_strings_in_string_fields(index: int, dotted: str, value: str) -> None:
    doc = tomllib.loads(tomli_w.dumps(BASES[index]))
    table, key = dotted.split(".", 1)
    node = doc.setdefault(table, {})
    if "." in key:
        sub, key = key.split(".")
        node = node.setdefault(sub, {})
    node[key] = value
    check(tomli_w.dumps(doc).encode())


cache_remotes = st.one_of(
    st.builds(
        lambda scheme, user, host, path: f"{scheme}{user}{host}{path}",
        st.sampled_from(
            [
                "redis://",
                "rediss://",
                "http://",
                "https://",
                "s3://",
                "gs://",
                "memcached://",
                "webdav+https://",
                "file:",
                "file://",
                "redis+unix:",
                "ftp://",
                "",
            ]
        ),  # fmt: skip
        st.sampled_from(["", "kiln@", "u:p@", "u%3Ap@"]),
        st.sampled_from(["h", "127.0.0.1:6379", "bucket", "", "/tmp/c", "h:99999"]),
        st.sampled_from(["", "/0", "/prefix", "/9999", "?db=1", "?region=x", "?bogus=1"]),
    ),
    st.text(max_size=12),
)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(range(len(BASES))),
    st.sampled_from(["none", "ccache", "sccache"]),
    st.one_of(st.none(), cache_remotes),
    st.sampled_from([None, "/tmp/kiln-cache", "~/c", "relative/c"]),
    st.sampled_from([None, "20G", "500M", "1.5Ti"]),
    st.sampled_from([None, ("credentials_env", "KILN_PW"), ("credentials_file", "/run/secrets/pw")]),
)
def test_check_and_plan_agree_on_generated_cache_settings(
    index: int,
    kind: str,
    remote: str | None,
    directory: str | None,
    max_size: str | None,
    credentials: tuple[str, str] | None,
) -> None:
    """One resolver (issue 11): every cache table the check accepts is one the plan accepts."""
    doc = tomllib.loads(tomli_w.dumps(BASES[index]))
    table: dict[str, object] = {"kind": kind}
    for key, value in (("remote", remote), ("dir", directory), ("max_size", max_size)):
        if value is not None:
            table[key] = value
    if credentials is not None:
        table[credentials[0]] = credentials[1]
    doc["cache"] = table
    check(tomli_w.dumps(doc).encode())
