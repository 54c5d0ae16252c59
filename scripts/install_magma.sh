#!/usr/bin/env bash
# Devel image: MAGMA (GPU LAPACK, torch.linalg on CUDA) built from its pinned release tarball.
# The tarball's sha256 must equal the recipe's magma.sha256 before anything is unpacked; a mismatch stops
# the build and leaves nothing installed. Reads KILN_MAGMA_VERSION, KILN_MAGMA_URL, KILN_MAGMA_SHA256, KILN_CUDA_ARCH_LIST
# ("7.5;8.0;12.0+PTX", the recipe's arch list) and MAGMA_PREFIX (default /usr/local/magma).
# No-op when KILN_MAGMA_VERSION is empty (CPU recipes, recipes without [magma]).
set -euo pipefail

if [[ -z "${KILN_MAGMA_VERSION:-}" ]]; then
  echo "install_magma: no KILN_MAGMA_VERSION; skipping"
  exit 0
fi
: "${KILN_MAGMA_URL:?KILN_MAGMA_URL must be set (the recipe's magma.url)}"
: "${KILN_MAGMA_SHA256:?KILN_MAGMA_SHA256 must be set (the recipe's magma.sha256)}"
prefix="${MAGMA_PREFIX:-/usr/local/magma}"
jobs="${MAGMA_JOBS:-$(nproc)}"

# "7.5;8.0;12.0+PTX" -> "sm_75 sm_80 sm_120" (MAGMA's GPU_TARGET names).
targets=()
IFS=';' read -r -a archs <<< "${KILN_CUDA_ARCH_LIST:-}"
for arch in "${archs[@]}"; do
  arch="${arch%+PTX}"
  arch="${arch%[af]}"
  [[ -n "$arch" ]] && targets+=("sm_${arch/./}")
done
if [[ ${#targets[@]} -eq 0 ]]; then
  echo "install_magma: KILN_CUDA_ARCH_LIST is empty; MAGMA needs the GPU architectures to build for" >&2
  exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tarball="$work/magma-${KILN_MAGMA_VERSION}.tar.gz"
curl --fail --location --silent --show-error --retry 3 --output "$tarball" "$KILN_MAGMA_URL"
got=$(sha256sum "$tarball" | cut -d' ' -f1)
if [[ "$got" != "$KILN_MAGMA_SHA256" ]]; then
  echo "install_magma: sha256 mismatch for $KILN_MAGMA_URL: expected $KILN_MAGMA_SHA256, got $got" >&2
  exit 1
fi
mkdir "$work/src"
tar -xzf "$tarball" -C "$work/src" --strip-components=1

cmake -S "$work/src" -B "$work/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX="$prefix" \
  -DBUILD_SHARED_LIBS=OFF \
  -DMAGMA_ENABLE_CUDA=ON \
  -DUSE_FORTRAN=OFF \
  -DGPU_TARGET="${targets[*]}"
cmake --build "$work/build" --parallel "$jobs" --target magma magma_sparse
cmake --install "$work/build"
echo "install_magma: MAGMA ${KILN_MAGMA_VERSION} for ${targets[*]} in $prefix"
