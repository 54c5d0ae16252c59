"""A newcomer follows README.md on a fresh minimal Debian (issues 20, 37, 44): ``debootstrap --variant=minbase``
of Debian 12 (bookworm, python3 3.11), 13 (trixie, 3.13) and 14 (forky, 3.14), then only the README's
commands, taken from README.md itself (the code blocks marked ``<!-- newcomer: NAME -->``, in order, so the
README and this test cannot drift), as root or as a user with sudo (who puts ``sudo`` in front of each
``apt-get`` line, as the README says):

* ``run-deps``, ``checkout``, ``setup``: what torchkiln needs to run, the clone (of a bare repository of this
  checkout, by its file:// URL in ``$TORCHKILN_URL``), its venv;
* ``recipe``: the CPU recipe made for the system's python3;
* ``check-missing``: ``torchkiln check`` names every tool a build still lacks (exit 2);
* ``build-deps``, ``check-ok``: the build packages, after which the check passes;
* ``torch-wheel``, ``main-job``: the first build from a local tree (tests/data/vision_like as the recipe's
  torchvision against upstream's CPU torch wheel); the one command not run is the download from PyTorch's
  CPU index, unreachable here: the same wheel comes from this host's pip configuration instead (for the
  suite's Python: where this host has none, the first build is not run and the test says so);
* ``unit``: ``nox -s unit``, green with no torch downloaded and the suite's own Python, git and tools.

Two forms (``TORCHKILN_NEWCOMER_FORM``): ``readme``, what CI runs by default (``nox -s readme``: Debian 12
and 13, as root, every block but the first build) and ``full`` (``nox -s newcomer``: Debian 12, 13 and 14,
as root and as a user with sudo, the first build included). A minimal root is a chroot: bubblewrap cannot
make namespaces there, as in an unprivileged container, so the unit tests that need them skip there.

The output the README quotes after a block (a ``console`` block) is the real output of that block, compared
line for line, paths normalised (the user's home is root's); the README quotes Debian 13's, compared as it is,
and the other suites' differ only in their Python: there both sides say their Python as 3.X.

What each command printed, and its time, go to .torchkiln/newcomer/<suite>-<mode>.md, the times to
.torchkiln/images-report.json.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from kit import ROOT
from kit.chroot import Root, make_root, publish_checkout
from kit.imagekit import report, require
from kit.readmekit import readme_blocks

from torchkiln.files.digests import file_sha256

pytestmark = [pytest.mark.integration, pytest.mark.newcomer]

TRANSCRIPTS = ROOT / ".torchkiln" / "newcomer"
CPU_TORCH = "torch==2.13.0+cpu"  # what the torch-wheel block downloads
# Each suite's python3 (data/distros.toml); the README quotes Debian 13's output.
PYTHONS = {"bookworm": "3.11", "trixie": "3.13", "forky": "3.14"}
README_PYTHON = PYTHONS["trixie"]
FORM = os.environ.get("TORCHKILN_NEWCOMER_FORM", "full")
FORMS = {  # form -> (suites, modes, the first build run)
    "readme": (("bookworm", "trixie"), ("root",), False),
    "full": (tuple(PYTHONS), ("root", "user-with-sudo"), True),
}
# the nox sessions run one suite each (TORCHKILN_NEWCOMER_SUITE); pytest alone runs the form's suites
SUITES = [s for s in FORMS[FORM][0] if os.environ.get("TORCHKILN_NEWCOMER_SUITE", s) == s]
MODES = FORMS[FORM][1]
FIRST_BUILD = FORMS[FORM][2]


def as_user_with_sudo(commands: str) -> str:
    """What the README says a user with sudo does: sudo in front of each apt-get line."""
    return re.sub(r"(?m)^apt-get ", "sudo apt-get ", commands)


def tag(python: str) -> str:
    return python.replace(".", "")


def neutral(lines: list[str], *pythons: str) -> list[str]:
    """``lines`` with each of ``pythons`` said as 3.X (py3X, cp3X)."""
    text = "\n".join(lines)
    for python in pythons:
        text = re.sub(rf"(?<![\d.]){re.escape(python)}(?!\d)", "3.X", text)
        text = re.sub(rf"\b(py|cp){tag(python)}\b", r"\g<1>3X", text)
    return text.splitlines()


def as_quoted(text: str, root: Root, python: str, quoted: list[str]) -> tuple[list[str], list[str]]:
    """What a block printed and what the README quotes, to compare: root's home for the user's; on Debian 12
    both with their Python said as 3.X (the README quotes Debian 13's output, and the shipped recipe keeps its
    name torch-2.13-cpu-py311 on both)."""
    lines = text.replace(root.home + "/", "/root/").strip().splitlines()
    if python == README_PYTHON:
        return lines, quoted
    return neutral(lines, python, README_PYTHON), neutral(quoted, python, README_PYTHON)


def host_cpu_torch(dest: Path, python: str) -> Path | None:
    """The torch-wheel block's wheel from this host's pip configuration (its index or find-links), as the
    block's own download would give it from PyTorch's CPU index for ``python``; None where there is none."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         "--python-version", python, "--dest", str(dest), CPU_TORCH],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    found = sorted(dest.glob(f"torch-2.13.0+cpu-cp{tag(python)}-*.whl"))
    return found[0] if done.returncode == 0 and found else None


class Transcript:
    """What the newcomer saw: each block's commands, output, exit status and time."""

    def __init__(self, name: str) -> None:
        self.path = TRANSCRIPTS / f"{name}.md"
        self.times: dict[str, float] = {}
        TRANSCRIPTS.mkdir(parents=True, exist_ok=True)
        self.path.write_text(f"# README.md in a fresh debootstrap root: {name}\n")

    def add(self, name: str, commands: str, done: subprocess.CompletedProcess[str], seconds: float) -> None:
        self.times[name] = round(seconds, 1)
        shown = "\n".join(f"$ {line}" for line in commands.splitlines())
        with self.path.open("a") as out:
            out.write(
                f"\n## {name} (exit {done.returncode}, {seconds:.0f} s)\n\n```console\n{shown}\n{done.stdout}```\n"
            )


@pytest.mark.timeout(10800)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("suite", SUITES)
def test_the_readme_takes_a_newcomer_from_a_minimal_debian_root_to_a_wheel_and_green_tests(
    suite_root: Path, tmp_path: Path, suite: str, mode: str
) -> None:
    blocks = {b.name: b for b in readme_blocks()}
    python = PYTHONS[suite]
    root = make_root(suite_root, tmp_path, "root" if mode == "root" else "newcomer")
    try:
        url, commit = publish_checkout(ROOT, root)
        # pip keeps no cache in the root: the 4.7 GB torch and its NVIDIA wheels once, not twice, on disk
        root = dataclasses.replace(root, environ={"TORCHKILN_URL": url, "PIP_NO_CACHE_DIR": "1"})
        transcript = Transcript(f"{suite}-{mode}")
        start = time.monotonic()

        def run(name: str) -> subprocess.CompletedProcess[str]:
            text = blocks[name].commands
            text = text if root.user == "root" else as_user_with_sudo(text)
            began = time.monotonic()
            done = root.run(text, timeout=3600)
            transcript.add(name, text, done, time.monotonic() - began)
            if blocks[name].quoted:  # what the README quotes is what it printed
                printed, quoted = as_quoted(done.stdout, root, python, blocks[name].quoted)
                assert printed == quoted, done.stdout
            return done

        assert shutil.which("python3", path=str(root.host_path("/usr/bin"))) is None  # nothing but minbase

        for name in ("run-deps", "checkout", "setup", "recipe"):
            done = run(name)
            assert done.returncode == 0, done.stdout[-3000:]
        checkout = root.host_path(root.checkout)
        # (the user's clone: root reads it here, which git allows by safe.directory)
        head = subprocess.run(
            ["git", "-c", f"safe.directory={checkout}", "-C", str(checkout), "rev-parse", "HEAD"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert head.stdout.strip() == commit  # the clone is this checkout as it is
        recipe = json.loads(subprocess.run(
            [sys.executable, "-c", "import json, sys; from torchkiln.recipe.loader import load_recipe; "
             "r = load_recipe(sys.argv[1]); print(json.dumps([r.name, r.python]))", str(checkout / "cpu.toml")],
            capture_output=True, text=True, check=True,
        ).stdout)  # fmt: skip
        assert recipe == [f"torch-2.13-cpu-py{tag(python)}", python]  # the system's python3

        # every tool a build lacks, named with its fix, exactly as README.md quotes it
        done = run("check-missing")
        assert done.returncode == 2, done.stdout[-3000:]

        done = run("build-deps")
        assert done.returncode == 0, done.stdout[-3000:]
        done = run("check-ok")
        assert (
            done.returncode == 0
            and f"ok: this host can build torch, torchvision of {recipe[0]} " in done.stdout
        )

        # torch-wheel: PyTorch's CPU index is not reachable here; the same wheel, from this host's pip
        wheels = checkout / "wheels"
        wheels.mkdir()
        wheel = host_cpu_torch(wheels, python) if FIRST_BUILD else None
        subprocess.run(["chown", "-R", f"{root.uid}:{root.gid}", str(wheels)], check=True)
        missing = f"no {CPU_TORCH} wheel for CPython {python} reachable from this host's pip configuration"
        said = (
            f"{wheel.name} copied in from this host's pip"
            if wheel
            else f"{missing}: the first build is not run"
            if FIRST_BUILD
            else "the first build is the full form's (nox -s newcomer), not this one's"
        )
        transcript.add("torch-wheel", blocks["torch-wheel"].commands, subprocess.CompletedProcess(
            [], 0, f"(not run: download.pytorch.org is unreachable here; {said})\n"
        ), 0.0)  # fmt: skip

        if wheel is not None:
            done = run("main-job")
            assert done.returncode == 0, done.stdout[-5000:]
            dist = checkout / "dist"
            built = f"kiln_vision_like-0.28.0+cpu.kiln1-cp{tag(python)}-cp{tag(python)}-linux_x86_64.whl"
            manifest = json.loads((dist / "manifest.json").read_text())
            (listed,) = manifest["wheels"]
            assert (listed["name"], listed["sha256"]) == (built, file_sha256(dist / built))
            with zipfile.ZipFile(dist / built) as archive:
                assert {"kiln_vision_like/_C.so", "kiln_vision_like/image.so"} <= set(archive.namelist())

        done = run("unit")
        assert done.returncode == 0, done.stdout[-5000:]
        summary = re.search(r"=+ (\d+) passed(.*) in [0-9.]+s", done.stdout)
        assert summary and "failed" not in summary.group(2) and "error" not in summary.group(2), done.stdout[
            -3000:
        ]
        # every skip names what this host lacks (a tool, torch, namespaces, a cgroup), never a bare skip
        skips = re.findall(r"(?m)^SKIPPED \[(\d+)\] [^:]+:\d+: (.*)$", done.stdout)
        bare = [reason for _, reason in skips if len(reason.split()) < 3]
        assert not bare, f"skips that do not say what is missing: {bare}"
        report(
            f"newcomer_{suite}_{mode}",
            {
                "python": python,
                "seconds": round(time.monotonic() - start, 1),
                "blocks": transcript.times,
                "skipped": {r: sum(int(n) for n, same in skips if same == r) for _, r in skips},
            },
        )
        if FIRST_BUILD:
            require(
                wheel is not None,
                f"{missing} (PyTorch's CPU index is unreachable): the first build was not run",
            )
    finally:
        shutil.rmtree(root.path, ignore_errors=True)
