"""A newcomer follows README.md on a fresh minimal Debian (issue 20): ``debootstrap --variant=minbase bookworm``
(the session's root, tests/conftest.py), then only the README's commands, taken from README.md itself (the
code blocks marked ``<!-- newcomer: NAME -->``, in order, so the README and this test cannot drift), once as
root and once as a user with sudo (who puts ``sudo`` in front of each ``apt-get`` line, as the README says):

* ``run-deps``, ``setup``: what torchkiln needs to run, and the checkout's venv;
* ``check-missing``: ``torchkiln check`` names every tool a build still lacks (exit 2), exactly as the README
  quotes it;
* ``build-deps``, ``check-ok``: the build packages, after which the check passes;
* ``torch-wheel``, ``main-job``: the first build from a local tree (tests/data/vision_like as the CPU test
  recipe's torchvision against upstream's CPU torch wheel); the one command not run is the download from
  PyPI's CPU index, unreachable here: the same wheel comes from this host's pip configuration instead;
* ``unit``: ``nox -s unit``, green with the torch PyPI gives (upstream's CUDA 13.0 build).

Heavy (apt, pip with a 4.7 GB torch, a 44-file compile, the unit tests, twice): ``nox -s newcomer`` only,
not a default session. What each command printed, and its time, go to .torchkiln/newcomer/<mode>.md.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from chroot import Root, copy_checkout, make_root
from imagekit import report
from readmekit import readme_blocks

from torchkiln.files.digests import file_sha256

pytestmark = [pytest.mark.integration, pytest.mark.newcomer]

ROOT = Path(__file__).resolve().parents[2]
TRANSCRIPTS = ROOT / ".torchkiln" / "newcomer"
CPU_TORCH = "torch==2.13.0+cpu"  # what the torch-wheel block downloads
WHEEL = "kiln_vision_like-0.28.0+cpu-cp311-cp311-linux_x86_64.whl"


def as_user_with_sudo(commands: str) -> str:
    """What the README says a user with sudo does: sudo in front of each apt-get line."""
    return re.sub(r"(?m)^apt-get ", "sudo apt-get ", commands)


def host_cpu_torch(dest: Path) -> Path:
    """The torch-wheel block's wheel from this host's pip configuration (its index or find-links), as the
    block's own download would give it from PyTorch's CPU index."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(dest), CPU_TORCH],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(
            f"no {CPU_TORCH} wheel reachable from this host's pip configuration: {done.stderr[-500:]}"
        )
    (wheel,) = dest.glob("torch-2.13.0+cpu-*.whl")
    return wheel


class Transcript:
    """What the newcomer saw: each block's commands, output, exit status and time."""

    def __init__(self, mode: str) -> None:
        self.path = TRANSCRIPTS / f"{mode}.md"
        self.times: dict[str, float] = {}
        TRANSCRIPTS.mkdir(parents=True, exist_ok=True)
        self.path.write_text(f"# README.md in a fresh debootstrap root, as {mode}\n")

    def add(self, name: str, commands: str, done: subprocess.CompletedProcess[str], seconds: float) -> None:
        self.times[name] = round(seconds, 1)
        shown = "\n".join(f"$ {line}" for line in commands.splitlines())
        with self.path.open("a") as out:
            out.write(
                f"\n## {name} (exit {done.returncode}, {seconds:.0f} s)\n\n```console\n{shown}\n{done.stdout}```\n"
            )


def run_block(
    root: Root, transcript: Transcript, name: str, commands: str
) -> subprocess.CompletedProcess[str]:
    start = time.monotonic()
    done = root.run(commands, timeout=3600)
    transcript.add(name, commands, done, time.monotonic() - start)
    return done


@pytest.mark.timeout(7200)
@pytest.mark.parametrize("mode", ["root", "user-with-sudo"])
def test_the_readme_takes_a_newcomer_from_a_minimal_debian_root_to_a_wheel_and_green_tests(
    debootstrap_root: Path, tmp_path: Path, mode: str
) -> None:
    blocks = {b.name: b for b in readme_blocks()}
    root = make_root(debootstrap_root, tmp_path, "root" if mode == "root" else "newcomer")
    try:
        copy_checkout(ROOT, root)
        transcript = Transcript(mode)
        start = time.monotonic()

        def run(name: str, commands: str | None = None) -> subprocess.CompletedProcess[str]:
            text = blocks[name].commands if commands is None else commands
            return run_block(root, transcript, name, text if root.user == "root" else as_user_with_sudo(text))

        assert shutil.which("python3", path=str(root.host_path("/usr/bin"))) is None  # nothing but minbase

        done = run("run-deps")
        assert done.returncode == 0, done.stdout[-3000:]
        done = run("setup")
        assert done.returncode == 0, done.stdout[-3000:]

        # every tool a build lacks, named with its fix, exactly as README.md quotes it (paths as root's)
        done = run("check-missing")
        assert done.returncode == 2, done.stdout[-3000:]
        seen = [line.replace(root.home + "/", "/root/") for line in done.stdout.strip().splitlines()]
        assert seen == blocks["check-missing"].quoted, done.stdout

        done = run("build-deps")
        assert done.returncode == 0, done.stdout[-3000:]
        done = run("check-ok")
        assert (
            done.returncode == 0
            and "ok: this host can build torch, torchvision of torch-2.13-cpu-py311" in done.stdout
        )

        # torch-wheel: PyTorch's CPU index is not reachable here; the same wheel, from this host's pip
        wheels = root.host_path(root.checkout) / "wheels"
        wheels.mkdir()
        wheel = host_cpu_torch(wheels)
        subprocess.run(["chown", "-R", f"{root.uid}:{root.gid}", str(wheels)], check=True)
        transcript.add("torch-wheel", blocks["torch-wheel"].commands, subprocess.CompletedProcess(
            [], 0, f"(not run: download.pytorch.org is unreachable here; {wheel.name} copied in from this host's pip)\n"
        ), 0.0)  # fmt: skip

        done = run("main-job")
        assert done.returncode == 0, done.stdout[-5000:]
        dist = root.host_path(root.checkout) / "dist"
        manifest = json.loads((dist / "manifest.json").read_text())
        (listed,) = manifest["wheels"]
        assert (listed["name"], listed["sha256"]) == (WHEEL, file_sha256(dist / WHEEL))
        with zipfile.ZipFile(dist / WHEEL) as built:
            assert {"kiln_vision_like/_C.so", "kiln_vision_like/image.so"} <= set(built.namelist())

        done = run("unit")
        assert done.returncode == 0, done.stdout[-5000:]
        summary = re.search(r"=+ (\d+) passed(.*) in [0-9.]+s", done.stdout)
        assert summary and "failed" not in summary.group(2) and "error" not in summary.group(2), done.stdout[
            -3000:
        ]
        report(
            f"newcomer_{mode}", {"seconds": round(time.monotonic() - start, 1), "blocks": transcript.times}
        )
    finally:
        shutil.rmtree(root.path, ignore_errors=True)
