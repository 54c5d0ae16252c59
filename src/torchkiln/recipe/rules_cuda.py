"""Recipe rules on CUDA: the fields a CUDA build names, CUDA, cuDNN and NCCL within the torch release's
ranges and built for each other, the runtime cuDNN/NCCL, the arch list against nvcc and cuDNN, and what an
aarch64 (SBSA) CUDA build may name. Rows of :data:`torchkiln.recipe.rules.RULES`.
"""

from __future__ import annotations

from collections.abc import Iterator

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from . import cuda_libraries, libcompat
from .archs import ENTRY_RE
from .compat import compat, cuda_release, torch_release
from .model import Recipe
from .rules_violations import Violation, _describe, rule, torch_range


def arch_capability(entry: str) -> tuple[str, str, bool]:
    """'12.0+PTX' -> ('12.0', '', True); '9.0a' -> ('9.0', 'a', False)."""
    match = ENTRY_RE.match(entry)
    assert match is not None, entry  # schema already checked every entry
    return f"{match['major']}.{match['minor']}", match["suffix"], bool(match["ptx"])


@rule(
    "cuda-fields", "CUDA builds name cuda, arch_list, cudnn, nccl; CPU builds none of them", ("accelerator",)
)
def _cuda_fields(r: Recipe) -> Iterator[Violation]:
    acc = r.accelerator
    if acc.is_cuda:
        for name in ("cuda", "arch_list", "cudnn", "nccl"):
            value = getattr(acc, name)
            if value is None or value == ():
                yield (
                    f"accelerator.{name}",
                    'required when accelerator.kind = "cuda"',
                    {
                        "cuda": "a CUDA version such as 13.0",
                        "arch_list": 'a non-empty list such as ["9.0"]',
                        "cudnn": "a cuDNN version such as 9.20.0.48",
                        "nccl": "an NCCL version such as 2.29.7",
                    }[name],
                )
    else:
        for name in ("cuda", "cudnn", "nccl", "cudnn_runtime", "nccl_runtime"):
            if getattr(acc, name) is not None:
                yield (
                    f"accelerator.{name}",
                    'only valid with accelerator.kind = "cuda"',
                    "remove it for a CPU build",
                )
        if acc.arch_list:
            yield (
                "accelerator.arch_list",
                'only valid with accelerator.kind = "cuda"',
                "remove it for a CPU build",
            )


@rule("cuda-range", "CUDA is within the torch release's range", ("torch.version", "accelerator.cuda"))
def _cuda_range(r: Recipe) -> Iterator[Violation]:
    cuda = r.accelerator.cuda
    if torch_release(r) is None or cuda is None:
        return
    if cuda_release(r) is None:
        yield ("accelerator.cuda", f"CUDA {cuda} has no compatibility data", ", ".join(compat()["cuda"]))
        return
    yield from torch_range(r, "cuda", "accelerator.cuda", f"CUDA {cuda}", cuda)


@rule(
    "cudnn-range",
    "cuDNN is within the torch release's range and built for the CUDA major",
    ("torch.version", "accelerator.cuda", "accelerator.cudnn"),
)
def _cudnn_range(r: Recipe) -> Iterator[Violation]:
    cudnn = r.accelerator.cudnn
    if torch_release(r) is None or cudnn is None:
        return
    yield from torch_range(r, "cudnn", "accelerator.cudnn", f"cuDNN {cudnn}", cudnn)
    cuda = cuda_release(r)
    if cuda is not None and cudnn < Version(cuda["min_cudnn"]):
        yield (
            "accelerator.cudnn",
            f"cuDNN {cudnn} has no build for CUDA {r.accelerator.cuda}",
            f">= {cuda['min_cudnn']}",
        )


@rule("nccl-for-cuda", "NCCL has a build for the CUDA major", ("accelerator.cuda", "accelerator.nccl"))
def _nccl_for_cuda(r: Recipe) -> Iterator[Violation]:
    cuda, nccl = cuda_release(r), r.accelerator.nccl
    if cuda is not None and nccl is not None and nccl < Version(cuda["min_nccl"]):
        yield (
            "accelerator.nccl",
            f"NCCL {nccl} has no build for CUDA {r.accelerator.cuda}",
            f">= {cuda['min_nccl']}",
        )


@rule(
    "runtime-libraries",
    "the cuDNN / NCCL a wheel runs with can run what it is compiled against",
    ("accelerator",),
)
def _runtime_libraries(r: Recipe) -> Iterator[Violation]:
    """``accelerator.cudnn_runtime`` / ``nccl_runtime``: a library torch compiled against ``cudnn`` / ``nccl``
    can run with (recipe/libcompat.py: cuDNN's rule from NVIDIA, NCCL's from its soname)."""
    acc = r.accelerator
    pairs = (
        ("cudnn", acc.cudnn, acc.cudnn_runtime, libcompat.cudnn_problem, libcompat.CUDNN_RULE),
        ("nccl", acc.nccl, acc.nccl_runtime, libcompat.nccl_problem, libcompat.NCCL_RULE),
    )
    for name, compiled, runtime, problem, library_rule in pairs:
        if runtime is None or not acc.is_cuda:
            continue
        if compiled is None:
            yield (
                f"accelerator.{name}_runtime",
                f"given without accelerator.{name} (the {name} torch is compiled against)",
                f"accelerator.{name} too",
            )
            continue
        found = problem(compiled, runtime)
        if found:
            yield (f"accelerator.{name}_runtime", found, library_rule)


@rule(
    "arch-vs-cuda",
    "every arch entry can be targeted by the recipe's nvcc",
    ("accelerator.cuda", "accelerator.arch_list"),
)
def _arch_vs_cuda(r: Recipe) -> Iterator[Violation]:
    cuda = r.accelerator.cuda
    if cuda is None:
        return
    arch_table, suffix_table = compat()["arch"], compat()["arch_suffix"]
    for entry in r.accelerator.arch_list:
        capability, suffix, _ = arch_capability(entry)
        spec_text = arch_table.get(capability)
        if spec_text is None:
            yield ("accelerator.arch_list", f"unknown compute capability {entry!r}", ", ".join(arch_table))
            continue
        spec = SpecifierSet(spec_text)
        if cuda not in spec:
            yield (
                "accelerator.arch_list",
                f"CUDA {cuda} cannot target {entry} (sm_{capability.replace('.', '')})",
                f"{entry} needs CUDA {_describe(spec)}; for CUDA {cuda}: {_archs_for(cuda)}",
            )
        if suffix and cuda not in SpecifierSet(suffix_table[suffix]):
            yield (
                "accelerator.arch_list",
                f"CUDA {cuda} has no '{suffix}' targets ({entry})",
                f"CUDA {suffix_table[suffix]}",
            )


@rule(
    "cudnn-min-sm", "cuDNN >= 9.11 with no arch below SM 7.5", ("accelerator.cudnn", "accelerator.arch_list")
)
def _cudnn_min_sm(r: Recipe) -> Iterator[Violation]:
    rule, cudnn = compat()["cudnn_min_sm"], r.accelerator.cudnn
    if cudnn is None or cudnn < Version(rule["since"]):
        return
    low = [e for e in r.accelerator.arch_list if Version(arch_capability(e)[0]) < Version(rule["min_arch"])]
    if low:
        yield (
            "accelerator.arch_list",
            f"cuDNN {cudnn} does not support SM < {rule['min_arch']}: {', '.join(low)}",
            f"drop them, or use cuDNN < {rule['since']}",
        )


def _aarch64_cuda_versions() -> str:
    """The CUDA versions an aarch64 recipe may name: those with sbsa nvcc wheels and upstream's arch list."""
    ok = [v for v, d in compat()["cuda"].items() if "sbsa_nvcc" in d and "aarch64_arch" in d]
    return ", ".join(ok)


@rule(
    "platform-cuda",
    "an aarch64 CUDA has sbsa toolkit wheels and upstream aarch64 wheels",
    ("build.platform", "accelerator.cuda"),
)
def _platform_cuda(r: Recipe) -> Iterator[Violation]:
    """An aarch64 CUDA build needs NVIDIA's sbsa toolkit wheels of its CUDA and the arch list upstream's
    aarch64 wheels of that CUDA were read to carry (compat.toml [cuda.*] sbsa_nvcc, aarch64_arch)."""
    cuda = cuda_release(r)
    if r.build.platform != "aarch64" or cuda is None:
        return
    if "sbsa_nvcc" not in cuda:
        yield (
            "accelerator.cuda",
            f"CUDA {r.accelerator.cuda} has no aarch64 (sbsa) toolkit wheels on PyPI (build.platform = aarch64)",
            _aarch64_cuda_versions(),
        )
    elif "aarch64_arch" not in cuda:
        yield (
            "accelerator.cuda",
            f"upstream builds no aarch64 wheel for CUDA {r.accelerator.cuda}, so no aarch64 arch list is known "
            "(build.platform = aarch64)",
            _aarch64_cuda_versions(),
        )


@rule(
    "platform-arch",
    "an aarch64 arch list names only what upstream's aarch64 wheels build",
    ("build.platform", "accelerator.cuda", "accelerator.arch_list"),
)
def _platform_arch(r: Recipe) -> Iterator[Violation]:
    """An aarch64 arch list names only what upstream's aarch64 wheels of that CUDA build (no sm_75, sm_86:
    no Turing or consumer Ampere on SBSA servers)."""
    cuda = cuda_release(r)
    if r.build.platform != "aarch64" or cuda is None or "aarch64_arch" not in cuda:
        return
    built = set(cuda["aarch64_arch"])
    extra = [e for e in r.accelerator.arch_list if arch_capability(e)[0] not in built]
    if extra:
        yield (
            "accelerator.arch_list",
            f"upstream's aarch64 CUDA {r.accelerator.cuda} wheels do not build {', '.join(extra)} "
            "(build.platform = aarch64)",
            f"entries of {', '.join(cuda['aarch64_arch'])}",
        )


def _archs_for(cuda: Version) -> str:
    return " ".join(a for a, s in compat()["arch"].items() if cuda in SpecifierSet(s))


@rule(
    "deploy-cuda-libraries",
    "a CUDA wheel's CUDA libraries come from NVIDIA's wheels, or are bundled where upstream bundles them",
    ("deploy", "accelerator", "torch.version"),
)
def _deploy_cuda_libraries(r: Recipe) -> Iterator[Violation]:
    yield from cuda_libraries.problems(r)
