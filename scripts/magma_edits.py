"""Edit an unpacked MAGMA release the way PyTorch builds it, before CMake runs (scripts/install_magma.sh).

PyTorch builds the MAGMA it links (``.ci/magma/build_magma.sh``) from the release tarball with its patches
in ``.ci/magma/package_files/``. These are torchkiln's own edits with the same effect, as data: each names a
file, what it changes and why, a pattern over the original text and how many times it must match. A pattern
that does not match exactly that often stops the build (exit 1) naming the file and the edit: a tarball
that is not the release the edits were written for is refused, never half-edited.

What PyTorch's patches do that needs no edit here is done with CMake options in install_magma.sh instead:
USE_FORTRAN off, no OpenMP / LAPACK search (CMAKE_DISABLE_FIND_PACKAGE_*), a static library with
position-independent code (BUILD_SHARED_LIBS=OFF, CMAKE_POSITION_INDEPENDENT_CODE=ON), ``-static-libstdc++
-fno-exceptions`` (CMAKE_CXX_FLAGS), only the ``magma`` target built and installed (no sparse library, no
testers, no pkg-config file).

    python magma_edits.py --version 2.6.1 SRC_DIR     # edit in place
    python magma_edits.py --versions                  # the releases known here, one per line
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Edit:
    file: str
    why: str
    pattern: str  # a regular expression (re.MULTILINE | re.DOTALL)
    replacement: str  # re.sub replacement
    count: int  # how often the pattern must match


# GPU_TARGET=All builds exactly the -gencode flags given as CUDA_ARCH_LIST (the recipe's arch list); MAGMA
# 2.6.1's own GPU_TARGET names stop at Ampere (sm_80), so sm_86 ... sm_120 would be dropped silently.
ARCH_LIST_BLOCK = """\
    # torchkiln: GPU_TARGET=All compiles for exactly the nvcc flags in CUDA_ARCH_LIST.
    if (GPU_TARGET STREQUAL "All")
        set( MIN_ARCH 370 )
        set( NV_SM ${CUDA_ARCH_LIST} )
        set( NV_COMP "" )
    endif()

"""

EDITS: dict[str, tuple[Edit, ...]] = {
    "2.6.1": (
        Edit(
            "CMake.src.cuda",
            "leave out the Fermi GEMM/GEMV kernels (PyTorch's CMake.patch drops the same eight sources)",
            r"^(magmablas/[sdcz]ge(?:mm|mv)_fermi\.cu)$",
            r"#\1",
            8,
        ),
        Edit(
            "CMakeLists.txt",
            "no relocatable device code: libtorch links the static library without a device-link step",
            r"set\(\s*CUDA_SEPARABLE_COMPILATION\s+ON\s*\)",
            "set(CUDA_SEPARABLE_COMPILATION OFF)",
            1,
        ),
        Edit(
            "CMakeLists.txt",
            "an explicit -gencode list instead of MAGMA's architecture names (GPU_TARGET=All)",
            r"^(    if \(NOT MIN_ARCH\)\n)",
            ARCH_LIST_BLOCK.replace("\\", "\\\\") + r"\1",
            1,
        ),
        Edit(
            "CMakeLists.txt",
            "cuBLAS backend, compressed fat binaries, C++11 device code (PyTorch's nvcc flags for MAGMA)",
            r"set\( CUDA_NVCC_FLAGS \$\{CUDA_NVCC_FLAGS\} -Xcompiler -fPIC ",
            "set( CUDA_NVCC_FLAGS ${CUDA_NVCC_FLAGS} -DHAVE_CUBLAS -Xfatbin -compress-all -Xcompiler -fPIC "
            "-std=c++11 ",
            1,
        ),
        Edit(
            "CMakeLists.txt",
            "the sparse testers' policy setting, which current CMake refuses (no testers are built)",
            r"^cmake_policy\( SET CMP0037 OLD\)$",
            "# cmake_policy( SET CMP0037 OLD)",
            1,
        ),
        Edit(
            "interface_cuda/interface.cpp",
            "cudaDeviceProp::clockRate is gone in CUDA 13: print 0 MHz there instead of failing to compile",
            r"^( *)prop\.clockRate / 1000\.,\n",
            "#if defined(CUDA_VERSION) && CUDA_VERSION >= 13000\n"
            r"\g<1>0., /* torchkiln: cudaDeviceProp::clockRate was removed in CUDA 13 */"
            "\n#else\n"
            r"\g<1>prop.clockRate / 1000.,"
            "\n#endif\n",
            1,
        ),
        Edit(
            "control/thread_queue.cpp",
            "built with -fno-exceptions: report the error without throwing (as PyTorch's build does)",
            r"^( *)throw std::exception\(\);",
            r"\1// throw std::exception();  /* torchkiln: -fno-exceptions */",
            2,
        ),
        Edit(
            "src/zgetrf_batched.cpp",
            "small square batched LU: the shuffle kernel gives wrong results, use the no-shuffle one",
            r"return magma_zgetrf_batched_smallsq_shfl\(",
            "return magma_zgetrf_batched_smallsq_noshfl(",
            1,
        ),
        Edit(
            "control/get_batched_crossover.cpp",
            "batched LU recursion block size 16 instead of 32 (PyTorch's getrf_nbparam.patch)",
            r"(void magma_get_[sdcz]getrf_batched_nbparam\([^)]*\)\s*\{[^}]*?\*recnb\s*=\s*)32;",
            r"\g<1>16;",
            4,
        ),
    ),
}


def apply(version: str, source: Path) -> list[str]:
    """Apply every edit of ``version`` under ``source``; returns problems (nothing written when any)."""
    edits = EDITS.get(version)
    if edits is None:
        return [f"no edits known for MAGMA {version} (valid: {', '.join(EDITS)})"]
    texts: dict[str, str] = {}
    problems: list[str] = []
    for edit in edits:
        path = source / edit.file
        if edit.file not in texts:
            if not path.is_file():
                problems.append(f"{edit.file}: no such file in {source} (is this MAGMA {version}?)")
                texts[edit.file] = ""
                continue
            texts[edit.file] = path.read_text(encoding="utf-8", errors="surrogateescape")
        pattern = re.compile(edit.pattern, re.MULTILINE | re.DOTALL)
        found = len(pattern.findall(texts[edit.file]))
        if found != edit.count:
            problems.append(
                f"{edit.file}: expected {edit.count} match(es) of {edit.pattern!r} ({edit.why}), found {found}"
                f" (is this MAGMA {version}?)"
            )
            continue
        texts[edit.file] = pattern.sub(edit.replacement, texts[edit.file])
    if problems:
        return problems
    for name, text in texts.items():
        (source / name).write_text(text, encoding="utf-8", errors="surrogateescape")
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--versions", action="store_true", help="print the MAGMA releases known here")
    parser.add_argument("--version", help="the MAGMA release the source is")
    parser.add_argument("source", nargs="?", type=Path, help="the unpacked release")
    args = parser.parse_args(argv)
    if args.versions:
        print("\n".join(EDITS))
        return 0
    if not args.version or args.source is None:
        parser.error("--version and SOURCE are required")
    problems = apply(args.version, args.source)
    for problem in problems:
        print(f"magma_edits: {problem}", file=sys.stderr)
    if problems:
        return 1
    for edit in EDITS[args.version]:
        print(f"magma_edits: {edit.file}: {edit.why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
