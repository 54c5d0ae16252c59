#!/usr/bin/env bash
# Runs inside the CUDA devel image (tests/test_images_cuda.py), as root, with the checkout mounted read-only
# at $KILN_CHECKOUT and upstream's torch wheel at $KILN_WHEELS. It builds, links and runs; the test reads
# its "KILN <section> <json>" lines and asserts on them. The environment holds what the build plan gives the
# torch build of the recipe (CUDA_HOME, CUDACXX, NCCL_*, TORCH_CUDA_ARCH_LIST), EXPECT_CUDNN/EXPECT_NCCL and
# KILN_TOOLKIT_TARGET (the toolkit's targets/ directory on the image's platform: x86_64-linux, sbsa-linux).
set -euo pipefail

checkout=${KILN_CHECKOUT:?}
work=$(mktemp -d)
report() { printf 'KILN %s %s\n' "$1" "$2"; }
# KILN_CHECKS: the sections to run, by name (default: all five); CI's arm64 tier, emulated, runs three of them.
checks=" ${KILN_CHECKS:-layout nvcc cmake magma ext} "
for section in $checks; do
  case "$section" in
    layout|nvcc|cmake|magma|ext) ;;
    *) echo "KILN_CHECKS: no section '$section' (valid: layout nvcc cmake magma ext)" >&2; exit 2 ;;
  esac
done
wants() { [[ "$checks" == *" $1 "* ]]; }
cuda=$(readlink -f /usr/local/cuda)

# ---- the toolkit's layout -------------------------------------------------------------------------------
if wants layout; then
missing=()
for f in bin/nvcc bin/ptxas nvvm/bin/cicc include/cuda.h include/cudnn.h include/nccl.h include/nvjpeg.h \
         include/cusparseLt.h include/cublas_v2.h include/nvtx3/nvToolsExt.h include/cccl/cub/cub.cuh \
         "targets/${KILN_TOOLKIT_TARGET:?}/include/cuda_runtime.h" lib64/libcudart.so lib64/libcublas.so lib64/libcudnn.so \
         lib64/libnccl.so lib64/libnvjpeg.so lib64/libcusparseLt.so lib64/libnvshmem_host.so \
         lib64/libcufile.so lib64/stubs/libcuda.so; do
  [[ -e "$cuda/$f" ]] || missing+=("$f")
done
soname=$(readelf -d "$cuda/lib64/stubs/libcuda.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
on_loader_path=$(ldconfig -p | grep -c 'libcuda\.so' || true)
report layout "{\"cuda\": \"$cuda\", \"missing\": \"${missing[*]}\", \"stub_soname\": \"$soname\", \"libcuda_on_loader_path\": $on_loader_path}"
fi

# ---- nvcc: one kernel compiled and linked for every arch of the recipe, then run --------------------------
if wants nvcc; then
# shellcheck source=../../scripts/gencode.sh
source "$checkout/scripts/gencode.sh"
mapfile -t gencode < <(gencode_flags "$TORCH_CUDA_ARCH_LIST")
mkdir -p "$work/nvcc/keep"
cat > "$work/nvcc/probe.cu" <<'CU'
#include <cstdio>
__global__ void kiln_add(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }
int main() { int n = -1; std::printf("%s\n", cudaGetErrorName(cudaGetDeviceCount(&n))); return 0; }
CU
nvcc "${gencode[@]}" -keep -keep-dir "$work/nvcc/keep" -o "$work/nvcc/probe" "$work/nvcc/probe.cu"
# nvcc keeps one cubin per real target: probe.compute_75.cubin, probe.compute_120.sm_120.cubin, ...
cubins=$(cd "$work/nvcc/keep" && ls probe.*.cubin | sed -E 's/^probe\.compute_([0-9]+[af]?)(\.sm_[0-9]+[af]?)?\.cubin$/sm_\1/' | sort -u | tr '\n' ' ')
report nvcc "{\"cubins\": \"$cubins\", \"runs\": \"$("$work/nvcc/probe")\", \"targets\": ${#gencode[@]}}"
fi

# ---- a CMake project that finds the toolkit as PyTorch's build does ---------------------------------------
if wants cmake; then
# With the CMake torchkiln's build venv gets (cmake>=3.27 from PyPI; the plan's build-env step): Debian's
# 3.25.1 FindCUDAToolkit fails on toolkits without libnvToolsExt (CUDA >= 12.9) when a project requires 3.25.
python -m pip install --quiet "cmake>=3.27"
archs=$(echo "$TORCH_CUDA_ARCH_LIST" | tr -d '.')  # 7.5;8.0 -> 75;80 (CMAKE_CUDA_ARCHITECTURES)
cmake -S "$checkout/tests/data/cuda_cmake_project" -B "$work/cmake" -G Ninja \
  -DEXPECT_CUDA="${KILN_CUDA:?}" -DEXPECT_CUDNN="$EXPECT_CUDNN" -DEXPECT_NCCL="$EXPECT_NCCL" \
  "-DCMAKE_CUDA_ARCHITECTURES=$archs" > "$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; exit 1; }
grep '^-- kiln:' "$work/cmake.log"
cmake --build "$work/cmake" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
versions=$("$work/cmake/kiln_cuda_versions" | tr '\n' ';')
driver_needed=$(readelf -d "$work/cmake/libkiln_driver.so" | sed -n 's/.*NEEDED.*\[\(libcuda[^]]*\)\].*/\1/p')
report cmake "{\"versions\": \"$versions\", \"driver_needed\": \"$driver_needed\"}"
fi

# ---- MAGMA the way PyTorch builds it, on tests/data/magma_shape (the release is not reachable) -------------
if wants magma; then
tar -C "$checkout/tests/data" -czf "$work/magma-2.6.1.tar.gz" --transform 's,^magma_shape,magma-2.6.1,' magma_shape
KILN_MAGMA_VERSION=2.6.1 KILN_MAGMA_URL="file://$work/magma-2.6.1.tar.gz" \
  KILN_MAGMA_SHA256=$(sha256sum "$work/magma-2.6.1.tar.gz" | cut -d' ' -f1) \
  KILN_CUDA_ARCH_LIST="$TORCH_CUDA_ARCH_LIST" MAGMA_PREFIX="$work/magma" \
  bash "$checkout/scripts/install_magma.sh" > "$work/magma.log" 2>&1 || { cat "$work/magma.log"; exit 1; }
grep -E '^(install_magma|magma_edits):' "$work/magma.log"
cat > "$work/magma_check.c" <<'C'
#include <stdio.h>
#include "magma.h"
int main(void) {
  magma_int_t nb = 0, recnb = 0, all16 = 1;
  void (*getrf[])(magma_int_t, magma_int_t*, magma_int_t*) = {
      magma_get_zgetrf_batched_nbparam, magma_get_cgetrf_batched_nbparam,
      magma_get_dgetrf_batched_nbparam, magma_get_sgetrf_batched_nbparam};
  for (int i = 0; i < 4; ++i) { getrf[i](64, &nb, &recnb); all16 = all16 && recnb == 16; }
  magma_get_spotrf_batched_nbparam(64, &nb, &recnb);
  printf("{\"getrf_recnb_16\": %d, \"potrf_recnb\": %d, \"zgetrf_kernel\": %d}\n", all16, recnb,
         magma_zgetrf_batched(8, 800));
  return 0;
}
C
# libmagma.a into a shared library (only position-independent objects link into one), then a program on it.
gcc -shared -o "$work/libkilnmagma.so" -Wl,--whole-archive "$work/magma/lib/libmagma.a" -Wl,--no-whole-archive \
  -L"$cuda/lib64" -lcudart -lstdc++
gcc -I"$work/magma/include" -I"$cuda/include" -o "$work/magma_check" "$work/magma_check.c" \
  -L"$work" -lkilnmagma -Wl,-rpath,"$work"
report magma "$("$work/magma_check")"
fi

# ---- a CUDA extension through the compiler cache, built twice from two checkouts ---------------------------
if wants ext; then
# --no-compile: Python writes the bytecode of what the builds import when they first import it; compiling all
# of torch's .py files beforehand costs more, under emulation most of all
python -m pip install --quiet --no-deps --no-compile "$KILN_WHEELS"/torch-*.whl
python -m pip install --quiet --no-compile filelock typing-extensions sympy networkx jinja2 fsspec numpy \
  "setuptools>=77.0.3" wheel build
python - "$checkout/tests/data/cache_ext" "$work/ext" <<'PY'
import json, os, shutil, subprocess, sys, time, zipfile
from dataclasses import replace
from pathlib import Path
from torchkiln import cache
from torchkiln.recipe.model import CacheSpec

source, root = Path(sys.argv[1]), Path(sys.argv[2])
config = cache.resolve_cache(CacheSpec(kind="ccache"), dir=root / "ccache")
# different checkout paths: CCACHE_BASEDIR maps them onto each other; KILN_EXT_BUILDERS=first builds it once
for builder in os.environ.get("KILN_EXT_BUILDERS", "first second").split():
    checkout = root / builder / "cache_ext"
    shutil.copytree(source, checkout)
    # The container's environment (the plan's CUDA variables: TORCH_CUDA_ARCH_LIST, CUDA_HOME, ...) without
    # inherited cache settings, then the cache session's public and secret layers, as a compile step gets them.
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("CCACHE_", "SCCACHE_"))}
    environ |= {"MAX_JOBS": "2", "KILN_CACHE_EXT_CUDA": "1"}
    session = cache.open_session(replace(config, basedir=checkout.parent), environ)
    env = {**environ, **session.public_env, **session.secret_env}
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--skip-dependency-check"], cwd=checkout,
                              env=env, capture_output=True, text=True, timeout=1500)
    finally:
        stats = session.close()
    if done.returncode != 0:
        print(done.stdout[-4000:], done.stderr[-4000:], file=sys.stderr)
        sys.exit(1)
    (wheel,) = (checkout / "dist").glob("*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall",
                    str(wheel)], check=True)
    probe = subprocess.run([sys.executable, "-c", "import torch, kiln_cache_ext._C as c; "
                            "print(torch.version.cuda, c.cuda_launch_status())"],
                           cwd=root, capture_output=True, text=True, check=True)
    with zipfile.ZipFile(wheel) as zf:
        so = [n for n in zf.namelist() if n.endswith(".so")]
    nvcc_cached = "ccache" in done.stdout and "nvcc" in done.stdout
    print("KILN ext " + json.dumps({"builder": builder, "seconds": round(time.monotonic() - start, 1),
                                    "hits": stats.hits, "misses": stats.misses,
                                    "uncacheable": stats.uncacheable, "so": so, "probe": probe.stdout.split(),
                                    "nvcc_through_ccache": nvcc_cached}), flush=True)
PY
fi
rm -rf "$work"
