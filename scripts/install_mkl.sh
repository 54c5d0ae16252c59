#!/usr/bin/env bash
# Devel image: Intel MKL (static libraries + headers) at the recipe's version into MKLROOT (/opt/intel),
# the way PyTorch's .ci/docker/common/install_mkl.sh does it: the mkl-static and mkl-include wheels from
# PyPI (pip checks their hashes), unpacked rather than installed. No-op when KILN_MKL is empty.
set -euo pipefail

if [[ -z "${KILN_MKL:-}" ]]; then
  echo "install_mkl: no KILN_MKL (the recipe's BLAS is not MKL); skipping"
  exit 0
fi
mklroot="${MKLROOT:-/opt/intel}"
python="${VIRTUAL_ENV:-/opt/venv}/bin/python"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$python" -m pip download --no-deps --only-binary=:all: --dest "$work" \
  "mkl-static==${KILN_MKL}" "mkl-include==${KILN_MKL}"
mkdir -p "$mklroot/lib" "$mklroot/include"
# A wheel's data files live under <name>-<version>.data/data/{lib,include}.
"$python" - "$work" "$mklroot" <<'PY'
import pathlib
import shutil
import sys
import zipfile

work, root = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
for wheel in sorted(work.glob("*.whl")):
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            parts = pathlib.PurePosixPath(info.filename).parts
            if info.is_dir() or len(parts) < 4 or not parts[0].endswith(".data") or parts[1] != "data":
                continue
            if parts[2] not in ("lib", "include"):
                continue
            dest = root.joinpath(*parts[2:])
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
PY
test -f "$mklroot/include/mkl.h" || { echo "install_mkl: $mklroot/include/mkl.h missing after unpacking" >&2; exit 1; }
ls "$mklroot"/lib/libmkl_core.a >/dev/null
echo "install_mkl: MKL ${KILN_MKL} in $mklroot ($(du -sh "$mklroot" | cut -f1))"
