"""Preflight's checks of what torch and torchvision compile against: the CUDA toolkit's nvcc, the cuDNN, NCCL
and MAGMA of the recipe's pins, the BLAS (OpenBLAS, NVPL), and each optional part of torchvision asked for.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from packaging.version import Version

from torchkiln.host import distro as distros
from torchkiln.host.toolchain import cudnn_version
from torchkiln.process.environ import compose
from torchkiln.recipe.compat import platform_data

from . import vision_parts
from .model import Plan
from .preflight_findings import Finding, Host, _env, _run

# OpenBLAS as Debian/Ubuntu (libopenblas-dev, under the platform's multiarch triplet) and RHEL
# (openblas-devel) install it.
OPENBLAS_LIBS = ("libopenblas.so", "libopenblas.a")
LIB_DIRS = ("/usr/lib/{multiarch}", "/usr/lib64", "/usr/lib", "/usr/local/lib", "/opt/OpenBLAS/lib")
CBLAS_HEADERS = (
    "/usr/include/cblas.h",
    "/usr/include/{multiarch}/cblas.h",
    "/usr/include/openblas/cblas.h",
    "/usr/local/include/cblas.h",
    "/opt/OpenBLAS/include/cblas.h",
)


def _nvcc(plan: Plan, host: Host) -> Iterator[Finding]:
    r = plan.recipe
    if r.accelerator.cuda is None:
        return
    env = _env(plan)
    home = env.get("CUDA_HOME", "")
    nvcc = env.get("CUDACXX") or f"{home}/bin/nvcc"
    want = f"nvcc {r.accelerator.cuda} at {nvcc} (accelerator.cuda; the plan's CUDA_HOME)"
    fix = f"install the CUDA {r.accelerator.cuda} toolkit into {home}"
    if not Path(nvcc).is_file():
        yield Finding("nvcc", f"no {nvcc}", want, fix)
        return
    target = platform_data(r)["toolkit_target"]
    targets = Path(home, "targets")
    if targets.is_dir() and not (targets / target).is_dir():
        found = ", ".join(sorted(p.name for p in targets.iterdir())) or "nothing"
        yield Finding("nvcc", f"{targets} holds {found}", f"{targets}/{target} (build.platform)", fix)
        return
    done = _run([nvcc, "--version"], host)
    text = done if isinstance(done, str) else done.output
    match = re.search(r"release (\d+\.\d+)", text)
    if match is None:
        yield Finding("nvcc", f"{nvcc} --version says no release ({text.strip()[:120]})", want, fix)
    elif Version(match.group(1)) != r.accelerator.cuda:
        yield Finding("nvcc", f"CUDA {match.group(1)} at {nvcc}", want, fix)


def header_version(path: Path, prefix: str, parts: tuple[str, ...]) -> str | None:
    """``#define <prefix>_<part> N`` for each part, joined with dots; None when the header lacks one."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = [re.search(rf"#define\s+{prefix}_{part}\s+(\d+)", text) for part in parts]
    return ".".join(m.group(1) for m in found if m) if all(found) else None


def _release_of(pin: Version, parts: int = 3) -> str:
    return ".".join(str(n) for n in (pin.release + (0, 0, 0))[:parts])


def _cudnn(plan: Plan, host: Host) -> Iterator[Finding]:
    """cuDNN and NCCL are torch's (torchvision compiles against neither): checked when torch is built."""
    pin = plan.recipe.accelerator.cudnn
    if pin is None or "torch" not in plan.projects:
        return
    home = _env(plan).get("CUDA_HOME", "")
    want = f"cuDNN {_release_of(pin)} (accelerator.cudnn = {pin})"
    fix = f"install cuDNN {pin} for CUDA {plan.recipe.accelerator.cuda} under {home} (include/, lib64/)"
    got = cudnn_version(home)
    if got is None:
        yield Finding("cudnn", f"no cudnn_version.h under {home}/include", want, fix)
    elif got != _release_of(pin):
        yield Finding("cudnn", f"cuDNN {got} ({home}/include/cudnn_version.h)", want, fix)


def _nccl(plan: Plan, host: Host) -> Iterator[Finding]:
    pin = plan.recipe.accelerator.nccl
    if pin is None or "torch" not in plan.projects:
        return
    include = Path(_env(plan).get("NCCL_INCLUDE_DIR", ""))
    want = f"NCCL {_release_of(pin)} (accelerator.nccl)"
    fix = f"install NCCL {pin} for CUDA {plan.recipe.accelerator.cuda} (nccl.h into {include})"
    got = header_version(include / "nccl.h", "NCCL", ("MAJOR", "MINOR", "PATCH"))
    if got is None:
        yield Finding("nccl", f"no nccl.h in {include}", want, fix)
    elif got != _release_of(pin):
        yield Finding("nccl", f"NCCL {got} ({include}/nccl.h)", want, fix)


def _magma(plan: Plan, host: Host) -> Iterator[Finding]:
    magma = plan.recipe.magma
    if magma is None or "torch" not in plan.projects:
        return
    home = Path(_env(plan).get("MAGMA_HOME", "/usr/local/magma"))
    want = f"MAGMA {magma.version} in {home} (the [magma] table; the plan's MAGMA_HOME)"
    fix = f"install MAGMA {magma.version} into {home} (scripts/install_magma.sh), or drop [magma]"
    libs = [home / "lib" / name for name in ("libmagma.so", "libmagma.a")]
    if not (home / "include" / "magma_v2.h").is_file() or not any(p.is_file() for p in libs):
        yield Finding("magma", f"no include/magma_v2.h and lib/libmagma.* under {home}", want, fix)
        return
    got = header_version(home / "include" / "magma_types.h", "MAGMA_VERSION", ("MAJOR", "MINOR", "MICRO"))
    if got is not None and Version(got) != magma.version:
        yield Finding("magma", f"MAGMA {got} in {home}", want, fix)


def _blas(plan: Plan, host: Host) -> Iterator[Finding]:
    if plan.recipe.blas.kind == "nvpl" and "torch" in plan.projects:
        yield from _nvpl(plan)
    if plan.recipe.blas.kind != "openblas" or "torch" not in plan.projects:
        return  # MKL: mkl-static/mkl-include are pip-installed into the build venv by the env steps
    multiarch = platform_data(plan.recipe)["multiarch"]
    have_lib = any(Path(d.format(multiarch=multiarch), n).exists() for d in LIB_DIRS for n in OPENBLAS_LIBS)
    have_header = any(Path(h.format(multiarch=multiarch)).is_file() for h in CBLAS_HEADERS)
    if not (have_lib and have_header):
        missing = [w for w, ok in (("libopenblas", have_lib), ("cblas.h", have_header)) if not ok]
        yield Finding(
            "blas",
            f"no {' and no '.join(missing)} in the system's directories",
            'OpenBLAS (blas.kind = "openblas")',
            f'{distros.install(host.distro, "libopenblas-dev")}, or blas.kind = "mkl"',
        )


def _nvpl(plan: Plan) -> Iterator[Finding]:
    """NVPL's BLAS library and header under one of the platform's NVPL prefixes (compat.toml)."""
    nvpl = platform_data(plan.recipe)["nvpl"]
    for prefix in map(Path, nvpl["dirs"]):
        lib_dir = prefix / "lib"
        has_lib = lib_dir.is_dir() and any(lib_dir.glob(nvpl["library"] + "*"))
        if has_lib and (prefix / "include" / nvpl["header"]).is_file():
            return
    yield Finding(
        "blas",
        f"no {nvpl['library']} with include/{nvpl['header']} under {', '.join(nvpl['dirs'])}",
        'NVPL (blas.kind = "nvpl")',
        "unpack NVIDIA's nvpl_blas and nvpl_lapack linux-sbsa archives into /opt/nvpl (as upstream's "
        'install_nvpl.sh), or blas.kind = "openblas"',
    )


# ------------------------------------------------------------------------------------------------------
# torchvision's optional parts: setup.py leaves out what it does not find, so each one asked for is looked
# up here as setup.py will look for it (torchkiln.plan.vision_parts).
# ------------------------------------------------------------------------------------------------------


def _vision_parts(plan: Plan, host: Host) -> Iterator[Finding]:
    """Each part of [torchvision.features] the recipe asks for, looked for where torchvision's setup.py
    will look, in the environment of the ``torchvision:wheel`` step (its variables, the venv's bin/ first
    on PATH, the caller's environment less what torchkiln removes); each directory of
    ``torchvision.include_dirs`` / ``library_dirs`` must exist."""
    step = next((s for s in plan.steps if s.name == "torchvision:wheel"), None)
    source = next((s for s in plan.sources if s.name == "torchvision"), None)
    if step is None or source is None:
        return
    r = plan.recipe
    for field, dirs in (("include_dirs", r.vision.include_dirs), ("library_dirs", r.vision.library_dirs)):
        for directory in dirs:
            if not Path(directory).is_dir():
                yield Finding(
                    f"torchvision.{field}",
                    f"no directory {directory}",
                    f"the directories torchvision.{field} names",
                    f"create {directory} with what it should hold, or take it out of torchvision.{field}",
                )
    environ = compose(host.environ, step.env, path_prepend=step.path_prepend)
    setup = vision_parts.Setup(environ, source.path, r.python)
    for part in r.vision.enabled:
        miss = vision_parts.missing(part, setup)
        if miss is not None:
            yield Finding(
                f"torchvision.features.{part}",
                miss.found,
                f"{miss.wanted}: torchvision's setup.py builds without {part} otherwise",
                f"{distros.portable(host.distro, miss.provides)}; or {part} = false in [torchvision.features]",
            )
