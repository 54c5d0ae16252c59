#!/usr/bin/env bash
# Devel image: the CUDA toolkit of the recipe from NVIDIA's PyPI wheels, laid out as /usr/local/cuda-X.Y
# the way an NVIDIA installer lays it out and PyTorch's CMake expects it (FindCUDAToolkit, its FindCUDNN /
# FindNCCL, CUDA_HOME): bin/ (nvcc, ptxas, ...), include/, lib/ with lib64 -> lib, nvvm/,
# targets/<KILN_TOOLKIT_TARGET>/{include,lib} (what nvcc.profile names: $(_TARGET_DIR_), x86_64-linux on
# x86_64 and sbsa-linux on aarch64 servers, as NVIDIA's installers lay it out), lib/stubs/libcuda.so, and the unversioned
# library names the linker and find_library need. No NVIDIA registry: any PyPI mirror will do.
#
# Reads the build args KILN_CUDA_FROM (only "pypi" does anything here; "nvidia": the base image is
# NVIDIA's devel image and has the toolkit), KILN_CUDA ("13.0"), KILN_CUDA_WHEELS (the requirement
# specifiers, space separated, from torchkiln's table in src/torchkiln/images/spec.py) and KILN_TOOLKIT_TARGET
# (the targets/ directory of the image's platform: data/compat.toml's toolkit_target). cuDNN and NCCL come
# next, from install_cuda_libs.sh. CUDA_PREFIX overrides /usr/local/cuda-X.Y (tests only).
set -euo pipefail

if [[ "${KILN_CUDA_FROM:-}" != pypi ]]; then
  echo "install_cuda_toolkit: toolkit source is '${KILN_CUDA_FROM:-none}', not pypi; skipping"
  exit 0
fi
: "${KILN_CUDA:?KILN_CUDA must be set (accelerator.cuda of the recipe, e.g. 13.0)}"
: "${KILN_CUDA_WHEELS:?KILN_CUDA_WHEELS must be set (the toolkit wheels of CUDA ${KILN_CUDA})}"
prefix="${CUDA_PREFIX:-/usr/local/cuda-${KILN_CUDA}}"
python="${VIRTUAL_ENV:-/opt/venv}/bin/python"
major="${KILN_CUDA%%.*}"
: "${KILN_TOOLKIT_TARGET:?KILN_TOOLKIT_TARGET must be set (the targets/ directory of the toolkit: x86_64-linux, sbsa-linux)}"
arch_dir="targets/${KILN_TOOLKIT_TARGET}"

read -r -a wheels <<< "$KILN_CUDA_WHEELS"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# --target: the wheels' files only (no venv of their own); pip checks each file's hash from the index.
"$python" -m pip install --no-compile --target "$work/site" "${wheels[@]}"

# NVIDIA's CUDA 13 wheels install under site-packages/nvidia/cu13/{bin,include,lib,nvvm}; cuSPARSELt and
# NVSHMEM under nvidia/<name>/{include,lib}. Merge them all into one prefix, like the redist tarballs.
mkdir -p "$prefix"
shopt -s nullglob
for pkg in "$work"/site/nvidia/*/; do
  for part in bin include lib nvvm; do
    if [[ -d "$pkg/$part" ]]; then
      mkdir -p "$prefix/$part"
      cp -a "$pkg/$part/." "$prefix/$part/"
    fi
  done
done
test -x "$prefix/bin/nvcc" || { echo "install_cuda_toolkit: no bin/nvcc in the wheels (${KILN_CUDA_WHEELS})" >&2; exit 1; }
ln -sfn lib "$prefix/lib64"
mkdir -p "$prefix/$arch_dir"
ln -sfn ../../include "$prefix/$arch_dir/include"
ln -sfn ../../lib "$prefix/$arch_dir/lib"

# The wheels ship versioned sonames (libcublas.so.13) only; -lcublas and CMake's find_library need the
# unversioned name, as the toolkit installers provide it.
for lib in "$prefix"/lib/lib*.so.[0-9]*; do
  base="${lib%%.so.*}.so"
  if [[ ! -e "$base" ]]; then ln -s "$(basename "$lib")" "$base"; fi
done

# lib/stubs/libcuda.so: the driver API for linking without a driver (libcaffe2_nvrtc.so links libcuda.so.1;
# FindCUDAToolkit's CUDA::cuda_driver looks in lib64/stubs). The wheels have no stub, so make one from the
# toolkit's own headers: every cu* function they declare (with and without per-thread default stream), each
# returning CUDA_ERROR_STUB_LIBRARY as NVIDIA's stub does (cuda.h: "the CUDA driver that the application
# has loaded is a stub library"). Never on the loader's path: only the linker sees it.
stub_error=$(awk '$1 == "CUDA_ERROR_STUB_LIBRARY" && $2 == "=" {gsub(",", "", $3); print $3}' "$prefix/include/cuda.h")
[[ "$stub_error" =~ ^[0-9]+$ ]] || { echo "install_cuda_toolkit: CUDA_ERROR_STUB_LIBRARY not found in cuda.h" >&2; exit 1; }
headers=$'#include <cuda.h>\n#include <cudaProfiler.h>\n'
{
  gcc -E -P -x c -I "$prefix/include" - <<< "$headers"
  gcc -E -P -x c -DCUDA_API_PER_THREAD_DEFAULT_STREAM -I "$prefix/include" - <<< "$headers"
} | grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' | tr -d '( \t' | sort -u > "$work/driver-api.txt"
count=$(wc -l < "$work/driver-api.txt")
if (( count < 300 )); then
  echo "install_cuda_toolkit: only $count driver API functions found in cuda.h; expected several hundred" >&2
  exit 1
fi
awk -v rc="$stub_error" '{print "int " $1 "(void) { return " rc "; }"}' "$work/driver-api.txt" > "$work/stub.c"
mkdir -p "$prefix/lib/stubs"
gcc -shared -fPIC -nostdlib -Wl,-soname,libcuda.so.1 -o "$prefix/lib/stubs/libcuda.so" "$work/stub.c"

# What was installed, and NVIDIA's license texts, stay with the toolkit (like the host's dist-info/).
mkdir -p "$prefix/dist-info"
cp -a "$work"/site/*.dist-info "$prefix/dist-info/"

if [[ -z "${CUDA_PREFIX:-}" ]]; then
  ln -sfn "cuda-${KILN_CUDA}" /usr/local/cuda
  echo "$prefix/lib" > /etc/ld.so.conf.d/000-torchkiln-cuda.conf
  ldconfig
fi

release=$("$prefix/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
if [[ "$release" != "$KILN_CUDA" ]]; then
  echo "install_cuda_toolkit: nvcc from the wheels is CUDA $release, the recipe asks for $KILN_CUDA" >&2
  exit 1
fi
echo "install_cuda_toolkit: CUDA $release (cu${major} wheels, $count driver API stubs) in $prefix ($(du -sh "$prefix" | cut -f1))"
