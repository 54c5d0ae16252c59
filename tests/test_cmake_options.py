"""The CMake option tables (data/cmake_options.toml, data/host_tools.toml) and check_flags, on the real data."""

from __future__ import annotations

import re

import pytest
from kit import ROOT
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from torchkiln.recipe import cmake_options as co
from torchkiln.recipe.compat import compat
from torchkiln.recipe.validators import FLAG_RE
from torchkiln.shipped import tomllib

SHIPPED = sorted((ROOT / "recipes").glob("*.toml"))
SHA_RE = re.compile(r"^[0-9a-f]{40}$")


# ---------------------------------------------------------------------------------------------------
# The data
# ---------------------------------------------------------------------------------------------------


def test_releases_are_compat_releases() -> None:
    assert list(co.releases()) == sorted(compat()["torch"], key=Version)
    assert set(co.host_tools_data()["release"]) == set(co.releases())


@pytest.mark.parametrize("version", co.releases())
def test_every_option_of_every_release_loads(version: str) -> None:
    rel = co.release(version)
    assert rel.confidence in {"exact", "nearest"}
    assert rel.base in co.data()["source"]
    assert rel.note
    assert len(rel.options) > 100
    sources = co.data()["source"]
    for name, option in rel.options.items():
        assert name == option.name
        assert option.kind in {"bool", "string"}, name
        assert option.declared in {"option", "cmake_dependent_option", "cache", "env", "reported", "cmake"}, (
            name
        )
        assert option.source and all(s in sources for s in option.source), name
        if option.declared == "cmake_dependent_option":
            assert option.condition and option.forced, name
    # What the brief calls environment-only knobs: each is legal in every release, whatever declares it.
    for name in (
        "USE_PRECOMPILED_HEADERS",
        "BUILD_LIBTORCH_WHL",
        "BUILD_PYTHON_ONLY",
        "USE_FLASH_ATTENTION",
        "USE_MEM_EFF_ATTENTION",
        "USE_PRIORITIZED_TEXT_FOR_LD",
        "USE_CUDA_STATIC_LINK",
    ):
        assert name in rel.options, name


def test_every_entry_is_well_formed() -> None:
    doc = co.data()
    for table in ("option", "removed", "refused", "conflict"):
        for entry in doc[table]:
            SpecifierSet(entry["releases"])  # parses
            assert any(Version(r) in SpecifierSet(entry["releases"]) for r in co.releases()), entry
            assert all(s in doc["source"] for s in entry["source"]), entry
    for sid, src in doc["source"].items():
        assert src["repo"] and src["path"] and src["what"], sid
        if "/" in src["repo"] and " " not in src["repo"]:  # a GitHub repository: a full commit
            assert SHA_RE.match(src["commit"]), sid
    # a removed name is not also an option of the same release
    for entry in doc["removed"]:
        for r in co.releases():
            if Version(r) in SpecifierSet(entry["releases"]):
                assert entry["name"] not in co.options(r), (entry["name"], r)


def test_shipped_recipes_flags_pass() -> None:
    for path in SHIPPED:
        doc = tomllib.loads(path.read_text("utf-8"))
        flags = doc.get("build", {}).get("flags", {})
        version = doc["torch"]["version"]
        assert co.check_flags(version, flags) == [], path.name


# ---------------------------------------------------------------------------------------------------
# check_flags
# ---------------------------------------------------------------------------------------------------


def test_typo_suggests_the_closest_name() -> None:
    [(field, problem, valid)] = co.check_flags("2.13", {"USE_FLASH_ATENTION": False})
    assert field == "build.flags.USE_FLASH_ATENTION"
    assert problem == "not an option of torch 2.13's build"
    assert valid.startswith("did you mean USE_FLASH_ATTENTION?")
    assert "known: USE_FLASH_ATTENTION" in valid


def test_unknown_name_without_a_close_match() -> None:
    [(field, problem, valid)] = co.check_flags("2.13", {"USE_FOO_BAR": 1})
    assert field == "build.flags.USE_FOO_BAR"
    assert problem == "not an option of torch 2.13's build"
    assert valid  # never empty: either a suggestion or where the list lives


def test_wrong_type_for_a_bool_option() -> None:
    assert co.check_flags("2.13", {"USE_MKLDNN": "yes"}) == [
        ("build.flags.USE_MKLDNN", "'yes' is not a boolean", "true/false, 1/0, ON/OFF")
    ]
    assert co.check_flags("2.13", {"USE_MKLDNN": 2}) == [
        ("build.flags.USE_MKLDNN", "2 is not a boolean", "true/false, 1/0, ON/OFF")
    ]


@pytest.mark.parametrize("value", [True, False, 0, 1, "ON", "off", "TRUE", "false", "1", "0"])
def test_boolean_spellings_accepted(value: bool | int | str) -> None:
    assert co.check_flags("2.14", {"USE_CUDA": value}) == []


def test_string_option() -> None:
    assert co.check_flags("2.13", {"USE_CUSTOM_DEBINFO": "torch/csrc/Module.cpp"}) == []
    assert co.check_flags("2.12", {"USE_NIGHTLY": "2.12.0.dev20260301+cpu"}) == []
    [(field, problem, _valid)] = co.check_flags("2.13", {"USE_CUSTOM_DEBINFO": True})
    assert (field, problem) == ("build.flags.USE_CUSTOM_DEBINFO", "true is not a string")


def test_mslk_is_2_11_on_fbgemm_genai_is_2_10() -> None:
    # USE_FBGEMM_GENAI became USE_MSLK on main in January 2026, after the 2.10 cut.
    assert co.check_flags("2.10", {"USE_FBGEMM_GENAI": True}) == []
    assert co.check_flags("2.11", {"USE_MSLK": True}) == []
    [(field, problem, valid)] = co.check_flags("2.10", {"USE_MSLK": True})
    assert field == "build.flags.USE_MSLK"
    assert problem == "not an option of torch 2.10's build"
    assert valid == "USE_MSLK exists in torch 2.11-2.15"
    [(_, problem, valid)] = co.check_flags("2.14", {"USE_FBGEMM_GENAI": False})
    assert problem == "not an option of torch 2.14's build"
    assert "renamed USE_MSLK" in valid


def test_hipsparselt_is_2_14_on() -> None:
    assert co.check_flags("2.14", {"USE_HIPSPARSELT": False}) == []
    [(_, _, valid)] = co.check_flags("2.13", {"USE_HIPSPARSELT": False})
    assert valid == "USE_HIPSPARSELT exists in torch 2.14-2.15"


def test_setup_py_knobs_gone_with_scikit_build_core() -> None:
    assert co.check_flags("2.13", {"USE_NINJA": True}) == []
    [(_, problem, valid)] = co.check_flags("2.14", {"USE_NINJA": True})
    assert problem == "not an option of torch 2.14's build"
    assert "CMAKE_GENERATOR" in valid
    [(field, problem, valid)] = co.check_flags("2.15", {"USE_NIGHTLY": "2.15.0.dev20260901+cpu"})
    assert (field, problem) == ("build.flags.USE_NIGHTLY", "torch 2.15's build refuses USE_NIGHTLY")
    assert "tools/nightly.py" in valid


def test_conflicting_pair() -> None:
    both = {"BUILD_LIBTORCH_WHL": True, "BUILD_PYTHON_ONLY": "ON"}
    [(field, problem, valid)] = co.check_flags("2.13", both)
    assert field == "build.flags.BUILD_PYTHON_ONLY"
    assert "cannot both be ON" in problem
    assert valid == "set BUILD_LIBTORCH_WHL or BUILD_PYTHON_ONLY to false"
    assert co.check_flags("2.13", {"BUILD_LIBTORCH_WHL": True, "BUILD_PYTHON_ONLY": 0}) == []


def test_every_problem_at_once() -> None:
    problems = co.check_flags("2.13", {"USE_CUDA": "maybe", "USE_FOO_BAR": 1, "USE_NCCL": True})
    assert [p[0] for p in problems] == ["build.flags.USE_CUDA", "build.flags.USE_FOO_BAR"]


def test_full_version_and_unknown_release() -> None:
    assert co.check_flags("2.13.0+cu130", {"USE_CUDA": True}) == []
    [(field, problem, valid)] = co.check_flags("2.5", {"USE_CUDA": True})
    assert (field, problem) == ("build.flags", "no CMake option table for torch 2.5")
    assert valid == "2.6, 2.7, 2.8, 2.9, 2.10, 2.11, 2.12, 2.13, 2.14, 2.15"
    assert co.check_flags("main", {})[0][1] == "no CMake option table for torch main"


def test_every_forwardable_option_passes_its_own_release() -> None:
    for version in co.releases():
        opts = co.options(version)
        flags: dict[str, bool | int | str] = {
            name: (True if o.kind == "bool" else "x")
            for name, o in opts.items()
            if FLAG_RE.match(name) and name not in {"BUILD_LIBTORCH_WHL"}  # the conflict pair
        }
        assert co.check_flags(version, flags) == [], version


# ---------------------------------------------------------------------------------------------------
# Host tools
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", co.releases())
def test_host_tools(version: str) -> None:
    tools = co.host_tools(version)
    for key in ("cmake_min", "ninja_min", "git_min", "gcc_min"):
        Version(tools[key])
    assert tools["gcc_confidence"] in {"exact", "nearest", "inferred"}
    # cmake_minimum_required of the release's CMakeLists.txt: 3.18 up to 2.8, 3.27 from 2.9
    assert Version(tools["cmake_min"]) >= Version("3.18")
    if "cmake_below" in tools:
        assert (
            Version(tools["cmake_min"]) < Version(tools["cmake_known_good"]) < Version(tools["cmake_below"])
        )


def test_release_2_6_is_read_from_its_own_tree() -> None:
    """2.6's table is exact (release 2.6.0's CMakeLists.txt): what it has that later releases dropped, and
    what came later, are told apart with the release that has them."""
    assert co.release("2.6").confidence == "exact"
    assert co.check_flags("2.6", {"BUILD_EXECUTORCH": False, "USE_FAKELOWP": False}) == []
    [(_, problem, valid)] = co.check_flags("2.6", {"USE_XCCL": False})
    assert (problem, valid) == ("not an option of torch 2.6's build", "USE_XCCL exists in torch 2.8-2.15")
    [(_, _, valid)] = co.check_flags("2.9", {"USE_FAKELOWP": False})
    assert "dropped before release 2.9.0" in valid
    [(_, _, valid)] = co.check_flags("2.8", {"USE_NIGHTLY": "2.8.0.dev20250608+cpu"})
    assert valid == "USE_NIGHTLY exists in torch 2.9-2.13"
    # CMake 4 cannot configure 2.6 (pytorch#150203 first shipped in 2.7.0)
    assert co.host_tools("2.6")["cmake_below"] == "4" and "cmake_below" not in co.host_tools("2.7")


def test_nvcc_host_compilers_cover_compat_cuda() -> None:
    for cuda in compat()["cuda"]:
        entry = co.nvcc_host_compilers(cuda)
        assert entry["gcc_max"] >= 13 and entry["clang_max"] >= 17
        assert entry["read"]
    assert co.nvcc_host_compilers("13.4")["gcc_max"] == 16  # host_config.h of nvidia-cuda-crt 13.4.x
