#!/usr/bin/env bash
# Runtime image, step 2: install the wheels (from the `dist` build context, mounted at /mnt/dist, never
# copied into a layer), torchkiln and its verification suite, then run the sanity gate.
# Reads KILN_TORCH_VERSION, KILN_TORCHVISION_VERSION (empty: no torchvision wheel), KILN_CUDA, KILN_CUDNN,
# KILN_NCCL and RECIPE_FILE (the recipe, from the `recipe` context at /mnt/recipe, kept as
# /opt/torchkiln/recipe.toml); the build's manifest.json in the `dist` context is kept as
# /opt/torchkiln/manifest.json, with the build's supply-chain documents: each wheel's SBOM, the lock file, the
# signed provenance statement KILN_PROVENANCE names and the public key KILN_PROVENANCE_KEY (base64 DER) it is
# checked with; then the image's own SBOM (its Debian and Python packages) is written.
set -euo pipefail

: "${KILN_TORCH_VERSION:?KILN_TORCH_VERSION must be set (the exact version of the torch wheel in dist/)}"
dist=/mnt/dist
context=/mnt/context
pip=("${VIRTUAL_ENV:-/opt/venv}/bin/python" -m pip)

# Exact pins (local labels such as +cpu.kiln1 included), installed first from dist/ alone: an index that
# has a wheel of the same version and tags would otherwise win the tie (pip took upstream's torch 2.13.0 from
# the index over the same file in dist/). Their dependencies (numpy, sympy, nvidia-*) come from the index
# next, the wheels already installed satisfying their own pins.
requirements=("torch==${KILN_TORCH_VERSION}")
if [[ -n "${KILN_TORCHVISION_VERSION:-}" ]]; then
  requirements+=("torchvision==${KILN_TORCHVISION_VERSION}")
fi
"${pip[@]}" install --no-index --no-deps --find-links "$dist" "${requirements[@]}"
if [[ -n "${KILN_CUDA:-}" ]]; then
  # The cuDNN and NCCL the devel image compiled against (the recipe's pins), from the same NVIDIA wheels
  # (the CUDA runtime base has no cuDNN); the sanity gate checks the loaded cuDNN is this one.
  major="${KILN_CUDA%%.*}"
  if [[ -n "${KILN_CUDNN:-}" ]]; then requirements+=("nvidia-cudnn-cu${major}==${KILN_CUDNN}"); fi
  if [[ -n "${KILN_NCCL:-}" ]]; then requirements+=("nvidia-nccl-cu${major}==${KILN_NCCL}"); fi
fi
"${pip[@]}" install --find-links "$dist" "${requirements[@]}"

# torchkiln itself (pure Python) with the verification suite's requirements, built outside the
# read-only context mount.
build=$(mktemp -d)
cp -r "$context/pyproject.toml" "$context/README.md" "$context/src" "$context/verify" "$build/"
"${pip[@]}" install "$build" pytest pytest-timeout
rm -rf "$build"
mkdir -p /opt/torchkiln
cp -r "$context/verify" /opt/torchkiln/verify
if [[ -n "${RECIPE_FILE:-}" ]]; then
  cp "/mnt/recipe/${RECIPE_FILE}" /opt/torchkiln/recipe.toml
fi
# The manifest of the build the wheels come from (torchkiln images requires one; the bake file's `wheels`
# stage exports it beside them): the sanity gate compares it with what was installed, and
# `python -m torchkiln verify --manifest /opt/torchkiln/manifest.json` checks the installation against it.
if [[ -f "$dist/manifest.json" ]]; then
  cp "$dist/manifest.json" /opt/torchkiln/manifest.json
fi
# Supply chain (docs/supply-chain.md): the SBOM of each wheel and the lock file of the build, and the signed
# provenance statement that binds them, kept beside the manifest (the statement names them as byproducts);
# the public key (never a private one: the image build has none) as PEM.
for wheel in "$dist"/*.whl; do
  sbom="${wheel%.whl}.cdx.json"
  if [[ -f "$sbom" ]]; then cp "$sbom" /opt/torchkiln/; fi
done
if [[ -n "${RECIPE_NAME:-}" && -f "$dist/${RECIPE_NAME}.lock.json" ]]; then
  cp "$dist/${RECIPE_NAME}.lock.json" /opt/torchkiln/
fi
if [[ -n "${KILN_PROVENANCE:-}" ]]; then
  cp "$dist/${KILN_PROVENANCE}" /opt/torchkiln/
fi
if [[ -n "${KILN_PROVENANCE_KEY:-}" ]]; then
  { echo "-----BEGIN PUBLIC KEY-----"; fold -w 64 <<<"$KILN_PROVENANCE_KEY"; echo "-----END PUBLIC KEY-----"; } \
    > /opt/torchkiln/provenance-key.pub
fi
# The image's own SBOM, last, when everything is installed: dpkg's status and the venv's distributions.
venv_python="${VIRTUAL_ENV:-/opt/venv}/bin/python"
"$venv_python" -m torchkiln.artifacts.sbom image --root / \
  --site-packages "$("$venv_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
  --name "torchkiln runtime ${RECIPE_NAME:-}" --version "$KILN_TORCH_VERSION" --out /opt/torchkiln/image.cdx.json
find /opt/torchkiln/verify -name __pycache__ -prune -exec rm -rf {} +
chmod -R a+rX /opt/torchkiln

# An arm64 image built on an x86_64 host runs this through qemu-user, and there upstream's aarch64 torch dies at
# import (SIGSEGV after "Can't open MIDR_EL1 sysfs entry": oneDNN's xbyak_aarch64 lists the host's CPUs in
# /sys/devices/system/cpu and finds no Arm ID registers). On such a host (aarch64 userland, CPUs without
# regs/identification/midr_el1) the sanity gate runs with that directory hidden behind an empty tmpfs, which
# needs CAP_SYS_ADMIN in this step (torchkiln images gives it to buildah for another machine's image); the
# mount lasts for this step only. A native aarch64 host has the registers and is left alone.
cpus=/sys/devices/system/cpu
if [[ "$(uname -m)" == aarch64 && -d "$cpus/cpu0" && ! -e "$cpus/cpu0/regs/identification/midr_el1" ]]; then
  if ! mount -t tmpfs -o ro,size=4k kiln-no-host-cpus "$cpus" 2>/dev/null; then
    echo "install_wheels: this arm64 image is built under emulation, where the host's CPUs in $cpus make" \
      "aarch64 torch crash at import, and this step may not hide them (no CAP_SYS_ADMIN): build it with" \
      "torchkiln images --engine buildah (which grants it), or on an aarch64 host" >&2
    exit 1
  fi
  echo "install_wheels: emulated aarch64: the host's CPUs are hidden from the sanity gate ($cpus)"
fi
"${VIRTUAL_ENV:-/opt/venv}/bin/python" "$(dirname "$0")/image_sanity.py"
