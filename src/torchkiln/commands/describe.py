"""``torchkiln recipe describe``: the exact recipe of an installed torch (+ torchvision), written from what the
wheels report about themselves. (In commands/: it reads the recipe rules and CMake option tables, which the
verification support, :mod:`torchkiln.verify`, may not import.)

``torchkiln recipe describe`` reads :class:`~torchkiln.verify.facts.BuildFacts` in the target interpreter (the
facts ``torchkiln verify`` checks) and writes the recipe those facts satisfy, so that ``torchkiln verify
--recipe`` passes on that installation: a user describes a wheel they already have (upstream's, or a build of
their own) and gets a recipe to rebuild it, or to verify it later. Every value says where it was read; the
few that an installed wheel does not record are named as such (the git refs, MAGMA's version and tarball).

What is read, and from where (one recipe field each):

* torch/torchvision versions and commits: ``torch.__version__`` (its local label and ``.postN``),
  ``torch.version.git_version``, ``torchvision.__version__`` / ``torchvision.version.git_version``;
* CUDA, the arch list (``torch._C._cuda_getArchFlags()``: ``sm_XY`` a cubin, ``compute_XY`` PTX), cuDNN
  compiled (``torch._C._cudnn.getCompileVersion()``) and shipped (the installed ``nvidia-cudnn-cuXX``, else the
  loaded library), NCCL compiled (``torch.cuda.nccl.version()``) and shipped (``nvidia-nccl-cuXX``, else
  ``ncclGetVersion()`` of the loaded libnccl); MAGMA (``torch.cuda.has_magma``);
* BLAS (``BLAS_INFO``) and MKL's version, the host compiler (``GCC 13.3``), ``BUILD_TYPE``, the ``USE_*``
  Build settings a recipe may set (those torch's release reads as CMake options and torchkiln does not set
  from another field), ``USE_DISTRIBUTED`` (``torch.distributed.is_available()``);
* the Python and the machine; torchvision's optional parts (each codec used once).

Pure: :func:`describe` turns facts into TOML text; the command runs the facts script.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from packaging.version import Version

from torchkiln.errors import UsageError
from torchkiln.recipe import cmake_options
from torchkiln.recipe.archs import parse_compiled
from torchkiln.recipe.compat import compat
from torchkiln.recipe.rules_settings import MANAGED_FLAGS
from torchkiln.recipe.spelling import truth
from torchkiln.verify.facts import BuildFacts, dotted

# torch reports that it has MAGMA (torch.cuda.has_magma), never which release: a described CUDA build with
# MAGMA gets the one upstream's wheels link (.ci/docker/common/install_magma.sh MAGMA_VERSION=2.6.1, the
# tarball's sha256 as install_magma.sh checks it), said so in the recipe. verify checks has_magma only.
UPSTREAM_MAGMA = {
    "version": "2.6.1",
    "sha256": "6cd83808c6e8bc7a44028e05112b3ab4e579bcc73202ed14733f66661127e213",
    "url": "https://icl.utk.edu/projectsfiles/magma/downloads/magma-2.6.1.tar.gz",
}
PARTS = ("png", "jpeg", "webp", "nvjpeg", "video_codec", "ffmpeg")


@dataclass(frozen=True)
class Line:
    """One ``key = value`` line and where its value came from (the comment beside it)."""

    key: str
    value: object
    source: str = ""

    def render(self) -> str:
        text = f"{self.key} = {_toml(self.value)}"
        return f"{text:<46} # {self.source}" if self.source else text


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # ASCII JSON strings are TOML basic strings
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def arch_entries(compiled: tuple[str, ...]) -> list[str]:
    """``torch._C._cuda_getArchFlags()`` entries as TORCH_CUDA_ARCH_LIST entries: ``sm_90`` -> ``9.0``,
    ``sm_120`` with ``compute_120`` -> ``12.0+PTX``, ``sm_90a`` -> ``9.0a``; ordered by capability. PTX without
    its cubin cannot be asked for (``X.Y+PTX`` builds both): refused, naming it."""
    cubins: dict[tuple[int, int, str], bool] = {}
    ptx: set[tuple[int, int, str]] = set()
    for arch in compiled:
        kind, major, minor, suffix = parse_compiled(arch)
        (
            cubins.setdefault((major, minor, suffix), False)
            if kind == "sm"
            else ptx.add((major, minor, suffix))
        )
    alone = sorted(ptx - set(cubins))
    if alone:
        names = ", ".join(f"compute_{m}{n}{s}" for m, n, s in alone)
        raise UsageError(
            f"the build has PTX without its cubin ({names}): no TORCH_CUDA_ARCH_LIST entry asks for that"
        )
    return [f"{m}.{n}{s}{'+PTX' if (m, n, s) in ptx else ''}" for m, n, s in sorted(cubins)]


def _blas_kind(info: str | None) -> str:
    for kind, entry in compat()["blas"].items():
        if info is not None and info.startswith(entry["info"]):
            return str(kind)
    raise UsageError(f"Build settings BLAS_INFO={info}: not a BLAS a recipe names (mkl, open, nvpl)")


def _platform(machine: str) -> str:
    for name, entry in compat()["platform"].items():
        if machine in entry["machines"]:
            return str(name)
    raise UsageError(
        f"machine {machine!r} is no platform torchkiln builds for ({', '.join(compat()['platform'])})"
    )


def described_flags(facts: BuildFacts, torch_version: str) -> dict[str, bool]:
    """The ``USE_*`` Build settings a recipe's ``build.flags`` may set (the release's CMake options, not set
    by torchkiln from another field), as booleans; ``USE_DISTRIBUTED`` from torch.distributed (no Build
    setting reports it)."""
    flags: dict[str, bool] = {}
    if facts.distributed is not None:
        flags["USE_DISTRIBUTED"] = facts.distributed
    for key, raw in sorted(facts.settings.items()):
        value = truth(raw)
        if not key.startswith("USE_") or key in MANAGED_FLAGS or value is None:
            continue
        if not cmake_options.check_flags(torch_version, {key: value}):
            flags[key] = value
    while problems := cmake_options.check_flags(torch_version, flags):  # a pair refused together: drop one
        flags.pop(problems[0][0].rsplit(".", 1)[-1])
    return dict(sorted(flags.items()))


def _flag_source(key: str, settings: Mapping[str, str]) -> str:
    if key in settings:
        return f"Build settings {key}={settings[key]}"
    return "torch.distributed.is_available()" if key == "USE_DISTRIBUTED" else "(not reported)"


def _version_fields(version: Version) -> list[Line]:
    """build.local_version, or -- ``.postN`` from a build number -- pytorch_build_version and _number."""
    local = version.local or ""
    labels = local.split(".") if local else []
    if labels and labels[-1].startswith("post") and labels[-1][4:].isdigit() and int(labels[-1][4:]) > 1:
        base = f"{version.base_version}+{'.'.join(labels[:-1])}" if labels[:-1] else version.base_version
        return [
            Line("pytorch_build_version", base, "torch.__version__ without its .postN"),
            Line("pytorch_build_number", int(labels[-1][4:]), f"torch.__version__ {version}"),
        ]
    if version.post is not None and version.post > 1:
        return [
            Line(
                "pytorch_build_version",
                f"{version.major}.{version.minor}.{version.micro}",
                "torch.__version__",
            ),
            Line("pytorch_build_number", version.post, f"torch.__version__ {version}"),
        ]
    return [Line("local_version", f"+{local}", f"torch.__version__ {version}")] if local else []


def _accelerator(facts: BuildFacts) -> list[Line]:
    if facts.cuda_version is None:
        return [Line("kind", "cpu", f"torch.version.cuda is None, USE_CUDA={facts.settings.get('USE_CUDA')}")]
    major = Version(facts.cuda_version).major
    lines = [
        Line("kind", "cuda", f"USE_CUDA={facts.settings.get('USE_CUDA')}"),
        Line("cuda", facts.cuda_version, "torch.version.cuda"),
        Line("arch_list", arch_entries(facts.arch_list), f"{facts.arch_source}: {' '.join(facts.arch_list)}"),
    ]
    for name, compiled, loaded, dist, how in (
        ("cudnn", dotted(facts.cudnn_compile), dotted(facts.cudnn_runtime), f"nvidia-cudnn-cu{major}",
         "torch._C._cudnn.getCompileVersion()"),
        ("nccl", dotted(facts.nccl_version), dotted(facts.nccl_runtime), f"nvidia-nccl-cu{major}",
         "torch.cuda.nccl.version()"),
    ):  # fmt: skip
        if compiled is None:
            continue
        package = facts.nvidia_dists.get(dist)
        shipped = package or loaded or compiled
        where = (
            f"installed {dist}" if package else ("the loaded library" if loaded else "linked in statically")
        )
        if Version(shipped).release[:3] == Version(compiled).release[:3]:
            lines.append(Line(name, shipped, f"{how} = {compiled}; {where} {shipped}"))
        else:
            lines.append(Line(name, compiled, how))
            lines.append(Line(f"{name}_runtime", shipped, f"{where}; the library loaded is {loaded}"))
    return lines


def _vision(facts: BuildFacts) -> tuple[list[Line], list[Line]]:
    tv = facts.torchvision
    if tv is None or tv.version is None:
        raise UsageError(
            "torchvision is not installed in that Python"
            + (f" ({tv.error})" if tv is not None and tv.error else "")
            + ": a recipe builds torch and torchvision (valid: install the torchvision that pairs with it)"
        )
    version = Version(tv.version)
    head = [
        Line(
            "ref",
            f"v{version.base_version}",
            "the release tag of torchvision.__version__ (not recorded in the wheel)",
        ),
        Line("commit", tv.git_version, "torchvision.version.git_version") if tv.git_version else None,
        Line("version", version.base_version, f"torchvision.__version__ {tv.version}"),
    ]
    parts = []
    for part in PARTS:
        built = tv.parts.get(part)
        if built is None:
            note = tv.part_notes.get(part, "no probe result")
            raise UsageError(f"could not tell whether torchvision has {part} ({note})")
        if built or part in ("png", "jpeg", "webp", "nvjpeg"):
            parts.append(Line(part, built, "each codec used once (torchkiln.verify.facts.probe_parts)"))
    return [line for line in head if line is not None], parts


def describe(
    facts: BuildFacts,
    *,
    name: str,
    description: str | None = None,
    needs: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """The recipe ``facts`` satisfy, as TOML text with the source of each value beside it. ``needs``: the
    sonames the wheels' shared objects need that nothing the target is known to have provides
    (:func:`unresolved_needs`), each with the files that need it: ``[deploy] system_libraries``."""
    torch_v = Version(facts.torch_version)
    vision_head, vision_parts = _vision(facts)
    settings = facts.settings
    tv = facts.torchvision
    assert tv is not None and tv.version is not None
    title = f"torch {facts.torch_version} / torchvision {tv.version} for Python {facts.python_version} on {facts.machine}"
    sections: list[tuple[str, list[Line]]] = [
        ("recipe", [Line("name", name), Line("description", description or title)]),
        ("torch", [
            Line("ref", f"v{torch_v.base_version}", "the release tag of torch.__version__ (not recorded in the wheel)"),
            Line("commit", facts.git_version, f"torch.version.git_version; Build settings COMMIT_SHA={settings.get('COMMIT_SHA')}"),
            Line("version", torch_v.base_version, f"torch.__version__ {facts.torch_version}"),
        ]),
        ("torchvision", vision_head),
        ("torchvision.features", vision_parts),
        ("python", [Line("version", facts.python_version, "the interpreter the wheels are installed in")]),
        ("accelerator", _accelerator(facts)),
    ]  # fmt: skip
    blas = [
        Line(
            "kind",
            _blas_kind(settings.get("BLAS_INFO")),
            f"Build settings BLAS_INFO={settings.get('BLAS_INFO')}",
        )
    ]
    if blas[0].value == "mkl":
        if facts.mkl_version is None:
            raise UsageError("BLAS_INFO=mkl, but torch.__config__.show() names no MKL version")
        mkl = ".".join((facts.mkl_version.split(".") + ["0", "0"])[:3])
        blas.append(Line("mkl", mkl, f"torch.__config__.show(): MKL {facts.mkl_version}"))
    sections.append(("blas", blas))
    if facts.cuda_version is not None and facts.has_magma:
        sections.append(("magma", [
            Line("version", UPSTREAM_MAGMA["version"], "torch.cuda.has_magma is True; the release upstream links (torch reports none)"),
            Line("sha256", UPSTREAM_MAGMA["sha256"], "of that tarball (upstream's install_magma.sh)"),
            Line("url", UPSTREAM_MAGMA["url"]),
        ]))  # fmt: skip
    if "BUILD_TYPE" not in settings:
        raise UsageError("torch's Build settings have no BUILD_TYPE")
    build = [
        Line("platform", _platform(facts.machine), "platform.machine()"),
        Line("type", settings["BUILD_TYPE"], "Build settings BUILD_TYPE"),
        *_version_fields(torch_v),
    ]
    family, _, compiler_version = (facts.compiler or "").partition(" ")
    if family == "GCC" and compiler_version:
        build.append(
            Line(
                "gcc",
                int(compiler_version.split(".")[0]),
                f"torch.__config__.show(): {facts.compiler}; CXX_COMPILER={settings.get('CXX_COMPILER')}",
            )
        )
    sections.append(("build", build))
    flags = described_flags(facts, torch_v.base_version)
    sections.append(
        (
            "build.flags",
            [Line(k, v, _flag_source(k, settings)) for k, v in flags.items()],
        )
    )
    sections.append(("cache", [Line("kind", "none")]))
    if needs:
        sections.append(("deploy", [Line("system_libraries", sorted(needs), _needed_by(needs))]))
    out = [
        f"# Written by `torchkiln recipe describe` from what the installed wheels report about themselves: {title}.",
        "# `torchkiln verify --recipe` with this file passes on that installation. Regenerate it rather than edit it.",
    ]
    for table, lines in sections:
        out += ["", f"[{table}]", *(line.render() for line in lines)]
    return "\n".join(out) + "\n"


def _needed_by(needs: Mapping[str, Sequence[str]]) -> str:
    said = "; ".join(f"{name}: {', '.join(sorted(files))}" for name, files in sorted(needs.items()))
    return f"needed by the wheels' own files and not bundled ({said})"


def unresolved_needs(paths: Sequence[str]) -> dict[str, list[str]]:
    """Soname -> the files of torch and torchvision (installed on ``paths``: the described interpreter's
    sys.path) that need it and find it in nothing a target machine is known to have (their own files, a
    declared distribution's, a manylinux policy's, the NVIDIA driver's): what verify's release check
    (``test_libraries_resolve_without_ld_library_path``) asks a recipe's ``[deploy] system_libraries`` to
    promise. Upstream's torch 2.15.0 ships torch/lib/libgfortran.so.5 without the libquadmath.so.0 it needs."""
    from torchkiln.verify import linkage  # noqa: PLC0415 - ELF readers: describe only

    index = linkage.installed(list(paths))
    found: dict[str, list[str]] = {}
    for project in ("torch", "torchvision"):
        if project in index:
            for entry in linkage.check_distribution(index[project], index).unresolved:
                found.setdefault(entry.needed, []).append(entry.obj)
    return found


def default_name(facts: BuildFacts) -> str:
    """``torch-2.8.0-cu128-py311``: the release, the local label (or ``local``) and the Python."""
    version = Version(facts.torch_version)
    label = (version.local or "local").split(".")[0]
    return f"torch-{version.base_version}-{label}-py{facts.python_version.replace('.', '')}"


def facts_from_output(stdout: str, python: str) -> BuildFacts:
    """The facts script's last line of output, read back (a usage error naming the interpreter if not)."""
    lines = stdout.strip().splitlines()
    try:
        data: Mapping[str, object] = json.loads(lines[-1]) if lines else {}
        return BuildFacts.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{python}: its torch's facts could not be read ({exc})") from None
