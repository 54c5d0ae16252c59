"""Preflight looks for torchvision's optional parts where torchvision's own setup.py looks (issue 19.3).

setup.py builds without a codec it does not find ("Building torchvision without PNG support"), so preflight
must find exactly what setup.py will find. The verdicts of torchkiln.plan.vision_parts are compared with
upstream's own ``find_libpng`` and ``find_library``, taken whole from the real torchvision 0.21.0 setup.py
(tests/kit/realtrees.py) and run as they are, in the same environment: the host as it is, a PATH without
libpng-config, an old libpng, and (in a bubblewrap sandbox) a system whose include directories are empty,
with the headers in TORCHVISION_INCLUDE or a conda prefix instead. Then the recipe side: torchvision.include_dirs
/ library_dirs reach setup.py as TORCHVISION_INCLUDE / TORCHVISION_LIBRARY, checked as paths.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from kit import ROOT
from kit.imagekit import need_sandbox, require

from torchkiln.cli import main
from torchkiln.plan import preflight, vision_parts
from torchkiln.plan.jobs import GIB, Resources
from torchkiln.plan.make import make_plan
from torchkiln.recipe.loader import load_recipe

CPU = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"
BIG = Resources(cpus=4, memory_bytes=64 * GIB)
HEADERS = {"png": "png.h", "jpeg": "jpeglib.h", "webp": "webp/decode.h"}
# What setup.py's functions need around them (0.21.0 imports parse_version from pkg_resources, whose
# parse_version is packaging's; main imports packaging's directly).
PRELUDE = (
    "import json, os, shutil, subprocess, sys, warnings\n"
    "from pathlib import Path\n"
    "from packaging.version import parse as parse_version\n"
)


def upstream_lookups(tree: Path) -> str:
    """A script running setup.py's own find_libpng() and find_library() (with its TORCHVISION_INCLUDE /
    TORCHVISION_LIBRARY lines), taken whole from ``tree``'s setup.py; it prints their verdicts as JSON."""
    source = (tree / "setup.py").read_text()
    parts = [PRELUDE]
    for node in ast.parse(source).body:
        names = {t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)}
        if names & {"TORCHVISION_INCLUDE", "TORCHVISION_LIBRARY"} or (
            isinstance(node, ast.FunctionDef) and node.name in ("find_libpng", "find_library")
        ):
            parts.append(ast.get_source_segment(source, node) or "")
    assert sum("def find_" in p for p in parts) == 2 and len(parts) == 7, "setup.py changed shape"
    parts.append(
        'print(json.dumps({"png": find_libpng()[0], "jpeg": find_library("jpeglib.h")[0], '
        '"webp": find_library("webp/decode.h")[0]}))'
    )
    return "\n".join(parts)


TORCHKILN_LOOKUPS = """
import json, os, sys
from pathlib import Path
from torchkiln.plan import vision_parts
setup = vision_parts.Setup(dict(os.environ), Path(sys.argv[1]), "3.11")
print(json.dumps({p: vision_parts.missing(p, setup) is None for p in ("png", "jpeg", "webp")}))
"""


def bwrap_empty_includes() -> list[str]:
    """A sandbox in which /usr/include and /usr/local/include are empty (every header gone)."""
    return [need_sandbox(), "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc"] + [
        arg for d in ("/usr/include", "/usr/local/include") for arg in ("--tmpfs", d)
    ]


def verdicts(tree: Path, env: dict[str, str], sandbox: list[str], tmp: Path) -> tuple[dict, dict]:
    """(setup.py's, torchkiln's) verdict per codec: True = found, in the same environment and sandbox."""
    script = tmp / "upstream_lookups.py"
    script.write_text(upstream_lookups(tree))
    out = []
    for argv in ([sys.executable, str(script)], [sys.executable, "-c", TORCHKILN_LOOKUPS, str(tree)]):
        done = subprocess.run(
            [*sandbox, *argv], env=env, capture_output=True, text=True, check=False, cwd=tree
        )
        assert done.returncode == 0, done.stderr[-2000:]
        out.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return out[0], out[1]


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def env() -> dict[str, str]:
    """The caller's PATH and this interpreter's packages; no conda prefix, no TORCHVISION_* of the caller."""
    keep = ("PATH", "HOME", "LANG")
    return {k: os.environ[k] for k in keep if k in os.environ}


def need_codec_headers() -> None:
    have = shutil.which("libpng-config") and all(Path("/usr/include", h).exists() for h in HEADERS.values())
    require(bool(have), "libpng-dev, libjpeg-dev and libwebp-dev are not installed (CI installs them)")


def test_on_this_host_both_find_every_codec(vision_0_21_tree: Path, env: dict, tmp_path: Path) -> None:
    need_codec_headers()
    upstream, ours = verdicts(vision_0_21_tree, env, [], tmp_path)
    assert upstream == ours == {"png": True, "jpeg": True, "webp": True}


def test_without_libpng_config_or_with_an_old_libpng_neither_finds_png(
    vision_0_21_tree: Path, env: dict, tmp_path: Path
) -> None:
    need_codec_headers()
    bare = tmp_path / "bare"
    bare.mkdir()
    upstream, ours = verdicts(vision_0_21_tree, {**env, "PATH": str(bare)}, [], tmp_path)
    assert upstream == ours == {"png": False, "jpeg": True, "webp": True}
    old = tmp_path / "old"
    executable(
        old / "libpng-config",
        'case "$1" in --version) echo 1.5.30;; --I_opts) echo -I/usr/include/libpng16;; esac\n',
    )
    upstream, ours = verdicts(vision_0_21_tree, {**env, "PATH": f"{old}:{env['PATH']}"}, [], tmp_path)
    assert upstream["png"] is ours["png"] is False


def test_headers_found_where_find_library_looks_and_nowhere_else(
    vision_0_21_tree: Path, env: dict, tmp_path: Path
) -> None:
    """With the system's include directories empty: nothing; then the headers in TORCHVISION_INCLUDE (what
    torchvision.include_dirs sets) or under $CONDA_PREFIX/include, both places setup.py searches first."""
    sandbox = bwrap_empty_includes()
    upstream, ours = verdicts(vision_0_21_tree, env, sandbox, tmp_path)
    assert upstream["jpeg"] is ours["jpeg"] is False and upstream["webp"] is ours["webp"] is False
    # png: setup.py trusts libpng-config's --I_opts directory without looking; the compile then fails on
    # png.h. Preflight looks, and says so before anything is built.
    assert upstream["png"] is True and ours["png"] is False
    include = tmp_path / "include"
    for header in ("jpeglib.h", "webp/decode.h"):
        (include / header).parent.mkdir(parents=True, exist_ok=True)
        (include / header).write_text("/* stands in for the header: the lookups test existence */\n")
    upstream, ours = verdicts(
        vision_0_21_tree, {**env, "TORCHVISION_INCLUDE": str(include)}, sandbox, tmp_path
    )
    assert upstream["jpeg"] is ours["jpeg"] is True and upstream["webp"] is ours["webp"] is True
    conda = tmp_path / "conda"
    (conda / "include").mkdir(parents=True)
    shutil.copy(include / "jpeglib.h", conda / "include" / "jpeglib.h")
    upstream, ours = verdicts(vision_0_21_tree, {**env, "CONDA_PREFIX": str(conda)}, sandbox, tmp_path)
    assert (upstream["jpeg"], upstream["webp"]) == (ours["jpeg"], ours["webp"]) == (True, False)


def test_a_missing_png_h_is_named_with_the_directory_libpng_config_gave(tmp_path: Path) -> None:
    inc = tmp_path / "libpng16"
    inc.mkdir()
    tool = executable(
        tmp_path / "bin" / "libpng-config",
        f'case "$1" in --version) echo 1.6.39;; --I_opts) echo -I{inc};; esac\n',
    )
    setup = vision_parts.Setup({"PATH": str(tool.parent)}, tmp_path, "3.11")
    miss = vision_parts.missing("png", setup)
    assert miss is not None and miss.found == f"no png.h in {inc} (from {tool} --I_opts)"
    (inc / "png.h").write_text("/* png */\n")
    assert vision_parts.missing("png", setup) is None


def test_nvjpeg_is_looked_for_under_cuda_home_in_a_cuda_build(tmp_path: Path) -> None:
    """make_image_extension(): nvjpeg.h in $CUDA_HOME/include, for a CUDA build (FORCE_CUDA=1) only."""
    home = tmp_path / "cuda"
    (home / "include").mkdir(parents=True)
    setup = vision_parts.Setup({"PATH": "", "CUDA_HOME": str(home), "FORCE_CUDA": "1"}, tmp_path, "3.11")
    miss = vision_parts.missing("nvjpeg", setup)
    assert miss is not None and miss.found == f"no nvjpeg.h in {home}/include"
    (home / "include" / "nvjpeg.h").write_text("/* nvjpeg */\n")
    assert vision_parts.missing("nvjpeg", setup) is None
    cpu = vision_parts.Setup({"PATH": "", "CUDA_HOME": str(home), "FORCE_CUDA": "0"}, tmp_path, "3.11")
    assert vision_parts.missing("nvjpeg", cpu) is not None


def test_ffmpeg_needs_the_binary_and_every_librarys_headers(tmp_path: Path) -> None:
    """make_video_decoders_extensions(): ffmpeg on PATH, <prefix>/include[/<multiarch>]/<lib>/*.h."""
    prefix = tmp_path / "ffmpeg"
    tool = executable(prefix / "bin" / "ffmpeg", "exit 0\n")
    cc = executable(tmp_path / "cc" / "gcc", "echo x86_64-linux-gnu\n")
    env = {"PATH": f"{tool.parent}:{cc.parent}"}
    libs = ("libavcodec", "libavformat", "libavutil", "libswresample")
    for lib in libs:
        (prefix / "include" / "x86_64-linux-gnu" / lib).mkdir(parents=True)
        (prefix / "include" / "x86_64-linux-gnu" / lib / "version.h").write_text("/* */\n")
    miss = vision_parts.missing("ffmpeg", vision_parts.Setup(env, tmp_path, "3.11"))
    assert miss is not None and miss.found.startswith("no headers of libswscale in ")
    (prefix / "include" / "libswscale").mkdir()
    (prefix / "include" / "libswscale" / "swscale.h").write_text("/* */\n")
    assert vision_parts.missing("ffmpeg", vision_parts.Setup(env, tmp_path, "3.11")) is None
    py39 = vision_parts.missing("ffmpeg", vision_parts.Setup(env, tmp_path, "3.9"))
    assert py39 is not None and py39.found == "Python 3.9"


def vision_recipe(tmp_path: Path, extra: str) -> Path:
    text = CPU.read_text().replace("[torchvision.features]", f"{extra}\n[torchvision.features]", 1)
    path = tmp_path / "recipe.toml"
    path.write_text(text)
    return path


def test_include_and_library_dirs_become_setup_pys_variables_and_must_exist(tmp_path: Path) -> None:
    """TORCHVISION_INCLUDE / TORCHVISION_LIBRARY: removed from the caller's environment with every
    TORCHVISION_* variable, set from the recipe only, in the one environment table."""
    jpeg = tmp_path / "jpeg"
    (jpeg / "include").mkdir(parents=True)
    path = vision_recipe(
        tmp_path, f'include_dirs = ["{jpeg}/include", "/nonexistent/sdk"]\nlibrary_dirs = ["{jpeg}/lib"]\n'
    )
    plan = make_plan(load_recipe(path), workdir=tmp_path / "w", dist=tmp_path / "d", resources=BIG)
    env = plan.env_for("torchvision")
    assert env["TORCHVISION_INCLUDE"] == f"{jpeg}/include:/nonexistent/sdk"
    assert env["TORCHVISION_LIBRARY"] == f"{jpeg}/lib"
    assert "TORCHVISION_INCLUDE" not in plan.env_for("torch")
    bundle = next(s for s in plan.steps if s.name == "torchvision:bundle")
    # the bundling finds what was linked; the wheel it bundles follows `--`
    assert bundle.argv[-4:-2] == ("--library-path", f"{jpeg}/lib") and bundle.argv[-2] == "--"
    found = {(f.check, f.found) for f in preflight.preflight(plan)}
    assert ("torchvision.include_dirs", "no directory /nonexistent/sdk") in found
    assert ("torchvision.library_dirs", f"no directory {jpeg}/lib") in found


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ('["include"]', "not an absolute directory path: 'include'"),
        ('["$HOME/include"]', "not an absolute directory path: '$HOME/include'"),
        ('["/a:/b"]', "not an absolute directory path: '/a:/b'"),
        ('["/opt/my include"]', "not an absolute directory path: '/opt/my include'"),
        ('["/a", "/a"]', "a directory is listed twice"),
        ('"/a"', "wrong type str"),
    ],
)
def test_include_dirs_are_refused_when_not_plain_absolute_paths(
    tmp_path: Path, value: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = vision_recipe(tmp_path, f"include_dirs = {value}\n")
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: torchvision.include_dirs: {words}" in err, err
    assert "Traceback" not in err


def test_check_names_each_missing_part_by_its_field_with_what_provides_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """PATH without libpng-config: `torchkiln check` names torchvision.features.png, what setup.py looks
    for, the package, and the recipe's way out; a recipe without png is not asked about it."""
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("c++", "cc", "gcc", "as", "ld", "git", "ccache"):
        if shutil.which(tool):
            (bare / tool).symlink_to(shutil.which(tool))  # type: ignore[arg-type]
    (bare / "python3.11").symlink_to(Path(getattr(sys, "_base_executable", sys.executable)).resolve())
    monkeypatch.setenv("PATH", str(bare))
    assert main(["check", str(CPU), "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("host: torchvision.features.png:"))
    assert line.startswith(
        "host: torchvision.features.png: found no libpng-config on PATH; needs libpng-config"
    )
    assert "apt-get install libpng-dev" in line and "png = false in [torchvision.features]" in line
    without = vision_recipe(tmp_path, "").read_text().replace("png = true", "png = false")
    (tmp_path / "nopng.toml").write_text(without)
    main(["check", str(tmp_path / "nopng.toml"), "--workdir", str(tmp_path / "w")])
    assert "torchvision.features.png" not in capsys.readouterr().err
