"""The torchvision watcher on the real torchvision 0.21.0 setup.py (tests/kit/realtrees.py): the lines of
src/torchkiln/data/vision_setup.toml are the ones it prints, and a build whose setup.py drops a part the recipe
asks for stops before compiling, naming torchvision.features.<part>."""

from __future__ import annotations

import io
import os
import shutil
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from kit import ROOT, realtrees
from rich.console import Console

from torchkiln.build.loop import BuildOptions, ConfigureMismatch, run_build
from torchkiln.build.vision_watch import VisionWatcher
from torchkiln.cache import resolve_cache
from torchkiln.plan.make import make_plan
from torchkiln.plan.model import Step
from torchkiln.recipe.loader import load_recipe
from torchkiln.recipe.vision_setup import vision_parts

HERE = ROOT / "tests"
ASK_ALL = {part.env: "1" for part in vision_parts().values()}


def test_every_line_the_watcher_keys_on_is_printed_by_the_real_setup_py(vision_0_21_tree: Path) -> None:
    setup_py = (vision_0_21_tree / "setup.py").read_text()
    for part in vision_parts().values():
        assert f'os.getenv("{part.env}", "1") == "1"' in setup_py, part.env
        for line in part.dropped:
            assert f'"{line}"' in setup_py or f'"{line.split(" Couldn")[0]}"' in setup_py, line


def test_a_part_not_asked_for_is_not_reported() -> None:
    output = [
        "/src/vision/setup.py:302: UserWarning: Building torchvision without PNG support",
        '  warnings.warn("Building torchvision without PNG support")',
        "Building without video decoders extensions. Couldn't find ffmpeg binary.",
        "running bdist_wheel",
    ]
    off = {"TORCHVISION_USE_PNG": "0", "TORCHVISION_USE_FFMPEG": "0", "TORCHVISION_USE_VIDEO_CODEC": "0"}
    asked = VisionWatcher.for_step({**ASK_ALL, **off})
    assert all(asked.feed(line) is None for line in output) and asked.close() is None
    watcher = VisionWatcher.for_step(ASK_ALL)
    verdicts = [v for line in output if (v := watcher.feed(line)) is not None]
    assert [[c.setting for c in v] for v in verdicts] == [
        ["torchvision.features.png", "torchvision.features.ffmpeg", "torchvision.features.video_codec"]
    ], "every dropped part, once, when setuptools starts its commands"


def old_setuptools(tmp_path: Path) -> Path:
    """setuptools 80.9.0 unpacked: torchvision 0.21's setup.py imports pkg_resources (setuptools < 81)."""
    target = tmp_path / "setuptools-80.9.0"
    with zipfile.ZipFile(realtrees.pypi_wheel("setuptools==80.9.0")) as wheel:
        wheel.extractall(target)
    return target


@pytest.mark.integration
def test_setup_py_without_libpng_stops_the_build_before_it_compiles(
    vision_0_21_tree: Path, tmp_path: Path
) -> None:
    """The real setup.py, run as torchvision's compile step with libpng-config off PATH (and no ffmpeg): the
    build stops at setuptools' first command, naming torchvision.features.png and the line setup.py printed."""
    if shutil.which("c++") is None and os.environ.get("CI") != "true":
        pytest.skip(
            "no C++ compiler"
        )  # setup.py's extensions are CppExtensions: torch's cpp_extension wants one
    tree = tmp_path / "vision"
    shutil.copytree(vision_0_21_tree, tree)
    tools = tmp_path / "bin"  # PATH: the compilers, nothing of libpng
    tools.mkdir()
    for tool in ("cc", "c++", "gcc", "g++"):
        if (found := shutil.which(tool)) is not None:
            (tools / tool).symlink_to(found)
    environ = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{tools}"}
    assert shutil.which("libpng-config", path=environ["PATH"]) is None
    recipe = load_recipe(HERE / "data" / "ext-cpu-test.toml")
    plan = make_plan(
        recipe,
        workdir=tmp_path / "work",
        dist=tmp_path / "dist",
        cache=resolve_cache(recipe.cache, kind="none"),
    )
    env = {
        **ASK_ALL,
        "TORCHVISION_USE_NVJPEG": "0",
        "TORCHVISION_USE_VIDEO_CODEC": "0",
        "TORCHVISION_USE_FFMPEG": "0",
    }
    env["PYTHONPATH"] = str(old_setuptools(tmp_path))
    argv = (sys.executable, "setup.py", "bdist_wheel")
    step = Step(
        "torchvision:wheel", "compile", "torchvision", argv, env, str(tree), scratch=(str(tree / "build"),)
    )
    out = io.StringIO()
    options = BuildOptions(console=Console(file=out, width=200), skip_postcheck=True, environ=environ)
    with pytest.raises(ConfigureMismatch) as info:
        run_build(replace(plan, steps=[step]), options)
    message = str(info.value)
    contradictions = [line for line in message.splitlines() if line.startswith("  - ")]
    assert len(contradictions) == 1, (
        message
    )  # jpeg and webp headers are found; nvjpeg and video not asked for
    assert contradictions[0].startswith(
        "  - torchvision.features.png came out false, the recipe asks for true"
    )
    assert "libpng-config on PATH" in message
    assert (
        "setup.py said: '/" in message and "UserWarning: Building torchvision without PNG support" in message
    )
    assert "torchvision's setup.py builds without what the recipe asks for" in message
    assert not list(tree.glob("build/temp*/**/*.o")), "stopped before anything was compiled"
