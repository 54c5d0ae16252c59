#!/usr/bin/env bash
# Devel image: MAGMA (GPU LAPACK, torch.linalg on CUDA), built from its pinned release tarball the way
# PyTorch builds the MAGMA its wheels link (.ci/magma/build_magma.sh and package_files/build.sh): the
# release edited first (magma_edits.py: torchkiln's equivalents of PyTorch's patches, among them the guard
# for cudaDeviceProp::clockRate that CUDA 13 removed), then a static, position-independent libmagma.a for
# an explicit -gencode list (GPU_TARGET=All + CUDA_ARCH_LIST), no Fortran, OpenMP, LAPACK, sparse library
# or testers.
#
# The tarball's sha256 must equal the recipe's magma.sha256 before anything is unpacked; a mismatch stops
# the build and leaves nothing installed. Reads KILN_MAGMA_VERSION, KILN_MAGMA_URL, KILN_MAGMA_SHA256,
# KILN_CUDA_ARCH_LIST ("7.5;8.0;12.0+PTX", the recipe's arch list) and MAGMA_PREFIX (default
# /usr/local/magma, where MAGMA_HOME points). No-op when KILN_MAGMA_VERSION is empty (CPU recipes, recipes
# without [magma]).
set -euo pipefail

if [[ -z "${KILN_MAGMA_VERSION:-}" ]]; then
  echo "install_magma: no KILN_MAGMA_VERSION; skipping"
  exit 0
fi
: "${KILN_MAGMA_URL:?KILN_MAGMA_URL must be set (magma.url of the recipe)}"
: "${KILN_MAGMA_SHA256:?KILN_MAGMA_SHA256 must be set (magma.sha256 of the recipe)}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
prefix="${MAGMA_PREFIX:-/usr/local/magma}"
jobs="${MAGMA_JOBS:-$(nproc)}"
python="${MAGMA_PYTHON:-${VIRTUAL_ENV:-/opt/venv}/bin/python}"

# "7.5;8.0;12.0+PTX" -> "-gencode=arch=compute_75,code=sm_75;...": a CMake list, one nvcc argument each.
# shellcheck source=gencode.sh
source "$here/gencode.sh"
mapfile -t gencode < <(gencode_flags "${KILN_CUDA_ARCH_LIST:-}")
if [[ ${#gencode[@]} -eq 0 ]]; then
  echo "install_magma: KILN_CUDA_ARCH_LIST is empty; MAGMA needs the GPU architectures to build for" >&2
  exit 2
fi
arch_list=$(IFS=';'; echo "${gencode[*]}")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tarball="$work/magma-${KILN_MAGMA_VERSION}.tar.gz"
# --globoff: curl reads [1-3] and {a,b} in a URL as a list of URLs; --url: the recipe's value is the URL,
# never one of curl's options.
curl --fail --location --silent --show-error --retry 3 --globoff --output "$tarball" --url "$KILN_MAGMA_URL"
got=$(sha256sum "$tarball" | cut -d' ' -f1)
if [[ "$got" != "$KILN_MAGMA_SHA256" ]]; then
  echo "install_magma: sha256 mismatch for $KILN_MAGMA_URL: expected $KILN_MAGMA_SHA256, got $got" >&2
  exit 1
fi
mkdir "$work/src"
tar -xzf "$tarball" -C "$work/src" --strip-components=1
"$python" "$here/magma_edits.py" --version "$KILN_MAGMA_VERSION" "$work/src"

# CMAKE_POLICY_VERSION_MINIMUM: MAGMA 2.6.1 asks for CMake 2.8.1, which CMake >= 4 refuses without it.
cmake -S "$work/src" -B "$work/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
  -DUSE_FORTRAN=OFF \
  -DMAGMA_ENABLE_CUDA=ON \
  -DGPU_TARGET=All \
  "-DCUDA_ARCH_LIST=${arch_list}" \
  -DBUILD_SHARED_LIBS=OFF \
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
  "-DCMAKE_CXX_FLAGS=-static-libstdc++ -fno-exceptions" \
  -DCMAKE_DISABLE_FIND_PACKAGE_OpenMP=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_LAPACK=ON
# The flags nvcc will get are in FindCUDA's per-source scripts: every -gencode of the recipe must be in each
# (MAGMA drops architectures it has no name for without a word; better to stop here than to ship without).
scripts=("$work"/build/CMakeFiles/magma.dir/*/magma_generated_*.cu.o.Release.cmake)
[[ -e "${scripts[0]}" ]] || { echo "install_magma: no CUDA sources configured for the magma target" >&2; exit 1; }
for script in "${scripts[@]}"; do
  nvcc_flags=$(grep -m1 '^set(CUDA_NVCC_FLAGS ' "$script")  # set(CUDA_NVCC_FLAGS a;b;c ;; ) # list
  listed="${nvcc_flags#set(CUDA_NVCC_FLAGS }"
  listed=";${listed%% ;;*};"
  for flag in "${gencode[@]}" -DHAVE_CUBLAS -Xfatbin -compress-all; do
    if [[ "$listed" != *";${flag};"* ]]; then
      echo "install_magma: $(basename "$script" .o.Release.cmake) would be compiled without $flag ($nvcc_flags)" >&2
      exit 1
    fi
  done
done
cmake --build "$work/build" --parallel "$jobs" --target magma

# What PyTorch's MAGMA package holds: include/*.h (the release's and the generated ones) and lib/libmagma.a.
library=$(find "$work/build" -name libmagma.a -print -quit)
[[ -n "$library" ]] || { echo "install_magma: the build produced no libmagma.a" >&2; exit 1; }
mkdir -p "$prefix/include" "$prefix/lib"
cp "$work"/src/include/*.h "$prefix/include/"
if compgen -G "$work/build/include/*.h" >/dev/null; then cp "$work"/build/include/*.h "$prefix/include/"; fi
cp "$library" "$prefix/lib/libmagma.a"
echo "install_magma: MAGMA ${KILN_MAGMA_VERSION} for ${KILN_CUDA_ARCH_LIST} (${#gencode[@]} targets) in $prefix"
