#!/usr/bin/env python3
"""Regenerate the configure logs of this directory (README.md says what each is). Not run by the tests.

Every line of a log is printed by a real CMake (the one on PATH) running real upstream code:

1. the prologue is the real output of configuring the real PyTorch 2.6.0 tree (``tests/kit/realtrees.py``:
   Debian's ``pytorch_2.6.0+dfsg.orig.tar.xz``) on this machine, up to the last line its top-level
   ``CMakeLists.txt`` prints before ``include(cmake/Dependencies.cmake)``. That tree has no submodules, so
   its configure cannot go further (third_party/protobuf, pocketfft, onnx, ... are absent);
2. the rest comes from a driver project laid out like PyTorch's tree: each upstream statement a scenario
   runs (a ``message(...)``, an ``include``, a ``find_package``) is copied from the upstream file, by its
   line number, to the same line of the same path in the driver, so CMake prints the same
   ``CMake Warning at cmake/public/cuda.cmake:218 (message):`` headers, call stacks, wrapping and spacing it
   prints in a real configure. ``find_package(CUDA)`` and ``find_package(MKL)`` run the real tree's own
   modules on this machine (which has neither). PyTorch's summary is the real ``cmake/Summary.cmake``
   included whole and called where upstream calls it; ONNX's is onnx's real ``cmake/summary.cmake`` (read
   with the search tool from onnx/onnx: give its path with ``--onnx-summary``), called from the driver's
   ``third_party/onnx`` as onnx's CMakeLists.txt calls it, from ``add_subdirectory(third_party/onnx)`` at
   cmake/Dependencies.cmake's real line. The values a scenario prints (versions, paths) are set by the driver.

usage: make_logs.py --tree PYTORCH_2_6_0_TREE --torch-2-13 SITE_PACKAGES/torch --onnx-summary summary.cmake
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent

# The real 2.6.0 configure of this machine, cut after the last line CMakeLists.txt prints before
# include(cmake/Dependencies.cmake) (CMakeLists.txt:858).
PROLOGUE_OPTIONS = ("-DUSE_CUDA=ON", "-DBUILD_TEST=OFF", "-DCMAKE_BUILD_TYPE=Release")
DETECTION = ("-- The C", "-- Detecting C", "-- Check for working C")
PROLOGUE_LAST = "-- Compiler does not support SVE extension. Will not build perfkernels."

# (file, line) of an upstream statement. 2.6.0 lines are of the real tree; "2.13:" lines of torch 2.13.0's
# wheel (torch/share/cmake/Caffe2/public/cuda.cmake is the release's own file).
CUDA_MISSING_2_6 = [
    ("cmake/public/cuda.cmake", 10),  # list(APPEND CMAKE_MODULE_PATH .../Modules_CUDA_fix)
    ("cmake/public/cuda.cmake", 29),  # find_package(CUDA): the real FindCUDA, on a machine without CUDA
    ("cmake/public/cuda.cmake", 31),  # "PyTorch: CUDA cannot be found. ..."
]
CUDA_FOUND_2_6 = [
    ("cmake/public/cuda.cmake", 69),  # "PyTorch: CUDA detected: "
    ("cmake/public/cuda.cmake", 70),
    ("cmake/public/cuda.cmake", 71),
    ("cmake/public/cuda.cmake", 108),  # "PyTorch: Header version is: "
    ("cmake/public/cuda.cmake", 144),  # nvrtc shorthash
]
CUDNN_MISSING_2_6 = [("cmake/public/cuda.cmake", 218)]  # "Cannot find cuDNN library. Turning the option off"
CUSPARSELT_MISSING_2_6 = [("cmake/public/cuda.cmake", 243)]  # "Cannot find cuSPARSELt library. ..."
CUDSS_MISSING_2_6 = [("cmake/public/cuda.cmake", 259)]  # "Cannot find CUDSS library. ..."
CUDA_TAIL_2_6 = [
    ("cmake/public/cuda.cmake", 284),  # "USE_CUFILE is set to 0. Compiling without cuFile support"
    ("cmake/public/cuda.cmake", 335),  # "Added CUDA NVCC flags for: "
]
MKL_MISSING_2_6 = [
    ("cmake/Dependencies.cmake", 192),  # find_package(MKL QUIET): the real FindMKL, on a machine without MKL
    ("cmake/Dependencies.cmake", 207),  # "MKL could not be found. Defaulting to Eigen"
    ("cmake/Dependencies.cmake", 255),  # "Preferred BLAS (MKL) cannot be found, ..."
]
MKL_FOUND_2_6 = [("cmake/Dependencies.cmake", n) for n in (196, 197, 198, 199)]
NCCL_WITHOUT_CUDA_2_6 = [("cmake/Dependencies.cmake", 1103)]  # "Not using CUDA/ROCM, so disabling USE_NCCL..."
# FindNCCL's STATUS lines (they print no location) run where cmake/External/nccl.cmake runs find_package(NCCL)
NCCL_FOUND_2_6 = [("cmake/Modules/FindNCCL.cmake", 82), ("cmake/Modules/FindNCCL.cmake", 88)]
ONNX_2_6 = [("cmake/Dependencies.cmake", 1281)]  # add_subdirectory(third_party/onnx EXCLUDE_FROM_ALL)
FP16_2_6 = [("cmake/Dependencies.cmake", 1368), ("cmake/Dependencies.cmake", 1379)]
NDEBUG_2_6 = [("cmake/Dependencies.cmake", 1379)]  # "Adding -DNDEBUG to compile flags"
MAGMA_FOUND_2_6 = [("cmake/Dependencies.cmake", n) for n in (1397, 1398, 1399, 1400)]
MAGMA_MISSING_2_6 = [("cmake/Dependencies.cmake", 1402)]  # "MAGMA not found. Compiling without MAGMA support"
MAGMA_WITHOUT_CUDA_2_6 = [("cmake/Dependencies.cmake", 1407)]  # "Not compiling with MAGMA. Suppress ..."

CUDA_FOUND_2_13 = [("2.13:cmake/public/cuda.cmake", n) for n in (70, 71, 72, 109, 145)]
CUDNN_MISSING_2_13 = [("2.13:cmake/public/cuda.cmake", 202)]
CUSPARSELT_MISSING_2_13 = [("2.13:cmake/public/cuda.cmake", 227)]
CUDSS_MISSING_2_13 = [("2.13:cmake/public/cuda.cmake", 243)]
CUDA_TAIL_2_13 = [("2.13:cmake/public/cuda.cmake", 268), ("2.13:cmake/public/cuda.cmake", 339)]

INCLUDES = {  # how the driver reaches each file: upstream's include statement, by its line
    "cmake/Dependencies.cmake": ("CMakeLists.txt", 858),
    "cmake/public/cuda.cmake": ("cmake/Dependencies.cmake", 44),
    "cmake/External/nccl.cmake": ("cmake/Dependencies.cmake", 1111),
}


PLACED_IN = {"cmake/Modules/FindNCCL.cmake": "cmake/External/nccl.cmake"}


@dataclass
class Scenario:
    release: str
    events: list[tuple[str, int]]
    values: dict[str, str] = field(default_factory=dict)


COMMON = {
    "TORCH_VERSION": "2.6.0",
    "CMAKE_BUILD_TYPE": "Release",
    "BUILD_PYTHON": "True",
    "Python_VERSION": "3.12.8",
    "Python_EXECUTABLE": "/work/venv/bin/python",
    "Python_LIBRARIES": "/usr/lib/x86_64-linux-gnu/libpython3.12.so",
    "Python_INCLUDE_DIRS": "/usr/include/python3.12",
    "Python_SITELIB": "/work/venv/lib/python3.12/site-packages",
    "BUILD_SHARED_LIBS": "ON",
    "BUILD_CUSTOM_PROTOBUF": "ON",
    "CAFFE2_LINK_LOCAL_PROTOBUF": "ON",
    "USE_BLAS": "1",
    "USE_LAPACK": "1",
    "USE_ASAN": "OFF",
    "USE_TSAN": "OFF",
    "USE_CPP_CODE_COVERAGE": "OFF",
    "USE_XPU": "OFF",
    "USE_ROCM": "OFF",
    "USE_FBGEMM": "ON",
    "USE_FAKELOWP": "OFF",
    "USE_KINETO": "ON",
    "USE_GFLAGS": "OFF",
    "USE_GLOG": "OFF",
    "USE_LITE_PROTO": "OFF",
    "USE_MKLDNN": "ON",
    "USE_MKLDNN_ACL": "OFF",
    "USE_MKLDNN_CBLAS": "OFF",
    "USE_UCC": "OFF",
    "USE_ITT": "ON",
    "USE_NNPACK": "ON",
    "USE_NUMPY": "ON",
    "USE_OPENMP": "ON",
    "USE_MIMALLOC": "OFF",
    "USE_VULKAN": "OFF",
    "USE_PROF": "OFF",
    "USE_PYTORCH_QNNPACK": "ON",
    "USE_XNNPACK": "ON",
    "USE_DISTRIBUTED": "ON",
    "USE_MPI": "OFF",
    "USE_GLOO": "ON",
    "USE_GLOO_WITH_OPENSSL": "OFF",
    "USE_TENSORPIPE": "ON",
    "USE_GOLD_LINKER": "OFF",
    "USE_CCACHE": "ON",
    "CCACHE_PROGRAM": "/usr/bin/ccache",
    "CMAKE_INSTALL_PREFIX": "/work/src/torch/torch",
    "CMAKE_PREFIX_PATH": "/work/venv/lib/python3.12/site-packages",
    "ONNX_VERSION": "1.17.0",
    "ONNX_NAMESPACE": "onnx_torch",
    "ONNX_USE_LITE_PROTO": "OFF",
    "ONNX_USE_PROTOBUF_SHARED_LIBS": "OFF",
    "ONNX_DISABLE_EXCEPTIONS": "OFF",
    "ONNX_DISABLE_STATIC_REGISTRATION": "OFF",
    "ONNX_WERROR": "OFF",
    "ONNX_HARDENING": "OFF",
    "ONNX_BUILD_TESTS": "OFF",
    "ONNX_USE_UNITY_BUILD": "OFF",
    "ONNX_BUILD_PYTHON": "OFF",
    "Protobuf_VERSION": "3.13.0.0",
    "BLAS": "MKL",
    "USE_STATIC_MKL": "OFF",
    # upstream's option defaults (CMakeLists.txt) for the summary lines the scenarios do not change
    "BUILD_STATIC_RUNTIME_BENCHMARK": "OFF",
    "BUILD_BINARY": "OFF",
    "CAFFE2_USE_MSVC_STATIC_RUNTIME": "ON",
    "BUILD_TEST": "False",
    "BUILD_JNI": "OFF",
    "BUILD_MOBILE_AUTOGRAD": "OFF",
    "BUILD_LITE_INTERPRETER": "OFF",
    "TRACING_BASED": "OFF",
    "USE_PYTORCH_METAL": "OFF",
    "USE_PYTORCH_METAL_EXPORT": "OFF",
    "USE_MPS": "OFF",
    "USE_OBSERVERS": "OFF",
    "USE_OPENCL": "OFF",
    "USE_COREML_DELEGATE": "OFF",
    "BUILD_LAZY_TS_BACKEND": "ON",
    "USE_ROCM_KERNEL_ASSERT": "OFF",
    "USE_CUDNN": "OFF",
    "USE_CUSPARSELT": "OFF",
    "USE_CUDSS": "OFF",
    "Caffe2_PUBLIC_DEPENDENCY_LIBS": "",
    "Caffe2_DEPENDENCY_LIBS": "onnx_library;foxi_loader;fmt::fmt-header-only;kineto",
}
CUDA_VALUES = {
    "USE_CUDA": "ON",
    "CUDA_VERSION": "12.4",
    "CUDA_VERSION_STRING": "12.4",
    "cuda_version_from_header": "12.4",
    "CUDA_NVCC_EXECUTABLE": "/usr/local/cuda/bin/nvcc",
    "CUDA_TOOLKIT_ROOT_DIR": "/usr/local/cuda",
    "CUDA_NVRTC_LIB": "/usr/local/cuda/lib64/libnvrtc.so.12",
    "CUDA_NVRTC_SHORTHASH": "5c9a5e26",
    "NVCC_FLAGS_EXTRA": "-gencode;arch=compute_80,code=sm_80;-gencode;arch=compute_90,code=sm_90",
    "BUILD_SPLIT_CUDA": "OFF",
    "CAFFE2_STATIC_LINK_CUDA": "OFF",
    "USE_CUFILE": "OFF",
    "USE_FLASH_ATTENTION": "ON",
    "USE_MEM_EFF_ATTENTION": "ON",
    "CUDA_cuda_driver_LIBRARY": "/usr/local/cuda/lib64/stubs/libcuda.so",
    "CUDA_cudart_LIBRARY": "/usr/local/cuda/lib64/libcudart.so",
    "CUDA_cublas_LIBRARY": "/usr/local/cuda/lib64/libcublas.so",
    "CUDA_cufft_LIBRARY": "/usr/local/cuda/lib64/libcufft.so",
    "CUDA_curand_LIBRARY": "/usr/local/cuda/lib64/libcurand.so",
    "CUDA_cusparse_LIBRARY": "/usr/local/cuda/lib64/libcusparse.so",
    "CUDA_nvrtc_LIBRARY": "/usr/local/cuda/lib64/libnvrtc.so",
    "CUDA_INCLUDE_DIRS": "/usr/local/cuda/include",
    "CMAKE_CUDA_COMPILER": "/usr/local/cuda/bin/nvcc",
    "CMAKE_CUDA_HOST_COMPILER": "",
    "CUDA_SEPARABLE_COMPILATION": "OFF",
    "USE_TENSORRT": "OFF",
    "Caffe2_PUBLIC_CUDA_DEPENDENCY_LIBS": "",
    "Caffe2_CUDA_DEPENDENCY_LIBS": "caffe2::curand;caffe2::cufft;caffe2::cublas;__caffe2_nccl;torch::cudart",
    "CUDNN_VERSION": "9.1.0",
    "CUSPARSELT_VERSION": "0.6.3",
    "USE_SYSTEM_NCCL": "ON",
    "NCCL_VERSION_FROM_HEADER": "22105",
    "NCCL_INCLUDE_DIRS": "/usr/local/cuda/include",
    "NCCL_LIBRARIES": "/usr/local/cuda/lib64/libnccl.so",
    "MAGMA_INCLUDE_DIR": "/opt/magma/include",
    "MAGMA_LIBRARIES": "/opt/magma/lib/libmagma.a",
    "MAGMA_V2": "1",
}
MKL_VALUES = {
    "CAFFE2_USE_MKL": "ON",
    "USE_STATIC_MKL": "ON",
    "BLAS_INFO": "mkl",
    "Caffe2_PUBLIC_DEPENDENCY_LIBS": "caffe2::mkl",
    "LAPACK_INFO": "mkl",
    "MKL_LIBRARIES": "-Wl,--start-group;/work/venv/lib/libmkl_intel_lp64.a;/work/venv/lib/libmkl_gnu_thread.a;"
    "/work/venv/lib/libmkl_core.a;-Wl,--end-group;-fopenmp;-lpthread;-lm;-ldl",
    "MKL_INCLUDE_DIR": "/work/venv/include",
    "MKL_OPENMP_TYPE": "GNU",
    "MKL_OPENMP_LIBRARY": "/usr/lib/gcc/x86_64-linux-gnu/12/libgomp.so",
}

# What torch 2.13.0's configure (the CUDA 13.0 wheel's cmake files) sets in every 2.13 scenario.
VALUES_2_13 = {
    **CUDA_VALUES,
    **MKL_VALUES,
    "TORCH_VERSION": "2.13.0",
    "CUDA_VERSION": "13.0",
    "CUDA_VERSION_STRING": "13.0",
    "cuda_version_from_header": "13.0",
    "CUDA_NVRTC_LIB": "/usr/local/cuda/lib64/libnvrtc.so.13",
    "NVCC_FLAGS_EXTRA": "-gencode;arch=compute_90,code=sm_90;-gencode;arch=compute_120,code=sm_120",
}

SCENARIOS = {
    # USE_CUDA asked for, no CUDA toolkit: CUDA, NCCL, MAGMA (and, without MKL, MKL) come out off
    "pytorch-2.6.0-no-cuda-no-mkl.log": Scenario(
        "2.6",
        CUDA_MISSING_2_6 + MKL_MISSING_2_6 + NCCL_WITHOUT_CUDA_2_6 + ONNX_2_6 + NDEBUG_2_6 + MAGMA_WITHOUT_CUDA_2_6,
        {
            "USE_CUDA": "OFF",
            "CAFFE2_USE_MKL": "OFF",
            "CAFFE2_USE_EIGEN_FOR_BLAS": "ON",
            "USE_BLAS": "0",
            "USE_LAPACK": "0",
            "USE_NCCL": "OFF",
            "USE_MAGMA": "ON",
        },
    ),
    # CUDA found; cuDNN, cuSPARSELt, cuDSS and MAGMA missing
    "pytorch-2.6.0-cuda-without-libraries.log": Scenario(
        "2.6",
        CUDA_FOUND_2_6
        + CUDNN_MISSING_2_6
        + CUSPARSELT_MISSING_2_6
        + CUDSS_MISSING_2_6
        + CUDA_TAIL_2_6
        + MKL_FOUND_2_6
        + NCCL_FOUND_2_6
        + ONNX_2_6
        + FP16_2_6
        + MAGMA_MISSING_2_6,
        {
            **CUDA_VALUES,
            **MKL_VALUES,
            "USE_CUDNN": "OFF",
            "USE_CUSPARSELT": "OFF",
            "USE_CUDSS": "OFF",
            "USE_NCCL": "ON",
        },
    ),
    # everything the CUDA recipes ask for is found
    "pytorch-2.6.0-all-found.log": Scenario(
        "2.6",
        CUDA_FOUND_2_6 + CUDA_TAIL_2_6 + MKL_FOUND_2_6 + NCCL_FOUND_2_6 + ONNX_2_6 + FP16_2_6 + MAGMA_FOUND_2_6,
        {
            **CUDA_VALUES,
            **MKL_VALUES,
            "USE_CUDNN": "ON",
            "USE_CUSPARSELT": "ON",
            "USE_CUDSS": "ON",
            "USE_NCCL": "ON",
            "CUDSS_LIBRARY_PATH": "/usr/local/cuda/lib64/libcudss.so",
        },
    ),
    # torch 2.13.0's cuda.cmake: cuDNN, cuSPARSELt, cuDSS and MAGMA missing
    "pytorch-2.13.0-cuda-without-libraries.log": Scenario(
        "2.13",
        CUDA_FOUND_2_13
        + CUDNN_MISSING_2_13
        + CUSPARSELT_MISSING_2_13
        + CUDSS_MISSING_2_13
        + CUDA_TAIL_2_13
        + MKL_FOUND_2_6
        + NCCL_FOUND_2_6
        + ONNX_2_6
        + FP16_2_6
        + MAGMA_MISSING_2_6,
        {
            **VALUES_2_13,
            "USE_CUDNN": "OFF",
            "USE_CUSPARSELT": "OFF",
            "USE_CUDSS": "OFF",
            "USE_NCCL": "ON",
            "NCCL_VERSION_FROM_HEADER": "22907",
            "ONNX_VERSION": "1.19.1",
        },
    ),
    "pytorch-2.13.0-all-found.log": Scenario(
        "2.13",
        CUDA_FOUND_2_13 + CUDA_TAIL_2_13 + MKL_FOUND_2_6 + NCCL_FOUND_2_6 + ONNX_2_6 + FP16_2_6 + MAGMA_FOUND_2_6,
        {
            **VALUES_2_13,
            "USE_CUDNN": "ON",
            "USE_CUSPARSELT": "ON",
            "USE_CUDSS": "ON",
            "USE_NCCL": "ON",
            "CUDNN_VERSION": "9.20.0",
            "CUSPARSELT_VERSION": "0.8.1",
            "NCCL_VERSION_FROM_HEADER": "22907",
            "ONNX_VERSION": "1.19.1",
        },
    ),
}


def statement(text: list[str], line: int) -> list[str]:
    """The CMake command starting at ``line`` (1-based) of ``text``: up to its balanced closing paren."""
    depth, quoted, out = 0, False, []
    for current in text[line - 1 :]:
        out.append(current)
        escaped = False
        for char in current:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quoted = not quoted
            elif not quoted and char == "(":
                depth += 1
            elif not quoted and char == ")":
                depth -= 1
                if depth == 0:
                    return [s.strip() for s in out]
    raise ValueError(f"no complete statement at line {line}")


def upstream_text(name: str, tree: Path, torch_2_13: Path) -> list[str]:
    if name.startswith("2.13:"):
        path = torch_2_13 / "share" / "cmake" / "Caffe2" / name.split(":", 1)[1].removeprefix("cmake/")
    else:
        path = tree / name
    return path.read_text().splitlines()


def place(files: dict[str, dict[int, list[str]]], name: str, line: int, lines: list[str]) -> None:
    slots = files.setdefault(name, {})
    for offset, text in enumerate(lines):
        assert line + offset not in slots, f"{name}:{line + offset} is taken"
        slots[line + offset] = [text]


def render(slots: dict[int, list[str]]) -> str:
    last = max(slots)
    return "\n".join(" ".join(slots.get(n, [""])) for n in range(1, last + 1)) + "\n"


def driver(scenario: Scenario, tree: Path, torch_2_13: Path, onnx_summary: Path, root: Path) -> None:
    values = {**COMMON, **scenario.values}
    files: dict[str, dict[int, list[str]]] = {}
    for name, line in scenario.events:
        text = upstream_text(name, tree, torch_2_13)
        target = PLACED_IN.get(name, name.removeprefix("2.13:"))
        place(files, target, line, statement(text, line))
    for name in list(files):  # the include chain, at upstream's lines
        child = name
        while child in INCLUDES:
            parent, line = INCLUDES[child]
            slot = files.setdefault(parent, {})
            if line not in slot:
                slot[line] = [statement((tree / parent).read_text().splitlines(), line)[0]]
            child = parent
    top = files.setdefault("CMakeLists.txt", {})
    top[1358] = ["include(cmake/Summary.cmake)"]
    top[1359] = ["caffe2_print_configuration_summary()"]
    preamble = [
        "cmake_minimum_required(VERSION 3.18)",
        "project(Torch CXX C)",
        "set(CMAKE_MODULE_PATH ${PROJECT_SOURCE_DIR}/cmake/Modules ${CMAKE_MODULE_PATH})",
        "set(CMAKE_CXX_FLAGS \" -D_GLIBCXX_USE_CXX11_ABI=1 -fvisibility-inlines-hidden -DUSE_PTHREADPOOL "
        '-DNDEBUG -DUSE_KINETO -DUSE_FBGEMM -DUSE_XNNPACK -O2 -fPIC -Wall -Wextra")',
        *(f'set({k} "{v}")' for k, v in values.items()),
        "set(CUDA_LIBRARIES ${CUDA_cudart_LIBRARY})",
        "add_library(torch::cudnn INTERFACE IMPORTED)",
        "set_property(TARGET torch::cudnn PROPERTY INTERFACE_LINK_LIBRARIES /usr/local/cuda/lib64/libcudnn.so)",
        "add_library(torch::cusparselt INTERFACE IMPORTED)",
        "set_property(TARGET torch::cusparselt PROPERTY INTERFACE_LINK_LIBRARIES "
        "/usr/local/cuda/lib64/libcusparseLt.so)",
        "add_library(torch::cudss INTERFACE IMPORTED)",
        "set_property(TARGET torch::cudss PROPERTY INTERFACE_LINK_LIBRARIES /usr/local/cuda/lib64/libcudss.so)",
    ]
    assert len(preamble) < 850
    for n, text in enumerate(preamble, start=1):
        top[n] = [text]
    for name, slots in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(slots))
    # the real modules find_package runs; the real summary, included whole
    for sub in ("cmake/Modules", "cmake/Modules_CUDA_fix"):
        shutil.copytree(tree / sub, root / sub, dirs_exist_ok=True)
    shutil.copy(tree / "cmake" / "Summary.cmake", root / "cmake" / "Summary.cmake")
    onnx = root / "third_party" / "onnx"
    (onnx / "cmake").mkdir(parents=True)
    shutil.copy(onnx_summary, onnx / "cmake" / "summary.cmake")
    (onnx / "CMakeLists.txt").write_text(
        "add_library(onnx_proto INTERFACE)\n"
        "add_library(onnx INTERFACE)\n"
        "include(${CMAKE_CURRENT_LIST_DIR}/cmake/summary.cmake)\n"
        "onnx_print_configuration_summary()\n"
    )


def prologue(tree: Path, work: Path) -> list[str]:
    """The real configure of the tree, stdout and stderr in one stream as a terminal shows them."""
    build = work / "prologue"
    build.mkdir()
    done = subprocess.run(
        ["cmake", "-G", "Ninja", str(tree), *PROLOGUE_OPTIONS],
        cwd=build,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = done.stdout.splitlines()
    return lines[: lines.index(PROLOGUE_LAST) + 1]


def run_driver(root: Path, build: Path) -> list[str]:
    build.mkdir()
    done = subprocess.run(
        ["cmake", "-G", "Ninja", str(root)], cwd=build, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    # project()'s compiler detection: the prologue already has the tree's own
    while lines and lines[0].startswith(DETECTION):
        del lines[0]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, required=True)
    parser.add_argument("--torch-2-13", type=Path, required=True)
    parser.add_argument("--onnx-summary", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        head = prologue(args.tree, work)
        for name, scenario in SCENARIOS.items():
            root = work / name / "src"
            driver(scenario, args.tree, args.torch_2_13, args.onnx_summary, root)
            body = run_driver(root, work / name / "build")
            text = "\n".join(head + body) + "\n"
            # the driver's own paths read as a build of the tree would print them
            text = text.replace(str(root), "/work/src/torch").replace(str(work / name / "build"), "/work/src/torch/build")
            text = text.replace(str(args.tree), "/work/src/torch").replace(str(work / "prologue"), "/work/src/torch/build")
            (args.out / name).write_text(text)
            print(f"{name}: {len(text.splitlines())} lines")


if __name__ == "__main__":
    main()
