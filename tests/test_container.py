"""Container engines (torchkiln.images.engines): what each of docker, podman and buildah is asked to run, for every
operation torchkiln needs (build, export, run, image config, size, existence, removal), and which engine is
chosen. The engines here are stand-in executables on PATH that log their argv and answer as the real CLI does
(its JSON shapes), so each call goes through torchkiln's runner like a real one; the real builds are in
test_images_build.py (buildah), test_images_podman.py (podman) and test_images_cuda.py."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from torchkiln.errors import TorchkilnError, UsageError
from torchkiln.images.engines import (
    ENGINES,
    Buildah,
    BuildRequest,
    Docker,
    Engine,
    Podman,
    Storage,
    parse_size,
    select_engine,
)

STORAGE = Storage(Path("/s/root"), Path("/s/run"), "vfs")
STORAGE_ARGS = ["--root", "/s/root", "--runroot", "/s/run", "--storage-driver", "vfs"]

# A stand-in engine CLI: logs its argv (one JSON list per line) and answers like the real one.
FAKE_ENGINE = r"""
import json, os, sys
args = sys.argv[1:]
with open(os.environ["KILN_ENGINE_LOG"], "a") as log:
    log.write(json.dumps([os.path.basename(sys.argv[0]), *args]) + "\n")
name = os.path.basename(sys.argv[0])
image = args[-1] if args else ""
config = {"User": "10001:10001", "Labels": {"io.torchkiln.recipe": "r"}}
if "missing" in image and ("inspect" in args or "exists" in args or "images" in args):
    print("Error: missing: image not known", file=sys.stderr)
    sys.exit(1)
if name in ("docker", "podman") and "image" in args and "inspect" in args:
    print(json.dumps([{"Config": config, "Size": 1234567}]))
elif name == "buildah" and "inspect" in args:
    print(json.dumps({"Docker": {"config": config}, "OCIv1": {"config": {"User": "oci"}}}))
elif name == "buildah" and "images" in args:
    print(json.dumps([{"size": "1.27 GB"}]))
elif name == "buildah" and "from" in args:
    print("Getting image source signatures\nkiln-working-container")
elif "run" in args:
    print("ran")
sys.exit(int(os.environ.get("KILN_ENGINE_RC", "0")) if "build" in args or "bud" in args else 0)
"""


@pytest.fixture
def engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """docker, podman and buildah stand-ins first on PATH; returns the log of their calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ENGINES:
        path = bin_dir / name
        path.write_text(f"#!{sys.executable}\n{FAKE_ENGINE}")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("KILN_ENGINE_LOG", str(log))
    return log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def request(**overrides: object) -> BuildRequest:
    fields: dict[str, object] = dict(
        dockerfile=Path("/ctx/docker/Dockerfile.devel"),
        context=Path("/ctx"),
        target="devel",
        tags=("localhost/torchkiln:2.13.0-cpu-devel",),
        build_args={"KILN_PYTHON": "3.11", "KILN_GCC": ""},
        named_contexts={"recipe": Path("/recipes")},
        secrets={"cache_password": Path("/tmp/pw")},
        labels={"io.torchkiln.recipe": "r"},
    )
    fields.update(overrides)
    return BuildRequest(**fields)  # type: ignore[arg-type]


# What every engine spells alike, in this order.
COMMON = [
    "--file", "/ctx/docker/Dockerfile.devel",
    "--target", "devel",
    "--tag", "localhost/torchkiln:2.13.0-cpu-devel",
    "--build-arg", "KILN_PYTHON=3.11",
    "--build-arg", "KILN_GCC=",
    "--label", "io.torchkiln.recipe=r",
    "--build-context", "recipe=/recipes",
    "--secret", "id=cache_password,src=/tmp/pw",
]  # fmt: skip
DAEMONLESS = ["--format", "docker", "--isolation", "chroot", "--network", "host"]


# ---------------------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "pull", "expected"),
    [
        (Docker("docker"), True, ["docker", "buildx", "build", *COMMON, "--pull", "--load", "--", "/ctx"]),
        (Docker("docker"), False, ["docker", "buildx", "build", *COMMON, "--load", "--", "/ctx"]),
        (
            Podman("podman", STORAGE),
            True,
            ["podman", *STORAGE_ARGS, "build", *DAEMONLESS, *COMMON, "--pull=always", "--", "/ctx"],
        ),
        (Podman("podman"), False, ["podman", "build", *DAEMONLESS, *COMMON, "--pull=never", "--", "/ctx"]),
        (
            Buildah("buildah", STORAGE),
            True,
            ["buildah", *STORAGE_ARGS, "bud", *DAEMONLESS, *COMMON, "--pull=true", "--", "/ctx"],
        ),
        (Buildah("buildah"), False, ["buildah", "bud", *DAEMONLESS, *COMMON, "--pull=never", "--", "/ctx"]),
    ],
    ids=["docker", "docker-no-pull", "podman", "podman-no-pull", "buildah", "buildah-no-pull"],
)
def test_build_argv(engine: Engine, pull: bool, expected: list[str]) -> None:
    assert engine.build_argv(request(pull=pull)) == expected


@pytest.mark.parametrize(
    "engine", [Docker("docker"), Podman("podman"), Buildah("buildah")], ids=lambda e: e.name
)
def test_export_writes_files_instead_of_an_image(engine: Engine) -> None:
    """The wheels target: every engine exports with --output; docker then must not --load (no image)."""
    argv = engine.build_argv(request(target="wheels", output=Path("/out/dist")))
    assert argv[argv.index("--output") + 1] == "type=local,dest=/out/dist"
    assert "--load" not in argv and argv[-1] == "/ctx"


def test_single_stage_files_have_no_target() -> None:
    argv = Buildah("buildah").build_argv(request(target=""))
    assert "--target" not in argv and argv[argv.index("--file") + 1] == "/ctx/docker/Dockerfile.devel"


@pytest.mark.parametrize("name", list(ENGINES))
def test_build_runs_the_argv_and_a_failure_names_the_engine(
    name: str, engines: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = select_engine(name)
    engine.build(request())
    assert calls(engines) == [[name, *engine.build_argv(request())[1:]]]
    monkeypatch.setenv("KILN_ENGINE_RC", "3")
    with pytest.raises(TorchkilnError, match=rf"image build failed \({name} exit 3\)"):
        engine.build(request())


# ---------------------------------------------------------------------------------------------------
# Running, inspecting, removing
# ---------------------------------------------------------------------------------------------------

RUN_OPTIONS = ["--user", "kiln", "--env", "A=b c", "--volume", "/data:/mnt/data:ro"]


def run_in(engine: Engine, tmp_path: Path) -> str:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    done = engine.run(
        "img:1",
        ["sh", "-c", "echo hi"],
        user="kiln",
        env={"A": "b c"},
        mounts={data: "/mnt/data"},
        capture=True,
    )
    assert done.ok and "ran" in done.stdout
    return str(data.resolve())


def test_docker_and_podman_run_a_removed_container(engines: Path, tmp_path: Path) -> None:
    for engine, prefix in (
        (select_engine("docker"), ["docker"]),
        (select_engine("podman", storage=STORAGE), ["podman", *STORAGE_ARGS]),
    ):
        engines.unlink(missing_ok=True)
        data = run_in(engine, tmp_path)
        options = [o.replace("/data", data, 1) if o.startswith("/data") else o for o in RUN_OPTIONS]
        assert calls(engines) == [[*prefix, "run", "--rm", *options, "--", "img:1", "sh", "-c", "echo hi"]]


def test_buildah_runs_in_a_working_container_it_removes(engines: Path, tmp_path: Path) -> None:
    engine = select_engine("buildah", storage=STORAGE)
    data = run_in(engine, tmp_path)
    options = [o.replace("/data", data, 1) if o.startswith("/data") else o for o in RUN_OPTIONS]
    assert calls(engines) == [
        ["buildah", *STORAGE_ARGS, "from", "--pull=false", "--", "img:1"],
        # a hostname that resolves: chroot isolation adds none to /etc/hosts (torchrun resolves its own)
        ["buildah", *STORAGE_ARGS, "run", "--isolation", "chroot", "--hostname", "localhost", *options,
         "kiln-working-container", "--", "sh", "-c", "echo hi"],
        ["buildah", *STORAGE_ARGS, "rm", "--", "kiln-working-container"],
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "config_call", "size_call", "exists_call", "remove_call"),
    [
        (
            "docker",
            ["image", "inspect", "--", "img:1"],
            ["image", "inspect", "--", "img:1"],
            ["image", "inspect", "--", "img:1"],
            ["image", "rm", "--force", "--", "img:1"],
        ),
        (
            "podman",
            ["image", "inspect", "--", "img:1"],
            ["image", "inspect", "--", "img:1"],
            ["image", "exists", "--", "img:1"],
            ["rmi", "--force", "--", "img:1"],
        ),
        (
            "buildah",
            ["inspect", "--type", "image", "--", "img:1"],
            ["images", "--json", "--", "img:1"],
            ["inspect", "--type", "image", "--", "img:1"],
            ["rmi", "--force", "--", "img:1"],
        ),
    ],
)
def test_image_config_size_existence_and_removal(
    name: str,
    config_call: list[str],
    size_call: list[str],
    exists_call: list[str],
    remove_call: list[str],
    engines: Path,
) -> None:
    engine = select_engine(name, storage=STORAGE if name != "docker" else None)
    prefix = [name, *(STORAGE_ARGS if name != "docker" else [])]
    config = engine.image_config("img:1")
    assert (config.user, config.labels) == ("10001:10001", {"io.torchkiln.recipe": "r"})
    assert engine.image_user("img:1") == "10001:10001"
    # docker and podman report bytes, buildah a size for people ("1.27 GB")
    assert engine.image_size("img:1") == (1_270_000_000 if name == "buildah" else 1234567)
    assert engine.image_exists("img:1") and not engine.image_exists("missing:1")
    engine.remove_image("img:1")
    assert calls(engines) == [
        [*prefix, *config_call],
        [*prefix, *config_call],
        [*prefix, *size_call],
        [*prefix, *exists_call],
        [*prefix, *exists_call[:-1], "missing:1"],
        [*prefix, *remove_call],
    ]
    with pytest.raises(TorchkilnError, match=rf"cannot inspect missing:1 with {name}: Error: missing"):
        engine.image_config("missing:1")
    assert engine.image_size("missing:1") is None


def test_buildah_sizes() -> None:
    assert parse_size("1.27 GB") == 1_270_000_000
    assert parse_size("512 MiB") == 512 * 2**20
    assert parse_size("880 B") == 880
    assert parse_size("big") is None and parse_size("3 parsecs") is None


# ---------------------------------------------------------------------------------------------------
# Choosing an engine
# ---------------------------------------------------------------------------------------------------


def fake_tool(directory: Path, name: str, rc: int) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\nexit {rc}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_engine_selection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(TorchkilnError, match="no container engine"):
        select_engine()
    assert select_engine(for_print=True).name == "docker"
    assert select_engine(for_print=True, storage=STORAGE).name == "buildah"  # docker has no private storage
    fake_tool(tmp_path, "podman", 0)
    assert select_engine().name == "podman"  # the only one
    fake_tool(tmp_path, "buildah", 0)
    assert select_engine().name == "buildah"  # before podman
    fake_tool(tmp_path, "docker", 1)  # a docker CLI whose engine does not answer
    assert select_engine().name == "buildah"
    fake_tool(tmp_path, "docker", 0)
    assert select_engine().name == "docker"
    # a private storage is for the daemonless engines: auto passes docker over, --engine docker refuses it
    assert select_engine(storage=STORAGE).name == "buildah"
    with pytest.raises(UsageError, match="docker keeps images in its daemon's storage"):
        select_engine("docker", storage=STORAGE)
    podman = select_engine("podman", storage=STORAGE)
    assert podman.command("images") == [str(tmp_path / "podman"), *STORAGE_ARGS, "images"]
    with pytest.raises(UsageError, match="valid: auto, docker, podman, buildah"):
        select_engine("nerdctl")


def test_a_chosen_engine_that_is_absent_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(
        TorchkilnError, match=r"--engine podman: no `podman` on PATH \(apt-get install podman\)"
    ):
        select_engine("podman")
    assert select_engine("podman", for_print=True).build_argv(request())[0] == "podman"
