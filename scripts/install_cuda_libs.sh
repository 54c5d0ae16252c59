#!/usr/bin/env bash
# Devel image: cuDNN and NCCL at the recipe's exact versions, into /usr/local/cuda (the CUDA base image
# has neither pinned). They come from NVIDIA's PyPI wheels (nvidia-cudnn-cuXX, nvidia-nccl-cuXX): the
# same packages a torch wheel depends on at run time, so build and run use one version. Headers and
# libraries are copied where PyTorch's build looks (CUDNN_ROOT_DIR/NCCL_ROOT_DIR=/usr/local/cuda), as
# upstream's install_cuda.sh does with the redist tarballs. No-op for CPU recipes (KILN_CUDA empty).
set -euo pipefail

if [[ -z "${KILN_CUDA:-}" ]]; then
  echo "install_cuda_libs: CPU recipe; skipping"
  exit 0
fi
: "${KILN_CUDNN:?KILN_CUDNN must be set for a CUDA recipe}"
: "${KILN_NCCL:?KILN_NCCL must be set for a CUDA recipe}"
major="${KILN_CUDA%%.*}"
cuda="${KILN_CUDA_HOME:-/usr/local/cuda}"  # another directory only for tests
python="${VIRTUAL_ENV:-/opt/venv}/bin/python"
test -x "$cuda/bin/nvcc" || { echo "install_cuda_libs: no $cuda/bin/nvcc: the base image is not a CUDA devel image" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip install --no-deps --target "$work" \
  "nvidia-cudnn-cu${major}==${KILN_CUDNN}" "nvidia-nccl-cu${major}==${KILN_NCCL}"
mkdir -p "$cuda/include" "$cuda/lib64"
for pkg in "$work"/nvidia/*/; do
  if [[ -d "$pkg/include" ]]; then cp -a "$pkg/include/." "$cuda/include/"; fi
  if [[ -d "$pkg/lib" ]]; then cp -a "$pkg/lib/." "$cuda/lib64/"; fi
done
# The wheels ship only versioned sonames; the linker needs the unversioned names.
for lib in "$cuda"/lib64/libcudnn*.so.[0-9]* "$cuda"/lib64/libnccl.so.[0-9]*; do
  if [[ ! -e "$lib" ]]; then continue; fi
  base="${lib%%.so.*}.so"
  if [[ ! -e "$base" ]]; then ln -s "$(basename "$lib")" "$base"; fi
done
if [[ "$cuda" == /usr/local/cuda ]]; then
  ldconfig  # the image's linker cache; a scratch KILN_CUDA_HOME is no system library path
fi

header_version() {  # file, then the three macro names of major/minor/patch
  local file=$1; shift
  local out=() name
  for name in "$@"; do out+=("$(awk -v n="$name" '$1=="#define" && $2==n {print $3; exit}' "$file")"); done
  (IFS=.; echo "${out[*]}")
}
got_cudnn=$(header_version "$cuda/include/cudnn_version.h" CUDNN_MAJOR CUDNN_MINOR CUDNN_PATCHLEVEL)
got_nccl=$(header_version "$cuda/include/nccl.h" NCCL_MAJOR NCCL_MINOR NCCL_PATCH)
want_cudnn=$(echo "$KILN_CUDNN" | cut -d. -f1-3)
want_nccl=$(echo "$KILN_NCCL" | cut -d. -f1-3)
[[ "$got_cudnn" == "$want_cudnn" ]] || { echo "install_cuda_libs: cudnn_version.h says $got_cudnn, recipe pins $KILN_CUDNN" >&2; exit 1; }
[[ "$got_nccl" == "$want_nccl" ]] || { echo "install_cuda_libs: nccl.h says $got_nccl, recipe pins $KILN_NCCL" >&2; exit 1; }
echo "install_cuda_libs: cuDNN $got_cudnn, NCCL $got_nccl in $cuda"
