"""Recipe input faults (issue 14 items 1, 2, 3, 11; issue 11's staged validation, flags and one resolver):
each case failed before (a traceback, a silently accepted value, a hang) and is now a clear problem line."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import tomli_w
from kit import ROOT

from torchkiln.cli import main
from torchkiln.errors import RecipeError
from torchkiln.plan.jobs import GIB, Resources
from torchkiln.plan.make import make_plan
from torchkiln.recipe.loader import load_recipe, parse_recipe
from torchkiln.shipped import tomllib

CPU = ROOT / "recipes" / "torch-2.13-cpu-py311.toml"
CU130 = ROOT / "recipes" / "torch-2.13-cu130-py312.toml"


def doc(path: Path = CPU) -> dict:
    return tomllib.loads(path.read_text())


def problems(document: dict | bytes) -> list[str]:
    data = document if isinstance(document, bytes) else tomli_w.dumps(document).encode()
    with pytest.raises(RecipeError) as info:
        parse_recipe(data, "r.toml")
    return [str(p) for p in info.value.problems]


def with_value(dotted: str, value: object, path: Path = CPU) -> dict:
    d = doc(path)
    *tables, key = dotted.split(".")
    node = d
    for table in tables:
        node = node.setdefault(table, {})
    node[key] = value
    return d


# -- item 1: tracebacks ------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [500, 5000])
def test_deep_nesting_is_a_problem_not_a_recursion_error(depth: int) -> None:
    text = CPU.read_bytes() + b"\n[other]\nx = " + b"[" * depth + b"1" + b"]" * depth + b"\n"
    assert any("nested too deeply" in line for line in problems(text))


@pytest.mark.parametrize("value", ["3.\u0661\u0661", "\u0663.11", "3.11\u0969"])
def test_non_ascii_digits_are_not_digits(value: str) -> None:
    lines = problems(with_value("python.version", value))
    assert any(line.startswith("r.toml: python.version: non-ASCII character") for line in lines), lines


def test_a_cache_dir_of_an_unknown_user_is_refused_by_check(tmp_path: Path) -> None:
    lines = problems(with_value("cache.dir", "~nosuchuser/c"))
    assert any("cache.dir" in line and "no user 'nosuchuser'" in line for line in lines), lines


@pytest.mark.parametrize("where", ["--cache-dir", "TORCHKILN_CACHE_DIR"])
def test_a_cache_dir_of_an_unknown_user_is_refused_on_the_command_line(
    where: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["plan", str(CPU)]
    if where == "--cache-dir":
        args += ["--cache-dir", "~nosuchuser/c"]
    else:
        monkeypatch.setenv("TORCHKILN_CACHE_DIR", "~nosuchuser/c")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{where}: ") and "no user 'nosuchuser'" in err and "Traceback" not in err


# -- item 2: trailing newlines, NUL bytes ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("dotted", "value"),
    [
        ("torch.ref", "v2.13.0\n"),
        ("recipe.name", "x\n"),
        ("torch.version", "2.13.0\n"),
        ("build.local_version", "+cpu\n"),
        ("torch.repo", "https://example.org/x\x00.git"),
        ("cache.dir", "/tmp/c\x00d"),
        ("cache.credentials_file", "/tmp/\x00"),
    ],
)
def test_control_characters_never_pass(dotted: str, value: str) -> None:
    lines = problems(with_value(dotted, value))
    assert any(line.startswith(f"r.toml: {dotted}: control character") for line in lines), lines


# -- item 3: passwords in the cache URL ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "url", ["redis://KilnSecretPw@host:6379", "redis://u%3Apw@h", "redis://user:pw@h", "http://a:b@h/c"]
)
def test_a_password_in_the_recipes_cache_url_is_refused(url: str) -> None:
    lines = problems(with_value("cache.remote", url))
    assert any(line.startswith("r.toml: cache.remote: ") and "password" in line for line in lines), lines
    assert not any("KilnSecretPw" in line or ":pw" in line for line in lines), lines


def test_a_user_name_with_a_credentials_source_is_fine() -> None:
    d = with_value("cache.remote", "redis://kiln@127.0.0.1:6379")
    d["cache"]["credentials_env"] = "KILN_REDIS_PASSWORD"
    assert parse_recipe(tomli_w.dumps(d).encode(), "r.toml").cache.remote == "redis://kiln@127.0.0.1:6379"


@pytest.mark.parametrize("url", ["redis://KilnSecretPw@host:6379", "redis://u:KilnSecretPw@host"])
def test_a_password_on_the_command_line_is_refused(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(CPU), "--cache-remote", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("--cache-remote: ") and "ps" in err and "KilnSecretPw" not in err


# -- item 11: unbounded input ---------------------------------------------------------------------------------


def test_a_huge_value_is_not_echoed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text(tomli_w.dumps(with_value("torch.ref", "v" * 200_000)))
    assert main(["recipe", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "torch.ref" in err and len(err) < 1000, len(err)


def test_a_huge_document_is_refused_unread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.toml"
    path.write_bytes(CPU.read_bytes() + b"# " + b"x" * (2 * 1024 * 1024) + b"\n")
    assert main(["recipe", "check", str(path)]) == 2
    assert "larger than" in capsys.readouterr().err


def test_a_fifo_is_refused_without_hanging(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "r.toml"
    os.mkfifo(fifo)
    result: list[int] = []
    worker = threading.Thread(target=lambda: result.append(main(["recipe", "check", str(fifo)])), daemon=True)
    worker.start()
    worker.join(20)
    if worker.is_alive():  # unblock the reader before failing
        with open(fifo, "wb"):
            pass
        pytest.fail("recipe check hangs on a FIFO")
    assert result == [2] and "not a regular file" in capsys.readouterr().err


def test_dev_zero_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipe", "check", "/dev/zero"]) == 2
    assert "not a regular file" in capsys.readouterr().err


@pytest.mark.parametrize("jobs", [9223372036854775807, 5000, 0])
def test_jobs_out_of_range(jobs: int) -> None:
    lines = problems(with_value("build.jobs", jobs))
    assert any(line.startswith("r.toml: build.jobs: ") and "1..4096" in line for line in lines), lines


# -- issue 11: one pass, flags, one resolver, names --------------------------------------------------------


def test_validation_is_one_pass() -> None:
    """Fixing the reported fields reveals nothing new: a malformed field and a rule's problem together."""
    d = with_value("build.local_version", "cpu")  # malformed (no '+')
    d["accelerator"]["cuda"] = "13.0"  # a rule: only valid with kind = "cuda"
    d["torchvision"]["version"] = "0.27.0"  # a rule: does not pair
    lines = problems(d)
    assert any(line.startswith("r.toml: build.local_version: malformed") for line in lines), lines
    assert any(line.startswith("r.toml: accelerator.cuda: only valid with") for line in lines), lines
    assert any(line.startswith("r.toml: torchvision.version: ") for line in lines), lines


def test_a_malformed_field_does_not_set_off_rules_about_it() -> None:
    lines = problems(with_value("torch.version", "2.13"))
    assert [line.split(": ")[1] for line in lines] == ["torch.version"], lines


@pytest.mark.parametrize(
    ("flags", "field", "words"),
    [
        ({"USE_FOO_BAR": 1}, "build.flags.USE_FOO_BAR", "not an option of torch 2.13"),
        ({"USE_MKLDNN": "yes"}, "build.flags.USE_MKLDNN", "'yes' is not a boolean"),
        ({"USE_DISTRIBUTD": True}, "build.flags.USE_DISTRIBUTD", "did you mean USE_DISTRIBUTED"),
    ],
)
def test_build_flags_are_checked_against_the_release(flags: dict, field: str, words: str) -> None:
    lines = problems(with_value("build.flags", flags))
    assert any(line.startswith(f"r.toml: {field}: ") and words in line for line in lines), lines
    assert all("cmake_options.toml" in line for line in lines if field in line)


def test_known_flags_pass() -> None:
    load = parse_recipe(tomli_w.dumps(with_value("build.flags", {"USE_MKLDNN": True})).encode(), "r.toml")
    assert load.build.flags["USE_MKLDNN"] == "1"


@pytest.mark.parametrize("remote", ["file:/tmp/c", "redis+unix:/s", "s3://bucket/x"])
def test_check_and_plan_agree_on_cache_remotes(remote: str, tmp_path: Path) -> None:
    """One resolver: a remote the plan refuses is refused by the check, with the same words."""
    d = with_value("cache.remote", remote)
    d["cache"]["kind"] = "ccache"
    try:
        recipe = parse_recipe(tomli_w.dumps(d).encode(), "r.toml")
    except RecipeError as exc:
        assert any(str(p).startswith("r.toml: cache.remote: ") for p in exc.problems)
    else:  # accepted: the plan must accept it too
        make_plan(recipe, workdir=tmp_path, resources=Resources(cpus=2, memory_bytes=8 * GIB))


def test_recipe_check_takes_a_shipped_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipe", "check", "torch-2.13-cpu-py311"]) == 0
    assert ": ok (" in capsys.readouterr().out


def test_build_without_a_recipe_names_build(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build"]) == 2
    assert "torchkiln build RECIPE" in capsys.readouterr().err


def test_shipped_recipes_still_load() -> None:
    """Every shipped recipe loads, under its own file name, as what its file pins."""
    paths = sorted((ROOT / "recipes").glob("*.toml"))
    assert paths
    for path in paths:
        recipe = load_recipe(path)
        doc = tomllib.loads(path.read_text())
        assert recipe.name == path.stem == doc["recipe"]["name"]
        assert (str(recipe.torch.version), recipe.python) == (
            doc["torch"]["version"],
            doc["python"]["version"],
        )
