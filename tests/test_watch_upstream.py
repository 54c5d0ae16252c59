"""Every message data/configure_watch.toml quotes is where it says in upstream's own artifacts: the line of the
2.6.0 release tree (Debian's copy of the release tarball) or of torch 2.13.0's wheel starts a ``message(``
call whose text the row's pattern matches, so a quote cannot drift from what configure really prints."""

from __future__ import annotations

import re
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from kit import realtrees

from torchkiln.shipped import shipped_toml

# "cmake/public/cuda.cmake:218 (2.13: 202): message(..." or "2.13: cmake/public/cuda.cmake:33: message(..."
QUOTE = re.compile(
    r"(?P<only213>2\.13: )?(?P<path>[\w/.]+):(?P<line>\d+)(?: \(2\.13: (?P<line213>\d+)\))?: message\("
)
CMAKE_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
WHEEL_CMAKE = "torch/share/cmake/Caffe2/"  # where the wheel keeps cmake/public/ (as Caffe2/public/)

ROWS = [
    (name, row)
    for name, setting in shipped_toml("configure_watch.toml")["setting"].items()
    for row in setting.get("off", ())
]


def message_at(lines: list[str], number: int) -> str:
    """The text of the ``message(`` call starting at line ``number`` (1-based): its string pieces joined,
    whitespace collapsed, as the watcher reads a message."""
    assert "message(" in lines[number - 1], f"line {number} is {lines[number - 1]!r}, not a message( call"
    call = []
    for line in lines[number - 1 : number + 5]:
        call.append(line)
        if line.rstrip().endswith(")"):
            break
    return " ".join("".join(CMAKE_STRING.findall("\n".join(call))).split())


@pytest.fixture(scope="module")
def wheel_213_files() -> Callable[[str], list[str]]:
    wheel = realtrees.pypi_wheel(realtrees.TORCH_CPU)
    assert "2.13.0" in wheel.name, wheel

    def read(path: str) -> list[str]:
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(WHEEL_CMAKE + path.removeprefix("cmake/")).decode().splitlines()

    return read


@pytest.mark.integration
@pytest.mark.parametrize(
    ("setting", "row"), ROWS, ids=[f"{name}-{row['message'][:24]}" for name, row in ROWS]
)
def test_each_quoted_message_is_what_upstream_prints_there(
    setting: str, row: dict[str, str], pytorch_2_6_tree: Path, wheel_213_files: Callable[[str], list[str]]
) -> None:
    quote = QUOTE.match(row["upstream"])
    assert quote, f"{setting}: upstream = {row['upstream']!r} names no FILE:LINE: message("
    pattern = re.compile(row["message"])
    places = []
    if not quote["only213"]:
        lines = (pytorch_2_6_tree / quote["path"]).read_text().splitlines()
        places.append(("2.6.0", lines, int(quote["line"])))
    line_213 = quote["line"] if quote["only213"] else quote["line213"]
    if line_213:
        places.append(("2.13.0", wheel_213_files(quote["path"]), int(line_213)))
    for release, lines, number in places:
        text = message_at(lines, number)
        assert pattern.search(text), f"{setting}: {release} {quote['path']}:{number} says {text!r}"


def test_a_moved_or_reworded_message_is_caught() -> None:
    """The reader itself: a line that is no message( call, or a message the pattern does not match, fails."""
    lines = ['  message(WARNING "Cannot find cuDNN library.', '    Turning the option off")', "  set(X ON)"]
    assert message_at(lines, 1) == "Cannot find cuDNN library. Turning the option off"
    with pytest.raises(AssertionError, match="not a message"):
        message_at(lines, 3)
