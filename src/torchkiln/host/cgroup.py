"""This process's own cgroup: the memory and CPU limits a container or a systemd unit puts on a build, and the
kernel's count of the processes it killed there for memory.

``/proc/meminfo`` shows the machine; a container's limit is its cgroup's (``docker run --memory``, a
Kubernetes limit, systemd's ``MemoryMax=``), often far lower. The process's cgroup is named in
``/proc/self/cgroup`` and found on disk through ``/proc/self/mountinfo`` (a container usually sees its own
cgroup as the root of the mount, so the path is taken relative to the mount's root). Both hierarchies, per
the kernel's Documentation/admin-guide/cgroup-v2.rst and cgroup-v1/memory.rst, cpu.rst:

==========  =========================================  ==================================================
            cgroup v2 (unified hierarchy)              cgroup v1 (one hierarchy per controller)
==========  =========================================  ==================================================
limit       ``memory.max`` (``max``: none)             ``memory.limit_in_bytes`` (near 2**63: none)
kills       ``memory.events`` ``oom_kill N``           ``memory.oom_control`` ``oom_kill N`` (kernel 4.13+)
peak        ``memory.peak`` (kernel 5.19+)             ``memory.max_usage_in_bytes``
CPU         ``cpu.max`` (``QUOTA PERIOD``, ``max``)    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1)
==========  =========================================  ==================================================

A controller mounted as a v1 hierarchy is not on the v2 one (a hybrid host, such as this project's CI, has
the memory controller on v1 and an empty unified hierarchy), so a v1 mount wins. The limit that applies is
the lowest of the cgroup's and its ancestors' up to the mount's root (a parent slice may hold the limit).

``sysroot`` lets the tests point every path at a tree holding the kernel's files as it writes them.
Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# A v1 limit at or above this is "no limit" (the kernel writes PAGE_COUNTER_MAX pages: 0x7FFFFFFFFFFFF000).
V1_UNLIMITED = 2**62


@dataclass(frozen=True)
class Files:
    """The files of one controller in one hierarchy version."""

    limit: tuple[str, ...]  # one file ("memory.max") or quota and period files (cgroup v1 CPU)
    kills: str | None = None  # the file with an ``oom_kill N`` line
    peak: str | None = None


FILES: dict[tuple[str, int], Files] = {
    ("memory", 2): Files(("memory.max",), "memory.events", "memory.peak"),
    ("memory", 1): Files(("memory.limit_in_bytes",), "memory.oom_control", "memory.max_usage_in_bytes"),
    ("cpu", 2): Files(("cpu.max",)),
    ("cpu", 1): Files(("cpu.cfs_quota_us", "cpu.cfs_period_us")),
}


@dataclass(frozen=True)
class Limit:
    value: float  # bytes of memory, or CPUs (quota / period)
    file: str  # e.g. "cgroup v2 memory.max of /user.slice/build.scope": which file set it


@dataclass(frozen=True)
class Cgroup:
    """One controller's cgroup of a process: its version, its path as the kernel names it, its directory."""

    controller: str
    version: int
    path: str  # as /proc/<pid>/cgroup names it
    dir: Path  # where its files are
    mount: Path  # the hierarchy's mount point: the top the limits are read up to

    @property
    def files(self) -> Files:
        return FILES[(self.controller, self.version)]

    def limit(self) -> Limit | None:
        """The lowest limit of the cgroup and its ancestors up to the mount, None when none is set."""
        found: Limit | None = None
        directory, path = self.dir, self.path
        while True:
            value = _read_limit(directory, self.files.limit)
            if value is not None and (found is None or value < found.value):
                names = "/".join(self.files.limit)
                found = Limit(value, f"cgroup v{self.version} {names} of {path or '/'}")
            if directory == self.mount or not directory.is_relative_to(self.mount):
                return found
            directory, path = directory.parent, path.rsplit("/", 1)[0]

    def oom_kills(self) -> int | None:
        """How many processes the kernel's OOM killer killed in this cgroup (v2: and below it) so far; None
        when the kernel keeps no count here."""
        if self.files.kills is None:
            return None
        for line in _read(self.dir / self.files.kills).splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return None

    def peak(self) -> int | None:
        """The highest memory use the cgroup has seen (bytes), None when the kernel does not say."""
        text = _read(self.dir / self.files.peak).strip() if self.files.peak else ""
        return int(text) if text.isdigit() else None


def find(controller: str, *, pid: str = "self", sysroot: Path = Path("/")) -> Cgroup | None:
    """The cgroup of process ``pid`` for ``controller`` ("memory" or "cpu"), None when it has none here."""
    lines = _read(sysroot / f"proc/{pid}/cgroup").splitlines()
    mounts = _mounts(_read(sysroot / f"proc/{pid}/mountinfo"))
    for version in (1, 2):
        path = _cgroup_path(lines, controller, version)
        mount = _mount_for(mounts, controller, version, sysroot)
        if path is None or mount is None:
            continue
        point, root = mount
        if version == 2 and controller not in _read(point / "cgroup.controllers").split():
            continue  # the unified hierarchy does not carry this controller on this host
        relative = path[len(root) :] if root != "/" and path.startswith(root) else path
        directory = point / relative.lstrip("/")
        if not directory.is_dir():  # a path from outside this mount namespace: the mount is the cgroup
            directory = point
        return Cgroup(controller, version, path, directory, point)
    return None


def _cgroup_path(lines: list[str], controller: str, version: int) -> str | None:
    """The path /proc/<pid>/cgroup gives for the controller: ``N:memory:/path`` (v1), ``0::/path`` (v2)."""
    for line in lines:
        number, _, rest = line.partition(":")
        names, _, path = rest.partition(":")
        if version == 2 and number == "0" and names == "":
            return path
        if version == 1 and controller in names.split(","):
            return path
    return None


def _mounts(text: str) -> list[tuple[str, str, str, str]]:
    """(filesystem type, super options, root, mount point) of each mountinfo line: ``36 25 0:31 / /sys/fs/
    cgroup/memory rw,nosuid - cgroup cgroup rw,memory`` (proc(5): the optional fields end at ``-``)."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if sep and len(fields) >= 5 and len(tail) >= 3:
            mounts.append((tail[0], tail[2], fields[3], fields[4]))
    return mounts


def _mount_for(
    mounts: list[tuple[str, str, str, str]], controller: str, version: int, sysroot: Path
) -> tuple[Path, str] | None:
    for fstype, options, root, point in mounts:
        if (version == 2 and fstype == "cgroup2") or (
            version == 1 and fstype == "cgroup" and controller in options.split(",")
        ):
            return sysroot / point.lstrip("/"), root
    return None


def _read_limit(directory: Path, names: tuple[str, ...]) -> float | None:
    """A cgroup's own limit: bytes of memory, or CPUs (quota / period); None for none."""
    if len(names) == 2:  # cgroup v1 CPU: quota and period, each in its own file
        return _ratio(*(_read(directory / name).strip() for name in names))
    words = _read(directory / names[0]).split()
    if len(words) == 2:  # cgroup v2 cpu.max: "QUOTA PERIOD", or "max PERIOD"
        return _ratio(*words)
    if len(words) == 1 and words[0].isdigit():
        value = int(words[0])
        return None if value >= V1_UNLIMITED else float(value)
    return None  # "max", or no such file


def _ratio(quota: str, period: str) -> float | None:
    if quota.isdigit() and period.isdigit() and int(quota) > 0 and int(period) > 0:
        return int(quota) / int(period)
    return None  # "max" or -1: no quota


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
