"""Build-config checks of how torch was compiled: the build type and flags, the host compiler and its C++
ABI, and the machine and wheel tag its objects are for."""

from __future__ import annotations

from collections.abc import Mapping

from packaging.version import Version

from torchkiln.recipe.compat import compat
from torchkiln.recipe.model import Recipe

from .comparison import Comparison, _cmp, _skip, flag
from .facts import BuildFacts

# Upstream builds with the CXX11 ABI only from 2.7 on (pytorch#126551); 2.6 and older shipped pre-CXX11-ABI
# wheels to PyPI (upstream's 2.6.0+cu124 reports -D_GLIBCXX_USE_CXX11_ABI=0) and CXX11 ones elsewhere.
CXX11_ABI_ONLY_SINCE = Version("2.7")


def cxx11_abi_check(facts: BuildFacts) -> Comparison:
    """torch.compiled_with_cxx11_abi(): required from 2.7 on; before, either ABI is a release's build."""
    what = "torch.compiled_with_cxx11_abi() (CXX11 ABI only since 2.7)"
    if Version(Version(facts.torch_version).base_version) < CXX11_ABI_ONLY_SINCE:
        return Comparison(
            "cxx11_abi",
            "pass",
            f"{what}: {facts.cxx11_abi} (torch {facts.torch_version} predates 2.7: either ABI is upstream's)",
            None,
            facts.cxx11_abi,
        )
    return _cmp("cxx11_abi", what, True, facts.cxx11_abi)


def wheel_tag_check(facts: BuildFacts) -> Comparison:
    """check_wheel_tags.py: the installed wheel is for this interpreter (cpXY) and this machine."""
    if not facts.wheel_tags:
        return _skip("wheel_tag", "torch is not installed from a wheel (no WHEEL metadata)")
    want = "cp" + facts.python_version.replace(".", "")
    ok = all(
        tag.split("-")[0] == want
        and tag.split("-")[1].startswith(want)
        and tag.split("-")[2].endswith(facts.machine)
        for tag in facts.wheel_tags
    )
    return _cmp(
        "wheel_tag",
        "installed torch wheel tag (python tag, ABI, platform)",
        f"{want}-{want}-*_{facts.machine}",
        ", ".join(facts.wheel_tags),
        ok=ok,
    )


def _build_type_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Comparison:
    s = facts.settings
    if "BUILD_TYPE" not in s:
        return Comparison(
            "build_type",
            "fail",
            "build.type: Build settings have no BUILD_TYPE",
            recipe.build.type,
            field="build.type",
        )
    return _cmp(
        "build_type", "Build settings BUILD_TYPE", recipe.build.type, s["BUILD_TYPE"], field="build.type"
    )


def _compiler_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Comparison:
    """build.gcc vs the compiler torch.__config__.show() names ("GCC 13.3"): the major version."""
    if recipe.build.gcc is None:
        return _skip("compiler", "the recipe does not pin a gcc (build.gcc)", field="build.gcc")
    got = facts.compiler or "(not reported)"
    family, _, version = got.partition(" ")
    return _cmp(
        "compiler",
        "host compiler (torch.__config__.show())",
        f"GCC {recipe.build.gcc}.x",
        got,
        ok=family == "GCC" and version.split(".")[0] == str(recipe.build.gcc),
        field="build.gcc",
    )


def _platform_vs_recipe(recipe: Recipe, facts: BuildFacts) -> Comparison:
    """build.platform vs the machine torch was imported on (platform.machine()): its shared objects loaded
    here, so they are this machine's. An x86_64 recipe for an aarch64 build, or the other way, fails by name
    (compat.toml [platform.*] machines: aarch64 is also spelt arm64)."""
    machines = compat()["platform"][recipe.build.platform]["machines"]
    return _cmp(
        "platform",
        "machine torch runs on (platform.machine())",
        recipe.build.platform,
        facts.machine or "(not reported)",
        ok=facts.machine in machines,
        field="build.platform",
    )


def _flags_vs_recipe(flags: Mapping[str, str], settings: Mapping[str, str]) -> Comparison:
    """Recipe build flags that PyTorch reports in Build settings (USE_MKLDNN, USE_CUDNN, ...) must match."""
    compared, wrong = [], []
    for key, value in sorted(flags.items()):
        if key not in settings:
            continue  # not every build flag is reported (USE_DISTRIBUTED, BUILD_TEST, ...)
        want: bool | str | None
        got: bool | str | None
        try:
            want, got = flag(value), flag(settings[key])
        except ValueError:
            want, got = value, settings[key]
        compared.append(key)
        if want != got:
            wrong.append(f"{key}: expected {value}, actual {settings[key]}")
    if not compared:
        return _skip(
            "flags", "none of the recipe's build flags appear in Build settings", field="build.flags"
        )
    if wrong:
        return Comparison(
            "flags", "fail", "build.flags: differ from the build: " + "; ".join(wrong), field="build.flags"
        )
    return Comparison(
        "flags", "pass", f"build flags match the recipe: {', '.join(compared)}", field="build.flags"
    )
