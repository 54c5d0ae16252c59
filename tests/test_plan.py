"""The build plan: the env mapping, the step order, MAX_JOBS, argv-only commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomli_w
from kit import ROOT

from torchkiln.cli import main
from torchkiln.plan.environment import ENV_TABLE
from torchkiln.plan.jobs import GIB, PER_JOB_GIB, RESERVE_GIB, Resources, decide_jobs
from torchkiln.plan.make import make_plan
from torchkiln.process.environ import base_environment
from torchkiln.recipe.loader import load_recipe, parse_recipe
from torchkiln.shipped import tomllib

RECIPES = ROOT / "recipes"
CPU = RECIPES / "torch-2.13-cpu-py311.toml"
CU130 = RECIPES / "torch-2.13-cu130-py312.toml"
CU130_214 = RECIPES / "torch-2.14-cu130-py312.toml"
BIG = Resources(cpus=64, memory_bytes=512 * GIB)


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("path", sorted(RECIPES.glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_recipe_plans(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = plan_json(capsys, str(path))
    assert {"recipe", "sources", "steps"} <= set(data)
    assert data["recipe"]["name"] == path.stem
    for step in data["steps"]:
        assert {"name", "env", "argv"} <= set(step)
        assert isinstance(step["argv"], list) and all(isinstance(a, str) for a in step["argv"])
    names = [s["name"] for s in data["steps"]]
    assert (
        names.index("torch:wheel")
        < names.index("torchvision:install-torch")
        < names.index("torchvision:wheel")
    )
    assert names[-2:] == ["checks:import", "publish"]
    assert data["steps"][-1]["argv"] == [] and "manifest.json" in data["steps"][-1]["note"]


def test_every_step_says_its_kind_and_the_builder_has_a_behaviour_for_it() -> None:
    """The builder dispatches on Step.kind (torchkiln.build.kinds.KINDS), never on a step's name."""
    from torchkiln.build.kinds import KINDS

    plan = make_plan(load_recipe(CU130), resources=BIG)
    kinds = {s.name: s.kind for s in plan.steps}
    assert set(kinds.values()) <= set(KINDS)
    assert kinds["torch:fetch:init"] == "fetch" and kinds["build-env:deps"] == "env"
    assert kinds["torch:wheel"] == kinds["torchvision:wheel"] == "compile"
    assert kinds["checks:import"] == "checks" and kinds["publish"] == "publish"
    fetches = [s for s in plan.steps if s.kind == "fetch" and s.project == "torch"]
    assert [bool(s.fresh) for s in fetches] == [True, False, False, False, False], "the first starts afresh"
    assert [s.pins for s in fetches] == [False, False, False, False, True], "the last one is pinned"
    wheels = plan.wheel_steps()
    # a CUDA torch wheel's final form: the repaired one, whose libraries are found where it is installed
    assert wheels["torch"].name == "torch:repair" and kinds["torch:repair"] == "package"
    assert wheels["torch"].wheels == str(plan.paths.wheelhouse / "torch.deploy")
    check = next(s for s in plan.steps if s.facts)
    assert check.name == "checks:import"
    assert next(s for s in plan.steps if s.name == "build-env:venv").creates == str(plan.paths.venv_python)
    deps = next(s for s in plan.steps if s.name == "build-env:deps")
    assert str(plan.source("torch").path / "requirements.txt") in deps.reads


def test_step_dependencies_follow_the_projects() -> None:
    """A torch step never depends on torchvision's; torchvision's depend on torch's; shared ones on all."""
    plan = make_plan(load_recipe(CPU), resources=BIG)
    index = {s.name: i for i, s in enumerate(plan.steps)}

    def deps(name: str) -> set[str]:
        return {plan.steps[i].name for i in plan.dependencies(index[name])}

    assert not any(n.startswith("torchvision:") for n in deps("torch:wheel"))
    assert {"torch:wheel", "torchvision:fetch:submodule", "build-env:deps"} <= deps("torchvision:wheel")
    assert deps("checks:import") == set(list(index)[: index["checks:import"]])


def test_plan_text_output_shows_env_and_steps(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(CU130)]) == 0
    out = capsys.readouterr().out
    for needle in (
        "TORCH_CUDA_ARCH_LIST",
        "7.5;8.0;8.6;9.0;10.0;12.0",
        "torch:wheel",
        "setup.py",
        "MAX_JOBS",
    ):
        assert needle in out


def test_cuda13_arch_list_has_nothing_below_7_5() -> None:
    plan = make_plan(load_recipe(CU130), resources=BIG)
    for project in ("torch", "torchvision"):
        archs = plan.env_for(project)["TORCH_CUDA_ARCH_LIST"].split(";")
        assert archs == ["7.5", "8.0", "8.6", "9.0", "10.0", "12.0"]
        assert all(float(a.split("+")[0]) >= 7.5 for a in archs)


def test_cuda_env_mapping() -> None:
    plan = make_plan(load_recipe(CU130), resources=BIG)
    torch_env, vision_env = plan.env_for("torch"), plan.env_for("torchvision")
    assert torch_env["USE_CUDA"] == "1"
    assert torch_env["USE_CUDNN"] == "1" and torch_env["USE_NCCL"] == "1"
    assert torch_env["CUDA_HOME"] == "/usr/local/cuda-13.0"
    assert torch_env["CUDACXX"] == "/usr/local/cuda-13.0/bin/nvcc"
    assert torch_env["MAGMA_HOME"] == "/usr/local/magma" and torch_env["USE_MAGMA"] == "1"
    assert torch_env["BLAS"] == "MKL"
    assert torch_env["PYTORCH_BUILD_VERSION"] == "2.13.0+cu130.kiln1"
    assert torch_env["PYTORCH_BUILD_NUMBER"] == "0"
    assert torch_env["BUILD_TEST"] == "0"
    assert "-compress-mode=size" in torch_env["TORCH_NVCC_FLAGS"]
    assert vision_env["FORCE_CUDA"] == "1"
    assert vision_env["BUILD_VERSION"] == "0.28.0+cu130.kiln1"
    assert vision_env["PYTORCH_VERSION"] == "2.13.0+cu130.kiln1"
    assert "USE_CUDA" not in vision_env  # torchvision reads FORCE_CUDA


def test_cpu_recipe_sets_use_cuda_0_and_no_magma() -> None:
    plan = make_plan(load_recipe(CPU), resources=BIG)
    env = plan.env_for("torch")
    assert env["USE_CUDA"] == "0"
    assert env["USE_CUDNN"] == "0" and env["USE_NCCL"] == "0"
    for absent in ("MAGMA_HOME", "USE_MAGMA", "TORCH_CUDA_ARCH_LIST", "CUDA_HOME", "TORCH_NVCC_FLAGS"):
        assert absent not in env
    assert plan.env_for("torchvision")["FORCE_CUDA"] == "0"
    assert env["USE_DISTRIBUTED"] == "1"  # recipe build.flags reach torch's env


def test_frontend_follows_the_release() -> None:
    assert make_plan(load_recipe(CU130), resources=BIG).frontend == "setup.py"
    plan = make_plan(load_recipe(CU130_214), resources=BIG)
    assert plan.frontend == "scikit-build-core"
    wheel = next(s for s in plan.steps if s.name == "torch:wheel")
    assert wheel.argv[1:5] == ("-m", "build", "--wheel", "--no-isolation")
    assert wheel.env["CMAKE_BUILD_PARALLEL_LEVEL"] == wheel.env["MAX_JOBS"]


@pytest.mark.parametrize(
    ("cpus", "mem_gib", "kind"),
    [(2, 24, "cpu"), (64, 16, "cuda"), (64, 512, "cuda"), (16, 32, "cuda"), (1, 1, "cpu"), (128, 64, "cpu")],
)
def test_max_jobs_never_exceeds_cores_nor_memory(cpus: int, mem_gib: int, kind: str) -> None:
    resources = Resources(cpus=cpus, memory_bytes=mem_gib * GIB)
    decision = decide_jobs(kind, resources)
    assert 1 <= decision.value <= cpus
    assert decision.value == 1 or decision.value <= (mem_gib - RESERVE_GIB) / PER_JOB_GIB[kind]
    assert decision.source == "auto"


def test_cuda_build_on_many_cores_little_memory_is_memory_bound() -> None:
    recipe = load_recipe(CU130)
    plan = make_plan(recipe, resources=Resources(cpus=64, memory_bytes=32 * GIB))
    assert plan.jobs.value == int((32 - RESERVE_GIB) // PER_JOB_GIB["cuda"]) == 6
    assert "memory" in plan.jobs.reason
    assert plan.env_for("torch")["MAX_JOBS"] == "6"


def test_jobs_cli_beats_recipe_beats_auto() -> None:
    doc = tomllib.loads(CU130.read_text())
    doc["build"]["jobs"] = 3
    recipe = parse_recipe(tomli_w.dumps(doc).encode(), "r.toml")
    assert make_plan(recipe, resources=BIG).jobs.value == 3
    assert make_plan(recipe, resources=BIG, jobs=5).jobs.value == 5
    assert make_plan(recipe, resources=BIG, jobs=5).env_for("torch")["MAX_JOBS"] == "5"


def test_memory_retries_cli_beats_recipe_beats_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    doc = tomllib.loads(CU130.read_text())
    assert make_plan(parse_recipe(tomli_w.dumps(doc).encode(), "r.toml"), resources=BIG).memory_retries == 3
    doc["build"]["memory_retries"] = 5
    recipe = parse_recipe(tomli_w.dumps(doc).encode(), "r.toml")
    assert make_plan(recipe, resources=BIG).memory_retries == 5
    assert make_plan(recipe, resources=BIG, memory_retries=0).memory_retries == 0
    assert plan_json(capsys, str(CPU), "--memory-retries", "1")["memory_retries"] == 1
    assert main(["plan", str(CPU), "--memory-retries", "13"]) == 2
    assert capsys.readouterr().err.strip().endswith("--memory-retries 13: must be 0 to 12")


def test_source_dir_skips_fetch_and_only_builds_one(tmp_path: Path) -> None:
    plan = make_plan(
        load_recipe(CPU), resources=BIG, source_dirs={"torchvision": tmp_path}, only="torchvision"
    )
    names = [s.name for s in plan.steps]
    assert not any(n.startswith(("torch:", "torchvision:fetch")) for n in names)
    # builds against this recipe's torch, built before into dist/
    install = next(s for s in plan.steps if s.name == "torchvision:install-torch")
    assert str(plan.paths.dist) in install.argv and "torch==2.13.0+cpu.kiln1" in install.argv
    assert plan.sources[0].path == tmp_path and plan.sources[0].provided


def test_bad_cli_values_are_usage_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["plan", str(CPU), "--source-dir", "torch"]) == 2
    assert "expected PROJECT=PATH" in capsys.readouterr().err
    assert main(["plan", str(CPU), "--source-dir", f"torchaudio={tmp_path}"]) == 2
    assert "unknown project" in capsys.readouterr().err
    assert main(["plan", str(CPU), "--jobs", "0"]) == 2
    assert main(["plan"]) == 2
    assert "a recipe is required" in capsys.readouterr().err


def test_plan_accepts_a_shipped_recipe_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan_json(capsys, "torch-2.13-cpu-py311")["recipe"]["name"] == "torch-2.13-cpu-py311"
    assert plan_json(capsys, "--recipe", str(CPU))["recipe"]["torch_version"] == "2.13.0+cpu.kiln1"


def test_hostile_ref_stays_one_literal_argv_item(tmp_path: Path) -> None:
    """A ref that would run a command through a shell is refused by the schema, and even a valid-looking
    ref with odd characters only ever travels as one argv element."""
    doc = tomllib.loads(CPU.read_text())
    doc["torch"]["ref"] = "v2.13.0; touch pwned"
    with pytest.raises(Exception, match="malformed git ref"):
        parse_recipe(tomli_w.dumps(doc).encode(), "r.toml")
    doc["torch"]["ref"] = "release/2.13-$(touch_pwned)"
    with pytest.raises(Exception, match="malformed git ref"):
        parse_recipe(tomli_w.dumps(doc).encode(), "r.toml")
    # Bypass the schema (as a library caller could) and check the plan keeps the string whole.
    recipe = load_recipe(CPU)
    from dataclasses import replace

    evil = replace(recipe, torch=replace(recipe.torch, ref="v2.13.0; touch pwned"))
    plan = make_plan(evil, resources=BIG, workdir=tmp_path)
    fetch = next(s for s in plan.steps if s.name == "torch:fetch:fetch-ref")
    assert "v2.13.0; touch pwned" in fetch.argv
    assert fetch.argv[0] == "git"


def test_hostile_ref_through_real_git_touches_nothing(tmp_path: Path) -> None:
    """Run the fetch argv for real against a local repo: git sees one bad ref name, no file is created."""
    import subprocess
    from dataclasses import replace

    upstream = tmp_path / "upstream"
    subprocess.run(["git", "init", "-q", "-b", "main", str(upstream)], check=True)
    (upstream / "f").write_text("x")
    subprocess.run(["git", "-C", str(upstream), "add", "f"], check=True)
    subprocess.run(
        ["git", "-C", str(upstream), "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "m"],
        check=True,
    )
    recipe = load_recipe(CPU)
    evil = replace(recipe, torch=replace(recipe.torch, repo=upstream.as_uri(), ref="main; touch pwned"))
    plan = make_plan(evil, resources=BIG, workdir=tmp_path / "w", only="torch")
    results = [
        subprocess.run(s.argv, cwd=tmp_path, capture_output=True, text=True, check=False)
        for s in plan.steps
        if s.kind == "fetch"
    ][:3]
    assert results[-1].returncode != 0  # "main; touch pwned" is not a ref
    assert not (tmp_path / "pwned").exists() and not any(tmp_path.rglob("pwned"))


def test_compile_steps_run_in_the_build_venv() -> None:
    plan = make_plan(load_recipe(CPU), resources=BIG)
    for project in ("torch", "torchvision"):
        step = next(s for s in plan.steps if s.name == f"{project}:wheel")
        assert step.env["VIRTUAL_ENV"] == str(plan.paths.venv)
        assert step.path_prepend == (str(plan.paths.venv / "bin"),)
        assert step.argv[0] == str(plan.paths.venv_python)
        assert step.to_dict()["path_prepend"] == [str(plan.paths.venv / "bin")]


def test_env_table_rows_are_documented() -> None:
    names = [row.name for row in ENV_TABLE]
    assert len(names) == len(set(names)), "a variable set twice"
    assert all(row.why for row in ENV_TABLE)
    required = {
        "USE_CUDA",
        "TORCH_CUDA_ARCH_LIST",
        "USE_CUDNN",
        "USE_NCCL",
        "BLAS",
        "MAGMA_HOME",
        "MAX_JOBS",
        "CMAKE_BUILD_PARALLEL_LEVEL",
        "PYTORCH_BUILD_VERSION",
        "PYTORCH_BUILD_NUMBER",
        "BUILD_TEST",
        "FORCE_CUDA",
        "BUILD_VERSION",
        "PYTORCH_VERSION",
    }
    assert required <= set(names)


def test_base_environment_drops_steering_variables() -> None:
    env = base_environment(
        {
            "PATH": "/bin",
            "HOME": "/root",
            "USE_CUDA": "1",
            "CMAKE_ARGS": "-DX=1",
            "MAX_JOBS": "99",
            "TORCH_CUDA_ARCH_LIST": "5.0",
            "CCACHE_DIR": "/x",
            "LANG": "C",
        }
    )
    assert env == {"PATH": "/bin", "HOME": "/root", "LANG": "C"}


def test_plan_shows_compiler_launchers(tmp_path: Path) -> None:
    plan = make_plan(load_recipe(CU130), resources=BIG, workdir=tmp_path / "work")
    env = plan.env_for("torch")
    for lang in ("C", "CXX", "CUDA"):
        assert env[f"CMAKE_{lang}_COMPILER_LAUNCHER"] == "ccache"
    # The cache's basedir is the work directory, set once in the plan's cache config (the build's cache
    # session reads the same config, so the two cannot disagree).
    assert env["CCACHE_BASEDIR"] == str(plan.paths.workdir) and plan.cache.basedir == plan.paths.workdir


def test_build_number_post_release_flows_to_torchvision_and_the_check() -> None:
    """PYTORCH_BUILD_VERSION is set without .postN (torch's build appends it for a build number > 1);
    everything that names the wheel's real version (torchvision's torch pin, the post-build check) has it."""
    data = CU130.read_bytes().replace(
        b'local_version = "+cu130.kiln1"',
        b'pytorch_build_version = "2.13.0+cu130.kiln1"\npytorch_build_number = 3',
    )
    plan = make_plan(parse_recipe(data, "post.toml"), resources=BIG)
    torch_env, vision_env = plan.env_for("torch"), plan.env_for("torchvision")
    assert (torch_env["PYTORCH_BUILD_VERSION"], torch_env["PYTORCH_BUILD_NUMBER"]) == (
        "2.13.0+cu130.kiln1",
        "3",
    )
    assert vision_env["PYTORCH_VERSION"] == "2.13.0+cu130.kiln1.post3"
    assert vision_env["BUILD_VERSION"] == "0.28.0+cu130.kiln1"
    check = next(s for s in plan.steps if s.name == "checks:import")
    assert "torch==2.13.0+cu130.kiln1.post3" in check.argv
    install = next(s for s in plan.steps if s.name == "torchvision:install-torch")
    assert install.argv[-1] == "torch==2.13.0+cu130.kiln1.post3"


def test_every_pip_call_after_the_deps_step_keeps_its_resolution(tmp_path: Path) -> None:
    """Issue 11: build-env:deps writes the constraints file; each later step that runs pip is held to it."""
    plan = make_plan(load_recipe(CPU), workdir=tmp_path, resources=BIG)
    constraints = str(plan.paths.constraints)
    steps = {s.name: s for s in plan.steps}
    deps = steps["build-env:deps"]
    assert deps.argv[deps.argv.index("--constraints") + 1] == constraints and deps.creates == constraints
    install = steps["torchvision:install-torch"]
    assert install.argv[install.argv.index("--constraint") + 1] == constraints
    assert constraints in install.reads  # a changed resolution runs it again
    check = steps["checks:import"].argv
    assert check[check.index("--constraints") + 1] == constraints
    later = plan.steps[plan.steps.index(deps) + 1 :]
    pip_steps = [s for s in later if "pip" in s.argv or s.facts]
    assert pip_steps and all(constraints in s.argv for s in pip_steps)


def test_cache_basedir_holds_the_work_directory_and_the_source_trees(tmp_path: Path) -> None:
    from torchkiln.plan.make import cache_basedir

    work = tmp_path / "builder" / "work"
    assert cache_basedir(work, [work / "src" / "vision"]) == work
    # --source-dir beside the work directory: the compiles' include paths into <work>/venv stay relative
    assert cache_basedir(work, [tmp_path / "builder" / "vision"]) == tmp_path / "builder"
    assert cache_basedir(Path("/work/w"), [Path("/srv/vision")]) == Path("/work/w"), "never the root"
    plan = make_plan(
        load_recipe(CU130),
        resources=BIG,
        workdir=work,
        only="torchvision",
        source_dirs={"torchvision": tmp_path / "builder" / "vision"},
    )
    assert plan.env_for("torchvision")["CCACHE_BASEDIR"] == str(tmp_path / "builder")


def test_the_torch_wheel_torchvision_installs_is_an_input_and_venvs_are_declared(tmp_path: Path) -> None:
    """Issue 15: install-torch is keyed by the content of the torch wheels it picks from: this build's own
    (a full build; dist/ is not read, or publishing it would make every rerun install torch again), else
    the one published in dist/ before. Each step that makes or changes a venv names it for the store."""
    full = make_plan(load_recipe(CPU), workdir=tmp_path / "w", dist=tmp_path / "d", resources=BIG)
    install = next(s for s in full.steps if s.name == "torchvision:install-torch")
    # torch's final wheel: torch:repair's (the runtime libraries copied in), what is published
    assert str(full.paths.wheelhouse / "torch.deploy" / "*.whl") in install.reads
    assert not any(r.startswith(str(full.paths.dist)) for r in install.reads)
    alone = make_plan(
        load_recipe(CPU),
        workdir=tmp_path / "w",
        dist=tmp_path / "d",
        resources=BIG,
        source_dirs={"torchvision": tmp_path},
        only="torchvision",
    )
    install = next(s for s in alone.steps if s.name == "torchvision:install-torch")
    assert str(alone.paths.dist / "torch-*.whl") in install.reads
    venvs = {s.name: s.venv for s in full.steps if s.venv is not None}
    build_venv, check_venv = str(full.paths.venv), str(full.paths.check_venv)
    assert venvs == {
        "build-env:venv": build_venv,
        "build-env:pip": build_venv,
        "build-env:deps": build_venv,
        "torchvision:install-torch": build_venv,
        "checks:venv": check_venv,
        "checks:import": check_venv,
    }
    check = next(s for s in full.steps if s.name == "checks:import")
    assert str(full.paths.wheelhouse / "torch.deploy") in check.reads, (
        "the check is keyed by the wheels it installs"
    )
