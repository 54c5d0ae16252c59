"""README.md's newcomer path: the code blocks marked ``<!-- newcomer: NAME -->``, in order, each with the output
the README quotes right after it. tests/newcomer runs them in a fresh debootstrap root; tests/test_messages.py
checks, in the unit part, that they are there and say what that run relies on."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kit import ROOT

README = ROOT / "README.md"
BLOCKS = (
    "run-deps", "checkout", "setup", "recipe", "check-missing", "build-deps", "check-ok", "torch-wheel", "main-job",
    "unit",
)  # fmt: skip
MARKED = re.compile(r"<!-- newcomer: ([a-z-]+) -->\n```bash\n(.*?)\n```\n", re.DOTALL)
CONSOLE = re.compile(r"\s*```console\n(.*?)\n```", re.DOTALL)


@dataclass(frozen=True)
class Block:
    name: str
    commands: str
    quoted: list[str]  # the output README.md quotes right after the block (a ```console block), if any


def readme_blocks() -> list[Block]:
    text = README.read_text()
    found = []
    for match in MARKED.finditer(text):
        console = CONSOLE.match(text, match.end())
        found.append(Block(match.group(1), match.group(2), console.group(1).splitlines() if console else []))
    assert tuple(b.name for b in found) == BLOCKS, (
        "README.md's newcomer blocks changed: update tests/kit/readmekit.py"
    )
    return found
