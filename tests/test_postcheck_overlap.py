"""The post-build check's overlap (issue 38): the interpreter that collects the facts imports torch while pip
installs the built wheels, and is used only where a fresh interpreter would see the same.

The rule, in torchkiln.build.postcheck: pip replaced or removed no distribution that was there, what it added
has a RECORD and no ``.pth`` file, and none of the added top-level names was looked for and missed while torch
was imported (facts.py ``--import-torch-then-wait``). The listings are real ``.dist-info`` directories; the
early interpreter imports the real torch of this environment (a CPU or a CUDA build)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchkiln.build import postcheck

FACTS = Path(postcheck.FACTS)

# RECORD lines as installers write them -> the top-level names they give (None: no RECORD at all).
RECORDS: list[tuple[str, list[str], set[str]]] = [
    ("a module", ["amodule.py,sha256=x,1", "amodule-1.0.dist-info/RECORD,,"], {"amodule"}),
    ("a package", ["PIL/__init__.py,sha256=x,1", "PIL/_imaging.cpython-311-x86_64-linux-gnu.so,,"], {"PIL"}),
    ("an extension module", ["_cffi_backend.cpython-311-x86_64-linux-gnu.so,sha256=x,9"], {"_cffi_backend"}),
    ("its bundled libraries", ["pillow.libs/libjpeg-8a13f4d6.so.62.4.0,sha256=x,9"], {"pillow"}),
    ("a script outside site-packages", ["../../../bin/tool,sha256=x,1"], set()),
    ("a wheel's .data", ["pkg-1.0.data/scripts/tool,,"], set()),
    ("a .pth file", ["distutils-precedence.pth,sha256=x,1", "_distutils_hack/__init__.py,,"],
     {"distutils-precedence.pth", "_distutils_hack"}),
    ("a quoted path with a comma", ['"odd,name.py",sha256=x,1'], {"odd,name"}),
    ("bytecode pip wrote", ["__pycache__/amodule.cpython-311.pyc,,", "amodule.py,,"], {"amodule"}),
]  # fmt: skip


def dist_info(site: Path, name: str, lines: list[str] | None) -> Path:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    if lines is not None:
        (info / "RECORD").write_text("\n".join(lines) + "\n")
    return info


@pytest.mark.parametrize(("lines", "names"), [(r[1], r[2]) for r in RECORDS], ids=[r[0] for r in RECORDS])
def test_top_level_names_of_a_record(tmp_path: Path, lines: list[str], names: set[str]) -> None:
    info = dist_info(tmp_path, "dist", lines)
    assert postcheck.top_level_names(str(info)) == names


def test_without_a_record_nothing_is_known(tmp_path: Path) -> None:
    assert postcheck.top_level_names(str(dist_info(tmp_path, "legacy", None))) is None


# What pip did between two listings -> whether the early interpreter may be used (and told which names).
def _unchanged(site: Path) -> None:
    pass


def _added(site: Path) -> None:
    dist_info(site, "pillow", ["PIL/__init__.py,,", "pillow.libs/libz.so,,"])


def _added_with_pth(site: Path) -> None:
    dist_info(site, "setuptools", ["setuptools/__init__.py,,", "distutils-precedence.pth,,"])


def _added_without_record(site: Path) -> None:
    dist_info(site, "legacy", None)


def _replaced(site: Path) -> None:  # a reinstall of the same version writes a new RECORD
    record = site / "numpy-1.0.dist-info" / "RECORD"
    text = record.read_text()
    record.unlink()
    record.write_text(text)


def _removed(site: Path) -> None:
    for path in sorted((site / "numpy-1.0.dist-info").iterdir()):
        path.unlink()
    (site / "numpy-1.0.dist-info").rmdir()


CHANGES = [
    (_unchanged, ["go"]),
    (_added, ["go", "PIL", "pillow"]),
    (_added_with_pth, None),
    (_added_without_record, None),
    (_replaced, None),
    (_removed, None),
]


@pytest.mark.parametrize(("change", "words"), CHANGES, ids=[c[0].__name__.strip("_") for c in CHANGES])
def test_the_early_interpreter_is_used_only_when_pip_added_what_torch_could_not_have_seen(
    tmp_path: Path, change, words: list[str] | None
) -> None:
    site = tmp_path / "site-packages"
    dist_info(site, "numpy", ["numpy/__init__.py,,"])
    dist_info(site, "torch", ["torch/__init__.py,,"])
    before = postcheck.dist_infos([str(site)])
    change(site)
    assert postcheck.early_words(before, postcheck.dist_infos([str(site)])) == words


def _facts_script():  # noqa: ANN202 - the script's module, loaded as the check venv's interpreter loads it
    sys.path.insert(0, str(FACTS.parent))
    try:
        import facts  # noqa: PLC0415

        return facts
    finally:
        sys.path.remove(str(FACTS.parent))


def test_the_check_and_the_facts_script_speak_the_same_words() -> None:
    """Both run as standalone scripts in the check venv (no shared import): their protocol's words are kept
    twice, and must agree."""
    facts = _facts_script()
    assert (postcheck.WAIT, postcheck.RESTART) == (facts.WAIT, facts.RESTART)


@pytest.mark.parametrize(
    ("expect", "warm"),
    [
        (["torchvision==0.21.0"], ["torch._dynamo"]),
        (["torch==2.6.0", "torchvision==0.21.0+cu124"], ["torch._dynamo"]),
        (["torch==2.6.0"], []),  # a torch build's check imports torch alone, as a fresh interpreter would
        ([], []),
    ],
)
def test_the_early_interpreter_imports_what_the_checked_wheels_import_reaches(
    expect: list[str], warm: list[str]
) -> None:
    assert postcheck.early_argv(expect) == [sys.executable, str(FACTS), postcheck.WAIT, *warm]


@pytest.mark.parametrize("name", ["os", "torchvision", "torch", "torchaudio._internal", "_torch"])
def test_the_early_start_imports_only_modules_of_torch(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Anything else imported early would be in the interpreter before pip installs what it may need; the
    script refuses it before importing anything (torch is always imported first, never named)."""
    assert _facts_script().main([postcheck.WAIT, "torch.fx", name]) == 2
    assert repr(name) in capsys.readouterr().err


def early(words: str, *warm: str) -> subprocess.CompletedProcess[str]:
    """facts.py's early start in this environment's Python (its real torch) with the ``warm`` modules, told
    ``words``."""
    return subprocess.run(
        [sys.executable, str(FACTS), postcheck.WAIT, *warm],
        input=words,
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        timeout=600,
    )


@pytest.mark.integration  # imports the real torch
@pytest.mark.parametrize("warm", [(), ("torch._dynamo",)], ids=["torch", "torch and torch._dynamo"])
def test_the_early_interpreter_collects_the_facts_when_torch_missed_none_of_the_added_names(
    warm: tuple[str, ...],
) -> None:
    done = early("go PIL pillow\n", *warm)
    assert done.returncode == 0, done.stderr[-2000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    fresh = subprocess.run([sys.executable, str(FACTS)], capture_output=True, text=True, check=True, cwd="/")
    assert facts == json.loads(fresh.stdout.strip().splitlines()[-1]), "what a fresh interpreter says"


@pytest.mark.integration  # imports the real torch
def test_the_early_interpreter_asks_for_a_fresh_one_when_a_warm_up_import_failed() -> None:
    """A module that raised leaves a half-imported state; a fresh interpreter meets the error where it
    arises (or never, when the checked wheels' import does not reach it)."""
    done = early("go PIL\n", "torch._dynamo", "torch._torchkiln_no_such_module")
    assert done.returncode == 0 and done.stdout.strip() == postcheck.RESTART, done.stdout + done.stderr


MISSES = """
import importlib.util, sys
sys.path.insert(0, sys.argv[1])
import facts
misses = facts._Misses()
sys.meta_path.append(misses)
import torch
sys.meta_path.remove(misses)
print(" ".join(sorted(n for n in misses.names if importlib.util.find_spec(n) is None)))
"""


@pytest.mark.integration  # imports the real torch
def test_the_early_interpreter_asks_for_a_fresh_one_when_torch_looked_for_an_added_name() -> None:
    """torch's import looks for optional modules it does without (``dill``, ``tqdm``; numpy where it is
    not installed): pip adding one would change what a fresh interpreter finds."""
    found = subprocess.run(
        [sys.executable, "-c", MISSES, str(FACTS.parent)], capture_output=True, text=True, check=True
    )
    missed = found.stdout.split()
    assert missed, "torch 2.x looks for optional modules at import (dill, tqdm, opt_einsum...)"
    done = early(f"go PIL {missed[0]}\n")
    assert done.returncode == 0 and done.stdout.strip() == postcheck.RESTART, done.stdout + done.stderr


@pytest.mark.integration  # imports the real torch
def test_the_early_interpreter_says_nothing_without_go() -> None:
    done = early("")
    assert done.returncode == 0 and done.stdout == "", done.stdout


# The interpreter started during the compile (issue 47, torchkiln.build.earlycheck): ``postcheck.py --serve``
# in a venv waits on a socket in it; the check connects, gets the listing and the interpreter, and tells it
# the words as it tells its own.
CLIENT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import postcheck
served = postcheck.connect()
if served is None:
    print(json.dumps(None))
    sys.exit(0)
out, err = served.communicate(sys.argv[2], timeout=600)
print(json.dumps({"before": served.before, "returncode": served.returncode, "out": out, "again": postcheck.connect() is not None}))
"""


def served_venv(root: Path) -> Path:
    """A venv under ``root`` (a deep path: longer than a socket address may be) whose interpreter imports this
    environment's torch (a ``.pth`` naming its site-packages), so ``sys.prefix`` is the venv's own."""
    venv = root / ("deep-" * 20) / "check-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    import torch  # noqa: PLC0415 - where this environment's torch is

    (site / "outer.pth").write_text(str(Path(torch.__file__).parents[1]) + "\n")
    dist_info(
        site, "numpy", ["numpy/__init__.py,,"]
    )  # a check venv holds distributions: an empty one serves nothing
    return venv


def serve_and_ask(venv: Path, words: str) -> tuple[dict | None, subprocess.Popen[str]]:
    python = venv / "bin" / "python"
    server = subprocess.Popen(
        [str(python), str(Path(postcheck.__file__)), "--serve", "--expect", "torchvision==0.21.0"],
        cwd="/",
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    socket_path = venv / postcheck.SOCKET
    for _ in range(3000):
        if socket_path.exists() or server.poll() is not None:
            break
        subprocess.run(["sleep", "0.01"], check=True)
    client = subprocess.run(
        [str(python), "-c", CLIENT, str(Path(postcheck.__file__).parent), words],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
        timeout=600,
    )
    return json.loads(client.stdout), server


@pytest.mark.integration  # imports the real torch
def test_the_check_takes_the_interpreter_started_during_the_compile(tmp_path: Path) -> None:
    """Its socket lies in the venv, reached by a short name whatever the venv's path (here over 107 bytes);
    it gives the listing it took, and the facts a fresh interpreter gives; one check only (the socket is gone
    once taken)."""
    venv = served_venv(tmp_path)
    assert len(str(venv / postcheck.SOCKET)) > 107
    listing = postcheck.dist_infos([str(p) for p in venv.glob("lib/python*/site-packages")])
    answer, server = serve_and_ask(venv, "go PIL pillow")
    assert server.wait(timeout=60) == 0, server.stderr.read() if server.stderr else ""
    assert answer is not None, "no interpreter was waiting"
    assert answer["returncode"] == 0 and answer["again"] is False
    assert {k: tuple(v) if v else None for k, v in answer["before"].items()} == listing
    fresh = subprocess.run(
        [str(venv / "bin" / "python"), str(FACTS)], capture_output=True, text=True, check=True, cwd="/"
    )
    assert json.loads(answer["out"].strip().splitlines()[-1]) == json.loads(
        fresh.stdout.strip().splitlines()[-1]
    )
    assert not (venv / postcheck.SOCKET).exists()


@pytest.mark.integration  # imports the real torch
def test_without_go_the_served_interpreter_says_restart_and_the_check_starts_its_own(tmp_path: Path) -> None:
    """The words the check sends when the venv changed under the interpreter (no ``go``): nothing collected."""
    answer, server = serve_and_ask(served_venv(tmp_path), "")
    server.wait(timeout=60)
    assert answer is not None and answer["out"] == ""


def test_no_interpreter_waiting_is_no_connection(tmp_path: Path) -> None:
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    client = subprocess.run(
        [str(venv / "bin" / "python"), "-c", CLIENT, str(Path(postcheck.__file__).parent), "go"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(client.stdout) is None


FACTS_OF_SERVED = """
import json, sys
sys.path.insert(0, sys.argv[1])
import postcheck
served = postcheck.connect()
code, out, err, used = postcheck._facts(served, ["go"])
print(json.dumps({"code": code, "used": used}))
"""


def bare_venv(root: Path, *dists: str) -> Path:
    """A venv without pip (its interpreter imports no torch), with these distributions' ``.dist-info``."""
    venv = root / "check-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    for name in dists:
        dist_info(site, name, [f"{name}/__init__.py,,"])
    return venv


def test_a_served_interpreter_that_failed_is_no_verdict_a_fresh_one_gives_it(tmp_path: Path) -> None:
    """The venv can be moved aside and back while the interpreter started during the compile starts
    (warmcheck's join before checks:venv): its failure, here torch not there to import, is not the check's;
    a fresh interpreter's is."""
    venv = bare_venv(tmp_path, "numpy")
    python = venv / "bin" / "python"
    server = subprocess.Popen(
        [str(python), postcheck.__file__, "--serve", "--expect", "torchvision==0.21.0"], cwd="/"
    )
    for _ in range(3000):
        if (venv / postcheck.SOCKET).exists() or server.poll() is not None:
            break
        time.sleep(0.01)
    client = subprocess.run(
        [str(python), "-c", FACTS_OF_SERVED, str(Path(postcheck.__file__).parent)],
        capture_output=True, text=True, check=True, cwd="/", timeout=600,
    )  # fmt: skip
    assert server.wait(timeout=60) == 0
    assert json.loads(client.stdout) == {"code": 1, "used": False}, "the fresh interpreter's failure"


def test_a_server_that_finds_its_venv_empty_serves_nothing(tmp_path: Path) -> None:
    """Its listing empty (the venv moved aside as it started): nothing could be compared with it, so it ends
    without a socket, and the check starts its own interpreter."""
    venv = bare_venv(tmp_path)
    done = subprocess.run(
        [str(venv / "bin" / "python"), postcheck.__file__, "--serve", "--expect", "torchvision==0.21.0"],
        capture_output=True, text=True, check=False, cwd="/", timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and not (venv / postcheck.SOCKET).exists(), done.stderr
