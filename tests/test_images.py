"""Images: build-arg table, tags, the runtime image's versions from the manifest in --dist, the CLI, the shell
scripts the images run (MAGMA checksum gate, cache-secret helper, CUDA toolkit layout, sanity gate). Runs
everywhere; engines are in test_container.py, the bake file in test_bake.py, the real image builds in
test_images_build.py, test_images_podman.py and test_images_cuda.py."""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from kit import ROOT
from kit.dists import manifest_of, source_lock, tiny_wheel
from kit.imagekit import need, require
from kit.realtrees import cuda_toolkit

from torchkiln import cli
from torchkiln.artifacts.manifest import RecipeInfo, WheelRecord, write_manifest
from torchkiln.artifacts.published import read_published
from torchkiln.errors import DocumentError, RecipeError, UsageError
from torchkiln.images.spec import (
    MAGMA_BUILDS,
    PYPI_TOOLKITS,
    base_images,
    devel_args,
    image_tag,
    runtime_args,
    toolkit_source,
)
from torchkiln.recipe.loader import load_recipe, parse_recipe
from torchkiln.recipe.model import Recipe

RECIPES = ROOT / "recipes"
CPU = RECIPES / "torch-2.13-cpu-py311.toml"
CU130 = RECIPES / "torch-2.14-cu130-py312.toml"
CU126 = RECIPES / "torch-2.14-cu126-py312.toml"
REFERENCE = ROOT / "tests" / "reference" / "recipes" / "upstream-2.13.0-cu130-py311.toml"
SCRIPTS = ROOT / "scripts"
MAGMA_SHAPE = ROOT / "tests" / "data" / "magma_shape"


def variant(path: Path, old: str, new: str) -> bytes:
    text = path.read_text()
    assert old in text, old
    return text.replace(old, new, 1).encode()


# ---------------------------------------------------------------------------------------------------
# Build args and base images
# ---------------------------------------------------------------------------------------------------


def test_cpu_recipe_builds_on_debian_with_its_python_and_mkl() -> None:
    args = devel_args(load_recipe(CPU))
    assert args["BASE_IMAGE"] == "debian:bookworm-slim"
    assert args["KILN_PYTHON"] == "3.11"
    assert args["KILN_MKL"] == "2024.2.0"
    assert args["KILN_CUDA"] == args["KILN_CUDNN"] == args["KILN_NCCL"] == ""
    assert args["KILN_MAGMA_VERSION"] == args["KILN_MAGMA_SHA256"] == ""
    assert args["RECIPE_FILE"] == "torch-2.13-cpu-py311.toml"


def test_cuda_recipe_gets_its_toolkit_from_pypi_on_the_plain_distribution_by_default() -> None:
    recipe = load_recipe(CU130)
    assert toolkit_source(recipe) == "pypi"
    assert base_images(recipe) == ("ubuntu:24.04", "ubuntu:24.04")
    args = devel_args(recipe)
    assert args["BASE_IMAGE"] == "ubuntu:24.04" and args["KILN_CUDA_FROM"] == "pypi"
    wheels = args["KILN_CUDA_WHEELS"].split()
    meta = wheels[0]
    assert meta.startswith("cuda-toolkit[") and meta.endswith("]==13.0.3")
    extras = set(meta[len("cuda-toolkit[") : meta.index("]")].split(","))
    # what upstream's torch 2.13.0+cu130 wheel runs on, plus the compiler and what building reads
    runtime = {"cublas", "cudart", "cufft", "cufile", "cupti", "curand", "cusolver", "cusparse"}
    assert runtime | {"nvjitlink", "nvrtc", "nvtx", "nvcc", "crt", "nvvm", "cccl", "nvjpeg"} <= extras
    assert set(wheels[1:]) == {
        "nvidia-nvjitlink==13.0.88",
        "nvidia-cusparselt-cu13==0.8.1",
        "nvidia-nvshmem-cu13==3.4.5",
    }
    assert args["KILN_CUDA"] == "13.0"
    assert args["KILN_CUDNN"] == "9.24.0.43"
    assert args["KILN_NCCL"] == "2.30.7"
    assert args["KILN_GCC"] == "13"
    assert args["KILN_CUDA_ARCH_LIST"] == "7.5;8.0;8.6;9.0;10.0;12.0"
    assert args["KILN_MAGMA_VERSION"] == "2.6.1"
    assert args["KILN_MAGMA_SHA256"] == recipe.magma.sha256
    assert args["KILN_MAGMA_URL"].endswith("magma-2.6.1.tar.gz")
    assert args["KILN_VISION_PACKAGES"] == "libpng-dev libjpeg-dev libwebp-dev"


def test_nvidia_images_are_the_other_toolkit_source() -> None:
    recipe = load_recipe(CU130)
    assert base_images(recipe, "nvidia") == (
        "nvidia/cuda:13.0.2-devel-ubuntu24.04",
        "nvidia/cuda:13.0.2-runtime-ubuntu24.04",
    )
    args = devel_args(recipe, cuda_from="nvidia")
    assert args["KILN_CUDA_FROM"] == "nvidia" and args["KILN_CUDA_WHEELS"] == ""
    # CUDA 12.6 has no PyPI toolkit here: auto picks NVIDIA's images, pypi is an error naming the field
    cu126 = load_recipe(CU126)
    assert toolkit_source(cu126) == "nvidia"
    assert base_images(cu126)[0] == "nvidia/cuda:12.6.3-devel-ubuntu24.04"
    with pytest.raises(
        RecipeError, match=r"accelerator.cuda: no CUDA 12.6 toolkit known on PyPI.*valid: 13.0"
    ):
        devel_args(cu126, cuda_from="pypi")
    with pytest.raises(UsageError, match="valid: auto, pypi, nvidia"):
        toolkit_source(recipe, "conda")
    assert toolkit_source(load_recipe(CPU), "pypi") is None
    assert set(PYPI_TOOLKITS) == {"13.0"}


def test_runtime_base_ignores_the_build_compiler() -> None:
    """Upstream's cu130 wheels were built with gcc 13 (the reference recipe says so); bookworm packages gcc 12
    only. The devel image cannot honour that, the runtime image has no compiler and does not care."""
    reference = load_recipe(REFERENCE)
    assert runtime_args(reference)["BASE_IMAGE"] == "debian:bookworm-slim"
    with pytest.raises(RecipeError, match=r"build.gcc: gcc 13 is not packaged by debian12"):
        devel_args(reference)


def test_vision_dev_packages_follow_the_recipes_features(tmp_path: Path) -> None:
    text = CPU.read_text().replace("png = true", "png = false", 1).replace("webp = true", "webp = false", 1)
    recipe = parse_recipe(text.encode(), "v.toml", Path("v.toml"))
    assert recipe.vision.enabled == ("jpeg",)
    assert devel_args(recipe)["KILN_VISION_PACKAGES"] == "libjpeg-dev"


def test_magma_release_the_images_cannot_build_is_a_recipe_error() -> None:
    recipe = parse_recipe(variant(CU130, 'version = "2.6.1"', 'version = "2.9.0"'), "m.toml", Path("m.toml"))
    with pytest.raises(RecipeError, match=r"m.toml: magma.version: .*MAGMA 2.9.0 \(valid: 2.6.1\)"):
        devel_args(recipe)
    known = subprocess.run(
        [sys.executable, str(SCRIPTS / "magma_edits.py"), "--versions"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert tuple(known.stdout.split()) == MAGMA_BUILDS  # the table and the edits know the same releases


def test_base_image_override_wins() -> None:
    assert devel_args(load_recipe(CPU), base_image="localhost/base:1")["BASE_IMAGE"] == "localhost/base:1"


def test_python_without_a_base_image_is_a_recipe_error_naming_the_field() -> None:
    """NVIDIA builds its images on Ubuntu only: no Python 3.11 base (Debian's) for --cuda-from nvidia."""
    recipe = parse_recipe(variant(CU130, 'version = "3.12"', 'version = "3.11"'), "x.toml", Path("x.toml"))
    with pytest.raises(RecipeError) as exc:
        devel_args(recipe, cuda_from="nvidia")
    message = str(exc.value)
    assert "x.toml: python.version" in message and "3.10, 3.12" in message


def test_gcc_the_base_does_not_package_is_a_recipe_error() -> None:
    recipe = parse_recipe(
        variant(CPU, 'local_version = "+cpu.kiln1"', 'local_version = "+cpu.kiln1"\ngcc = 13'),
        "g.toml",
        Path("g.toml"),
    )
    with pytest.raises(
        RecipeError, match=r"g.toml: build.gcc: gcc 13 is not packaged by debian12.*valid: 12"
    ):
        devel_args(recipe)


def test_cuda_without_an_nvidia_image_is_a_recipe_error() -> None:
    recipe = parse_recipe(variant(CU130, 'cuda = "13.0"', 'cuda = "13.4"'), "c.toml", Path("c.toml"))
    with pytest.raises(
        RecipeError, match=r"c.toml: accelerator.cuda: no NVIDIA CUDA image known for CUDA 13.4"
    ):
        base_images(recipe)


def test_runtime_args_from_the_recipe_carry_the_wheel_versions_and_pins() -> None:
    recipe = load_recipe(CU130)
    args = runtime_args(recipe)
    assert args["BASE_IMAGE"] == "ubuntu:24.04"
    assert runtime_args(recipe, cuda_from="nvidia")["BASE_IMAGE"] == "nvidia/cuda:13.0.2-runtime-ubuntu24.04"
    assert args["KILN_TORCH_VERSION"] == "2.14.0+cu130.kiln1"
    assert args["KILN_TORCHVISION_VERSION"] == "0.29.0+cu130.kiln1"
    assert (args["KILN_CUDNN"], args["KILN_NCCL"]) == ("9.24.0.43", "2.30.7")
    assert args["RECIPE_SHA256"] == recipe.sha256


# ---------------------------------------------------------------------------------------------------
# The runtime image's versions: from the manifest of the build in --dist
# ---------------------------------------------------------------------------------------------------


def published(dist: Path, recipe: Recipe, wheels: dict[str, tuple[str, str | None]]) -> Path:
    """``dist`` as a build of ``recipe`` leaves it: a tiny wheel per project (version, source commit) and the
    manifest listing them."""
    dist.mkdir(exist_ok=True)
    records = [
        WheelRecord.of(tiny_wheel(dist, project, version), project)
        for project, (version, _) in wheels.items()
    ]
    sources = {project: source_lock(project, commit) for project, (_, commit) in wheels.items()}
    manifest = dataclasses.replace(manifest_of(records, sources), recipe=RecipeInfo.of(recipe))
    write_manifest(dist / "manifest.json", manifest)
    return dist


def test_runtime_args_take_versions_commits_and_recipe_from_the_manifest(tmp_path: Path) -> None:
    """The wheels' versions are what the build made (here upstream's +cpu, not the recipe's +cpu.kiln1) and
    the commits what its sources were at: nothing is re-derived from the recipe or read out of the wheels."""
    recipe = load_recipe(CPU)
    dist = published(
        tmp_path, recipe, {"torch": ("2.13.0+cpu", "1" * 40), "torchvision": ("0.28.0+cpu", "2" * 40)}
    )
    args = runtime_args(recipe, read_published(dist))
    assert (args["KILN_TORCH_VERSION"], args["KILN_TORCH_COMMIT"]) == ("2.13.0+cpu", "1" * 40)
    assert (args["KILN_TORCHVISION_VERSION"], args["KILN_TORCHVISION_COMMIT"]) == ("0.28.0+cpu", "2" * 40)
    assert (args["RECIPE_NAME"], args["RECIPE_SHA256"]) == (recipe.name, recipe.sha256)
    assert (
        args["KILN_TORCH_VERSION"] != runtime_args(recipe)["KILN_TORCH_VERSION"]
    )  # the recipe's: +cpu.kiln1
    alone = published(
        tmp_path / "alone", recipe, {"torch": ("2.13.0+cpu", None)}
    )  # no torchvision, no commit
    args = runtime_args(recipe, read_published(alone))
    assert (args["KILN_TORCHVISION_VERSION"], args["KILN_TORCHVISION_COMMIT"], args["KILN_TORCH_COMMIT"]) == (
        "",
        "",
        "",
    )


def test_a_manifest_of_another_recipe_is_refused(tmp_path: Path) -> None:
    dist = published(tmp_path, load_recipe(CU130), {"torch": ("2.14.0+cu130.kiln1", "1" * 40)})
    with pytest.raises(DocumentError) as exc:
        runtime_args(load_recipe(CPU), read_published(dist), manifest_file=str(dist / "manifest.json"))
    assert f"{dist / 'manifest.json'}: recipe: the wheels were built from torch-2.14-cu130-py312" in str(
        exc.value
    )
    assert f"not from {CPU}" in str(exc.value)


def test_read_published_needs_a_manifest_that_lists_exactly_the_wheels_present(tmp_path: Path) -> None:
    recipe = load_recipe(CPU)
    with pytest.raises(UsageError, match="no such directory"):
        read_published(tmp_path / "nope")
    bare = tmp_path / "bare"
    bare.mkdir()
    tiny_wheel(bare, "torch", "2.13.0+cpu")
    with pytest.raises(UsageError) as missing:
        read_published(bare)
    assert f"{bare / 'manifest.json'}: no such file ({bare} holds torch-2.13.0+cpu-py3-none-any.whl)" in str(
        missing.value
    )
    dist = published(tmp_path / "dist", recipe, {"torch": ("2.13.0+cpu", "1" * 40)})
    assert [w.name for w in read_published(dist).wheels] == ["torch-2.13.0+cpu-py3-none-any.whl"]
    extra = tiny_wheel(dist, "torchvision", "0.28.0+cpu")
    with pytest.raises(
        DocumentError, match=r"manifest.json: wheels: does not list torchvision-0\.28\.0\+cpu"
    ):
        read_published(dist)
    extra.unlink()
    listed = dist / "torch-2.13.0+cpu-py3-none-any.whl"
    listed.write_bytes(listed.read_bytes() + b"\0")  # replaced after the build
    with pytest.raises(
        DocumentError,
        match=r"wheels\[0\]\.sha256: torch-2\.13\.0\+cpu-py3-none-any\.whl in .*(another sha256)",
    ):
        read_published(dist)
    listed.unlink()
    with pytest.raises(DocumentError, match=r"wheels\[0\]: torch-2\.13\.0\+cpu-py3-none-any\.whl is not in"):
        read_published(dist)


# ---------------------------------------------------------------------------------------------------
# Tags
# ---------------------------------------------------------------------------------------------------


def test_tags() -> None:
    assert (
        image_tag(load_recipe(CU130), "devel", "ghcr.io/acme") == "ghcr.io/acme/torchkiln:2.14.0-cu130-devel"
    )
    assert image_tag(load_recipe(CPU), "runtime") == "localhost/torchkiln:2.13.0-cpu-runtime"
    with pytest.raises(UsageError, match="valid: devel, wheels, runtime"):
        image_tag(load_recipe(CPU), "slim")


# ---------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------


def test_print_shows_the_exact_buildah_command(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(
        ["images", "--recipe", str(CU130), "--engine", "buildah", "--print", "--registry", "r.io/x"]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert out.startswith("buildah bud ") or out.startswith(shutil.which("buildah") or "buildah")
    assert "--target devel" in out and "--tag r.io/x/torchkiln:2.14.0-cu130-devel" in out
    assert "--build-arg BASE_IMAGE=ubuntu:24.04" in out and "--build-arg KILN_CUDA_FROM=pypi" in out
    assert f"--build-context recipe={RECIPES}" in out
    assert out.rstrip().endswith(str(ROOT))


def test_print_wheels_exports_to_dist_and_passes_the_secret_file_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_bytes(
        variant(
            CPU,
            'max_size = "20G"',
            'max_size = "20G"\nremote = "redis://cache:6379"\ncredentials_env = "CCACHE_PW"',
        )
    )
    secret = tmp_path / "pw"
    secret.write_text("hunter2-secret")
    rc = cli.main(
        [
            "images",
            "--recipe",
            str(recipe),
            "--target",
            "wheels",
            "--engine",
            "docker",
            "--print",
            "--cache-secret",
            str(secret),
            "--dist",
            str(tmp_path / "out"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert f"--secret id=cache_password,src={secret}" in out
    assert f"--output type=local,dest={tmp_path / 'out'}" in out and "--load" not in out
    assert "CACHE_CREDENTIALS_ENV=CCACHE_PW" in out
    assert "hunter2" not in out


def test_print_runtime_takes_its_build_args_from_the_manifest_in_dist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dist = published(tmp_path / "dist", load_recipe(CPU), {"torch": ("2.13.0+cpu", "c" * 40)})
    rc = cli.main(
        [
            "images",
            "--recipe",
            str(CPU),
            "--target",
            "runtime",
            "--engine",
            "docker",
            "--print",
            "--dist",
            str(dist),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert (
        "--build-arg KILN_TORCH_VERSION=2.13.0+cpu " in out
        and f"--build-arg KILN_TORCH_COMMIT={'c' * 40}" in out
    )
    assert f"--build-context dist={dist}" in out and "--target runtime" in out
    assert (
        f"--build-context recipe={RECIPES}" in out
        and "--build-arg RECIPE_FILE=torch-2.13-cpu-py311.toml" in out
    )


def test_runtime_without_a_manifest_or_with_another_recipes_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    tiny_wheel(bare, "torch", "2.13.0+cpu")
    other = published(tmp_path / "other", load_recipe(CU130), {"torch": ("2.14.0+cu130.kiln1", "1" * 40)})
    for dist, message in ((bare, "manifest.json: no such file"), (other, "the wheels were built from")):
        rc = cli.main(["images", "--recipe", str(CPU), "--target", "runtime", "--print", "--dist", str(dist)])
        err = capsys.readouterr().err
        assert rc == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--target", "devel", "--cache-secret", "/etc/hostname"],
            "--cache-secret is only used by --target wheels",
        ),
        (["--target", "devel", "--verify"], "--verify needs --target runtime"),
        (["--target", "runtime", "--dist", "/nonexistent-dist"], "no such directory"),
        (["--target", "wheels", "--cache-secret", "/etc/hostname"], "sets no cache.credentials_env"),
    ],
)
def test_cli_usage_errors_exit_2_with_a_message(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = cli.main(["images", "--recipe", str(CPU), "--engine", "docker", "--print", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err


def test_cli_bad_recipe_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_bytes(variant(CPU, 'version = "3.11"', 'version = "3.9"'))
    assert cli.main(["images", "--recipe", str(bad), "--print"]) == 2
    assert "python.version" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------
# Scripts the images run
# ---------------------------------------------------------------------------------------------------


def fake_tool(directory: Path, name: str, rc: int) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\nexit {rc}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def run_script(name: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPTS / name), *args],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_with_cache_secret_exports_the_secret_under_the_recipes_name(tmp_path: Path) -> None:
    (tmp_path / "cache_password").write_text("s3cr3t-value")
    env = {"CACHE_SECRET_DIR": str(tmp_path), "CACHE_CREDENTIALS_ENV": "CCACHE_PW"}
    done = run_script("with-cache-secret.sh", env, "sh", "-c", 'printf "%s" "$CCACHE_PW"')
    assert done.returncode == 0 and done.stdout == "s3cr3t-value"
    bad = run_script("with-cache-secret.sh", {**env, "CACHE_CREDENTIALS_ENV": "X;rm"}, "true")
    assert bad.returncode == 2 and "not an environment variable name" in bad.stderr
    unnamed = run_script("with-cache-secret.sh", {"CACHE_SECRET_DIR": str(tmp_path)}, "true")
    assert unnamed.returncode == 2 and "no cache.credentials_env" in unnamed.stderr
    (tmp_path / "cache_password").unlink()
    plain = run_script("with-cache-secret.sh", env, "sh", "-c", 'echo "[${CCACHE_PW-unset}]"')
    assert plain.returncode == 0 and plain.stdout == "[unset]\n"


def magma_tarball(path: Path) -> str:
    """tests/data/magma_shape packed as the release tarball is (one magma-2.6.1/ top directory)."""
    with tarfile.open(path, "w:gz") as tar:
        tar.add(MAGMA_SHAPE, arcname="magma-2.6.1")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def magma_env(tmp_path: Path, tarball: Path, digest: str) -> dict[str, str]:
    return {
        "KILN_MAGMA_VERSION": "2.6.1",
        "KILN_MAGMA_URL": tarball.as_uri(),
        "KILN_MAGMA_SHA256": digest,
        "MAGMA_PREFIX": str(tmp_path / "magma"),
        "KILN_CUDA_ARCH_LIST": "7.5;8.0;12.0+PTX",
        "MAGMA_JOBS": "2",
        "MAGMA_PYTHON": sys.executable,
    }


def test_install_magma_checks_the_sha256_before_anything_else(tmp_path: Path) -> None:
    need("curl")
    tarball = tmp_path / "magma-2.6.1.tar.gz"
    digest = magma_tarball(tarball)
    env = magma_env(tmp_path, tarball, "0" * 64)
    wrong = run_script("install_magma.sh", env)
    assert wrong.returncode == 1
    assert f"sha256 mismatch for {tarball.as_uri()}: expected {'0' * 64}, got {digest}" in wrong.stderr
    assert not Path(env["MAGMA_PREFIX"]).exists()


@pytest.mark.slow
def test_install_magma_builds_a_magma_shaped_tree_as_pytorch_builds_magma(tmp_path: Path) -> None:
    """On tests/data/magma_shape (see its README): unedited it cannot build; install_magma.sh edits it,
    compiles it for the explicit -gencode list and installs a static libmagma.a with PyTorch's settings.
    The toolkit: the host's, else CUDA 13.0 from NVIDIA's PyPI wheels (realtrees.cuda_toolkit)."""
    for tool in ("cmake", "ninja", "curl"):
        need(tool)
    toolkit = cuda_toolkit()
    tarball = tmp_path / "magma-2.6.1.tar.gz"
    env = magma_env(tmp_path, tarball, magma_tarball(tarball))
    env["PATH"] = f"{toolkit / 'bin'}{os.pathsep}{os.environ['PATH']}"
    done = run_script("install_magma.sh", env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "MAGMA 2.6.1 for 7.5;8.0;12.0+PTX (4 targets)" in done.stdout
    prefix = Path(env["MAGMA_PREFIX"])
    assert sorted(p.name for p in (prefix / "include").iterdir()) == ["magma.h", "magma_config.h"]
    assert "MAGMA_CUDA_ARCH_MIN 370" in (prefix / "include" / "magma_config.h").read_text()
    check = tmp_path / "check.c"
    check.write_text(
        '#include <stdio.h>\n#include "magma.h"\n'
        "int main(void) { magma_int_t nb, recnb; magma_get_cgetrf_batched_nbparam(64, &nb, &recnb);\n"
        '  printf("%d %d\\n", (int)recnb, (int)magma_zgetrf_batched(8, 800)); return 0; }\n'
    )
    lib = next(toolkit.glob("lib*/libcudart.so")).parent
    # only position-independent objects link into a shared library
    subprocess.run(
        ["gcc", "-shared", "-o", str(tmp_path / "libkm.so"), "-Wl,--whole-archive", str(prefix / "lib" / "libmagma.a"),
         "-Wl,--no-whole-archive", f"-L{lib}", "-lcudart", "-lstdc++"],
        check=True,
    )  # fmt: skip
    subprocess.run(
        ["gcc", f"-I{prefix / 'include'}", f"-I{toolkit / 'include'}", "-o", str(tmp_path / "check"), str(check),
         f"-L{tmp_path}", "-lkm", f"-Wl,-rpath,{tmp_path}:{lib}"],
        check=True,
    )  # fmt: skip
    ran = subprocess.run([str(tmp_path / "check")], capture_output=True, text=True, check=True)
    assert ran.stdout.split() == ["16", "2"]  # PyTorch's recursion block size, the no-shuffle LU kernel


def test_install_magma_needs_an_arch_list(tmp_path: Path) -> None:
    done = run_script(
        "install_magma.sh",
        {
            "KILN_MAGMA_VERSION": "2.6.1",
            "KILN_MAGMA_URL": "file:///x",
            "KILN_MAGMA_SHA256": "0" * 64,
            "MAGMA_PREFIX": str(tmp_path / "m"),
        },
    )
    assert done.returncode == 2 and "KILN_CUDA_ARCH_LIST is empty" in done.stderr


def test_magma_edits_change_what_pytorchs_patches_change(tmp_path: Path) -> None:
    source = tmp_path / "magma"
    shutil.copytree(MAGMA_SHAPE, source)
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "magma_edits.py"), "--version", "2.6.1", str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    cmakelists = (source / "CMakeLists.txt").read_text()
    assert "set(CUDA_SEPARABLE_COMPILATION OFF)" in cmakelists
    assert 'if (GPU_TARGET STREQUAL "All")' in cmakelists and "set( NV_SM ${CUDA_ARCH_LIST} )" in cmakelists
    assert cmakelists.index("GPU_TARGET STREQUAL") < cmakelists.index("\n    if (NOT MIN_ARCH)")
    assert "-DHAVE_CUBLAS -Xfatbin -compress-all -Xcompiler -fPIC -std=c++11 ${NV_SM}" in cmakelists
    sources = (source / "CMake.src.cuda").read_text().splitlines()
    assert sum(line.startswith("#magmablas/") and "_fermi.cu" in line for line in sources) == 8
    assert "magmablas/zgemm_reduce.cu" in sources  # only the Fermi kernels go
    interface = (source / "interface_cuda" / "interface.cpp").read_text()
    assert "#if defined(CUDA_VERSION) && CUDA_VERSION >= 13000" in interface
    assert interface.count("prop.clockRate") == 1  # kept for CUDA < 13
    assert "throw std::exception();" not in (source / "control" / "thread_queue.cpp").read_text().replace(
        "// throw std::exception();", ""
    )
    crossover = (source / "control" / "get_batched_crossover.cpp").read_text()
    assert crossover.count("*recnb = 16;") + crossover.count("*recnb =  16;") == 4
    assert "*recnb = 32;" in crossover  # potrf keeps its own


def test_magma_edits_refuse_a_tree_they_were_not_written_for(tmp_path: Path) -> None:
    """One edit that does not match exactly as often as it should: exit 1 naming file and edit, and no file
    is changed (not even those whose edits matched)."""
    source = tmp_path / "magma"
    shutil.copytree(MAGMA_SHAPE, source)
    listing = source / "CMake.src.cuda"
    listing.write_text(listing.read_text().replace("magmablas/cgemv_fermi.cu\n", ""))
    before = {p: p.read_bytes() for p in source.rglob("*") if p.is_file()}
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "magma_edits.py"), "--version", "2.6.1", str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert "CMake.src.cuda: expected 8 match(es)" in done.stderr and "found 7" in done.stderr
    assert "is this MAGMA 2.6.1?" in done.stderr and "Traceback" not in done.stderr
    assert {p: p.read_bytes() for p in source.rglob("*") if p.is_file()} == before
    unknown = subprocess.run(
        [sys.executable, str(SCRIPTS / "magma_edits.py"), "--version", "2.7.0", str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert unknown.returncode == 1 and "no edits known for MAGMA 2.7.0 (valid: 2.6.1)" in unknown.stderr


def test_gencode_flags_spell_the_arch_list_as_cpp_extension_does() -> None:
    done = subprocess.run(
        ["bash", "-c", f'source {SCRIPTS / "gencode.sh"}; gencode_flags "7.5;9.0a;12.0+PTX"'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == [
        "-gencode=arch=compute_75,code=sm_75",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_120,code=sm_120",
        "-gencode=arch=compute_120,code=compute_120",
    ]
    bad = subprocess.run(
        ["bash", "-c", f'source {SCRIPTS / "gencode.sh"}; gencode_flags "7.5;sm_80"'],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "'sm_80' is not an arch" in bad.stderr


def test_scripts_without_their_version_are_no_ops() -> None:
    for script in ("install_magma.sh", "install_mkl.sh", "install_cuda_libs.sh"):
        done = run_script(script, {})
        assert done.returncode == 0 and "skipping" in done.stdout, script


@pytest.mark.parametrize("dockerfile", ["Dockerfile.devel", "Dockerfile.runtime"])
def test_recipe_build_args_cannot_be_shadowed_by_a_base_images_env(dockerfile: str) -> None:
    """A base image's ENV beats an ARG of the same name in RUN steps (nvidia/cuda sets CUDA_VERSION=13.0.2
    and NCCL_VERSION; python images PYTHON_VERSION): every recipe value travels under a KILN_ name."""
    text = (ROOT / "docker" / dockerfile).read_text()
    args = set(re.findall(r"^ARG (\w+)", text, re.M))
    own = {
        "BASE_IMAGE",
        "RECIPE_FILE",
        "RECIPE_NAME",
        "RECIPE_SHA256",
        "TORCHKILN_VERSION",
        "CACHE_CREDENTIALS_ENV",
        "QEMU_CPU",  # read by qemu-user itself under that name (emulated builds), not a recipe value
    }
    assert {a for a in args - own if not a.startswith("KILN_")} == set()
    assert not args & {
        "CUDA_VERSION",
        "NCCL_VERSION",
        "CUDNN_VERSION",
        "PYTHON_VERSION",
        "NV_CUDA_LIB_VERSION",
    }


def nvidia_wheel(
    directory: Path,
    project: str,
    version: str,
    package: str,
    files: dict[str, str],
    executable: tuple[str, ...] = (),
) -> None:
    """A stand-in for NVIDIA's multi-hundred-MB cuDNN/NCCL wheels: same layout (nvidia/<pkg>/{include,lib})."""
    dist_name = project.replace("-", "_")
    info = f"{dist_name}-{version}.dist-info"
    members = {f"nvidia/{package}/{name}": text for name, text in files.items()}
    members[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n"
    members[f"{info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = "".join(f"{name},,\n" for name in members) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(directory / f"{dist_name}-{version}-py3-none-any.whl", "w") as zf:
        for name, text in members.items():
            entry = zipfile.ZipInfo(name)
            mode = 0o755 if name.removeprefix(f"nvidia/{package}/") in executable else 0o644
            entry.external_attr = (stat.S_IFREG | mode) << 16
            zf.writestr(entry, text)
        zf.writestr(f"{info}/RECORD", record)


def cuda_libs_env(tmp_path: Path, cudnn_header_minor: int) -> dict[str, str]:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    nvidia_wheel(
        wheels,
        "nvidia-cudnn-cu13",
        "9.20.0.48",
        "cudnn",
        {
            "include/cudnn_version.h": f"#define CUDNN_MAJOR 9\n#define CUDNN_MINOR {cudnn_header_minor}\n"
            "#define CUDNN_PATCHLEVEL 0\n",
            "lib/libcudnn.so.9": "elf",
            "lib/libcudnn_ops.so.9": "elf",
        },
    )
    nvidia_wheel(
        wheels,
        "nvidia-nccl-cu13",
        "2.29.7",
        "nccl",
        {
            "include/nccl.h": "#define NCCL_MAJOR 2\n#define NCCL_MINOR 29\n#define NCCL_PATCH 7\n",
            "lib/libnccl.so.2": "elf",
        },
    )
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    fake_tool(cuda / "bin", "nvcc", 0)
    return {
        "KILN_CUDA": "13.0",
        "KILN_CUDNN": "9.20.0.48",
        "KILN_NCCL": "2.29.7",
        "KILN_CUDA_HOME": str(cuda),
        "VIRTUAL_ENV": sys.prefix,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "HOME": str(tmp_path),
    }


def test_install_cuda_libs_puts_the_pinned_cudnn_and_nccl_where_the_build_looks(tmp_path: Path) -> None:
    env = cuda_libs_env(tmp_path, cudnn_header_minor=20)
    done = run_script("install_cuda_libs.sh", env)
    assert done.returncode == 0, done.stderr
    assert "cuDNN 9.20.0, NCCL 2.29.7" in done.stdout
    cuda = Path(env["KILN_CUDA_HOME"])
    assert (cuda / "include" / "cudnn_version.h").is_file() and (cuda / "include" / "nccl.h").is_file()
    for link, target in (
        ("libcudnn.so", "libcudnn.so.9"),
        ("libcudnn_ops.so", "libcudnn_ops.so.9"),
        ("libnccl.so", "libnccl.so.2"),
    ):
        assert os.readlink(cuda / "lib64" / link) == target


def test_install_cuda_libs_fails_when_the_headers_are_not_the_pinned_version(tmp_path: Path) -> None:
    done = run_script("install_cuda_libs.sh", cuda_libs_env(tmp_path, cudnn_header_minor=19))
    assert done.returncode == 1
    assert "cudnn_version.h says 9.19.0, recipe pins 9.20.0.48" in done.stderr


def cuda13_wheels(directory: Path) -> None:
    """Stand-ins for NVIDIA's CUDA 13 wheels, in their layout (nvidia/cu13/{bin,include,lib,nvvm}): an nvcc
    that reports its release, a cuda.h with CUDA_ERROR_STUB_LIBRARY and enough driver API declarations
    (with the _v2 / per-thread renames cuda.h does), versioned libraries only."""
    declarations = "".join(f"CUresult CUDAAPI cuKilnCall{i:03d}(int x);\n" for i in range(320))
    cuda_h = (
        "#define CUDAAPI\ntypedef enum cudaError_enum { CUDA_SUCCESS = 0,\n    CUDA_ERROR_STUB_LIBRARY"
        "                   = 34,\n} CUresult;\n#define cuMemAlloc cuMemAlloc_v2\n"
        "#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM\n#define cuLaunchKernel cuLaunchKernel_ptsz\n#endif\n"
        "CUresult CUDAAPI cuInit(unsigned int Flags);\nCUresult CUDAAPI cuMemAlloc(void **p, unsigned long n);\n"
        "CUresult CUDAAPI cuLaunchKernel(void *f);\n" + declarations
    )
    nvidia_wheel(
        directory,
        "nvidia-cuda-nvcc",
        "13.0.88",
        "cu13",
        {
            "bin/nvcc": "#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n",
            "nvvm/bin/cicc": "",
            "include/cuda.h": cuda_h,
            "include/cudaProfiler.h": "CUresult CUDAAPI cuProfilerStart(void);\n",
            "lib/libcublas.so.13": "elf",
            "lib/libcudart.so.13": "elf",
        },
        executable=("bin/nvcc",),
    )
    nvidia_wheel(
        directory, "nvidia-cusparselt-cu13", "0.8.1", "cusparselt", {"lib/libcusparseLt.so.0": "elf"}
    )


def test_install_cuda_toolkit_lays_the_wheels_out_as_an_installed_toolkit(tmp_path: Path) -> None:
    require(
        shutil.which("gcc") is not None,
        "gcc is not installed: install_cuda_toolkit.sh compiles the libcuda stub",
    )
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    cuda13_wheels(wheels)
    prefix = tmp_path / "cuda-13.0"
    env = {
        "KILN_CUDA_FROM": "pypi",
        "KILN_CUDA": "13.0",
        "KILN_TOOLKIT_TARGET": "x86_64-linux",
        "KILN_CUDA_WHEELS": "nvidia-cuda-nvcc==13.0.88 nvidia-cusparselt-cu13==0.8.1",
        "CUDA_PREFIX": str(prefix),
        "VIRTUAL_ENV": sys.prefix,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "HOME": str(tmp_path),
    }
    done = run_script("install_cuda_toolkit.sh", env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "CUDA 13.0 (cu13 wheels, 325 driver API stubs)" in done.stdout
    assert os.readlink(prefix / "lib64") == "lib"
    assert os.readlink(prefix / "targets" / "x86_64-linux" / "include") == "../../include"
    assert (prefix / "targets" / "x86_64-linux" / "lib" / "libcudart.so.13").is_file()
    for link, target in (("libcublas.so", "libcublas.so.13"), ("libcusparseLt.so", "libcusparseLt.so.0")):
        assert os.readlink(prefix / "lib" / link) == target
    assert (prefix / "nvvm" / "bin" / "cicc").is_file()
    assert sorted(p.name for p in (prefix / "dist-info").iterdir()) == [
        "nvidia_cuda_nvcc-13.0.88.dist-info",
        "nvidia_cusparselt_cu13-0.8.1.dist-info",
    ]
    stub = prefix / "lib" / "stubs" / "libcuda.so"
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(stub)], capture_output=True, text=True, check=True
    )
    names = {line.split()[-1] for line in symbols.stdout.splitlines()}
    # the names code compiled against this cuda.h references, plain and per-thread-stream
    assert {"cuInit", "cuMemAlloc_v2", "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuProfilerStart"} <= names
    assert "cuMemAlloc" not in names
    cuda = ctypes.CDLL(str(stub))
    assert cuda.cuInit(0) == 34  # CUDA_ERROR_STUB_LIBRARY, read from cuda.h
    soname = subprocess.run(["readelf", "-d", str(stub)], capture_output=True, text=True, check=True).stdout
    assert "Library soname: [libcuda.so.1]" in soname


def test_install_cuda_toolkit_refuses_wheels_of_another_release(tmp_path: Path) -> None:
    require(
        shutil.which("gcc") is not None,
        "gcc is not installed: install_cuda_toolkit.sh compiles the libcuda stub",
    )
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    cuda13_wheels(wheels)
    env = {
        "KILN_CUDA_FROM": "pypi",
        "KILN_CUDA": "13.2",
        "KILN_TOOLKIT_TARGET": "x86_64-linux",
        "KILN_CUDA_WHEELS": "nvidia-cuda-nvcc==13.0.88",
        "CUDA_PREFIX": str(tmp_path / "cuda-13.2"),
        "VIRTUAL_ENV": sys.prefix,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "HOME": str(tmp_path),
    }
    done = run_script("install_cuda_toolkit.sh", env)
    assert done.returncode == 1
    assert "nvcc from the wheels is CUDA 13.0, the recipe asks for 13.2" in done.stderr
    skipped = run_script("install_cuda_toolkit.sh", {**env, "KILN_CUDA_FROM": "nvidia"})
    assert skipped.returncode == 0 and "not pypi; skipping" in skipped.stdout


def test_pip_config_is_passed_as_a_secret_file_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nindex-url = https://kiln:s3cr3t-index@mirror.example/simple\n")
    dist = published(tmp_path / "dist", load_recipe(CPU), {"torch": ("2.13.0+cpu", "1" * 40)})
    for target in ("devel", "runtime"):
        extra = ["--dist", str(dist)] if target == "runtime" else []
        rc = cli.main(
            [
                "images",
                "--recipe",
                str(CPU),
                "--target",
                target,
                "--engine",
                "buildah",
                "--print",
                "--pip-config",
                str(config),
                *extra,
            ]
        )
        out = capsys.readouterr().out
        assert rc == 0 and f"--secret id=pip_config,src={config}" in out and "s3cr3t" not in out
    for name in ("Dockerfile.devel", "Dockerfile.runtime"):  # every step that runs pip mounts it
        text = (ROOT / "docker" / name).read_text()
        steps = [
            step
            for step in text.split("\nRUN ")[1:]
            if re.search(r"install_(mkl|wheels)|pip install|torchkiln build", step)
        ]
        assert steps and all(
            "--mount=type=secret,id=pip_config,target=/etc/pip.conf" in step for step in steps
        ), name
    assert cli.main(["images", "--recipe", str(CPU), "--print", "--pip-config", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "--pip-config" in err and "no such file" in err and "Traceback" not in err


def test_sanity_gate_compares_the_build_args_with_the_manifest_of_the_wheels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bake file's runtime targets name versions from the recipe; the image's sanity gate
    (scripts/image_sanity.py) holds them against the manifest the wheels stage exported beside the wheels."""
    spec = importlib.util.spec_from_file_location("image_sanity", SCRIPTS / "image_sanity.py")
    assert spec is not None and spec.loader is not None
    sanity = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sanity)
    dist = published(tmp_path / "dist", load_recipe(CPU), {"torch": ("2.13.0+cpu.kiln1", "1" * 40)})
    manifest = dist / "manifest.json"
    monkeypatch.setenv("KILN_TORCH_VERSION", "2.13.0+cpu.kiln1")
    monkeypatch.setenv("KILN_TORCH_COMMIT", "1" * 40)
    monkeypatch.delenv("KILN_TORCHVISION_VERSION", raising=False)
    assert sanity.manifest_problems(manifest) == []
    assert (
        sanity.manifest_problems(tmp_path / "absent.json") == []
    )  # an image without one: nothing to compare
    monkeypatch.setenv("KILN_TORCH_VERSION", "2.13.0+cpu.kiln2")
    monkeypatch.setenv("KILN_TORCH_COMMIT", "2" * 40)
    monkeypatch.setenv("KILN_TORCHVISION_VERSION", "0.28.0+cpu.kiln2")
    assert sanity.manifest_problems(manifest) == [
        "the build args name torch 2.13.0+cpu.kiln2, the manifest lists 2.13.0+cpu.kiln1",
        f"the build args name torch commit {'2' * 40}, the manifest records {'1' * 40}",
        "the build args name torchvision 0.28.0+cpu.kiln2, the manifest lists None",
    ]


def test_print_wheels_passes_the_cluster_token_as_a_secret_the_recipe_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def recipe_with(table: str) -> Path:
        path = tmp_path / "cluster.toml"
        path.write_bytes(variant(CPU, 'kind = "ccache"', 'kind = "sccache"') + table.encode())
        return path

    token = tmp_path / "token"
    token.write_text("kiln-cluster-token-77")
    good = recipe_with(
        '\n[cluster]\nscheduler_url = "http://10.0.0.1:10600"\ncredentials_file = "/run/secrets/dist_token"\n'
    )
    argv = ["images", "--target", "wheels", "--engine", "docker", "--print", "--dist", str(tmp_path / "out")]
    assert cli.main([*argv, "--recipe", str(good), "--cluster-secret", str(token)]) == 0
    out = capsys.readouterr().out
    assert f"--secret id=dist_token,src={token}" in out and "kiln-cluster-token-77" not in out
    # The image build can read the token only from the secret: a recipe reading it elsewhere, or no
    # secret, would fail inside the build; a secret without [cluster] is a mistake.
    assert cli.main([*argv, "--recipe", str(good)]) == 2
    assert "needs the client token: --cluster-secret FILE" in capsys.readouterr().err
    elsewhere = recipe_with('\n[cluster]\nscheduler_url = "http://10.0.0.1:10600"\ncredentials_env = "TOK"\n')
    assert cli.main([*argv, "--recipe", str(elsewhere), "--cluster-secret", str(token)]) == 2
    assert "cluster.credentials_file: the image build reads the client token only from its secret mount" in (
        capsys.readouterr().err
    )
    assert cli.main([*argv, "--recipe", str(CPU), "--cluster-secret", str(token)]) == 2
    assert "--cluster-secret given but the recipe has no [cluster] section" in capsys.readouterr().err


def test_a_named_engine_that_cannot_build_is_refused_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 11: `--engine docker` without buildx said only `unknown flag: --file`."""
    docker = tmp_path / "docker"
    docker.write_text(
        '#!/bin/sh\ncase "$1" in buildx) echo "unknown command: buildx" >&2; exit 1;; esac\nexit 0\n'
    )
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert cli.main(["images", "--recipe", str(CPU), "--engine", "docker"]) == 1
    err = capsys.readouterr().err
    assert "--engine docker: " in err and "cannot build here" in err and "buildx" in err
