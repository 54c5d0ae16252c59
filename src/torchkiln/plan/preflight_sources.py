"""Preflight's checks of what the build starts from: git new enough to fetch, each ``--source-dir`` tree at
the recipe's release (:func:`~torchkiln.plan.source_adoption.source_versions`) and with its submodules, and
the torch wheel that ``--only torchvision`` builds against.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator

from packaging.version import Version

from torchkiln.artifacts.wheelfile import parse
from torchkiln.host import distro as distros
from torchkiln.recipe import cmake_options
from torchkiln.source import submodules

from .given_torch import suited_requirement
from .model import Plan
from .preflight_findings import Finding, Host, _run
from .source_adoption import source_versions


def _git(plan: Plan, host: Host) -> Iterator[Finding]:
    if all(s.provided for s in plan.sources):
        return
    low = Version(cmake_options.host_tools(str(plan.recipe.torch.version))["git_min"])
    path = shutil.which("git", path=host.environ.get("PATH", os.defpath))
    want = f"git >= {low} (submodule update --jobs; data/host_tools.toml)"
    if path is None:
        yield Finding(
            "git",
            "no git on PATH",
            want,
            f"{distros.install(host.distro, 'git')}, or give --source-dir checkouts",
        )
        return
    done = _run([path, "--version"], host)
    text = done if isinstance(done, str) else done.stdout
    match = re.search(r"git version (\d+(?:\.\d+)+)", text)
    if match is None or Version(match.group(1)) < low:
        shown = f"git {match.group(1)}" if match else f"{path} ({text.strip()[:80]})"
        yield Finding("git", shown, want, "install a newer git")


def _sources(plan: Plan, host: Host) -> Iterator[Finding]:
    r = plan.recipe
    given = {s.name: s.path for s in plan.sources if s.provided}
    for project, found in source_versions(r, given).items():
        shown = f"{found.text!r} in {found.path}" if found.text is not None else f"no {found.path}"
        yield Finding(
            f"source:{project}",
            shown,
            f"{project} {r.spec(project).version} ({project}.version)",
            f"check out {r.spec(project).ref} in that tree, or build the tree's own version with "
            f"--accept-source-version {project} (recorded in the manifest)",
        )


def _submodules(plan: Plan, host: Host) -> Iterator[Finding]:
    """A given tree without its submodules (a source archive, a clone without --recursive) fails after the
    env steps, in third_party/; refused here, naming them. PyTorch's setup.py skips its own check under
    ``USE_SYSTEM_LIBS`` (the system's libraries instead of the submodules): so does this one."""
    for source in plan.sources:
        if not source.provided or _truthy(plan.env_for(source.name).get("USE_SYSTEM_LIBS")):
            continue
        missing = submodules.missing_submodules(source.path)
        if missing is not None:
            yield Finding(
                f"submodules:{source.name}",
                missing.found(),
                "every submodule the tree declares, with its files (the build compiles them)",
                f"run `{submodules.FIX}` in {source.path} (a git checkout), or use a source archive that "
                "carries the submodules (upstream's release tarball, e.g. pytorch-v2.6.0.tar.gz, does; "
                "GitHub's source archives do not)",
            )


def _truthy(value: str | None) -> bool:
    """A CMake-style true value. (setup.py's own test is ``bool(os.getenv(...))``, true even for "0"; a tree
    built with USE_SYSTEM_LIBS=0 uses its submodules, so it is checked here.)"""
    return value is not None and value.strip().upper() not in ("", "0", "OFF", "FALSE", "NO", "N")


def _torch_wheel(plan: Plan, host: Host) -> Iterator[Finding]:
    """``--only torchvision`` without ``--torch`` installs the recipe's own torch build, which only an
    earlier torchkiln build leaves (in dist/, or the work directory's wheelhouse): without it the build would
    stop in pip at install-torch, after the env steps."""
    r = plan.recipe
    wanted = f"torch=={r.torch_wheel_version}"
    install = next((s for s in plan.steps if s.name == "torchvision:install-torch"), None)
    # --torch's torch is checked where it is given (plan.given_torch), also when it reads as the recipe's own
    if "torch" in plan.projects or install is None or plan.given_torch is not None:
        return
    places = (plan.paths.dist, plan.paths.wheelhouse / "torch")
    requirement, index = suited_requirement(r)
    for place in places:
        for wheel in place.glob("torch-*.whl") if place.is_dir() else ():
            name = parse(wheel.name)
            if name is not None and name.project == "torch" and name.version == r.torch_wheel_version:
                return
    yield Finding(
        "torch-wheel",
        f"no torch {r.torch_wheel_version} wheel in {places[0]} or {places[1]}",
        f"the recipe's own torch build ({wanted}), which --only torchvision builds against",
        f"build torch first (torchkiln build {r.name} --only torch, with the same --dist), or build against "
        f"a torch you have: --torch WHEEL (a torch wheel file), or --torch {requirement} where pip's index "
        f"has it (PyTorch's: --extra-index-url {index})",
    )
