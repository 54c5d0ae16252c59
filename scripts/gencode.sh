# shellcheck shell=bash
# Sourced by the image scripts: nvcc's -gencode flags for a TORCH_CUDA_ARCH_LIST-style list, spelled the way
# torch.utils.cpp_extension._get_cuda_arch_flags spells them (torch 2.13): "X.Y" -> real code for sm_XY,
# "X.Y+PTX" -> also PTX for compute_XY. An "a"/"f" suffix (9.0a, 10.0f) stays on both names, as nvcc
# spells those targets (sm_90a, compute_90a).
#
#   gencode_flags "7.5;8.0;12.0+PTX"   # prints one flag per line:
#   -gencode=arch=compute_75,code=sm_75
#   -gencode=arch=compute_80,code=sm_80
#   -gencode=arch=compute_120,code=sm_120
#   -gencode=arch=compute_120,code=compute_120

gencode_flags() {
  local list=$1 entry arch ptx major minor suffix num
  local -a entries
  IFS=';' read -r -a entries <<< "$list"
  for entry in "${entries[@]}"; do
    [[ -n "$entry" ]] || continue
    arch="${entry%+PTX}"
    ptx=$([[ "$arch" != "$entry" ]] && echo 1 || echo 0)
    if [[ ! "$arch" =~ ^([0-9]+)\.([0-9])([af]?)$ ]]; then
      echo "gencode_flags: '$entry' is not an arch such as 8.0, 9.0a or 12.0+PTX" >&2
      return 2
    fi
    major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]} suffix=${BASH_REMATCH[3]}
    num="${major}${minor}${suffix}"
    echo "-gencode=arch=compute_${num},code=sm_${num}"
    if [[ "$ptx" == 1 ]]; then
      echo "-gencode=arch=compute_${num},code=compute_${num}"
    fi
  done
}
