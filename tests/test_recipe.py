"""Recipe loading: the shipped recipes are valid, and bad ones are refused field by field, exit 2."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w
from kit import ROOT
from packaging.version import Version

from torchkiln.cli import main
from torchkiln.errors import RecipeError
from torchkiln.recipe.compat import compat, vision_pairs
from torchkiln.recipe.loader import load_recipe, parse_recipe
from torchkiln.shipped import tomllib

SHIPPED = sorted((ROOT / "recipes").glob("*.toml"))
CUDA_RECIPE = ROOT / "recipes" / "torch-2.13-cu130-py312.toml"


def base_doc() -> dict:
    return tomllib.loads(CUDA_RECIPE.read_text())


def test_at_least_the_four_required_recipes_ship() -> None:
    names = {p.stem for p in SHIPPED}
    assert {
        "torch-2.13-cpu-py311",
        "torch-2.13-cu130-py312",
        "torch-2.14-cu130-py312",
        "torch-2.14-cu126-py312",
    } <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_recipe_is_valid(path: Path) -> None:
    recipe = load_recipe(path)
    assert recipe.name == path.stem
    assert recipe.torch.repo == "https://github.com/pytorch/pytorch.git"
    assert recipe.torchvision.repo == "https://github.com/pytorch/vision.git"
    row = compat()["torch"][f"{recipe.torch.version.major}.{recipe.torch.version.minor}"]
    assert vision_pairs(row, recipe.torchvision.version), "the torchvision released for its torch"


def test_cli_check_accepts_all_shipped(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipe", "check", *map(str, SHIPPED)]) == 0
    out = capsys.readouterr().out
    assert out.count(": ok (") == len(SHIPPED)


@pytest.mark.parametrize("path", [p for p in SHIPPED if "-cu" in p.stem], ids=lambda p: p.stem)
def test_shipped_cuda_recipes_use_upstreams_arch_list(path: Path) -> None:
    recipe = load_recipe(path)
    # aarch64: what upstream's aarch64 wheels of that CUDA carry (tests/test_platform.py has the rest)
    key = "aarch64_arch" if recipe.build.platform == "aarch64" else "default_arch"
    upstream = compat()["cuda"][f"{recipe.accelerator.cuda.major}.{recipe.accelerator.cuda.minor}"][key]
    assert list(recipe.accelerator.arch_list) == upstream


def test_cpu_recipe_matches_local_wheel() -> None:
    recipe = load_recipe(ROOT / "recipes" / "torch-2.13-cpu-py311.toml")
    assert (recipe.python, str(recipe.torch.version), recipe.accelerator.kind) == ("3.11", "2.13.0", "cpu")
    assert recipe.magma is None and recipe.accelerator.arch_list == ()


def _set(doc: dict, dotted: str, value) -> None:
    *tables, key = dotted.split(".")
    node = doc
    for t in tables:
        node = node.setdefault(t, {})
    node[key] = value


def _del(doc: dict, dotted: str) -> None:
    *tables, key = dotted.split(".")
    node = doc
    for t in tables:
        node = node[t]
    del node[key]


def mutate(**changes) -> str:
    """The CUDA 13.0 recipe with changes: dotted=value sets, dotted=None deletes."""
    doc = copy.deepcopy(base_doc())
    for dotted, value in changes.items():
        dotted = dotted.replace("__", ".")
        if value is None:
            _del(doc, dotted)
        else:
            _set(doc, dotted, value)
    return tomli_w.dumps(doc)


# (id, recipe text, field the problem line must name, words the message must contain)
INVALID: list[tuple[str, str, str, str]] = [
    ("empty-file", "", "<document>", "empty recipe"),
    ("not-toml", "[recipe\nname = 1", "<document>", "invalid TOML"),
    ("unknown-table", mutate(extras={"a": 1}), "extras", "unknown table"),
    ("unknown-key", mutate(torch__branch="main"), "torch.branch", "unknown key"),
    ("missing-table", mutate(python=None), "python", "missing table"),
    ("missing-key", mutate(torch__ref=None), "torch.ref", "missing required key"),
    ("wrong-type-version", mutate(torch__version=2.13), "torch.version", "wrong type"),
    ("wrong-type-jobs-bool", mutate(build__jobs=True), "build.jobs", "wrong type"),
    (
        "wrong-type-arch-string",
        mutate(accelerator__arch_list="8.0;9.0"),
        "accelerator.arch_list",
        "wrong type",
    ),
    ("table-not-table", 'recipe = "x"\n' + mutate(recipe=None), "recipe", "must be a table"),
    ("malformed-version", mutate(torch__version="2.13"), "torch.version", "malformed version"),
    ("malformed-cuda", mutate(accelerator__cuda="13"), "accelerator.cuda", "malformed version"),
    ("bad-arch-sm", mutate(accelerator__arch_list=["sm_90"]), "accelerator.arch_list", "malformed arch"),
    (
        "bad-arch-ptx-case",
        mutate(accelerator__arch_list=["9.0+ptx"]),
        "accelerator.arch_list",
        "malformed arch",
    ),
    ("duplicate-arch", mutate(accelerator__arch_list=["9.0", "9.0"]), "accelerator.arch_list", "duplicates"),
    (
        "cuda13-drops-sm70",
        mutate(accelerator__arch_list=["7.0", "9.0"]),
        "accelerator.arch_list",
        "cannot target 7.0",
    ),
    (
        "sm120-needs-12.8",
        mutate(
            torch__version="2.14.0",
            torch__ref="v2.14.0",
            torchvision__version="0.29.0",
            torchvision__ref="v0.29.0",
            accelerator__cuda="12.6",
            accelerator__cudnn="9.10.2.21",
            accelerator__nccl="2.29.3",
            accelerator__arch_list=["9.0", "12.0"],
        ),
        "accelerator.arch_list",
        "cannot target 12.0",
    ),
    (
        "unknown-arch",
        mutate(accelerator__arch_list=["9.9"]),
        "accelerator.arch_list",
        "unknown compute capability",
    ),
    ("vision-mismatch", mutate(torchvision__version="0.27.0"), "torchvision.version", "does not pair"),
    ("python-too-old", mutate(python__version="3.9"), "python.version", "not supported"),
    ("python-too-new", mutate(python__version="3.16"), "python.version", "not supported"),
    ("cuda-out-of-range", mutate(accelerator__cuda="12.5"), "accelerator.cuda", "no compatibility data"),
    (
        "cuda-too-new-for-torch",
        mutate(accelerator__cuda="13.4"),
        "accelerator.cuda",
        "not supported by torch",
    ),
    (
        "cudnn-too-old-for-cuda13",
        mutate(accelerator__cudnn="9.10.2.21"),
        "accelerator.cudnn",
        "no build for CUDA",
    ),
    ("cudnn-major", mutate(accelerator__cudnn="10.0.0"), "accelerator.cudnn", "not supported by torch"),
    ("gcc-too-new", mutate(build__gcc=16), "build.gcc", "newer than CUDA"),
    ("gcc-too-old", mutate(build__gcc=8), "build.gcc", "cannot build torch"),
    ("cuda-without-arch", mutate(accelerator__arch_list=None), "accelerator.arch_list", "required when"),
    (
        "cpu-with-cudnn",
        mutate(
            accelerator__kind="cpu",
            accelerator__cuda=None,
            accelerator__arch_list=None,
            accelerator__nccl=None,
            magma=None,
        ),
        "accelerator.cudnn",
        "only valid with",
    ),
    ("magma-on-cpu", mutate(accelerator={"kind": "cpu"}), "magma", "only used by CUDA"),
    ("magma-without-sha", mutate(magma__sha256=None), "magma.sha256", "required when [magma]"),
    ("magma-bad-sha", mutate(magma__sha256="abc"), "magma.sha256", "malformed value"),
    ("magma-too-new", mutate(magma__version="2.10.0"), "magma.version", "does not build with torch"),
    (
        "build-version-without-number",
        mutate(build__pytorch_build_version="2.13.0+cu130", build__local_version=None),
        "build.pytorch_build_number",
        "together or not at all",
    ),
    (
        "build-number-without-version",
        mutate(build__pytorch_build_number=1),
        "build.pytorch_build_version",
        "together or not at all",
    ),
    (
        "bad-local-label",
        mutate(build__local_version="cu130"),
        "build.local_version",
        "malformed local version",
    ),
    ("managed-flag", mutate(build__flags={"USE_CUDA": False}), "build.flags.USE_CUDA", "set by torchkiln"),
    ("bad-flag-name", mutate(build__flags={"CFLAGS": "-O0"}), "build.flags", "not a USE_*/BUILD_* flag"),
    (
        "unvetted-cmake-variable",
        mutate(build__flags={"CMAKE_C_COMPILER_LAUNCHER": "distcc"}),
        "build.flags.CMAKE_C_COMPILER_LAUNCHER",
        "not an option of torch 2.13's build",
    ),
    ("bad-build-type", mutate(build__type="Fast"), "build.type", "not allowed"),
    ("bad-accelerator", mutate(accelerator__kind="rocm"), "accelerator.kind", "not allowed"),
    ("shell-in-ref", mutate(torch__ref="v2.13.0; touch pwned"), "torch.ref", "malformed git ref"),
    ("bad-commit", mutate(torch__commit="HEAD"), "torch.commit", "malformed value"),
    (
        "password-in-remote",
        mutate(cache__remote="redis://:hunter2@cache:6379"),
        "cache.remote",
        "password is written",
    ),
    ("ccache-s3", mutate(cache__remote="s3://bucket/prefix"), "cache.remote", "is not a ccache remote store"),
    ("bad-cache-kind", mutate(cache__kind="distcc"), "cache.kind", "not allowed"),
    ("jobs-zero", mutate(build__jobs=0), "build.jobs", "outside 1..4096"),
    ("memory-retries-negative", mutate(build__memory_retries=-1), "build.memory_retries", "outside 0..12"),
    (
        "cudnn-before-first-cu13-wheel",
        mutate(accelerator__cudnn="9.11.0.98"),
        "accelerator.cudnn",
        "no build for CUDA 13.0",
    ),
    (
        "nccl-before-first-cu13-wheel",
        mutate(accelerator__nccl="2.27.5"),
        "accelerator.nccl",
        "no build for CUDA",
    ),
    (
        "torch-2.15-drops-python-3.10",
        mutate(
            torch__version="2.15.0",
            torch__ref="v2.15.0",
            torchvision__version="0.29.2",
            torchvision__ref="v0.29.2",
            python__version="3.10",
        ),
        "python.version",
        "not supported by torch 2.15",
    ),
    (
        # 0.29.0 requires torch==2.14.0; 2.15's torchvision is 0.29.2 (compat.toml's torchvision_min)
        "torch-2.15-pairs-from-0.29.2",
        mutate(torch__version="2.15.0", torch__ref="v2.15.0", torchvision__version="0.29.0"),
        "torchvision.version",
        "does not pair",
    ),
    (
        "vision-feature-not-bool",
        mutate(torchvision__features={"png": "yes"}),
        "torchvision.features.png",
        "wrong type str",
    ),
    (
        "vision-feature-unknown",
        mutate(torchvision__features={"avif": True}),
        "torchvision.features.avif",
        "unknown key",
    ),
    (
        "vision-features-not-a-table",
        mutate(torchvision__features=True),
        "torchvision.features",
        "must be a table",
    ),
    (
        "vision-ffmpeg-on-0.28",
        mutate(torchvision__features={"ffmpeg": True}),
        "torchvision.features.ffmpeg",
        "no video decoders",
    ),
]

# Facts read off upstream that make otherwise-refused recipes valid (tests/reference/ holds the wheels' own).
VALID: list[tuple[str, str]] = [
    # nvidia-cudnn-cu13's first PyPI release is 9.12.0.46
    ("first-cudnn-cu13-wheel", mutate(accelerator__cudnn="9.12.0.46")),
    # torch 2.15.0 (2026-10-28): Requires-Python >=3.11, CUDA 13.2 is its PyPI default (cudnn 9.26.0.51)
    (
        "torch-2.15-cu132",
        mutate(
            torch__version="2.15.0",
            torch__ref="v2.15.0",
            torchvision__version="0.29.2",
            torchvision__ref="v0.29.2",
            accelerator__cuda="13.2",
            accelerator__cudnn="9.26.0.51",
            accelerator__nccl="2.30.7",
            build__local_version="+cu132",
        ),
    ),
]


@pytest.mark.parametrize(("case_id", "text"), VALID, ids=[c[0] for c in VALID])
def test_valid_against_upstream(case_id: str, text: str) -> None:
    """Accepted, and read as the document says: the pins a build and verify act on are the file's."""
    doc = tomllib.loads(text)
    recipe = parse_recipe(text.encode(), f"{case_id}.toml")
    assert (str(recipe.torch.version), recipe.torch.ref) == (doc["torch"]["version"], doc["torch"]["ref"])
    assert (str(recipe.torchvision.version), recipe.torchvision.ref) == (
        doc["torchvision"]["version"],
        doc["torchvision"]["ref"],
    )
    acc = doc["accelerator"]
    assert (str(recipe.accelerator.cuda), str(recipe.accelerator.cudnn), str(recipe.accelerator.nccl)) == (
        acc["cuda"],
        acc["cudnn"],
        acc["nccl"],
    )


def test_build_number_above_one_appends_post_to_the_torch_wheel_version() -> None:
    """tools/generate_torch_version.py: PYTORCH_BUILD_NUMBER > 1 appends .postN to PYTORCH_BUILD_VERSION."""
    text = mutate(
        build__pytorch_build_version="2.13.0+cu130", build__pytorch_build_number=2, build__local_version=None
    )
    recipe = parse_recipe(text.encode(), "post.toml")
    assert recipe.torch_build_version == "2.13.0+cu130"  # what PYTORCH_BUILD_VERSION is set to
    assert recipe.torch_wheel_version == "2.13.0+cu130.post2"  # what the wheel then carries
    assert recipe.torchvision_wheel_version == "0.28.0+cu130"  # torchvision uses BUILD_VERSION as given
    one = parse_recipe(
        mutate(
            build__pytorch_build_version="2.13.0", build__pytorch_build_number=1, build__local_version=None
        ).encode(),
        "one.toml",
    )
    assert one.torch_wheel_version == "2.13.0"


def test_there_are_at_least_twenty_invalid_cases() -> None:
    assert len(INVALID) >= 20


@pytest.mark.parametrize(("text", "field", "words"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_recipe_is_refused_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, field: str, words: str
) -> None:
    path = tmp_path / "r.toml"
    path.write_text(text)
    assert main(["recipe", "check", str(path)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines, "no problem reported"
    assert all(line.startswith(f"{path}: ") for line in lines), err
    matching = [line for line in lines if line.startswith(f"{path}: {field}: ") and words in line]
    assert matching, f"no line naming {field!r} with {words!r} in:\n{err}"
    assert "Traceback" not in err


def test_every_problem_is_reported_not_just_the_first(tmp_path: Path) -> None:
    text = mutate(torch__branch="x", build__gcc="twelve", accelerator__arch_list=["sm_80"])
    with pytest.raises(RecipeError) as info:
        parse_recipe(text.encode(), "r.toml")
    fields = {p.field for p in info.value.problems}
    assert {"torch.branch", "build.gcc", "accelerator.arch_list"} <= fields


def test_problem_line_format_names_valid_values() -> None:
    with pytest.raises(RecipeError) as info:
        parse_recipe(mutate(accelerator__kind="rocm").encode(), "x.toml")
    assert str(info.value.problems[0]) == "x.toml: accelerator.kind: 'rocm' is not allowed (valid: cpu, cuda)"


def test_check_reports_each_file_and_fails_if_any_is_bad(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(mutate(python__version="3.9"))
    assert main(["recipe", "check", str(SHIPPED[0]), str(bad)]) == 2
    captured = capsys.readouterr()
    assert f"{SHIPPED[0]}: ok" in captured.out
    assert f"{bad}: python.version:" in captured.err


def test_missing_file_is_a_problem_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.toml"
    assert main(["recipe", "check", str(missing)]) == 2
    assert f"{missing}: <file>: no such file" in capsys.readouterr().err


def test_binary_garbage_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bin.toml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    assert main(["recipe", "check", str(path)]) == 2
    assert "not UTF-8" in capsys.readouterr().err


def test_recipe_list_shows_every_shipped_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipe", "list"]) == 0
    out = capsys.readouterr().out
    for path in SHIPPED:
        assert path.stem in out


def test_python_m_torchkiln_entry_point() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "torchkiln", "recipe", "check", str(CUDA_RECIPE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "torch-2.13-cu130-py312: torch 2.13.0+cu130.kiln1" in result.stdout


def test_unknown_command_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bake"]) == 2
    assert "unknown command 'bake'" in capsys.readouterr().err


def test_vision_features_default_per_accelerator_and_nvjpeg_needs_cuda(tmp_path: Path) -> None:
    # recipes without [torchvision.features]: what upstream's wheels have
    cuda = load_recipe(ROOT / "tests" / "reference" / "recipes" / "upstream-2.13.0-cu130-py311.toml")
    assert cuda.vision.enabled == ("png", "jpeg", "webp", "nvjpeg")
    cpu = load_recipe(ROOT / "tests" / "data" / "ext-cpu-test.toml")
    assert cpu.vision.enabled == ("png", "jpeg", "webp")
    text = (ROOT / "recipes" / "torch-2.13-cpu-py311.toml").read_text()
    assert load_recipe(ROOT / "recipes" / "torch-2.13-cpu-py311.toml").vision.enabled == (
        "png",
        "jpeg",
        "webp",
    )
    bad = text.replace("webp = true\n", "webp = true\nnvjpeg = true\n", 1)
    with pytest.raises(RecipeError, match=r"torchvision.features.nvjpeg: needs CUDA"):
        parse_recipe(bad.encode(), "n.toml")
    unknown = text.replace("webp = true\n", "webp = true\navif = true\n", 1)
    with pytest.raises(
        RecipeError, match=r"torchvision.features.avif: unknown key \(valid: ffmpeg, jpeg, nvjpeg"
    ):
        parse_recipe(unknown.encode(), "u.toml")


# What upstream's own wheels on PyPI say (METADATA Requires-Dist torch, version.py, the day each was built),
# read 2026-11-27: a torchvision pairs with a torch release when it was released for it. 0.28.0: torch==2.13.0;
# 0.29.0: torch==2.14.0; 0.29.1 (2026-09-29, +cu130) and 0.29.2 (2026-10-28, the day of torch 2.15.0, +cu132,
# py3-none on the stable ABI): torch>=2.14.0; no 0.30 on the index.
PAIRINGS = [
    ("2.13.0", "0.28.0", True),
    ("2.13.0", "0.29.2", False),
    ("2.14.0", "0.29.0", True),
    ("2.14.1", "0.29.1", True),
    ("2.14.1", "0.29.2", True),
    ("2.15.0", "0.29.2", True),
    ("2.15.0", "0.29.2+cu132", True),
    ("2.15.0", "0.29.1", False),  # released before 2.15 (its first torchvision is 0.29.2)
    ("2.15.0", "0.29.0", False),  # requires torch==2.14.0
    ("2.15.0", "0.30.0", False),  # never released; compat pairs 2.15 with 0.29
    ("2.6.0", "0.21.0", True),
    ("2.6.0", "0.22.1", False),
]


@pytest.mark.parametrize(("torch", "vision", "pairs"), PAIRINGS)
def test_torchvision_pairs_torch_as_upstreams_wheels_say(torch: str, vision: str, pairs: bool) -> None:
    """One rule for the recipe check, --torch and verify (recipe.compat.vision_pairs), checked against the
    pairings upstream's wheels declare; a recipe of a pairing the rule refuses names torchvision.version."""
    row = compat()["torch"][".".join(torch.split(".")[:2])]
    assert vision_pairs(row, Version(vision)) is pairs
    public = vision.split("+")[0]
    text = mutate(torch__version=torch, torch__ref=f"v{torch}", torchvision__version=public)
    try:
        parse_recipe(text.encode(), "pairing.toml")
        named = False
    except RecipeError as exc:
        named = "torchvision.version: torchvision" in str(exc) and "does not pair" in str(exc)
    assert named is not pairs
