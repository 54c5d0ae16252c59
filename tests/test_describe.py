"""``torchkiln recipe describe``: the recipe it writes from an installation's facts is one ``verify --recipe``
passes on. Generated installations (hypothesis: releases, CUDA or CPU, cuDNN/NCCL compiled and shipped,
arch lists with PTX, local labels, build numbers, BLAS, torchvision's parts) each round-trip: facts ->
describe -> the loader -> every recipe and torchvision check passes. Upstream's real wheels: tests/reference
(the committed recipes are describe's output, byte for byte) and ``nox -s releases``.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kit.imagekit import examples

from torchkiln.commands import describe
from torchkiln.errors import UsageError
from torchkiln.recipe.compat import compat
from torchkiln.recipe.loader import parse_recipe
from torchkiln.verify import buildconfig
from torchkiln.verify.comparison import Comparison
from torchkiln.verify.facts import BuildFacts, TorchvisionFacts

PARTS = {"png": True, "jpeg": True, "webp": True, "nvjpeg": True, "ffmpeg": False, "video_codec": False}


def facts(**changes: object) -> BuildFacts:
    """What upstream's 2.8.0+cu128 pair reports (read off it: compiled against cuDNN 9.8.0, shipping
    nvidia-cudnn-cu12 9.10.2.21)."""
    base = BuildFacts(
        torch_version="2.8.0+cu128",
        git_version="a1cb3cc05d46d198467bebbb6e8fba50a325d4e7",
        settings={
            "BLAS_INFO": "mkl", "BUILD_TYPE": "Release", "COMMIT_SHA": "a1cb3cc05d46d198467bebbb6e8fba50a325d4e7",
            "CUDA_VERSION": "12.8", "CUDNN_VERSION": "9.8.0", "TORCH_VERSION": "2.8.0", "USE_CUDA": "ON",
            "USE_CUDNN": "ON", "USE_NCCL": "1", "USE_MKLDNN": "ON", "USE_CUSPARSELT": "1", "USE_GLOO": "ON",
            "USE_MPI": "OFF", "USE_ROCM": "OFF", "USE_EXCEPTION_PTR": "1",
        },
        cuda_version="12.8", cuda_built=True, cudnn_available=True, cudnn_compile=(9, 8, 0),
        cudnn_runtime=(9, 10, 2), cudnn_error=None, nccl_available=True, nccl_version=(2, 27, 3),
        nccl_runtime=(2, 27, 3), mkl_available=True, openmp_available=True, has_magma=True,
        arch_list=("sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"), cxx11_abi=True,
        python_version="3.11", machine="x86_64", compiler="GCC 13.3", mkl_version="2024.2",
        nvidia_dists={"nvidia-cudnn-cu12": "9.10.2.21", "nvidia-nccl-cu12": "2.27.3"}, distributed=True,
        torchvision=TorchvisionFacts(
            version="0.23.0+cu128", git_version="824e8c8726b65fd9d5abdc9702f81c2b0c4c0dc8", cuda="12.8",
            cuda_raw=12080, has_ops=True, extensions=("_C", "image"), parts=PARTS,
        ),
    )  # fmt: skip
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def round_trip(found: BuildFacts) -> dict[str, Comparison]:
    text = describe.describe(found, name=describe.default_name(found))
    recipe = parse_recipe(text.encode(), "<described>")  # RecipeError: describe wrote no recipe
    checks = buildconfig.postbuild_checks(recipe, found, ("torch", "torchvision"))
    failed = {k: c.message for k, c in checks.items() if c.status == "fail"}
    assert not failed, (failed, text)
    return checks


def test_upstreams_2_8_0_says_compiled_and_shipped_cudnn() -> None:
    text = describe.describe(facts(), name="upstream-2.8.0-cu128-py311")
    assert 'cudnn = "9.8.0"' in text and 'cudnn_runtime = "9.10.2.21"' in text
    assert 'nccl = "2.27.3"' in text and "nccl_runtime" not in text  # compiled == shipped: one field
    assert 'arch_list = ["7.0", "7.5", "8.0", "8.6", "9.0", "10.0", "12.0"]' in text
    checks = round_trip(facts())
    assert checks["torch.cudnn_runtime"].status == "pass"
    assert "USE_EXCEPTION_PTR" not in text  # reported, but no option torch 2.8's CMake reads
    assert "USE_ROCM = false" in text and "USE_DISTRIBUTED = true" in text


def test_each_value_says_where_it_was_read() -> None:
    text = describe.describe(facts(), name="x")
    assert "torch._C._cudnn.getCompileVersion()" in text and "installed nvidia-cudnn-cu12" in text
    assert "not recorded in the wheel" in text  # the refs: named as what they are


VERSIONS = st.sampled_from(sorted(compat()["torch"], key=lambda v: tuple(map(int, v.split(".")))))


@st.composite
def installations(draw: st.DrawFn) -> BuildFacts:
    minor = draw(VERSIONS)
    release = compat()["torch"][minor]
    torch_v = f"{minor}.{draw(st.integers(0, 3))}"
    python = draw(st.sampled_from(["3.11", "3.12"]))
    first = int(release.get("torchvision_min", f"{release['torchvision']}.0").split(".")[2])  # 2.15: 0.29.2
    vision = f"{release['torchvision']}.{draw(st.integers(first, first + 2))}"
    cuda = draw(st.sampled_from([None, *[c for c in compat()["cuda"] if _in(c, release["cuda"])]]))
    number = draw(st.sampled_from([0, 0, 2, 3]))
    label = f"cu{cuda.replace('.', '')}" if cuda else draw(st.sampled_from(["cpu", "", "kiln1"]))
    post = (
        f"post{number}" if number > 1 else ""
    )  # PyTorch: "+label.postN" after a label, ".postN" before none
    version = (
        f"{torch_v}+{label}{'.' + post if post else ''}"
        if label
        else f"{torch_v}{'.' + post if post else ''}"
    )
    changes: dict[str, object] = {
        "torch_version": version, "python_version": python,
        "torchvision": dataclasses.replace(
            facts().torchvision, version=f"{vision}+{label}" if label else vision,  # type: ignore[arg-type]
            cuda=cuda, parts={**PARTS, "nvjpeg": cuda is not None},
        ),
    }  # fmt: skip
    if cuda is None:
        settings = {k: v for k, v in facts().settings.items() if k not in ("CUDA_VERSION", "CUDNN_VERSION")}
        changes |= {
            "cuda_version": None, "cuda_built": False, "cudnn_available": False, "cudnn_compile": None,
            "cudnn_runtime": None, "nccl_available": False, "nccl_version": None, "nccl_runtime": None,
            "has_magma": False, "arch_list": (), "nvidia_dists": {},
            "settings": {**settings, "USE_CUDA": "OFF", "USE_CUDNN": "OFF", "USE_NCCL": "OFF"},
        }  # fmt: skip
        return facts(**changes)
    major = int(cuda.split(".")[0])
    floor = tuple(int(p) for p in compat()["cuda"][cuda]["min_cudnn"].split("."))
    compiled = (9, draw(st.integers(max(floor[1], 1) if floor[0] == 9 else 1, 20)), draw(st.integers(0, 3)))
    runtime = (9, draw(st.integers(compiled[1], 24)), draw(st.integers(0, 3)))
    archs = [
        a for a in compat()["cuda"][cuda]["default_arch"] if not (compiled[1] >= 11 and float(a[:3]) < 7.5)
    ]
    ptx = draw(st.booleans())
    flags = [f"sm_{a.split('+')[0].replace('.', '')}" for a in archs]
    if ptx or archs[-1].endswith("+PTX"):
        flags.append(f"compute_{archs[-1].split('+')[0].replace('.', '')}")
    nccl = (2, draw(st.integers(28, 30)), draw(st.integers(3, 9)))
    nccl_rt = (2, nccl[1] + draw(st.integers(0, 1)), nccl[2])
    dists = {
        f"nvidia-cudnn-cu{major}": f"{'.'.join(map(str, runtime))}.{draw(st.integers(1, 99))}",
        f"nvidia-nccl-cu{major}": ".".join(map(str, nccl_rt)),
    }
    return facts(
        **changes, cuda_version=cuda, cudnn_compile=compiled, cudnn_runtime=runtime, nccl_version=nccl,
        nccl_runtime=nccl_rt, arch_list=tuple(flags), nvidia_dists=dists,
        settings={**facts().settings, "CUDA_VERSION": cuda, "CUDNN_VERSION": ".".join(map(str, compiled))},
    )  # fmt: skip


def _in(version: str, spec: str) -> bool:
    from packaging.specifiers import SpecifierSet

    return version in SpecifierSet(spec)


@settings(max_examples=examples(150), deadline=None)
@given(installations())
def test_every_described_installation_passes_its_own_recipe(found: BuildFacts) -> None:
    checks = round_trip(found)
    acc_runtime = (
        found.cudnn_runtime is not None and found.cudnn_runtime[:2] != (found.cudnn_compile or ())[:2]
    )
    assert checks["torch.cudnn_runtime"].status == "pass"
    if acc_runtime:  # shipped differs from compiled: the recipe says both, and the rule allowed it
        assert checks["torch.cudnn"].expected != checks["torch.cudnn_runtime"].actual


def test_ptx_without_its_cubin_is_refused_by_name() -> None:
    with pytest.raises(UsageError, match=r"PTX without its cubin \(compute_120\)"):
        describe.arch_entries(("sm_90", "compute_120"))
    assert describe.arch_entries(("sm_90a", "sm_120", "compute_120", "sm_75")) == ["7.5", "9.0a", "12.0+PTX"]


def test_without_torchvision_it_says_so() -> None:
    with pytest.raises(UsageError, match="torchvision is not installed in that Python"):
        describe.describe(facts(torchvision=None), name="x")


def test_what_the_wheels_need_and_do_not_bundle_is_the_recipes_deploy_promise() -> None:
    """Upstream's torch 2.15.0 ships torch/lib/libgfortran.so.5 without the libquadmath.so.0 it needs
    (readelf -d of the wheel's file; no file of the wheel bundles it): describe says so in ``[deploy]
    system_libraries``, the one field that makes verify's release check pass there, and names the file."""
    needs = {"libquadmath.so.0": ["torch/lib/libgfortran.so.5"]}
    text = describe.describe(facts(), name="n", needs=needs)
    recipe = parse_recipe(text.encode(), "<described>")
    assert recipe.deploy.system_libraries == ("libquadmath.so.0",)
    assert "libquadmath.so.0: torch/lib/libgfortran.so.5" in text
    assert "[deploy]" not in describe.describe(facts(), name="n", needs={}), "nothing needed: no promise"
