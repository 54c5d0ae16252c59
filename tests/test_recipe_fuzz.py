"""Property-based: random and mutated recipe documents either load or are refused with the documented
error (RecipeError, one ``FILE: field: message`` line per problem), never with any other exception."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchkiln.errors import RecipeError
from torchkiln.recipe import FIELDS, Recipe, parse_recipe

ROOT = Path(__file__).resolve().parent.parent
BASES = [tomllib.loads(p.read_text()) for p in sorted((ROOT / "recipes").glob("*.toml"))]
LINE = re.compile(r"^fuzz\.toml: [^:]+: .+")

scalars = st.one_of(
    st.text(max_size=20),
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


def check(doc_text: bytes) -> None:
    try:
        recipe = parse_recipe(doc_text, "fuzz.toml")
    except RecipeError as exc:
        assert exc.problems, "RecipeError without problems"
        for line in str(exc).splitlines():
            assert LINE.match(line), line
    else:
        assert isinstance(recipe, Recipe)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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


@settings(max_examples=400, deadline=None)
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


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes(data: bytes) -> None:
    check(data)
