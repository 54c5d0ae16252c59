"""Images: build-arg table, tags, bake generation, wheel selection, engine selection and argv, the shell
scripts the images run (MAGMA checksum gate, cache-secret helper). Runs everywhere; the real image builds
are in test_images_build.py."""

from __future__ import annotations

import hashlib
import io
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

from torchkiln import cli
from torchkiln.container import Buildah, BuildRequest, Docker, Storage, select_engine
from torchkiln.errors import RecipeError, TorchkilnError, UsageError
from torchkiln.images import (
    bake_file,
    base_images,
    devel_args,
    find_wheels,
    image_tag,
    runtime_args,
)
from torchkiln.recipe import load_recipe, parse_recipe

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
CPU = RECIPES / "torch-2.13-cpu-py311.toml"
CU130 = RECIPES / "torch-2.14-cu130-py312.toml"
CU126 = RECIPES / "torch-2.14-cu126-py312.toml"
SCRIPTS = ROOT / "scripts"


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


def test_cuda_recipe_builds_on_nvidias_devel_image_and_runs_on_its_runtime_image() -> None:
    recipe = load_recipe(CU130)
    assert base_images(recipe) == (
        "nvidia/cuda:13.0.2-devel-ubuntu24.04",
        "nvidia/cuda:13.0.2-runtime-ubuntu24.04",
    )
    args = devel_args(recipe)
    assert args["KILN_CUDA"] == "13.0"
    assert args["KILN_CUDNN"] == "9.24.0.43"
    assert args["KILN_NCCL"] == "2.30.7"
    assert args["KILN_GCC"] == "13"
    assert args["KILN_CUDA_ARCH_LIST"] == "7.5;8.0;8.6;9.0;10.0;12.0"
    assert args["KILN_MAGMA_VERSION"] == "2.6.1"
    assert args["KILN_MAGMA_SHA256"] == recipe.magma.sha256
    assert args["KILN_MAGMA_URL"].endswith("magma-2.6.1.tar.gz")
    assert base_images(load_recipe(CU126))[0] == "nvidia/cuda:12.6.3-devel-ubuntu24.04"


def test_base_image_override_wins() -> None:
    assert devel_args(load_recipe(CPU), base_image="localhost/base:1")["BASE_IMAGE"] == "localhost/base:1"


def test_python_without_a_base_image_is_a_recipe_error_naming_the_field() -> None:
    recipe = parse_recipe(variant(CU130, 'version = "3.12"', 'version = "3.11"'), "x.toml", Path("x.toml"))
    with pytest.raises(RecipeError) as exc:
        devel_args(recipe)
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
    assert args["BASE_IMAGE"] == "nvidia/cuda:13.0.2-runtime-ubuntu24.04"
    assert args["KILN_TORCH_VERSION"] == "2.14.0+cu130.kiln1"
    assert args["KILN_TORCHVISION_VERSION"] == "0.29.0+cu130.kiln1"
    assert (args["KILN_CUDNN"], args["KILN_NCCL"]) == ("9.24.0.43", "2.30.7")
    assert args["RECIPE_SHA256"] == recipe.sha256


# ---------------------------------------------------------------------------------------------------
# Tags and bake
# ---------------------------------------------------------------------------------------------------


def test_tags() -> None:
    assert (
        image_tag(load_recipe(CU130), "devel", "ghcr.io/acme") == "ghcr.io/acme/torchkiln:2.14.0-cu130-devel"
    )
    assert image_tag(load_recipe(CPU), "runtime") == "localhost/torchkiln:2.13.0-cpu-runtime"
    with pytest.raises(UsageError, match="valid: devel, wheels, runtime"):
        image_tag(load_recipe(CPU), "slim")


def _targets(hcl: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r'^target "([^"]+)" \{\n(.*?)^\}', hcl, re.M | re.S)}


def test_bake_file_has_a_target_per_recipe_and_flavour() -> None:
    recipes = [load_recipe(p) for p in sorted(RECIPES.glob("*.toml"))]
    hcl = bake_file(recipes)
    targets = _targets(hcl)
    assert len(targets) == 3 * len(recipes)
    cu130 = targets["torch-2_14-cu130-py312-devel"]
    assert 'tags       = ["${REGISTRY}/torchkiln:2.14.0-cu130-devel"]' in cu130
    assert '"nvidia/cuda:13.0.2-devel-ubuntu24.04"' in cu130
    runtime = targets["torch-2_14-cu130-py312-runtime"]
    assert (
        '"dist"   = "target:torch-2_14-cu130-py312-wheels"' in runtime and '"recipe" = "recipes"' in runtime
    )
    assert re.search(r'"io\.torchkiln\.recipe" += "torch-2\.14-cu130-py312"', runtime)
    assert "org.opencontainers.image.version" not in runtime  # the runtime Dockerfile sets it from the wheel
    assert 'target     = "runtime"' in runtime and "Dockerfile.runtime" in runtime
    wheels = targets["torch-2_13-cpu-py311-wheels"]
    assert 'secret     = ["id=cache_password,env=TORCHKILN_CACHE_PASSWORD"]' in wheels
    assert 'output     = ["type=local,dest=dist"]' in wheels
    assert hcl.count("{") == hcl.count("}")
    assert re.search(r'group "devel" \{\n  targets = \[(.*)\]', hcl).group(1).count('"') == 2 * len(recipes)


def test_committed_bake_file_is_up_to_date(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(
        [
            "images",
            "--bake",
            "--check",
            "--output",
            str(ROOT / "docker-bake.hcl"),
            "--recipes-dir",
            str(RECIPES),
        ]
    )
    assert rc == 0, capsys.readouterr().err


def test_bake_rejects_two_recipes_with_one_tag(tmp_path: Path) -> None:
    twin = parse_recipe(
        variant(CPU, 'name = "torch-2.13-cpu-py311"', 'name = "twin"'), "twin.toml", Path("twin.toml")
    )
    with pytest.raises(RecipeError, match="image tag 2.13.0-cpu-devel is also"):
        bake_file([load_recipe(CPU), twin])


def test_bake_escapes_hcl_interpolation() -> None:
    recipe = parse_recipe(
        variant(CPU, 'description = "', 'description = "${oops} %{x} \\" '), "e.toml", Path("e.toml")
    )
    hcl = bake_file([recipe])
    assert "${oops}" not in hcl.replace("$${oops}", "")


def test_bake_writes_atomically_and_check_detects_drift(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bake.hcl"
    assert cli.main(["images", "--bake", "--output", str(out), "--recipes-dir", str(RECIPES)]) == 0
    assert cli.main(["images", "--bake", "--check", "--output", str(out), "--recipes-dir", str(RECIPES)]) == 0
    out.write_text(out.read_text().replace("13.0.2", "13.0.1"))
    capsys.readouterr()
    assert cli.main(["images", "--bake", "--check", "--output", str(out), "--recipes-dir", str(RECIPES)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["bake.hcl"]


# ---------------------------------------------------------------------------------------------------
# Wheels in dist/
# ---------------------------------------------------------------------------------------------------


def fake_wheel(dist: Path, project: str, version: str, python: str = "cp311", commit: str = "a" * 40) -> Path:
    path = dist / f"{project}-{version}-{python}-{python}-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{project}/version.py", f"__version__ = '{version}'\ngit_version = '{commit}'\n")
    return path


def test_find_wheels_prefers_the_recipes_exact_version_and_reads_commits(tmp_path: Path) -> None:
    recipe = load_recipe(CPU)
    fake_wheel(tmp_path, "torch", "2.13.0+cpu.kiln1", commit="1" * 40)
    fake_wheel(tmp_path, "torch", "2.13.0+cpu.kiln1", python="cp312")  # other Python: ignored
    fake_wheel(tmp_path, "torch", "2.12.0+cpu.kiln1")  # other release: ignored
    fake_wheel(tmp_path, "torchvision", "0.28.0+cpu.kiln1", commit="2" * 40)
    wheels = find_wheels(tmp_path, recipe)
    assert (wheels.torch.version, wheels.torch.commit) == ("2.13.0+cpu.kiln1", "1" * 40)
    assert (wheels.torchvision.version, wheels.torchvision.commit) == ("0.28.0+cpu.kiln1", "2" * 40)
    args = runtime_args(recipe, wheels)
    assert args["KILN_TORCH_COMMIT"] == "1" * 40 and args["KILN_TORCHVISION_VERSION"] == "0.28.0+cpu.kiln1"


def test_find_wheels_accepts_an_upstream_wheel_of_the_same_release(tmp_path: Path) -> None:
    fake_wheel(tmp_path, "torch", "2.13.0+cpu")
    wheels = find_wheels(tmp_path, load_recipe(CPU))
    assert wheels.torch.version == "2.13.0+cpu" and wheels.torchvision is None


def test_find_wheels_errors(tmp_path: Path) -> None:
    recipe = load_recipe(CPU)
    with pytest.raises(UsageError, match="no such directory"):
        find_wheels(tmp_path / "nope", recipe)
    fake_wheel(tmp_path, "torch", "2.12.0")
    with pytest.raises(UsageError, match=r"no torch 2.13.0 wheel for Python 3.11 \(found: torch-2.12.0-"):
        find_wheels(tmp_path, recipe)
    fake_wheel(tmp_path, "torch", "2.13.0+a")
    fake_wheel(tmp_path, "torch", "2.13.0+b")
    with pytest.raises(UsageError, match="several torch 2.13.0 wheels"):
        find_wheels(tmp_path, recipe)


# ---------------------------------------------------------------------------------------------------
# Engines
# ---------------------------------------------------------------------------------------------------


def request(**overrides: object) -> BuildRequest:
    fields: dict[str, object] = dict(
        dockerfile=Path("/ctx/docker/Dockerfile.devel"),
        context=Path("/ctx"),
        target="devel",
        tags=("localhost/torchkiln:2.13.0-cpu-devel",),
        build_args={"KILN_PYTHON": "3.11", "KILN_GCC": ""},
        named_contexts={"recipe": Path("/recipes")},
        secrets={"cache_password": Path("/tmp/pw")},
    )
    fields.update(overrides)
    return BuildRequest(**fields)  # type: ignore[arg-type]


def test_docker_argv() -> None:
    argv = Docker("docker").build_argv(request())
    assert argv[:3] == ["docker", "buildx", "build"]
    pairs = list(zip(argv, argv[1:], strict=False))
    assert ("--build-arg", "KILN_PYTHON=3.11") in pairs and ("--build-arg", "KILN_GCC=") in pairs
    assert argv[argv.index("--build-context") + 1] == "recipe=/recipes"
    assert argv[argv.index("--secret") + 1] == "id=cache_password,src=/tmp/pw"
    assert argv[-2:] == ["--load", "/ctx"]


def test_buildah_argv_uses_private_storage_and_no_pull() -> None:
    engine = Buildah("buildah", Storage(Path("/s/root"), Path("/s/run"), "vfs"))
    argv = engine.build_argv(request(pull=False))
    assert argv[:8] == [
        "buildah",
        "--root",
        "/s/root",
        "--runroot",
        "/s/run",
        "--storage-driver",
        "vfs",
        "bud",
    ]
    assert argv[argv.index("--isolation") + 1] == "chroot"
    assert argv[argv.index("--format") + 1] == "docker"
    assert "--pull=never" in argv and argv[-1] == "/ctx"
    assert argv[argv.index("--secret") + 1] == "id=cache_password,src=/tmp/pw"


def fake_tool(directory: Path, name: str, rc: int) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\nexit {rc}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_engine_selection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(TorchkilnError, match="no container engine"):
        select_engine()
    assert isinstance(select_engine(for_print=True), Docker)
    fake_tool(tmp_path, "buildah", 0)
    fake_tool(tmp_path, "docker", 1)  # a docker CLI whose engine does not answer
    assert isinstance(select_engine(), Buildah)
    fake_tool(tmp_path, "docker", 0)
    assert isinstance(select_engine(), Docker)
    assert isinstance(select_engine("buildah"), Buildah)
    with pytest.raises(UsageError, match="valid: auto, docker, buildah"):
        select_engine("podman")


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
    assert "--build-arg BASE_IMAGE=nvidia/cuda:13.0.2-devel-ubuntu24.04" in out
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


def test_print_runtime_uses_the_wheel_in_dist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake_wheel(tmp_path, "torch", "2.13.0+cpu", commit="c" * 40)
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
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert (
        "--build-arg KILN_TORCH_VERSION=2.13.0+cpu " in out
        and f"--build-arg KILN_TORCH_COMMIT={'c' * 40}" in out
    )
    assert f"--build-context dist={tmp_path}" in out and "--target runtime" in out
    assert (
        f"--build-context recipe={RECIPES}" in out
        and "--build-arg RECIPE_FILE=torch-2.13-cpu-py311.toml" in out
    )


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


FAKE_MAGMA_CMAKE = """\
cmake_minimum_required(VERSION 3.18)
project(magma C)
if(NOT GPU_TARGET STREQUAL "sm_75 sm_80 sm_120")
  message(FATAL_ERROR "GPU_TARGET is '${GPU_TARGET}'")
endif()
file(WRITE ${CMAKE_BINARY_DIR}/magma.c "int magma_init(void) { return 0; }\\n")
add_library(magma ${CMAKE_BINARY_DIR}/magma.c)
add_library(magma_sparse ${CMAKE_BINARY_DIR}/magma.c)
install(TARGETS magma magma_sparse DESTINATION lib)
install(FILES include/magma.h DESTINATION include)
"""


def magma_tarball(path: Path) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in (
            ("magma-2.6.1/CMakeLists.txt", FAKE_MAGMA_CMAKE),
            ("magma-2.6.1/include/magma.h", "int magma_init(void);\n"),
        ):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return hashlib.sha256(buf.getvalue()).hexdigest()


@pytest.mark.skipif(
    not (shutil.which("cmake") and shutil.which("ninja") and shutil.which("curl")),
    reason="needs cmake, ninja and curl",
)
def test_install_magma_checks_the_sha256_before_building(tmp_path: Path) -> None:
    tarball = tmp_path / "magma-2.6.1.tar.gz"
    digest = magma_tarball(tarball)
    prefix = tmp_path / "magma"
    env = {
        "KILN_MAGMA_VERSION": "2.6.1",
        "KILN_MAGMA_URL": tarball.as_uri(),
        "MAGMA_PREFIX": str(prefix),
        "KILN_CUDA_ARCH_LIST": "7.5;8.0;12.0+PTX",
        "MAGMA_JOBS": "2",
    }
    wrong = run_script("install_magma.sh", {**env, "KILN_MAGMA_SHA256": "0" * 64})
    assert wrong.returncode == 1
    assert f"sha256 mismatch for {tarball.as_uri()}: expected {'0' * 64}, got {digest}" in wrong.stderr
    assert not prefix.exists()
    right = run_script("install_magma.sh", {**env, "KILN_MAGMA_SHA256": digest})
    assert right.returncode == 0, right.stderr
    assert (prefix / "lib" / "libmagma.a").is_file() and (prefix / "include" / "magma.h").is_file()
    assert "for sm_75 sm_80 sm_120" in right.stdout


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


def test_scripts_without_their_version_are_no_ops() -> None:
    for script in ("install_magma.sh", "install_mkl.sh", "install_cuda_libs.sh"):
        done = run_script(script, {})
        assert done.returncode == 0 and "skipping" in done.stdout, script


def _unquote(value: object) -> object:
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    if isinstance(value, dict):
        return {_unquote(k): _unquote(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unquote(v) for v in value]
    return value


def test_bake_file_parses_and_matches_the_dockerfiles() -> None:
    """Every target names a stage its Dockerfile has, passes only ARGs that Dockerfile declares, and
    every runtime target's dist context is a wheels target of the same file."""
    hcl2 = pytest.importorskip("hcl2")
    doc = hcl2.loads((ROOT / "docker-bake.hcl").read_text())
    targets: dict[str, dict] = {}
    for block in doc["target"]:
        for name, body in block.items():
            targets[str(_unquote(name))] = _unquote(body)
    assert len(targets) == 3 * len(list(RECIPES.glob("*.toml")))
    for name, body in targets.items():
        dockerfile = (ROOT / body["dockerfile"]).read_text()
        declared = set(re.findall(r"^ARG (\w+)", dockerfile, re.M))
        assert re.search(rf"^FROM \S+ AS {body['target']}$", dockerfile, re.M), name
        assert set(body["args"]) <= declared, (name, set(body["args"]) - declared)
        if body["target"] == "runtime":
            source = body["contexts"]["dist"].removeprefix("target:")
            assert targets[source]["target"] == "wheels"


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
    }
    assert {a for a in args - own if not a.startswith("KILN_")} == set()
    assert not args & {
        "CUDA_VERSION",
        "NCCL_VERSION",
        "CUDNN_VERSION",
        "PYTHON_VERSION",
        "NV_CUDA_LIB_VERSION",
    }


def nvidia_wheel(directory: Path, project: str, version: str, package: str, files: dict[str, str]) -> None:
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
            zf.writestr(name, text)
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
