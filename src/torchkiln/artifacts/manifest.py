"""``dist/manifest.json``: what was built, from what, with what, how long it took; a typed, versioned document.

Written once per build by the publish step (:mod:`torchkiln.build.publish`) and read back with
:func:`load_manifest` by ``torchkiln verify --manifest`` (and, after issue 10, the images). Every figure is
one the build observed, not one it assumed:

* ``sources``: the lock file's entries (commit, or the tree's sha256 when there is no commit);
* ``toolchain``: the tools the compile steps really used, at the versions they report
  (:mod:`torchkiln.host.toolchain`), recorded when they compiled;
* ``build_env``: the variables each project's compile step ran with (the compiler cache's effective ones,
  never a secret);
* ``steps``: each step of this run, and for a compile step each time it resumed with fewer jobs after
  compiles died for memory (``memory_retries``: jobs before and after, the units killed, their peak alone);
* ``cache``: this run's compiler-cache statistics, None when this run compiled nothing;
* ``dist``: distributed compiles, when asked for: whether the cluster was used and how many compiles ran on
  its servers, here, from the cache, and fell back to here;
* ``wheels``: name, version, size, sha256 of each published wheel, and ``files_sha256``, the digest of the
  files it installs (:func:`torchkiln.artifacts.wheelfile.record_digest`), which the installed copy can be checked
  against without the wheel at hand; and ``portability``, where it runs, read from the wheel installed
  (:mod:`torchkiln.artifacts.portability`);
* ``rebuild``: what ``torchkiln reproduce`` needs to build them again (:class:`Rebuild`).

A field is added here and filled in :func:`torchkiln.build.publish._manifest` from what the steps recorded; the
loader checks its type like every other field's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from torchkiln.files.digests import file_sha256
from torchkiln.host.toolchain import Toolchain
from torchkiln.recipe.model import Recipe

from . import jsonfile, wheelfile
from .lockfile import SourceLock
from .portability import Portability

MANIFEST_FORMAT = 2  # 2: typed document (issue 12): toolchain tools, tree hashes, wheel versions and files


@dataclass(frozen=True)
class RecipeInfo:
    name: str
    path: str | None
    sha256: str
    torch_version: str
    torchvision_version: str
    python: str
    accelerator: str
    cuda: str | None
    arch_list: list[str]
    # every Python the build made wheels for (python.versions; python is the first); empty before issue 23
    pythons: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, recipe: Recipe) -> RecipeInfo:
        """What the manifest says of the recipe the wheels were built with."""
        return cls(
            name=recipe.name,
            path=str(recipe.path) if recipe.path else None,
            sha256=recipe.sha256,
            torch_version=recipe.torch_wheel_version,
            torchvision_version=recipe.torchvision_wheel_version,
            python=recipe.python,
            accelerator=recipe.accelerator.kind,
            cuda=str(recipe.accelerator.cuda) if recipe.accelerator.cuda else None,
            arch_list=list(recipe.accelerator.arch_list),
            pythons=list(recipe.python_versions),
        )


@dataclass(frozen=True)
class Jobs:
    """How many compiles ran at once (MAX_JOBS) and who decided it, as torchkiln.plan.jobs decided it."""

    value: int
    source: str  # "--jobs", "recipe" or "auto"
    reason: str


@dataclass(frozen=True)
class KilledUnit:
    """A compile the kernel killed for memory (torchkiln.build.memory): the unit, and how it went alone."""

    unit: str  # its source file, as the build names it (else ninja's output)
    target: str  # ninja's output (the object file)
    evidence: str  # the log line that said it died
    # Rebuilt alone (ninja -j1) before the step resumed: "built", "killed" (which stops the build) or None
    # (not rebuilt alone: no ninja build directory named it; the resumed step built it)
    alone: str | None = None
    peak_rss: int | None = None  # bytes its compile's largest process reached when rebuilt alone


@dataclass(frozen=True)
class MemoryRetry:
    """One resumption of a compile step after compiles died for memory: why, and with how many jobs."""

    attempt: int  # 1, 2, ...: the retry's number
    jobs_before: int  # MAX_JOBS of the run that died
    jobs_after: int  # MAX_JOBS the step resumed with
    killed: list[KilledUnit] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)  # what said so (log lines, the cgroup's counter)
    oom_kills: int | None = None  # the cgroup's oom_kill counter rose by this much; None: no counter
    log: str | None = None  # the log of the run that died


@dataclass(frozen=True)
class StepRecord:
    """One step of this run: ran, skipped (unchanged) or reused (from the environment store), how long, its log."""

    name: str
    stage: str
    project: str
    status: str  # "ran" | "skipped" (unchanged) | "reused" (its venv cloned from the environment store)
    duration_s: float
    log: str | None
    phases: dict[str, float] | None = None  # compile steps: configure / compile / wheel seconds
    last_run_s: float | None = None  # seconds of the step's last real run (this one, or an earlier)
    # compile steps: each time this run resumed the step with fewer jobs after compiles died for memory
    memory_retries: list[MemoryRetry] = field(default_factory=list)
    # torchkiln's own time for the step beyond its command (duration_s) in this run: deciding it is unchanged
    # (hashing what it reads), preparing it, probing the tools it used, hashing what it wrote, recording it,
    # keeping its venv in the environment store (issue 38: no time the steps do not account for)
    overhead_s: float = 0.0


@dataclass(frozen=True)
class HitsMisses:
    hits: int | None
    misses: int | None


@dataclass(frozen=True)
class CacheRecord:
    tool: str
    hits: int
    misses: int
    uncacheable: int
    hit_rate: float | None
    local: HitsMisses
    remote: HitsMisses
    errors: int
    by_language: dict[str, HitsMisses]


@dataclass(frozen=True)
class ClusterRecord:
    """Distributed compiles (sccache-dist) of this run: asked for, used, and where the compiles ran."""

    scheduler_url: str
    used: bool  # False: the preflight failed (one warning) and every compile ran locally
    remote: int = 0  # compiles that ran on a build server
    local: int = 0  # compiles that ran here: fallbacks and nvcc's driver steps included
    cache_hits: int = 0
    fallback: int = 0  # sent to the cluster, failed there, compiled here
    by_server: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckResult:
    status: str  # "pass" | "fail" | "skip"
    message: str


@dataclass(frozen=True)
class Checks:
    """What the post-build check found (``skipped`` with ``--skip-postcheck``)."""

    skipped: bool = False
    torch: str | None = None
    cuda: str | None = None
    torchvision: str | None = None
    results: dict[str, CheckResult] = field(default_factory=dict)


@dataclass(frozen=True)
class WheelRecord:
    name: str
    project: str
    version: str
    size: int
    sha256: str
    files_sha256: str  # wheelfile.record_digest of its RECORD: what an installation must hold
    python: str = ""  # the Python it was built for ("3.12", "3.13t"); "" in manifests from before issue 23
    # Where it runs (issue 34: manylinux policy, glibc, each NEEDED entry resolved; docs/portability.md);
    # None in manifests from before it
    portability: Portability | None = None

    @classmethod
    def of(cls, path: Path, project: str, python: str = "") -> WheelRecord:
        parsed = wheelfile.parse(path.name)
        version = parsed.version if parsed is not None else ""
        digest = wheelfile.record_digest(wheelfile.wheel_record(path))
        return cls(path.name, project, version, path.stat().st_size, file_sha256(path), digest, python)


@dataclass(frozen=True)
class GivenTorchRecord:
    """``--torch``: what torchvision was built against instead of the recipe's own torch build."""

    install: str  # as pip installed it: a wheel's absolute path, or a requirement (torch==2.6.0)
    sha256: str | None = None  # the wheel file's; None for a requirement


@dataclass(frozen=True)
class Rebuild:
    """What ``torchkiln reproduce`` needs beyond the recipe and the sources to build the same wheels again
    (torchkiln.artifacts.record): each compile's ``SOURCE_DATE_EPOCH`` (a tree without git takes it from
    its newest file, whose mtime a copy or an extraction resets), the files the build wrote into a tree
    without git (left out of its ``tree_sha256``), the torch a ``--torch`` build installed, and the compiler
    cache's tool."""

    source_date_epoch: dict[str, int] = field(default_factory=dict)  # project -> epoch
    tree_outputs: dict[str, list[str]] = field(default_factory=dict)  # project -> in-tree outputs
    torch: GivenTorchRecord | None = None
    # the compiler cache the compiles ran through (ccache rewrites paths under its basedir to relative ones in
    # the command it runs, so the tool is an input of the objects, whatever the cache held)
    cache: str = ""


@dataclass(frozen=True)
class Isolation:
    """How the build steps (env, compile, package, checks) ran (torchkiln.build.sandbox): ``bubblewrap`` when
    every one ran in a sandbox that hides the signing key, the user's home and the build's other secrets
    from it; ``none`` when any did not, with the reason and those steps."""

    mode: str  # "bubblewrap" | "none"
    reason: str | None = None
    steps: list[str] = field(default_factory=list)  # the build steps that ran without a sandbox
    # "none" signed all the same: the signer passed --allow-unisolated (a signed build is refused otherwise)
    allow_unisolated: bool = False


@dataclass(frozen=True)
class Manifest:
    format: int
    torchkiln: str
    started: str
    finished: str
    recipe: RecipeInfo
    projects: list[str]
    jobs: Jobs
    sources: dict[str, SourceLock]
    toolchain: Toolchain
    build_env: dict[str, dict[str, str]]
    stages: dict[str, float]
    steps: list[StepRecord]
    cache: CacheRecord | None
    checks: Checks
    wheels: list[WheelRecord]
    warnings: list[str] = field(default_factory=list)
    # The pins every pip call of the build was held to (build-env:deps' constraints file).
    constraints: list[str] = field(default_factory=list)
    # None: no distributed compiles were asked for. The key keeps its name from before issue 48 (the cluster was
    # "dist"): manifests are read by older tools.
    dist: ClusterRecord | None = None
    # A build for several Pythons (python.versions): the post-build check of each Python after the first, by
    # Python ("3.12": its Checks); ``checks`` is the first Python's. Empty for one Python.
    python_checks: dict[str, Checks] = field(default_factory=dict)
    # What `torchkiln reproduce` rebuilds with (None in manifests from before issue 35)
    rebuild: Rebuild | None = None
    isolation: Isolation | None = None  # None: a manifest from before isolation was recorded
    # torchkiln's own seconds outside the steps: "plan" (the recipe read, the plan made, a --torch requirement
    # resolved), "preflight" (the host's checks before the first step) and "publish" (from the last step to
    # this manifest: the trees' locks, the wheels copied, their portability records and SBOMs). What none
    # says (start-up and imports, the signature after this file) is not here. A library caller's build has
    # "publish" only.
    overhead: dict[str, float] = field(default_factory=dict)

    def wheel(self, project: str) -> WheelRecord | None:
        return next((w for w in self.wheels if w.project == project), None)


def stages_of(steps: list[StepRecord]) -> dict[str, float]:
    """Seconds per stage; a compile step's time is split into its phases (configure, compile, wheel)."""
    stages: dict[str, float] = {}
    for step in steps:
        for stage, seconds in (step.phases or {step.stage: step.duration_s}).items():
            stages[stage] = round(stages.get(stage, 0.0) + seconds, 3)
    return stages


def write_manifest(path: Path, manifest: Manifest) -> None:
    jsonfile.write(path, manifest)


def load_manifest(path: Path) -> Manifest:
    """Read a manifest; DocumentError (exit 2) naming the file and each bad field otherwise."""
    return jsonfile.read(path, Manifest, what="manifest", version=MANIFEST_FORMAT)
