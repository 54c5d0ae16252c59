"""Recipes name their platform (build.platform: x86_64 by default, aarch64 for SBSA hosts such as GH200), and a
recipe that mixes up the platforms is refused at `torchkiln recipe check`, naming the field: MKL on aarch64,
NVPL on x86_64, an arch upstream's aarch64 wheels do not build, a CUDA without aarch64 toolkit wheels or
upstream aarch64 wheels. The shipped aarch64 recipe is what upstream's aarch64 2.13.0 wheel reports
(tests/aarch64/ reads that wheel itself; data/compat.toml names it)."""

from __future__ import annotations

import dataclasses
import os
import platform
from pathlib import Path

import pytest
import tomli_w
from kit import ROOT
from kit.imagekit import need_torch

from torchkiln.cli import main
from torchkiln.host import distro
from torchkiln.plan import preflight, preflight_libraries, preflight_machine
from torchkiln.plan.jobs import GIB, Resources
from torchkiln.plan.make import make_plan
from torchkiln.plan.model import Plan
from torchkiln.plan.preflight_findings import Host
from torchkiln.recipe.compat import compat
from torchkiln.recipe.loader import load_recipe
from torchkiln.shipped import tomllib

AARCH64 = ROOT / "recipes" / "torch-2.13-cu130-py312-aarch64.toml"
X86_64 = ROOT / "recipes" / "torch-2.13-cu130-py312.toml"


def _write(tmp_path: Path, base: Path, **changes: object) -> Path:
    """``base`` with ``table__key=value`` changes (None deletes the key or table)."""
    doc = tomllib.loads(base.read_text())
    for dotted, value in changes.items():
        *tables, key = dotted.split("__")
        node = doc
        for t in tables:
            node = node.setdefault(t, {})
        if value is None:
            node.pop(key, None)
        else:
            node[key] = value
    path = tmp_path / "recipe.toml"
    path.write_text(tomli_w.dumps(doc))
    return path


def _refused(path: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["recipe", "check", str(path)]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return [line for line in captured.err.splitlines() if line.startswith(str(path))]


def test_shipped_aarch64_recipe_is_upstreams_aarch64_build() -> None:
    """The fields that differ from x86_64's 2.13 cu130 recipe are exactly the ones upstream's aarch64 wheel
    differs in: platform, NVPL for MKL, no MAGMA, sm_80 ... sm_120 with 11.0 (Thor) and without 7.5/8.6."""
    arm, x86 = load_recipe(AARCH64), load_recipe(X86_64)
    assert arm.build.platform == "aarch64" and x86.build.platform == "x86_64"
    assert arm.blas.kind == "nvpl" and arm.blas.mkl is None and arm.magma is None
    assert arm.accelerator.arch_list == ("8.0", "9.0", "10.0", "11.0", "12.0")
    assert list(arm.accelerator.arch_list) == compat()["cuda"]["13.0"]["aarch64_arch"]
    same = ("cuda", "cudnn", "nccl")  # the aarch64 wheel's Requires-Dist pins are x86_64's
    assert [getattr(arm.accelerator, f) for f in same] == [getattr(x86.accelerator, f) for f in same]
    assert (arm.torch.version, arm.torchvision.version, arm.python) == (
        x86.torch.version,
        x86.torchvision.version,
        x86.python,
    )


def test_platform_defaults_to_x86_64_for_every_other_shipped_recipe() -> None:
    for path in sorted((ROOT / "recipes").glob("*.toml")):
        if "aarch64" not in path.name:
            assert load_recipe(path).build.platform == "x86_64", path.name


@pytest.mark.parametrize(
    ("base", "changes", "field", "words"),
    [
        pytest.param(
            AARCH64,
            {"blas__kind": "mkl", "blas__mkl": "2024.2.0"},
            "blas.kind",
            "'mkl' has no build for aarch64",
            id="mkl-on-aarch64",
        ),
        pytest.param(
            X86_64, {"blas__kind": "nvpl", "blas__mkl": None}, "blas.kind", "'nvpl'", id="nvpl-on-x86"
        ),
        pytest.param(
            AARCH64,
            {"accelerator__arch_list": ["7.5", "8.0", "8.6", "9.0"]},
            "accelerator.arch_list",
            "do not build 7.5, 8.6",
            id="x86-arch-on-aarch64",
        ),
        pytest.param(
            AARCH64,
            {"accelerator__cuda": "12.8", "accelerator__arch_list": ["8.0", "9.0"]},
            "accelerator.cuda",
            "no aarch64 wheel for CUDA 12.8",
            id="cuda-without-aarch64-wheels",
        ),
        pytest.param(
            AARCH64, {"build__platform": "arm64"}, "build.platform", "'arm64'", id="unknown-platform"
        ),
        pytest.param(
            X86_64,
            {"build__platform": "aarch64"},
            "blas.kind",
            "'mkl' has no build for aarch64",
            id="x86-as-arm",
        ),
    ],
)
def test_mixed_up_platform_is_refused_by_field(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    base: Path,
    changes: dict[str, object],
    field: str,
    words: str,
) -> None:
    lines = _refused(_write(tmp_path, base, **changes), capsys)
    assert any(f": {field}: " in line and words in line and "(valid: " in line for line in lines), lines


def test_x86_64_recipe_turned_aarch64_names_every_field_that_does_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Upstream's x86_64 recipe with only build.platform changed: MKL and the x86_64 arch list are both
    reported at once (one pass), the valid values from the aarch64 data."""
    lines = _refused(_write(tmp_path, X86_64, build__platform="aarch64"), capsys)
    fields = sorted(line.split(": ")[1] for line in lines)
    assert fields == ["accelerator.arch_list", "blas.kind"], lines
    assert any("valid: on aarch64: nvpl, openblas" in line for line in lines)
    assert any("7.5, 8.6" in line and "8.0, 9.0, 10.0, 11.0, 12.0" in line for line in lines)


def test_every_cuda_of_the_compat_data_has_an_aarch64_toolkit_wheel_named() -> None:
    """sbsa_nvcc names NVIDIA's aarch64 nvcc wheel of that CUDA; an aarch64 arch list is only given where
    upstream's aarch64 wheels were read, and it names capabilities the CUDA can target."""
    for version, data in compat()["cuda"].items():
        name, _, digest = data["sbsa_nvcc"].partition(" sha256:")
        assert name.endswith(".whl") and "aarch64" in name and f"-{version}." in name, version
        assert len(digest) == 64, version
        for entry in data.get("aarch64_arch", []):
            assert entry in compat()["arch"], (version, entry)


# -- plan and preflight: what differs on aarch64 is data (compat.toml [platform.*]), and no cross-compiling --


def _plan(recipe: Path, tmp_path: Path) -> Plan:
    return make_plan(
        load_recipe(recipe),
        workdir=tmp_path / "w",
        dist=tmp_path / "d",
        resources=Resources(cpus=4, memory_bytes=64 * GIB),
    )


def test_aarch64_plan_sets_upstreams_aarch64_variables_and_x86_64_does_not(tmp_path: Path) -> None:
    arm, x86 = _plan(AARCH64, tmp_path).env_for("torch"), _plan(X86_64, tmp_path).env_for("torch")
    assert arm["BLAS"] == "NVPL" and x86["BLAS"] == "MKL"
    assert arm["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0;10.0;11.0;12.0"
    assert arm["CMAKE_SHARED_LINKER_FLAGS"] == "-Wl,-z,max-page-size=0x10000"
    assert arm["USE_PRIORITIZED_TEXT_FOR_LD"] == "1"
    assert "CMAKE_SHARED_LINKER_FLAGS" not in x86 and "USE_PRIORITIZED_TEXT_FOR_LD" not in x86
    assert "USE_MAGMA" in arm and arm["USE_MAGMA"] == "0"  # the aarch64 recipe has no [magma], as upstream


def test_aarch64_recipe_on_this_x86_64_machine_is_refused_as_cross_compiling(tmp_path: Path) -> None:
    """This machine (platform.machine(), not a stand-in) against the aarch64 recipe: the platform finding
    names build.platform and says why; an x86_64 recipe gets no such finding here."""
    machine = platform.machine()
    if machine != "x86_64":
        pytest.skip(f"this machine is {machine}: the x86_64 case is the next test's")
    here = Host(dict(os.environ))  # its machine: platform.machine()
    [found] = list(preflight_machine._platform(_plan(AARCH64, tmp_path), here))
    assert "this machine is x86_64" in found.found
    assert "build.platform = 'aarch64'" in found.wanted and "does not cross-compile" in found.wanted
    assert not list(preflight_machine._platform(_plan(X86_64, tmp_path), here))
    # and `torchkiln check` runs that check: the whole preflight names it among its findings
    assert "platform" in {f.check for f in preflight.preflight(_plan(AARCH64, tmp_path))}


def test_x86_64_recipe_on_an_aarch64_machine_is_refused_by_name(tmp_path: Path) -> None:
    """The other way round, with the machine given as `uname -m` says it on a GH200 (Host.machine: the
    preflight's one input about the machine); under emulation tests/aarch64/ runs it for real."""
    host = Host(dict(os.environ), machine="aarch64")
    [found] = [f for f in preflight_machine._platform(_plan(X86_64, tmp_path), host)]
    assert "this machine is aarch64" in found.found and "build.platform = 'x86_64'" in found.wanted
    assert "a recipe for aarch64" in found.fix
    assert not list(preflight_machine._platform(_plan(AARCH64, tmp_path), host))


def test_a_toolkit_of_the_other_platform_is_named(tmp_path: Path) -> None:
    """An aarch64 plan whose CUDA_HOME has targets/x86_64-linux (an x86_64 toolkit) is told it needs
    targets/sbsa-linux. The toolkit is a directory tree as NVIDIA's installers lay it out, nvcc a script."""
    home = tmp_path / "cuda"
    (home / "targets" / "x86_64-linux" / "include").mkdir(parents=True)
    (home / "bin").mkdir()
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    nvcc.chmod(0o755)
    plan = _plan(AARCH64, tmp_path)
    steps = [
        dataclasses.replace(s, env={**s.env, "CUDA_HOME": str(home), "CUDACXX": str(nvcc)})
        if s.kind == "compile"
        else s
        for s in plan.steps
    ]
    plan = dataclasses.replace(plan, steps=steps)
    found = [f for f in preflight_libraries._nvcc(plan, Host(dict(os.environ))) if f.check == "nvcc"]
    assert len(found) == 1 and "holds x86_64-linux" in found[0].found
    assert found[0].wanted.endswith("targets/sbsa-linux (build.platform)")
    (home / "targets" / "sbsa-linux").mkdir()
    assert not list(preflight_libraries._nvcc(plan, Host(dict(os.environ))))


def test_nvpl_is_looked_for_where_upstream_installs_it(tmp_path: Path) -> None:
    """No NVPL on this machine: the blas finding names the library, the header and /opt/nvpl."""
    found = [f for f in preflight_libraries._blas(_plan(AARCH64, tmp_path), Host(dict(os.environ)))]
    if Path("/opt/nvpl/include/nvpl_blas.h").is_file():
        pytest.skip("NVPL is installed in /opt/nvpl here")
    assert len(found) == 1 and "libnvpl_blas_lp64_gomp.so" in found[0].found and "/opt/nvpl" in found[0].found


def test_verify_names_build_platform_when_the_installed_torch_runs_on_another_machine() -> None:
    """The installed torch's own facts (this machine's): the aarch64 recipe fails on build.platform, the x86_64
    recipe passes it. Under emulation tests/aarch64/ runs the same check the other way round."""
    from torchkiln.verify import buildconfig  # noqa: PLC0415 - imports torch's facts lazily, as verify does

    need_torch()
    facts = buildconfig.collect_facts()
    arm = buildconfig.recipe_checks(load_recipe(AARCH64), facts)["platform"]
    x86 = buildconfig.recipe_checks(load_recipe(X86_64), facts)["platform"]
    if facts.machine != "x86_64":
        pytest.skip(f"this machine is {facts.machine}")
    assert (arm.status, arm.field, x86.status) == ("fail", "build.platform", "pass")
    assert "expected aarch64, actual x86_64" in arm.message


def test_upstreams_aarch64_build_settings_match_the_aarch64_reference_recipe_not_the_x86_64_one() -> None:
    """torch.__config__.show() of upstream's aarch64 2.13.0 wheel, whole as it printed it under qemu
    (tests/data/torch_config_show/), with what that run reported besides (MKL and MAGMA absent, the machine):
    the aarch64 reference recipe's BLAS, arch list, MAGMA and platform pass; upstream's x86_64 recipe of the
    same release fails each by its field."""
    from torchkiln.verify import buildconfig, facts  # noqa: PLC0415

    shown = ROOT / "tests" / "data" / "torch_config_show" / "2.13.0+cu130-aarch64.txt"
    settings = buildconfig.parse_build_settings(shown.read_text())
    assert settings["BLAS_INFO"] == "nvpl" and settings["LAPACK_INFO"] == "nvpl"
    arm_facts = facts.BuildFacts(
        torch_version="2.13.0+cu130",
        git_version=settings["COMMIT_SHA"],
        settings=settings,
        cuda_version=settings["CUDA_VERSION"],
        mkl_available=False,
        has_magma=False,
        arch_list=facts.gencode_archs(settings["CUDA_FLAGS"]),
        machine="aarch64",
        # not read by the four checks compared here:
        cuda_built=True,
        cudnn_available=False,
        cudnn_compile=(9, 20, 0),
        cudnn_runtime=None,
        cudnn_error=None,
        nccl_available=True,
        nccl_version=(2, 29, 7),
        openmp_available=True,
        cxx11_abi=True,
    )
    reference = ROOT / "tests" / "reference" / "recipes"
    fields = ("blas", "arch_list", "magma", "platform")
    arm = buildconfig.recipe_checks(
        load_recipe(reference / "upstream-2.13.0-cu130-py311-aarch64.toml"), arm_facts
    )
    assert {k: arm[k].status for k in fields} == dict.fromkeys(fields, "pass")
    x86 = buildconfig.recipe_checks(load_recipe(reference / "upstream-2.13.0-cu130-py311.toml"), arm_facts)
    assert {x86[k].field for k in fields if x86[k].status == "fail"} == {
        "blas.kind",
        "accelerator.arch_list",
        "magma",
        "build.platform",
    }


def test_fix_hints_offer_the_devel_image_only_where_images_are_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The aarch64 NVPL recipe wants Python 3.12, which this PATH lacks (and Debian 12 does not package): the
    fix names pyenv and the distribution, not a devel image, which cannot install NVPL (data/compat.toml:
    image_blas); the x86_64 recipe's fix for the same Python offers its devel image, and so does the aarch64
    OpenBLAS recipe's."""
    monkeypatch.setattr(distro, "OS_RELEASE", (ROOT / "tests" / "data" / "os-release" / "debian-12",))
    env = {"PATH": str(tmp_path / "empty")}
    arm = {f.check: f for f in preflight.preflight(_plan(AARCH64, tmp_path), env)}["python"].fix
    x86 = {f.check: f for f in preflight.preflight(_plan(X86_64, tmp_path), env)}["python"].fix
    assert "pyenv install 3.12" in arm and "devel" not in arm, arm
    assert "torchkiln images --recipe torch-2.13-cu130-py312 --target devel" in x86, x86
    arm_openblas = ROOT / "recipes" / "torch-2.13-cu130-py311-aarch64-openblas.toml"
    fixes = {f.check: f for f in preflight.preflight(_plan(arm_openblas, tmp_path), env)}
    assert "--target devel" in fixes["python"].fix, fixes["python"].fix
