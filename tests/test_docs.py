"""README.md and docs/ say only what is true now (issue 44, item 5): no unfilled placeholder or template token,
no reference to a file, a test or an anchor that is not there, and every paragraph that states measured facts
about the code names the files those facts depend on with their digest, so that a change to any of them fails
here until the paragraph is read again against the code (``python tests/test_docs.py`` writes the new digests
once it has been)."""

from __future__ import annotations

import ast
import hashlib
import re
import sys
from pathlib import Path

import pytest
from kit import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# What the code is: every text file the project ships or tests with, but the prose itself and this file (which
# names made-up words to prove the check fails on them).
CODE_DIRS = ("src", "tests", "verify", "scripts", "docker", "bench", "recipes", ".ci")
CODE_FILES = ("noxfile.py", "pyproject.toml", "docker-bake.json", ".gitignore", ".dockerignore")
# An ALL_CAPS word with an underscore (an environment variable, a constant, or a placeholder such as
# a minutes figure never filled in) and the tokens of the common template languages left unfilled.
CAPS = re.compile(r"\b[A-Z][A-Z0-9]{2,}(?:_[A-Z0-9]+)+\b")
TEMPLATE = re.compile(
    r"\{\{[^}]*\}\}|\{%[^%]*%\}|<(?:TODO|TBD|FIXME)[^>]*>|\b(?:TODO|TBD|FIXME|XXX)\b|%\([a-z_]+\)s"
)
FACTS = re.compile(r"<!-- facts: (?P<files>[^>]*?) sha256:(?P<digest>[0-9a-f]{12}) -->")
TEST_REF = re.compile(r"(?<![\w/.-])(?P<file>(?:src|tests|verify|bench)/[\w/.-]+\.py)::(?P<name>\w+)")
# Names the prose may use that no code of torchkiln's names: other tools' own, and a user's choice in an example.
OTHERS = {
    "ATEN_STATIC_CUDA": "PyTorch's CMake option (docs/deploy.md)",
    "GNU_PROPERTY_X86_ISA_1_NEEDED": "the ELF property note of x86-64 ISA levels (docs/portability.md)",
    "PYENV_VERSION": "pyenv's variable (docs/gpu-run.md)",
    "TORCHKILN_SIGNING_KEY": "an example of the variable a user names with --sign-key-env",
    "TORCHKILN_CACHE_SECRET": "an example of the variable a recipe's [cache] credentials_env names",
}
LINK = re.compile(r"\]\((?P<target>[^)#\s]+)?(?:#(?P<anchor>[^)\s]+))?\)")


def code_corpus() -> str:
    paths = [ROOT / f for f in CODE_FILES if (ROOT / f).is_file()]
    for folder in CODE_DIRS:
        paths += [
            p
            for p in (ROOT / folder).rglob("*")
            if p.is_file()
            and not any(part == "__pycache__" or part.endswith(".egg-info") for part in p.parts)
        ]
    texts = []
    for path in paths:
        if (
            path.resolve() == Path(__file__).resolve()
            or path.suffix == ".md"
            or path.stat().st_size > 2_000_000
        ):
            continue
        try:
            texts.append(path.read_text())
        except UnicodeDecodeError:
            continue
    return "\n".join(texts)


def placeholders(text: str, corpus: str) -> list[str]:
    """Every ALL_CAPS word of ``text`` that no code names, and every unfilled template token."""
    found = sorted({w for w in CAPS.findall(text) if w not in corpus and w not in OTHERS})
    return found + sorted({m.group(0) for m in TEMPLATE.finditer(text)})


@pytest.fixture(scope="module")
def corpus() -> str:
    return code_corpus()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_no_placeholder_or_template_token(doc: Path, corpus: str) -> None:
    found = placeholders(doc.read_text(), corpus)
    assert not found, f"{doc.relative_to(ROOT)} holds words no code names (unfilled placeholders?): {found}"


def test_the_placeholder_check_fails_on_an_injected_placeholder(corpus: str) -> None:
    """The check above can fail: a made-up word (spelt in pieces, so this file does not name it) is found, and
    so is each kind of template token; the README as it is holds none."""
    made_up = "_".join(("KILN", "SAMPLE", "MINUTES"))
    text = (ROOT / "README.md").read_text()
    injected = text.replace("## The tests", f"took {made_up} minutes {{{{ total }}}} TBD\n\n## The tests", 1)
    assert injected != text
    before = placeholders(text, corpus)
    assert [w for w in placeholders(injected, corpus) if w not in before] == [made_up, "TBD", "{{ total }}"]


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    anchors = set()
    for heading in re.findall(r"(?m)^#+ (.+)$", markdown):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_reference_is_there(doc: Path) -> None:
    """Links to files and their anchors, and ``file.py::name`` of a test, function, class or constant,
    resolve."""
    text = doc.read_text()
    missing = []
    for match in LINK.finditer(text):
        target, anchor = match.group("target"), match.group("anchor")
        if target and re.match(r"[a-z]+:", target):
            continue  # an URL
        path = (doc.parent / target).resolve() if target else doc
        if not path.exists():
            missing.append(f"link {target}")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path.read_text()):
            missing.append(f"anchor {target or ''}#{anchor}")
    for match in TEST_REF.finditer(text):
        try:
            fact_source(match.group(0))
        except (OSError, LookupError):
            missing.append(match.group(0))
    assert not missing, f"{doc.relative_to(ROOT)} refers to what is not there: {missing}"


def fact_source(entry: str) -> bytes:
    """What a facts marker names: a whole file (``path``), or one definition of a Python file
    (``path::name``: a function, a class or a module-level assignment, its source as written)."""
    path, _, name = entry.partition("::")
    text = (ROOT / path).read_text()
    if not name:
        return text.encode()
    for node in ast.parse(text).body:
        targets = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        if getattr(node, "name", None) == name or name in targets:
            return (ast.get_source_segment(text, node) or "").encode()
    raise LookupError(f"{path} defines no {name}")


def facts_digest(entries: list[str]) -> str:
    digest = hashlib.sha256()
    for entry in entries:
        digest.update(entry.encode() + b"\0" + fact_source(entry) + b"\0")
    return digest.hexdigest()[:12]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_measured_facts_were_read_against_the_code_as_it_is(doc: Path) -> None:
    """A paragraph stating measured facts carries ``<!-- facts: FILE... sha256:DIGEST -->``: the files (or one
    definition of a file, ``path::name``) its facts depend on and their digest when it was last read against
    them. A change to any of them fails here, naming the paragraph, until someone reads it again and runs
    ``python tests/test_docs.py`` (which writes the new digests)."""
    stale = []
    for match in FACTS.finditer(doc.read_text()):
        files = match.group("files").split()
        absent = [f for f in files if not (ROOT / f.partition("::")[0]).is_file()]
        if absent:
            stale.append(f"{match.group(0)}: no such file {absent}")
            continue
        try:
            digest = facts_digest(files)
        except LookupError as exc:
            stale.append(f"{match.group(0)}: {exc}")
            continue
        if digest != match.group("digest"):
            line = doc.read_text()[: match.start()].count("\n") + 1
            stale.append(f"line {line}: {' '.join(files)} changed since the facts above were read")
    assert not stale, f"{doc.relative_to(ROOT)}: re-read these paragraphs against the code: {stale}"


def test_docs_that_state_measurements_mark_what_they_depend_on() -> None:
    """The pages of measured facts about what the code does carry at least one facts marker each."""
    for name in ("aarch64.md", "performance.md"):
        assert FACTS.search((ROOT / "docs" / name).read_text()), f"docs/{name} has no facts marker"


def rewrite_digests() -> None:
    """After reading each stale paragraph again: the markers' digests as the files are now."""
    for doc in DOCS:
        text = doc.read_text()
        new = FACTS.sub(
            lambda m: f"<!-- facts: {m.group('files')} sha256:{facts_digest(m.group('files').split())} -->",
            text,
        )
        if new != text:
            doc.write_text(new)
            print(f"rewrote the facts digests of {doc.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    rewrite_digests()
