"""Compatibility rules, checked when a recipe loads and before any work starts.

The numbers live in ``data/compat.toml`` (with the upstream source of each); this module holds the rule
table, :data:`RULES`: one row per rule, naming the field it reports on and what it requires. A rule that
cannot apply (no CUDA, no MAGMA, an unknown release already reported) says nothing.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from torchkiln.errors import Problem, UsageError

from . import cmake_options, cuda_libraries, libcompat
from .archs import ENTRY_RE
from .compat import compat, cuda_release, minor, platform_data, torch_release, vision_pairing, vision_pairs
from .model import Recipe


def arch_capability(entry: str) -> tuple[str, str, bool]:
    """'12.0+PTX' -> ('12.0', '', True); '9.0a' -> ('9.0', 'a', False)."""
    match = ENTRY_RE.match(entry)
    assert match is not None, entry  # schema already checked every entry
    return f"{match['major']}.{match['minor']}", match["suffix"], bool(match["ptx"])


# A finding: (field path, what is wrong, what would be valid).
Finding = tuple[str, str, str]
Check = Callable[[Recipe], Iterator[Finding]]


@dataclass(frozen=True)
class Rule:
    """One rule: ``reads`` names the fields (or whole tables) it looks at; when one of them is itself
    malformed, the rule is not run (its finding would only echo that problem), every other rule is."""

    id: str
    summary: str
    check: Check
    reads: tuple[str, ...]

    def blocked_by(self, bad: Collection[str]) -> bool:
        return any(r == b or r.startswith(b + ".") or b.startswith(r + ".") for r in self.reads for b in bad)


# ------------------------------------------------------------------------------------------------------
# The checks. Each yields findings; none raises.
# ------------------------------------------------------------------------------------------------------


def _known_torch(r: Recipe) -> Iterator[Finding]:
    if torch_release(r) is None:
        known = ", ".join(f"{v}.x" for v in compat()["torch"])
        yield ("torch.version", f"torch {r.torch.version} has no compatibility data", known)


def _vision_pairs_torch(r: Recipe) -> Iterator[Finding]:
    release = torch_release(r)
    if release is None:
        return
    if not vision_pairs(release, r.torchvision.version):
        yield (
            "torchvision.version",
            f"torchvision {r.torchvision.version} does not pair with torch {r.torch.version}",
            f"{vision_pairing(release)} (data/compat.toml: 0.(N+15) pairs with torch 2.N up to 2.14; 2.15 "
            "with 0.29, torch's stable ABI)",
        )


def _python_field(r: Recipe) -> str:
    """The field that names the recipe's Pythons: what a finding about one of them reports on."""
    return "python.versions" if r.pythons else "python.version"


def _python_range(r: Recipe) -> Iterator[Finding]:
    release = torch_release(r)
    if release is None:
        return
    spec = SpecifierSet(release["python"])
    for python in r.python_versions:
        if Version(python.removesuffix("t")) not in spec:
            yield (
                _python_field(r),
                f"Python {python} is not supported by torch {minor(r.torch.version)}",
                _describe(spec),
            )


def _free_threaded(r: Recipe) -> Iterator[Finding]:
    """A free-threaded Python (``3.13t``) only for a release that ships wheels for it (data/compat.toml
    ``free_threaded``): its C API differs, and a release that never built for it is not known to."""
    release = torch_release(r)
    if release is None:
        return
    shipped = release["free_threaded"]
    for python in r.python_versions:
        base = python.removesuffix("t")
        if (
            python.endswith("t")
            and python not in shipped
            and Version(base) in SpecifierSet(release["python"])
        ):
            yield (
                _python_field(r),
                f"Python {python} (free-threaded): torch {minor(r.torch.version)} ships no cp{base.replace('.', '')}t "
                "wheels",
                f"the free-threaded Pythons of torch {minor(r.torch.version)}: {', '.join(shipped) or 'none'}"
                f"; or Python {base}",
            )


def _cuda_fields(r: Recipe) -> Iterator[Finding]:
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


def _cuda_range(r: Recipe) -> Iterator[Finding]:
    release, cuda = torch_release(r), r.accelerator.cuda
    if release is None or cuda is None:
        return
    if cuda_release(r) is None:
        yield ("accelerator.cuda", f"CUDA {cuda} has no compatibility data", ", ".join(compat()["cuda"]))
        return
    spec = SpecifierSet(release["cuda"])
    if cuda not in spec:
        yield (
            "accelerator.cuda",
            f"CUDA {cuda} is not supported by torch {minor(r.torch.version)}",
            _describe(spec),
        )


def _cudnn_range(r: Recipe) -> Iterator[Finding]:
    release, cudnn = torch_release(r), r.accelerator.cudnn
    if release is None or cudnn is None:
        return
    spec = SpecifierSet(release["cudnn"])
    if cudnn not in spec:
        yield (
            "accelerator.cudnn",
            f"cuDNN {cudnn} is not supported by torch {minor(r.torch.version)}",
            _describe(spec),
        )
    cuda = cuda_release(r)
    if cuda is not None and cudnn < Version(cuda["min_cudnn"]):
        yield (
            "accelerator.cudnn",
            f"cuDNN {cudnn} has no build for CUDA {r.accelerator.cuda}",
            f">= {cuda['min_cudnn']}",
        )


def _nccl_for_cuda(r: Recipe) -> Iterator[Finding]:
    cuda, nccl = cuda_release(r), r.accelerator.nccl
    if cuda is not None and nccl is not None and nccl < Version(cuda["min_nccl"]):
        yield (
            "accelerator.nccl",
            f"NCCL {nccl} has no build for CUDA {r.accelerator.cuda}",
            f">= {cuda['min_nccl']}",
        )


def _runtime_libraries(r: Recipe) -> Iterator[Finding]:
    """``accelerator.cudnn_runtime`` / ``nccl_runtime``: a library torch compiled against ``cudnn`` / ``nccl``
    can run with (recipe/libcompat.py: cuDNN's rule from NVIDIA, NCCL's from its soname)."""
    acc = r.accelerator
    pairs = (
        ("cudnn", acc.cudnn, acc.cudnn_runtime, libcompat.cudnn_problem, libcompat.CUDNN_RULE),
        ("nccl", acc.nccl, acc.nccl_runtime, libcompat.nccl_problem, libcompat.NCCL_RULE),
    )
    for name, compiled, runtime, problem, rule in pairs:
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
            yield (f"accelerator.{name}_runtime", found, rule)


def _arch_vs_cuda(r: Recipe) -> Iterator[Finding]:
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


def _cudnn_min_sm(r: Recipe) -> Iterator[Finding]:
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


def _gcc_range(r: Recipe) -> Iterator[Finding]:
    gcc = r.build.gcc
    if gcc is None:
        return
    release, cuda = torch_release(r), cuda_release(r)
    if release is not None and gcc < release["min_gcc"]:
        yield (
            "build.gcc",
            f"gcc {gcc} cannot build torch {minor(r.torch.version)} (C++{release['cxx_std']})",
            f">= {release['min_gcc']}",
        )
    if cuda is not None and gcc > cuda["max_gcc"]:
        yield (
            "build.gcc",
            f"gcc {gcc} is newer than CUDA {r.accelerator.cuda}'s nvcc accepts",
            f"<= {cuda['max_gcc']}",
        )


def _magma(r: Recipe) -> Iterator[Finding]:
    if r.magma is None:
        return
    if not r.accelerator.is_cuda:
        yield ("magma", "MAGMA is only used by CUDA builds", "remove [magma] for a CPU build")
        return
    doc = r.document.get("magma", {})
    for key in ("version", "sha256"):
        if key not in doc:
            yield (
                f"magma.{key}",
                "required when [magma] is present",
                "a MAGMA release such as 2.6.1" if key == "version" else "the tarball's sha256",
            )
    release = torch_release(r)
    if release is not None and "version" in doc and r.magma.version not in SpecifierSet(release["magma"]):
        yield (
            "magma.version",
            f"MAGMA {r.magma.version} does not build with torch {minor(r.torch.version)}",
            _describe(SpecifierSet(release["magma"])),
        )


def _blas(r: Recipe) -> Iterator[Finding]:
    if r.blas.kind == "mkl" and r.blas.mkl is None:
        yield ("blas.mkl", 'required when blas.kind = "mkl"', "an MKL version such as 2024.2.0")
    if r.blas.kind != "mkl" and r.blas.mkl is not None:
        yield ("blas.mkl", 'only valid with blas.kind = "mkl"', 'remove it, or set blas.kind = "mkl"')


def _platform_blas(r: Recipe) -> Iterator[Finding]:
    """MKL is x86_64 only, NVPL aarch64 only (compat.toml [platform.*] blas)."""
    kinds = platform_data(r)["blas"]
    if r.blas.kind not in kinds:
        yield (
            "blas.kind",
            f"{r.blas.kind!r} has no build for {r.build.platform} (build.platform)",
            f"on {r.build.platform}: {', '.join(kinds)}",
        )


def _aarch64_cuda_versions() -> str:
    """The CUDA versions an aarch64 recipe may name: those with sbsa nvcc wheels and upstream's arch list."""
    ok = [v for v, d in compat()["cuda"].items() if "sbsa_nvcc" in d and "aarch64_arch" in d]
    return ", ".join(ok)


def _platform_cuda(r: Recipe) -> Iterator[Finding]:
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


def _platform_arch(r: Recipe) -> Iterator[Finding]:
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


def _build_version_pair(r: Recipe) -> Iterator[Finding]:
    have_version = r.build.pytorch_build_version is not None
    have_number = r.build.pytorch_build_number is not None
    if have_version != have_number:
        missing = "build.pytorch_build_number" if have_version else "build.pytorch_build_version"
        yield (
            missing,
            "PYTORCH_BUILD_VERSION and PYTORCH_BUILD_NUMBER are set together or not at all",
            "set both, or neither",
        )
    if have_version and r.build.local_version:
        yield (
            "build.local_version",
            "conflicts with build.pytorch_build_version, which sets the whole version",
            "put the local label into pytorch_build_version, or drop it",
        )
    if r.build.pytorch_build_version and Version(r.build.pytorch_build_version).base_version != str(
        r.torch.version
    ):
        yield (
            "build.pytorch_build_version",
            f"{r.build.pytorch_build_version} is not torch {r.torch.version}",
            f"{r.torch.version} with an optional +local label",
        )


# torchvision's video decoders: "deprecated from version 0.22 and will be removed in version 0.24" (the 0.28.0
# wheel's torchvision/io/_video_deprecation_warning.py); 0.28/0.29 wheels have neither decoder.
VIDEO_DECODERS_REMOVED = Version("0.24")


def _vision_features(r: Recipe) -> Iterator[Finding]:
    features = r.vision
    for name in ("nvjpeg", "video_codec"):
        if getattr(features, name) and not r.accelerator.is_cuda:
            yield (
                f"torchvision.features.{name}",
                "needs CUDA (it is built against the CUDA toolkit)",
                'false, or accelerator.kind = "cuda"',
            )
    if r.torchvision.version >= VIDEO_DECODERS_REMOVED:
        for name in ("video_codec", "ffmpeg"):
            if getattr(features, name):
                yield (
                    f"torchvision.features.{name}",
                    f"torchvision {r.torchvision.version} has no video decoders (removed in 0.24)",
                    "false",
                )


# Flags torchkiln sets itself from recipe fields: setting them in build.flags would contradict the recipe.
MANAGED_FLAGS: dict[str, str] = {
    "USE_CUDA": "accelerator.kind",
    "USE_CUDNN": "accelerator.cudnn",
    "USE_NCCL": "accelerator.nccl",
    "USE_MKL": "blas.kind",
    "BLAS": "blas.kind",
    "USE_MAGMA": "magma",
    "BUILD_TEST": "(always 0: torchkiln builds wheels)",
}


def _flags(r: Recipe) -> Iterator[Finding]:
    for key in r.build.flags:
        if key in MANAGED_FLAGS:
            yield (
                f"build.flags.{key}",
                f"{key} is set by torchkiln from {MANAGED_FLAGS[key]}",
                "change that field instead",
            )


def _flags_known(r: Recipe) -> Iterator[Finding]:
    """Each flag against the CMake options table of the recipe's torch release (names and value types).

    An unknown name is an error, not a warning, although the tables are "nearest" (read from bracketing
    upstream files, not each release's own): a misspelt flag silently does nothing and is found, if ever,
    after an hour's compile, while a false alarm costs one line in data/cmake_options.toml, found in a
    second. The problem line says which table was used and how sure it is."""
    raw = r.document.get("build", {}).get("flags", {})
    flags = {k: v for k, v in raw.items() if k not in MANAGED_FLAGS}
    if not flags or torch_release(r) is None:
        return
    found = cmake_options.check_flags(str(r.torch.version), flags)
    if not found:
        return
    table = cmake_options.release(minor(r.torch.version))
    for field, message, valid in found:
        yield (
            field,
            message,
            f"{valid}; table: data/cmake_options.toml, torch {table.version}, {table.confidence}",
        )


def _cache(r: Recipe) -> Iterator[Finding]:
    c = r.cache
    if c.kind == "none" and (c.remote or c.dir or c.max_size):
        yield ("cache.kind", '"none" with cache settings', "ccache or sccache, or drop the other cache keys")
    if c.credentials_env and c.credentials_file:
        yield ("cache.credentials_file", "set together with cache.credentials_env", "one of the two")
    if (c.credentials_env or c.credentials_file) and not c.remote:
        yield (
            "cache.remote",
            "credentials given without a remote store",
            "a remote URL, or drop the credentials",
        )
    if c.remote:
        secret = remote_secret(c.remote, credentials=bool(c.credentials_env or c.credentials_file))
        if secret:
            yield ("cache.remote", secret, "put it in cache.credentials_env or cache.credentials_file")
            return
    if c.kind == "none" and (c.remote or c.dir or c.max_size):
        return  # reported above; the resolver would only say it again
    # One resolver: what the plan will resolve (the tool's remote schemes, its URL parameters, the size),
    # so a recipe this accepts is one the plan accepts. Imported here: the verification suite loads recipes
    # without importing the cache machinery unless a recipe has a [cache] table to resolve.
    from torchkiln.cache import resolve_cache  # noqa: PLC0415

    try:
        resolve_cache(c, environ={"HOME": "/"})
    except UsageError as exc:
        field, _, text = str(exc).partition(": ")
        message, _, valid = text.partition(" (valid: ")
        valid = valid.replace(")", "", 1) if valid.count(")") > 1 else valid.rstrip(")")
        yield (field if field.startswith("cache.") else "cache", message, valid)


def remote_secret(url: str, *, credentials: bool) -> str | None:
    """What is wrong when a remote store's URL carries a secret, else None. Any ``user:password@`` (also
    percent-encoded, ``u%3Apw@``) is one; so is a bare ``NAME@`` when no credentials source is named, since
    ccache's and sccache's redis take it as the password."""
    userinfo = url.split("://", 1)[-1].split("/", 1)[0].rpartition("@")[0]
    if not userinfo:
        return None
    if ":" in urllib.parse.unquote(userinfo):
        return "a password is written into the URL"
    if not credentials:
        return "the URL's user part is read as a password (NAME@ with no credentials source)"
    return None


def _dist(r: Recipe) -> Iterator[Finding]:
    d = r.dist
    if d is None:
        return
    if not d.scheduler_url:
        yield (
            "dist.scheduler_url",
            "[dist] without a scheduler",
            "http(s)://HOST[:PORT] of the sccache-dist scheduler",
        )
    if r.cache.kind != "sccache":
        yield (
            "dist",
            f"distributed compiles need the sccache compiler cache, not {r.cache.kind}",
            'cache.kind = "sccache" (sccache is the client of sccache-dist; ccache has no distributed mode)',
        )
    if d.credentials_env and d.credentials_file:
        yield ("dist.credentials_file", "set together with dist.credentials_env", "one of the two")


RULES: tuple[Rule, ...] = (
    Rule("torch-known", "the torch release has compatibility data", _known_torch, ("torch.version",)),
    Rule(
        "torchvision-pairs-torch",
        "torchvision pairs with torch as data/compat.toml says (0.(N+15) with 2.N up to 2.14)",
        _vision_pairs_torch,
        ("torch.version", "torchvision.version"),
    ),
    Rule(
        "python-range",
        "Python is within the torch release's supported range",
        _python_range,
        ("torch.version", "python"),
    ),
    Rule(
        "python-free-threaded",
        "a free-threaded Python (3.13t) only where the torch release ships wheels for it",
        _free_threaded,
        ("torch.version", "python"),
    ),
    Rule(
        "cuda-fields",
        "CUDA builds name cuda, arch_list, cudnn, nccl; CPU builds none of them",
        _cuda_fields,
        ("accelerator",),
    ),
    Rule(
        "cuda-range",
        "CUDA is within the torch release's range",
        _cuda_range,
        ("torch.version", "accelerator.cuda"),
    ),
    Rule(
        "cudnn-range",
        "cuDNN is within the torch release's range and built for the CUDA major",
        _cudnn_range,
        ("torch.version", "accelerator.cuda", "accelerator.cudnn"),
    ),
    Rule(
        "nccl-for-cuda",
        "NCCL has a build for the CUDA major",
        _nccl_for_cuda,
        ("accelerator.cuda", "accelerator.nccl"),
    ),
    Rule(
        "runtime-libraries",
        "the cuDNN / NCCL a wheel runs with can run what it is compiled against",
        _runtime_libraries,
        ("accelerator",),
    ),
    Rule(
        "arch-vs-cuda",
        "every arch entry can be targeted by the recipe's nvcc",
        _arch_vs_cuda,
        ("accelerator.cuda", "accelerator.arch_list"),
    ),
    Rule(
        "cudnn-min-sm",
        "cuDNN >= 9.11 with no arch below SM 7.5",
        _cudnn_min_sm,
        ("accelerator.cudnn", "accelerator.arch_list"),
    ),
    Rule(
        "gcc-range",
        "host gcc is new enough for torch and old enough for nvcc",
        _gcc_range,
        ("build.gcc", "torch.version", "accelerator.cuda"),
    ),
    Rule(
        "magma",
        "MAGMA only with CUDA, with version and sha256, in the torch release's range",
        _magma,
        ("magma", "accelerator.kind", "torch.version"),
    ),
    Rule("blas", "MKL builds name the MKL version", _blas, ("blas",)),
    Rule(
        "platform-blas",
        "the BLAS exists on the platform (MKL x86_64 only, NVPL aarch64 only)",
        _platform_blas,
        ("blas.kind", "build.platform"),
    ),
    Rule(
        "platform-cuda",
        "an aarch64 CUDA has sbsa toolkit wheels and upstream aarch64 wheels",
        _platform_cuda,
        ("build.platform", "accelerator.cuda"),
    ),
    Rule(
        "platform-arch",
        "an aarch64 arch list names only what upstream's aarch64 wheels build",
        _platform_arch,
        ("build.platform", "accelerator.cuda", "accelerator.arch_list"),
    ),
    Rule(
        "build-version-pair",
        "PYTORCH_BUILD_VERSION and PYTORCH_BUILD_NUMBER together or not at all",
        _build_version_pair,
        (
            "build.pytorch_build_version",
            "build.pytorch_build_number",
            "build.local_version",
            "torch.version",
        ),
    ),
    Rule(
        "torchvision-features",
        "nvJPEG and the GPU video decoder need CUDA; no video decoders from torchvision 0.24",
        _vision_features,
        ("torchvision.features", "accelerator.kind", "torchvision.version"),
    ),
    Rule("flags", "build.flags does not override what recipe fields decide", _flags, ("build.flags",)),
    Rule(
        "flags-known",
        "build.flags are options the torch release reads, with values of their type",
        _flags_known,
        ("build.flags", "torch.version"),
    ),
    Rule(
        "cache", "cache settings are consistent, usable by the plan and hold no secrets", _cache, ("cache",)
    ),
    Rule("dist", "distributed compiles name a scheduler and use sccache", _dist, ("dist", "cache.kind")),
    Rule(
        "deploy-cuda-libraries",
        "a CUDA wheel's CUDA libraries come from NVIDIA's wheels, or are bundled where upstream bundles them",
        cuda_libraries.problems,
        ("deploy", "accelerator", "torch.version"),
    ),
)


def check_rules(recipe: Recipe, file: str, skip: Collection[str] = ()) -> list[Problem]:
    """Every rule's findings; a rule that reads a field in ``skip`` (already reported as malformed) is not
    run."""
    return [
        Problem(file, *finding)
        for rule in RULES
        if not rule.blocked_by(skip)
        for finding in rule.check(recipe)
    ]


def _describe(spec: SpecifierSet) -> str:
    """'>=3.10, <3.16': lower bounds first, as people read ranges."""
    order = {">=": 0, ">": 1, "==": 2, "~=": 2, "!=": 3, "<=": 4, "<": 5}
    return ", ".join(str(s) for s in sorted(spec, key=lambda s: (order.get(s.operator, 9), s.version)))


def _archs_for(cuda: Version) -> str:
    return " ".join(a for a, s in compat()["arch"].items() if cuda in SpecifierSet(s))
