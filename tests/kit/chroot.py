"""A minimal Debian root to run README.md's commands in, as a newcomer's fresh machine: a copy of the session's
debootstrap root of the suite (tests/newcomer/conftest.py), the checkout as a bare repository the README's
``git clone`` clones (``/srv/torchkiln.git``, by a file:// URL in ``$TORCHKILN_URL``: where the user's URL
would point), commands run through ``chroot`` in a private mount namespace (``unshare --mount``: /dev, /proc and /sys are mounted for the commands and vanish with
them, nothing stays mounted on the host). The host's network (PyPI, Debian's archive) is the root's.

What the harness does besides the README's commands, each what a newcomer's machine already has:
``/etc/resolv.conf`` and ``/etc/hosts``; the host's CA bundle as a local CA (this machine reaches the
internet through a TLS-intercepting egress proxy, as a corporate network would; ``ca-certificates``, which
the README installs, adds it to the system bundle); for the user with sudo, ``sudo`` and the user; pip
without a cache (``PIP_NO_CACHE_DIR``: the disk is shared, and the root is removed at the end anyway).
"""

from __future__ import annotations

import datetime
import email.utils
import os
import re
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
USER = "newcomer"
# apt's downloads, kept between runs on the host (the same packages each time; apt checks them).
APT_CACHE = Path.home() / ".cache" / "torchkiln" / "newcomer" / "apt"


@dataclass(frozen=True)
class Root:
    """A root and who runs commands in it: root, or the user with sudo."""

    path: Path
    user: str  # "root" or USER
    uid: int
    gid: int
    environ: dict[str, str] = field(default_factory=dict)  # more of the terminal's environment

    @property
    def home(self) -> str:
        return "/root" if self.user == "root" else f"/home/{self.user}"

    @property
    def checkout(self) -> str:
        return f"{self.home}/torchkiln"

    def host_path(self, inside: str) -> Path:
        return self.path / inside.lstrip("/")

    def run(
        self, script: str, *, as_root: bool = False, timeout: float = 3600
    ) -> subprocess.CompletedProcess[str]:
        """Run a bash script in the root, as its user (or as root, for the harness), at the checkout with its
        venv active once the set-up made one (the terminal the README's commands are typed into), in a clean
        environment; stdout and stderr together."""
        name = f".newcomer-{os.getpid()}-{abs(hash(script))}.sh"
        home = "/root" if as_root else self.home
        file = self.host_path(home) / name
        prelude = f"cd {self.checkout} 2>/dev/null || cd {home}\nif [ -f .venv/bin/activate ]; then . .venv/bin/activate; fi\n"
        file.write_text(prelude + "set -e\n" + script + "\n")
        userspec = "0:0" if as_root else f"{self.uid}:{self.gid}"
        env = [
            *(f"{k}={v}" for k, v in sorted(self.environ.items())),
            "HOME=" + home,
            "PATH=" + PATH,
            "LANG=C.UTF-8",
            "TERM=dumb",
            "USER=" + ("root" if as_root else self.user),
            "LOGNAME=" + ("root" if as_root else self.user),
        ]
        mounts = (
            f'mount --rbind /dev "$1/dev" && mount -t proc proc "$1/proc" && mount -t sysfs sys "$1/sys" '
            f'&& mkdir -p "{APT_CACHE}" && mount --bind "{APT_CACHE}" "$1/var/cache/apt/archives" '
        )
        argv = [
            "unshare", "--mount", "--propagation", "private", "--", "bash", "-c",
            f'{mounts}&& cd / && exec chroot --userspec={userspec} "$1" /usr/bin/env -i "${{@:2}}"',
            "chroot-run", str(self.path), *env, "/bin/bash", f"{home}/{name}",
        ]  # fmt: skip
        try:
            return subprocess.run(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                timeout=timeout, check=False,
            )  # fmt: skip
        finally:
            file.unlink(missing_ok=True)


def make_root(debootstrap_root: Path, where: Path, user: str) -> Root:
    """A copy of the debootstrap root, ready for a newcomer (see the module's docstring); with ``user`` other
    than root, that user exists and has sudo."""
    path = where / "root"
    subprocess.run(["cp", "-a", str(debootstrap_root), str(path)], check=True)
    shutil.copyfile("/etc/resolv.conf", path / "etc" / "resolv.conf")
    (path / "etc" / "hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {socket.gethostname()}\n")
    if HOST_CA.is_file():
        local = path / "usr" / "local" / "share" / "ca-certificates"
        local.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(HOST_CA, local / "host-ca.crt")
    _accept_a_stored_suite(path)
    root = Root(path, "root", 0, 0)
    if user == "root":
        return root
    done = root.run(
        f"apt-get update -qq && apt-get install -y -qq sudo >/dev/null && useradd --create-home --shell /bin/bash "
        f"{user} && echo '{user} ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/{user} && chmod 0440 "
        f"/etc/sudoers.d/{user} && id -u {user} && id -g {user}",
        as_root=True,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    uid, gid = (int(x) for x in done.stdout.split()[-2:])
    return Root(path, user, uid, gid)


def _accept_a_stored_suite(path: Path) -> None:
    """The archive this machine reaches may be a stored copy: a suite whose Release says ``Valid-Until`` a day
    past (Debian's testing suite, forky, is valid for a week) is then refused by apt-get update, where a
    newcomer's live mirror serves a fresh one. Only for such a suite does the root's apt accept it as it is
    (``Acquire::Check-Valid-Until false``), and the harness says so in the root's apt configuration."""
    now = datetime.datetime.now(datetime.timezone.utc)
    for release in (path / "var" / "lib" / "apt" / "lists").glob("*_InRelease"):
        found = re.search(r"(?m)^Valid-Until: (.+)$", release.read_text(errors="replace"))
        if found and email.utils.parsedate_to_datetime(found.group(1)) < now:
            (path / "etc" / "apt" / "apt.conf.d" / "99newcomer-stored-archive").write_text(
                f"// tests/newcomer: {release.name} expired {found.group(1)}: this machine's archive is a "
                'stored copy\nAcquire::Check-Valid-Until "false";\n'
            )
            return


def publish_checkout(source: Path, root: Root) -> tuple[str, str]:
    """The checkout as git sees it (tracked files as they are now, and untracked ones it does not ignore),
    committed to a bare repository in the root that the user owns: what the README's ``git clone`` clones,
    by its file:// URL. Returns (the URL, the commit). The commit is made with a temporary index, so the
    checkout's own index and branches are untouched (it is an unreferenced object there, for git gc)."""
    with tempfile.TemporaryDirectory(prefix="newcomer-index-") as scratch:
        env = {
            **os.environ, "GIT_INDEX_FILE": str(Path(scratch) / "index"),
            "GIT_AUTHOR_NAME": "newcomer", "GIT_AUTHOR_EMAIL": "newcomer@localhost",
            "GIT_COMMITTER_NAME": "newcomer", "GIT_COMMITTER_EMAIL": "newcomer@localhost",
        }  # fmt: skip

        def git(*args: str) -> str:
            return subprocess.run(
                ["git", "-C", str(source), *args], env=env, capture_output=True, text=True, check=True
            ).stdout.strip()

        git("add", "--all", ".")
        commit = git("commit-tree", git("write-tree"), "-m", "the checkout as it is, for tests/newcomer")
    inside = "/srv/torchkiln.git"
    bare = root.host_path(inside)
    bare.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "--quiet", "--bare", "--initial-branch=main", str(bare)], check=True)
    subprocess.run(
        ["git", "-C", str(source), "push", "--quiet", str(bare), f"{commit}:refs/heads/main"], check=True
    )
    subprocess.run(["chown", "-R", f"{root.uid}:{root.gid}", str(bare)], check=True)
    return f"file://{inside}", commit
