"""The post-build check's portability part, and the record every published wheel carries (issue 34).

After the post-build check has installed the built wheels in its clean venv (pip brought what their
Requires-Dist names, nothing else), each wheel is read there by :mod:`torchkiln.artifacts.abi` (analysed in the
step's outputs, so a skipped or reused check keeps its record) and judged against the recipe's ``[deploy]
system_libraries`` (again on every run: the recipe may have changed). A wheel that needs a library the target
machines are not known to have stops the build before anything is published, naming the library and the file
that needs it (:func:`torchkiln.artifacts.portability.refusal`).

A build whose checks are skipped (``--skip-postcheck``) still records: the publish step reads each wheel unpacked
beside the build venv's distributions (:func:`records`), says so in the record's ``analysed``, and warns,
instead of stopping, about what the check would have refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from torchkiln.artifacts import jsonfile, wheelfile
from torchkiln.artifacts.manifest import WheelRecord
from torchkiln.artifacts.portability import (
    Portability,
    one_line,
    refusal,
    retarget,
    system_libraries_fix,
    unresolved_names,
)
from torchkiln.errors import BuildFailed
from torchkiln.files.digests import file_sha256
from torchkiln.plan.model import Step
from torchkiln.plan.records import Records

from .context import BuildRecord, BuildSetup

IN_CHECK_VENV = "installed by the post-build check (pip: the wheel and its Requires-Dist) in a clean venv"
IN_BUILD_VENV = (
    "the wheel unpacked beside the build venv's distributions (the post-build check was skipped: nothing pip "
    "would bring that the build venv lacks was read)"
)
UNRESOLVED = (
    "not bundled, not in a declared distribution, not allowed by a manylinux policy, not the NVIDIA driver's, "
    "not in [deploy] system_libraries"
)


def site_packages(venv: Path) -> list[Path]:
    """The venv's site-packages directories (lib/pythonX.Y/site-packages; lib64 is a link to lib)."""
    found = {p.resolve(): p for p in sorted(venv.glob("lib*/python*/site-packages")) if p.is_dir()}
    return list(found.values())


def checked_wheels(step: Step) -> list[Path]:
    """The built wheels a check step installs: its ``--expect PROJECT==VERSION`` found in its
    ``--wheelhouse`` directories, as the post-build check itself finds them (postcheck.built_wheel)."""
    argv = list(step.argv)
    values = {
        flag: [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]
        for flag in ("--expect", "--wheelhouse")
    }
    houses = [Path(d) for d in values["--wheelhouse"]]
    found = []
    for item in values["--expect"]:
        project, _, version = item.partition("==")
        found += wheelfile.find(houses, project=project, version=version)[:1]
    return found


def kept_readings(setup: BuildSetup) -> contextlib.AbstractContextManager[None]:
    """Within it, what the ELF reader finds is kept with the build's records (the work directory's and the
    environment store's, ``elf/``), by file identity: the check's venv and the build venv hold hard links of
    the same torch libraries, and a fresh work directory on this machine links the same store objects."""
    from torchkiln.artifacts import elf

    plan = setup.plan
    return elf.keeping([d / "elf" for d in Records.for_build(plan.paths.workdir, plan.env_store).dirs])


def analyse_checked(step: Step, setup: BuildSetup | None = None) -> dict[str, Any]:
    """Wheel file name -> its record (JSON data), read in the check step's venv (the step's outputs)."""
    with kept_readings(setup) if setup is not None else contextlib.nullcontext():
        return _analyse_checked(step)


def _analyse_checked(step: Step) -> dict[str, Any]:
    from torchkiln.artifacts.abi import analyse_installed
    from torchkiln.artifacts.installed import installed

    if step.venv is None:
        return {}
    index = installed([str(p) for p in site_packages(Path(step.venv))])
    records: dict[str, Any] = {}
    for wheel in checked_wheels(step):
        name = wheel.name
        parsed = wheelfile.parse(name)
        dist = index.get(parsed.project) if parsed is not None else None
        if dist is not None:
            record = analyse_installed(dist, index, analysed=IN_CHECK_VENV)
            records[name] = jsonfile.to_data(record)
    return records


def judge(
    setup: BuildSetup, record: BuildRecord, step: Step, outputs: Mapping[str, Any], log: str | None
) -> None:
    """The recipe's verdict on the records a check step analysed: each kept for the manifest; a wheel that
    needs what the target is not known to have stops the build, naming it."""
    raw = outputs.get("portability")
    if raw is None:  # a record from before the check read portability: read it now, in the same venv
        raw = analyse_checked(step, setup) if step.venv and Path(step.venv).is_dir() else {}
    system = setup.plan.recipe.deploy.system_libraries
    refused = []
    for name, data in sorted(raw.items()):
        found = retarget(jsonfile.from_data(Portability, data, file=name), system, UNRESOLVED)
        record.add_portability(name, found)
        reason = refusal(name, found)
        if reason is not None:
            refused.append(reason)
    if refused:
        lines = "\n".join(f"  - {reason}" for reason in refused)
        fix = system_libraries_fix(system, unresolved_names(record.portability.values()))
        raise BuildFailed(
            f"{step.name}: the built wheels need libraries the machines they are deployed to may lack:\n"
            f"{lines}\nfix: {fix}\nnothing was published (docs/portability.md; full log: {log})",
            step=step.name,
        )


CODE = tuple(
    Path(__file__).resolve().parents[1] / "artifacts" / f"{m}.py"
    for m in ("abi", "elf", "installed", "portability")
)


def _key(sha256: str, sites: Sequence[Path], target: Sequence[str]) -> str:
    """What a record read beside the build venv depends on: the wheel, the distributions there (names and
    versions: their dist-info directories), the recipe's system libraries, the analysis's code."""
    dists = sorted(p.name for site in sites for p in site.glob("*.dist-info"))
    code = [file_sha256(path) for path in CODE]
    return Records.key(
        "portability", {"wheel": sha256, "dists": dists, "target": sorted(target), "code": code}
    )


def attach(
    setup: BuildSetup,
    built: BuildRecord,
    wheels: Sequence[tuple[Path, str, str]],
    found: Sequence[WheelRecord],
) -> list[WheelRecord]:
    """``found`` (the published wheels' records, in the order of ``wheels``: (path in dist/, project,
    Python)) with their portability: the post-build check's, else read now beside the build venv's
    distributions (checks skipped). A record read that way is kept by what it depends on (:func:`_key`), in
    the work directory's records and the environment store's (:class:`~torchkiln.plan.records.Records`): the
    same wheel bytes beside the same distributions read the same, so a run that changed nothing, or a fresh
    work directory on the same machine building the same bytes, reads nothing again (about a second for
    torchvision beside torch's 40,000 files). Each run warns about what the check would have refused."""
    plan = setup.plan
    records = Records.for_build(plan.paths.workdir, plan.env_store)
    out = []
    target = plan.recipe.deploy.system_libraries
    for (path, _, python), wheel in zip(wheels, found, strict=True):
        record = built.portability.get(path.name)
        if record is None:
            sites = site_packages(plan.paths.for_python("" if python == plan.recipe.python else python).venv)
            key = _key(wheel.sha256, sites, target)
            kept = records.get(key)
            if kept is not None:
                record = jsonfile.from_data(Portability, kept, file=f"{key}.json")
            else:
                from torchkiln.artifacts.abi import analyse_wheel  # noqa: PLC0415 - ELF readers: on a miss only

                with kept_readings(setup):
                    record = analyse_wheel(path, sites, target=target, analysed=IN_BUILD_VENV)
                records.put(key, jsonfile.to_data(record))
        out.append(replace(wheel, portability=record))
        setup.display.note(f"{path.name}: {one_line(record)}")
    judged = {wheel.name: wheel.portability for wheel in out if wheel.portability is not None}
    fix = system_libraries_fix(target, unresolved_names(judged.values()))
    for name, record in judged.items():
        reason = refusal(name, record)
        if reason is not None:  # each warning complete: its fix covers every wheel's libraries
            built.warn(f"--skip-postcheck: the post-build check would have refused it: {reason}; fix: {fix}")
    return out
