"""docs/values-to-tools.md, row by row: every recipe or command-line value that reaches another tool, with that
tool's own option or expansion syntax. Each test shows the refusal (one line naming the field or option and
why) and, where the tool is on this machine, what the tool itself makes of such a value: real git, real
ccache, real pip (offline, local wheels), real curl. The test of a row is named in the table's last column;
test_every_row_has_its_test keeps the two in step.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w
from kit import ROOT
from kit.dists import tiny_wheel
from kit.imagekit import need
from test_build_fetch import ENV as GIT_ENV
from test_build_fetch import git

from torchkiln.cache import resolve_cache
from torchkiln.cache.ccache import Ccache, parse_printed_size, storage_url
from torchkiln.cache.config import size_bytes
from torchkiln.cache.remote import parse_remote
from torchkiln.errors import RecipeError, UsageError
from torchkiln.plan.make import make_plan
from torchkiln.recipe.loader import load_recipe, parse_recipe
from torchkiln.shipped import tomllib
from torchkiln.source.git import fetch_commands

RECIPE = ROOT / "tests" / "data" / "ext-cpu-test.toml"
DOC = ROOT / "docs" / "values-to-tools.md"


def recipe_with(**fields: object) -> bytes:
    """The test recipe with dotted ``fields`` set (``torch__repo="..."`` sets torch.repo)."""
    doc = tomllib.loads(RECIPE.read_text())
    for dotted, value in fields.items():
        *tables, key = dotted.split("__")
        table = doc
        for name in tables:
            table = table.setdefault(name, {})
        table[key] = value
    return tomli_w.dumps(doc).encode()


def problems(**fields: object) -> str:
    """What ``recipe check`` says of the test recipe with ``fields`` set ("" when it is valid)."""
    try:
        parse_recipe(recipe_with(**fields), "r.toml")
    except RecipeError as exc:
        return str(exc)
    return ""


def ccache_reads(key: str, variable: str, value: str) -> subprocess.CompletedProcess[str]:
    """What real ccache makes of ``variable=value``: ``ccache -k key`` prints the setting as it reads it."""
    env = {"PATH": os.environ["PATH"], "HOME": "/home/kiln", variable: value}
    if variable != "CCACHE_DIR":
        env["CCACHE_DIR"] = "/tmp/kiln-ccache-probe"
    return subprocess.run([need("ccache"), "-k", key], env=env, capture_output=True, text=True, check=False)


def test_every_row_has_its_test() -> None:
    """Each row names its example test (this module) and its generated test (test_values_decoded), both
    defined; a URL's row also its real consumers' corpus tests (test_values_decoded)."""
    import test_values_decoded

    cells = re.findall(r"\| (`test_\w+`(?:, `test_\w+`)*) \|$", DOC.read_text(), re.MULTILINE)
    rows = [re.findall(r"`(test_\w+)`", cell) for cell in cells]
    assert len(rows) >= 20 and all(len(names) >= 2 for names in rows), rows
    examples, generated = [names[0] for names in rows], [name for names in rows for name in names[1:]]
    assert len(set(examples)) == len(examples) and len(set(generated)) == len(generated)
    defined = {name for name in globals() if name.startswith("test_")}
    assert set(examples) <= defined, sorted(set(examples) - defined)
    decoded = {name for name in vars(test_values_decoded) if name.startswith("test_")}
    assert set(generated) <= decoded, sorted(set(generated) - decoded)
    consumers = {name for name in decoded if "_means_" in name}
    assert consumers <= set(generated), sorted(consumers - set(generated))


# --------------------------------------------------------------------------------------------------
# Sources: git and ssh.
# --------------------------------------------------------------------------------------------------


def test_repo_git_and_ssh_option_syntax(tmp_path: Path) -> None:
    for repo, why in (
        ("--upload-pack@x:y", "begins with '-', which git reads as an option"),
        ("ssh://-oProxyCommand=x/p", "its host begins with '-', which ssh and git read as an option"),
        ("ssh://-o@host/p", "its user begins with '-'"),
        ("git@-oProxy:p", "its host begins with '-'"),
        ("ssh://host:-p1/p", "its port '-p1' is not a number"),
        ("ext::sh -c touch% /tmp/pwned", "malformed value"),
    ):
        said = problems(torch__repo=repo)
        assert (
            f"r.toml: torch.repo: {repo!r}" in said or f"r.toml: torch.repo: malformed value {repo!r}" in said
        )
        assert why in said, said
    for fine in (
        "https://github.com/pytorch/pytorch.git",
        "git@github.com:pytorch/pytorch.git",
        "/srv/pytorch",
    ):
        assert problems(torch__repo=fine) == ""
    # real git: the plan's commands put `--` before the URL and the ref, and fetch a local repository
    upstream = tmp_path / "up"
    upstream.mkdir()
    git(upstream, "init", "-q")
    (upstream / "f").write_text("x")
    git(upstream, "add", "f")
    git(upstream, "commit", "-qm", "c")
    git(upstream, "tag", "v1")
    recipe = parse_recipe(recipe_with(torch__repo=f"file://{upstream}", torch__ref="v1"), "r.toml")
    dest = tmp_path / "checkout"
    commands = fetch_commands(recipe.torch, dest)
    assert commands[1][-3:] == ("--", "origin", f"file://{upstream}") and commands[2][-3:] == (
        "--",
        "origin",
        "v1",
    )
    for argv in commands[:4]:
        subprocess.run(argv, check=True, capture_output=True, env=GIT_ENV)
    assert (dest / "f").read_text() == "x"
    # what `--` is for: without it, git reads the URL as one of its own options
    bare = subprocess.run(
        ["git", "-C", str(dest), "remote", "add", "other", "--upload-pack@x:y"],
        capture_output=True,
        text=True,
    )
    assert bare.returncode != 0 and "unknown option" in bare.stderr


def test_ref_git_option_and_refspec_syntax() -> None:
    for ref in ("--upload-pack=x", "-x", "+main", "main:refs/heads/x", "release/*", "^main", "a..b"):
        said = problems(torch__ref=ref)
        assert "r.toml: torch.ref: malformed git ref" in said, (ref, said)
    assert problems(torch__ref="release/2.13") == "" and problems(torch__ref="v2.13.0-rc1") == ""


def test_commit_reaches_no_tool(tmp_path: Path) -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    recipe = parse_recipe(recipe_with(torch__commit=commit), "r.toml")
    plan = make_plan(
        recipe,
        workdir=tmp_path / "w",
        dist=tmp_path / "d",
        only="torch",
        cache=resolve_cache(None, kind="none"),
    )
    assert not [s.name for s in plan.steps if any(commit in a for a in s.argv) or commit in str(s.env)]
    assert "r.toml: torch.commit: malformed value '--x'" in problems(torch__commit="--x")


# --------------------------------------------------------------------------------------------------
# The compiler caches: ccache's expansion and remote syntax, sccache's lists.
# --------------------------------------------------------------------------------------------------


def test_cache_dir_ccache_expansion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # real ccache: $HOME in CCACHE_DIR is the user's home, and an unset variable fails every compile
    assert ccache_reads("cache_dir", "CCACHE_DIR", "/tmp/c$HOME").stdout.strip() == "/tmp/c/home/kiln"
    unset = ccache_reads("cache_dir", "CCACHE_DIR", "/tmp/c${IFS}")
    assert unset.returncode != 0 and 'environment variable "IFS" not set' in unset.stderr
    said = problems(cache__dir="/tmp/c$HOME")
    assert "r.toml: cache.dir: '/tmp/c$HOME' holds '$': ccache expands $VAR and ${VAR} in it" in said
    with pytest.raises(UsageError, match=r"^--cache-dir: '/tmp/c\$\{IFS\}' holds '\$': ccache expands"):
        resolve_cache(None, kind="ccache", dir="/tmp/c${IFS}")
    with pytest.raises(UsageError, match=r"^TORCHKILN_CACHE_DIR: '/x\$y/ccache' holds '\$'"):
        resolve_cache(None, kind="ccache", environ={"TORCHKILN_CACHE_DIR": "/x$y"})
    monkeypatch.setenv("HOME", "/h$o")
    monkeypatch.delenv("TORCHKILN_CACHE_DIR", raising=False)
    with pytest.raises(UsageError, match=r"^HOME \(the default cache directory\): '/h\$o/.cache"):
        resolve_cache(None, kind="sccache")
    assert resolve_cache(None, kind="ccache", dir=tmp_path / "c").dir == tmp_path / "c"


@pytest.mark.parametrize(
    ("fields", "named", "said"),
    [
        (
            {"torch__repo": "ssh://%2doProxyCommand=touch%20%2ftmp%2fx/p"},
            "torch.repo",
            "its host begins with '-', which ssh and git read as an option (git decodes %XX before it reads "
            "the URL)",
        ),
        (
            {"cache__remote": "redis://127.0.0.1:6379/%2e%2e"},
            "cache.remote",
            "ccache reads its redis database as '' (it decodes %XX and drops '.' and '..' path segments), "
            "which is not a number (valid: redis://HOST[:PORT][/DB] with DB a number from 0 to 4294967295",
        ),
        # issue 45 item 4: values every check passed, which meant something else to the tool reading them
        ({"torch__repo": "https://2130706433/p"}, "torch.repo", "is the IPv4 address 127.0.0.1 to git, curl and ccache: write 127.0.0.1"),
        ({"torch__repo": "https://0x7f.1/p"}, "torch.repo", "the host '0x7f.1' is the IPv4 address 127.0.0.1"),
        ({"torch__repo": "https://git.example.com/p?x=1"}, "torch.repo", "it holds a '?' query (git's https asks for /info/refs after it"),
        ({"torch__repo": "https://git.example.com/p#frag"}, "torch.repo", "it holds a '#' fragment"),
        ({"torch__repo": "file:///%2e%2e/srv/mirror"}, "torch.repo", "its path '/%2e%2e/srv/mirror' holds '%'"),
        ({"torch__repo": "file:///srv/a/../mirror"}, "torch.repo", "segment or a trailing '/' (curl and git remove dot-segments, ccache drops empty ones, a file system resolves them): write '/srv/mirror'"),
        ({"cache__kind": "sccache", "cache__remote": "redis://cache.example:6379/3#frag"}, "cache.remote", "it holds a '#' fragment (curl, git's https and sccache drop it, ccache refuses it)"),
        ({"cache__remote": "redis://0x7f.1:6379/3"}, "cache.remote", "the host '0x7f.1' is the IPv4 address 127.0.0.1"),
        ({"magma__url": "https://2130706433/magma-2.6.1.tar.gz"}, "magma.url", "the host '2130706433' is the IPv4 address 127.0.0.1"),
        ({"cache__kind": "sccache", "cluster__scheduler_url": "http://0177.0.0.1:10600"}, "cluster.scheduler_url", "the host '0177.0.0.1' is the IPv4 address 127.0.0.1"),
    ],
    ids=["issue-35-repo", "issue-35-ccache-remote", "issue-45-integer-host", "issue-45-hex-host", "issue-45-query",
         "issue-45-fragment", "issue-45-encoded-dot-segments", "issue-45-dot-segments", "issue-45-sccache-fragment",
         "issue-45-ccache-hex-host", "issue-45-magma-integer-host", "issue-45-scheduler-octal-host"],
)  # fmt: skip
def test_issue_examples_are_refused_by_recipe_check_and_check(
    fields: dict[str, str], named: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 35 and 45 item 4's examples, through the command line: `recipe check`, `check` and `plan`
    refuse each, naming the field, saying why as the tool reads it, and what is valid."""
    from torchkiln.cli import main

    recipe = tmp_path / "r.toml"
    recipe.write_bytes(recipe_with(**fields))
    for command in (["recipe", "check"], ["check"], ["plan"]):
        assert main([*command, str(recipe)]) == 2
        err = capsys.readouterr().err
        assert f"r.toml: {named}: " in err and said in err and "(valid: " in err and "Traceback" not in err, (
            err
        )


def test_cache_remote_ccache_storage_syntax() -> None:
    # real ccache: the remote storage is expanded as a whole
    said = ccache_reads("remote_storage", "CCACHE_REMOTE_STORAGE", "redis://cache$HOME")
    assert said.stdout.strip() == "redis://cache/home/kiln"
    for url, why in (
        ("redis://cache:6379/$DB", "holds '$': ccache expands"),
        ("redis://a:6379 redis://b:6379", "holds a space: ccache reads a space in its remote storage"),
        ("redis://cache:6379|read-only", "holds '|': ccache reads '|' in its remote storage"),
    ):
        assert f"r.toml: cache.remote: {why}" in problems(cache__remote=url), url
        with pytest.raises(UsageError, match=rf"^--cache-remote: {re.escape(why)}"):
            resolve_cache(None, kind="ccache", remote=url)
    assert resolve_cache(None, kind="ccache", remote="redis://cache:6379").remote == "redis://cache:6379"


def test_cache_remote_sccache_variables() -> None:
    from torchkiln.cache.sccache import Sccache

    config = resolve_cache(None, kind="sccache", remote="s3://bucket/prefix?region=eu-west-1")
    env = Sccache().public_env(config)
    assert (env["SCCACHE_BUCKET"], env["SCCACHE_S3_KEY_PREFIX"], env["SCCACHE_REGION"]) == (
        "bucket",
        "prefix",
        "eu-west-1",
    )
    with pytest.raises(UsageError, match=r"unknown URL parameter x for s3://"):
        resolve_cache(None, kind="sccache", remote="s3://bucket?x=1")
    with pytest.raises(UsageError, match=r"redis database 'a' is not a number"):
        resolve_cache(None, kind="sccache", remote="redis://h:6379/a")


def test_cache_secret_in_ccache_url() -> None:
    remote = parse_remote("redis://cache:6379", kind="ccache", schemes=("redis",))
    assert storage_url(remote, None, "s3cr3t-value") == "redis://s3cr3t-value@cache:6379"
    for secret in ("pa$word", "pa%41", "a@b", "a/b"):
        with pytest.raises(
            UsageError, match=r"^cache.credentials: the secret holds characters ccache cannot take"
        ):
            storage_url(remote, None, secret)
    # real ccache: why '$' cannot be in it
    said = ccache_reads("remote_storage", "CCACHE_REMOTE_STORAGE", "redis://pa$word@cache")
    assert said.returncode != 0 and 'environment variable "word" not set' in said.stderr


# What real ccache printed for `ccache -k max_size` (CCACHE_MAXSIZE=the key): 4.7.5 (Debian 12) and 4.11.2
# (Debian 13, in a trixie debootstrap root), so the parser is checked on both whichever is installed here.
PRINTED_SIZES = {
    "4.7.5": {"20G": "20.0G", "20Gi": "21.5G", "500M": "500.0M", "1.5T": "1500.0G", "100K": "100000", "0": "0"},
    "4.11.2": {"20G": "20.0 GB", "20Gi": "20.0 GiB", "500M": "500.0 MB", "1.5T": "1500.0 GB", "100K": "100.0 kB",
               "1024Mi": "1.0 GiB", "0": "0"},
}  # fmt: skip


@pytest.mark.parametrize("version", sorted(PRINTED_SIZES))
def test_ccaches_printed_sizes_of_either_version_are_read(version: str) -> None:
    for given, printed in PRINTED_SIZES[version].items():
        got, precision = parse_printed_size(printed)
        meant = 0 if given == "0" else size_bytes(given)
        assert abs(got - meant) <= precision, (version, given, printed)


def test_cache_max_size_size_syntax() -> None:
    assert "r.toml: cache.max_size: malformed value '1G$X'" in problems(cache__max_size="1G$X")
    assert "r.toml: cache.max_size: malformed value '-1G'" in problems(cache__max_size="-1G")
    assert "r.toml: cache.max_size: malformed value '20'" in problems(
        cache__max_size="20"
    )  # 4.7: GB, 4.11: GiB
    assert problems(cache__max_size="20G") == ""
    # the installed ccache (4.7's "20.0G", 4.10+'s "20.0 GB") reads each size of the recipe's grammar as meant
    for size in ("20G", "20Gi", "500M", "1.5T", "100K", "7.5G", "1024Mi", "2T", "999Ki"):
        said = ccache_reads("max_size", "CCACHE_MAXSIZE", size)
        got, precision = parse_printed_size(said.stdout)
        assert abs(got - size_bytes(size)) <= precision, (size, said.stdout)


def test_basedir_ccache_expansion_and_sccache_list(tmp_path: Path) -> None:
    recipe = parse_recipe(recipe_with(), "r.toml")
    # real ccache: CCACHE_BASEDIR is expanded too
    assert ccache_reads("base_dir", "CCACHE_BASEDIR", "/b$HOME").stdout.strip() == "/b/home/kiln"
    src = tmp_path / "s$rc"
    src.mkdir()
    with pytest.raises(
        UsageError, match=r"^--workdir/--source-dir: the compiler cache's basedir .* holds '\$'"
    ):
        make_plan(recipe, workdir=src / "work", dist=tmp_path / "d", source_dirs={"torch": src}, only="torch",
                  cache=resolve_cache(None, kind="ccache"))  # fmt: skip
    # sccache's list: the basedir is a prefix of the work directory, which may hold no ':' (the next row)
    from torchkiln.cache.syntax import basedir_problem

    assert "holds ':': sccache splits SCCACHE_BASEDIRS at ':'" in str(basedir_problem("/a:b", "sccache"))
    colon = tmp_path / "a:b"
    colon.mkdir()
    with pytest.raises(UsageError, match=r"^--workdir .*: holds ':'"):
        make_plan(recipe, workdir=colon / "w", dist=tmp_path / "d", only="torch",
                  cache=resolve_cache(None, kind="sccache"))  # fmt: skip
    plan = make_plan(recipe, workdir=tmp_path / "w", dist=tmp_path / "d", source_dirs={"torch": colon},
                     only="torch", cache=resolve_cache(None, kind="sccache"))  # fmt: skip
    assert plan.cache.basedir == tmp_path, "a source tree's ':' below the basedir never reaches the list"


def test_workdir_in_path_lists(tmp_path: Path) -> None:
    recipe = parse_recipe(recipe_with(blas__kind="mkl", blas__mkl="2024.2.0"), "r.toml")
    with pytest.raises(UsageError, match=r"^--workdir .*a:b/work: holds ':', which splits PATH"):
        make_plan(
            recipe,
            workdir=tmp_path / "a:b" / "work",
            dist=tmp_path / "d",
            cache=resolve_cache(None, kind="none"),
        )
    plan = make_plan(
        recipe, workdir=tmp_path / "w", dist=tmp_path / "d", cache=resolve_cache(None, kind="none")
    )
    assert plan.env_for("torch")["CMAKE_INCLUDE_PATH"] == str(tmp_path / "w" / "venv" / "include")


def test_tmpdir_ccache_stats_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    said = ccache_reads("stats_log", "CCACHE_STATSLOG", "/t$HOME/s.log")
    assert said.stdout.strip() == "/t/home/kiln/s.log"
    odd = tmp_path / "t$mp"
    odd.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(odd))
    with pytest.raises(UsageError, match=r"^TMPDIR: '.*t\$mp/torchkiln-ccache-stats-.*' holds '\$'"):
        Ccache().run_env(resolve_cache(None, kind="ccache", dir=tmp_path / "c"))


# --------------------------------------------------------------------------------------------------
# Paths and requirements: git, venv, build, pip.
# --------------------------------------------------------------------------------------------------


def test_paths_are_positionals_after_double_dash(tmp_path: Path) -> None:
    recipe = parse_recipe(recipe_with(), "r.toml")
    plan = make_plan(
        recipe, workdir=Path("rel/work"), dist=Path("rel/dist"), cache=resolve_cache(None, kind="none")
    )
    steps = {s.name: s.argv for s in plan.steps}
    work = str(plan.paths.workdir)
    assert work.startswith("/"), "every path torchkiln hands over is absolute"
    assert steps["torch:fetch:init"][-2:] == ("--", str(plan.paths.src / "pytorch"))
    assert steps["build-env:venv"][-2:] == ("--", str(plan.paths.venv))
    assert steps["checks:venv"][-2:] == ("--", str(plan.paths.check_venv))
    assert steps["torch:wheel"][-2:] == ("--", str(plan.paths.src / "pytorch"))
    assert steps["torchvision:install-torch"][-2] == "--"
    # real python -m venv and pip take a path after `--` (the forms the plan runs)
    venv = tmp_path / "-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--", str(venv)], check=True)
    assert (venv / "bin" / "python").exists()
    from torchkiln.build.envstore import clone_tree

    clone_tree(venv, tmp_path / "-clone")
    assert (tmp_path / "-clone" / "pyvenv.cfg").is_file()


def test_torch_requirement_pip_syntax(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchkiln.plan.given_torch import resolve_given_torch, resolve_requirement

    recipe = parse_recipe(recipe_with(), "r.toml")
    for given in (
        "--index-url=http://x.invalid/simple",
        "-r requirements.txt",
        "torch @ https://x.invalid/t.whl",
    ):
        with pytest.raises(UsageError, match=r"^--torch "):
            resolve_given_torch(given, recipe, "torchvision")
    # real pip, offline: the requirement after `--`, from a local wheel
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    tiny_wheel(wheels, "torch", "2.13.0+cpu")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    found = resolve_requirement("torch==2.13.0+cpu", "3.11", [wheels])
    assert str(found.version) == "2.13.0+cpu" and found.cuda is None
    plan = make_plan(recipe, workdir=tmp_path / "w", dist=tmp_path / "d", only="torchvision",
                     cache=resolve_cache(None, kind="none"))  # fmt: skip
    install = next(s for s in plan.steps if s.name == "torchvision:install-torch").argv
    assert install[-2:] == ("--", "torch==2.13.0+cpu")


def test_build_requirements_pip_syntax(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "requirements.txt").write_text(
        "--index-url http://x.invalid/simple\n-e .\ntinydep>=1.0  # the one\n"
    )
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    tiny_wheel(wheels, "tinydep", "1.0")
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels), "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "torchkiln.build.buildreqs", "--python", sys.executable, "--source",
         f"torch={src}", "--extra", "tinydep==1.0", "--dry-run"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (
        "tinydep>=1.0  <- torch: requirements.txt" in done.stdout and "resolved tinydep==1.0" in done.stdout
    )
    assert "index-url" not in done.stdout and "-e ." not in done.stdout, "option lines are not requirements"


# --------------------------------------------------------------------------------------------------
# Recipe values in the build's environment and names.
# --------------------------------------------------------------------------------------------------


def test_python_version_is_a_program_name() -> None:
    assert "r.toml: python.version: malformed version '3.12 -c x'" in problems(python__version="3.12 -c x")
    assert "r.toml: python.version: malformed version '-3.12'" in problems(python__version="-3.12")


def test_recipe_name_in_file_names() -> None:
    for name in ("-x", "../x", "a/b", ".hidden"):
        assert f"r.toml: recipe.name: malformed value {name!r}" in problems(recipe__name=name), name


def test_build_flags_cmake_syntax() -> None:
    for value in ("ON;-DCMAKE_C_COMPILER=/tmp/x", "${HOME}", "a b"):
        said = problems(build__flags={"USE_KINETO": value})
        assert (
            "r.toml: build.flags: value of USE_KINETO must be a boolean, an integer or a plain string" in said
        )
    assert "build.flags.CMAKE_C_FLAGS: not an option of torch 2.13's build" in problems(
        build__flags={"CMAKE_C_FLAGS": "x"}
    )


def test_arch_list_separators() -> None:
    said = problems(accelerator__kind="cuda", accelerator__cuda="13.0", accelerator__arch_list=["8.0;9.0"])
    assert "r.toml: accelerator.arch_list: malformed arch '8.0;9.0'" in said
    said = problems(accelerator__kind="cuda", accelerator__cuda="13.0", accelerator__arch_list=["8.0 9.0"])
    assert "malformed arch '8.0 9.0'" in said


def test_versions_pep440() -> None:
    assert "r.toml: torch.version: malformed version" in problems(torch__version="2.13.0;x")
    assert "r.toml: build.local_version: malformed local version label" in problems(
        build__local_version="+a b"
    )
    assert "r.toml: build.pytorch_build_version: '2.13 x' is not a PEP 440 version" in problems(
        build__pytorch_build_version="2.13 x"
    )


def test_jobs_is_an_integer() -> None:
    assert "r.toml: build.jobs: " in problems(build__jobs="4; rm")
    assert "is outside 1..4096" in problems(build__jobs=0)
    from torchkiln.commands.plan import add_plan_arguments

    parser = argparse.ArgumentParser(exit_on_error=False)
    add_plan_arguments(parser)
    with pytest.raises(argparse.ArgumentError):
        parser.parse_args(["r.toml", "--jobs", "4x"])


def test_cluster_scheduler_in_toml(tmp_path: Path) -> None:
    from torchkiln.distributed.client import client_config
    from torchkiln.distributed.spec import ClusterSpec, scheduler_url

    assert scheduler_url("http://sched.example:10600") == "http://sched.example:10600/"
    for url in ("http://sched/x", "http://u:p@sched", "ftp://sched"):
        with pytest.raises(UsageError, match=r"^cluster.scheduler_url: "):
            scheduler_url(url)
    token = 'a"b\\c\nd'
    text = client_config(ClusterSpec("http://sched:10600/"), token, tmp_path / "tc")
    assert tomllib.loads(text)["dist"]["auth"]["token"] == token, "quoted by tomli-w, read back whole"


def test_magma_url_curl_globbing(tmp_path: Path) -> None:
    need("curl")
    import hashlib

    served = tmp_path / "magma-{2.6.1}.tar.gz"  # curl reads {2.6.1} as a list: it asks for magma-2.6.1.tar.gz
    served.write_bytes(b"not really a tarball")
    url = f"file://{served}"
    env = {"PATH": os.environ["PATH"], "KILN_MAGMA_VERSION": "2.6.1", "KILN_MAGMA_URL": url,
           "KILN_MAGMA_SHA256": "0" * 64, "KILN_CUDA_ARCH_LIST": "8.0", "MAGMA_PREFIX": str(tmp_path / "m")}  # fmt: skip
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install_magma.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    digest = hashlib.sha256(served.read_bytes()).hexdigest()
    assert done.returncode == 1 and f"expected {'0' * 64}, got {digest}" in done.stderr, done.stderr
    assert not (tmp_path / "m").exists()
    globbed = subprocess.run(["curl", "--fail", "--silent", "--output", "/dev/null", url], check=False)
    assert globbed.returncode != 0, "without --globoff curl fetches another file"


def test_image_names_after_double_dash(tmp_path: Path) -> None:
    from torchkiln.images.engines import Buildah, BuildRequest, Docker, Podman, Storage

    storage = Storage(tmp_path / "s", tmp_path / "r", "vfs")
    req = BuildRequest(tmp_path / "Dockerfile", tmp_path / "ctx", "", ("-x:1",), {"KILN_PYTHON": "3.11"})
    for engine in (Docker("docker"), Podman("podman", storage), Buildah("buildah", storage)):
        argv = engine.build_argv(req)
        assert argv[-2:] == ["--", str(tmp_path / "ctx")] and argv[argv.index("--tag") + 1] == "-x:1"
    # real buildah: an image name after `--` is a name, never an option
    engine = Buildah(need("buildah"), storage)
    assert engine.image_exists("--help") is False


def test_paths_inside_engine_option_fields(tmp_path: Path) -> None:
    from torchkiln.commands.images import _secret_file
    from torchkiln.images.engines import _run_options

    odd = tmp_path / "a,b"
    odd.mkdir()
    (odd / "pip.conf").write_text("[global]\n")
    with pytest.raises(UsageError, match=r"^--pip-config .*a,b/pip.conf: holds ','"):
        _secret_file("--pip-config", str(odd / "pip.conf"), "a pip configuration file")
    plain = tmp_path / "pip.conf"
    plain.write_text("[global]\n")
    assert _secret_file("--pip-config", str(plain), "x") == plain
    with pytest.raises(UsageError, match=r"cannot be mounted with --volume"):
        _run_options(None, None, {tmp_path / "x:y": "/data"})
    assert _run_options(None, None, {plain: "/data"}) == ["--volume", f"{plain}:/data:ro"]


def test_build_args_are_single_items(tmp_path: Path) -> None:
    from torchkiln.images.engines import BuildRequest
    from torchkiln.images.spec import devel_args

    recipe = parse_recipe(recipe_with(), "r.toml")
    args = devel_args(recipe)
    argv = BuildRequest(tmp_path / "D", tmp_path / "c", "devel", (), args).args()
    items = [argv[i + 1] for i, a in enumerate(argv) if a == "--build-arg"]
    assert items == [f"{k}={v}" for k, v in args.items()], "one argv item per build arg, never split"
    for script in (ROOT / "scripts").glob("*.sh"):
        unquoted = re.findall(r'(?<!")\$\{?KILN_\w+', script.read_text())
        assert not [u for u in unquoted if not _quoted(script.read_text(), u)], (script.name, unquoted)


def _quoted(text: str, use: str) -> bool:
    """Whether every occurrence of ``use`` in a shell script is inside double quotes (or a [[ ]] test)."""
    for line in text.splitlines():
        start = line.find(use)
        while start != -1:
            before = line[:start]
            if before.count('"') % 2 == 0 and "[[" not in before:
                return False
            start = line.find(use, start + 1)
    return True


def test_verify_options_are_values(tmp_path: Path) -> None:
    from torchkiln.commands.verify import build_argv, register

    parser = argparse.ArgumentParser()
    register(parser)
    recipe = tmp_path / "r.toml"
    recipe.write_bytes(recipe_with())
    args = parser.parse_args(["--recipe", str(recipe), "--report", str(tmp_path / "rep"), "--area", "ddp"])
    argv = build_argv(args, tmp_path / "suite")
    assert argv[argv.index("--recipe") + 1] == str(recipe.resolve())
    assert argv[argv.index("--report") + 1] == str((tmp_path / "rep").resolve())
    assert argv[len(argv) - 1 - argv[::-1].index("-m") + 1] == "ddp"
    with pytest.raises(SystemExit):
        parser.parse_args(["--area", "ddp or not x"])


def test_recipe_build_requirements_pip_syntax(tmp_path: Path) -> None:
    """``build.requirements`` reach build-env:deps' pip (``--extra``, after its ``--``) as requirements of
    projects from the index: pip's options, direct URLs, a name pip reads as a file, a form pip reads as
    another text, a project twice are refused naming the field and what is valid."""
    refused = {
        "-r reqs.txt": "is not a PEP 508 requirement",
        "--index-url=http://x.invalid/simple": "is not a PEP 508 requirement",
        "tinydep @ https://x.invalid/tinydep-1.0-py3-none-any.whl": "names a URL",
        "tinydep-1.0-py3-none-any.whl": "is read by pip as a file to install",
        "tinydep.tar.gz": "is read by pip as a file to install",
        "tinydep == 1.0": "is read by pip as 'tinydep==1.0' (valid: 'tinydep==1.0')",
    }
    for value, said in refused.items():
        found = problems(build__requirements=[value])
        assert f"r.toml: build.requirements: {value!r} {said}" in found, (value, found)
    assert "tinydep listed more than once" in problems(build__requirements=["tinydep", "TinyDep>=1"])
    from pip._internal.utils.filetypes import ARCHIVE_EXTENSIONS

    from torchkiln.recipe.validators import PIP_ARCHIVES

    assert set(PIP_ARCHIVES) == set(ARCHIVE_EXTENSIONS), "the names pip reads as files: this pip's"
    assert problems(build__requirements=["tinydep==1.0", 'pyyaml; python_version < "3.12"']) == ""
    recipe_file = tmp_path / "r.toml"
    recipe_file.write_bytes(recipe_with(build__requirements=["tinydep==1.0"]))
    plan = make_plan(load_recipe(recipe_file), workdir=tmp_path / "w", dist=tmp_path / "d", only="torch",
                     source_dirs={"torch": tmp_path}, cache=resolve_cache(None, kind="none"))  # fmt: skip
    deps = next(s for s in plan.steps if s.name == "build-env:deps").argv
    assert deps[deps.index("tinydep==1.0") - 1] == "--extra", deps
