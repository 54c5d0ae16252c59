#!/usr/bin/env bash
# The GPU run: `torchkiln verify --require-cuda` on a lent GPU machine, every area, against the exact recipe
# of the image's torch (docs/gpu-run.md). One command, from the repository root of a copy of the working tree:
#
#   bash scripts/gpu-run.sh            (the device tool's `run`, with carry=["gpu-wheels"])
#
# The machine is bare and offline: its image has upstream's torch 2.11.0+cu130 and torchvision 0.26.0 for
# Python 3.12, nvcc, CMake and ninja. torchkiln's own dependencies (and pytest, NumPy) come from
# gpu-wheels/ (made here by `nox -s gpu-wheels`, carried along); torchkiln itself runs from src/ of this tree, so
# the code that runs is the code committed. Everything it writes goes under $OUT (default ./gpu-run-out):
#   run.log            this script's own lines: the machine, the installs, verify's exit status
#   environment.txt    nvidia-smi, nvcc --version, the interpreter, torch's and torchvision's versions
#   described.toml     `torchkiln recipe describe` of the image's pair, and recipe-drift.txt (diff against the
#                      committed recipe: empty when the image is exactly that pair)
#   report/            summary.md (read first), summary.json, junit.xml, verify.log (the whole pytest output)
#
# Exit status: verify's (0 all passed, 1 a check failed, 2 a usage error), 3 when the set-up failed.
# Variables: PYTHON (default: python3.12, else python3), RECIPE (default: the committed 2.11.0/cu130/py312
# recipe), VERIFY_TIMEOUT (seconds, default 540: the device tool's command limit is 600), WHEELS (gpu-wheels).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-run-out}
WHEELS=${WHEELS:-$ROOT/gpu-wheels}
RECIPE=${RECIPE:-$ROOT/tests/reference/recipes/upstream-2.11.0-cu130-py312.toml}
VERIFY_TIMEOUT=${VERIFY_TIMEOUT:-540}
PYTHON=${PYTHON:-$(command -v python3.12 || command -v python3)}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-run.XXXXXX")
mkdir -p "$OUT/report"
exec > >(tee -a "$OUT/run.log") 2>&1
started=$(date +%s)
say() { echo "gpu-run [$(( $(date +%s) - started ))s]: $*"; }
fail() { say "set-up failed: $*"; exit 3; }

say "python $PYTHON, wheels $WHEELS, recipe $RECIPE, report in $OUT"
[[ -x "$PYTHON" ]] || fail "no python3.12 or python3 on PATH (set PYTHON)"
[[ -f "$RECIPE" ]] || fail "no recipe $RECIPE"
compgen -G "$WHEELS/*.whl" > /dev/null || fail "no wheels in $WHEELS: make them with \`nox -s gpu-wheels\` and carry gpu-wheels"
{
  echo "## nvidia-smi"; nvidia-smi 2>&1 || echo "(no nvidia-smi)"
  echo "## nvidia-smi -L"; nvidia-smi -L 2>&1 || true
  echo "## nvcc --version"; nvcc --version 2>&1 || echo "(no nvcc on PATH)"
  echo "## cmake, ninja, gcc"; cmake --version 2>&1 | head -1; ninja --version 2>&1; gcc --version 2>&1 | head -1
  echo "## $PYTHON"; "$PYTHON" -VV 2>&1
  echo "## torch"; "$PYTHON" -c 'import torch, torchvision; print(torch.__version__, torch.version.git_version, torch.version.cuda, torch.cuda.is_available(), torchvision.__version__)' 2>&1
} > "$OUT/environment.txt"
"$PYTHON" -c 'import torch, torchvision' || fail "$PYTHON cannot import torch and torchvision"

# torchkiln's dependencies into a directory of their own, from the carried wheels only (no index: the machine
# is offline, and a wheel missing from gpu-wheels/ fails here, naming it). The image's torch stays where it is.
SITE="$WORK/site"
if "$PYTHON" -m pip --version > /dev/null 2>&1; then
  "$PYTHON" -m pip install --quiet --no-index --find-links "$WHEELS" --target "$SITE" \
    -r "$WHEELS/requirements.txt" || fail "pip could not install the carried wheels"
else  # no pip in the image: a wheel is a zip laid out as it installs (pure Python and binary wheels alike)
  "$PYTHON" -c 'import sys, zipfile, pathlib; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in pathlib.Path(sys.argv[2]).glob("*.whl")]' \
    "$SITE" "$WHEELS" || fail "could not unpack the carried wheels"
fi
export PYTHONPATH="$ROOT/src:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export TORCHKILN_VERIFY_DIR="$ROOT/verify"
"$PYTHON" -c 'import torchkiln, pytest, elftools' \
  || fail "torchkiln (from $ROOT/src) or its dependencies are not importable: PYTHONPATH=$PYTHONPATH"
say "installed $(ls "$WHEELS"/*.whl | wc -l) wheels into $SITE; torchkiln $("$PYTHON" -m torchkiln --version 2>&1)"

# The image's pair, described the way the committed recipe was: any difference is the image, not verify.
if "$PYTHON" -m torchkiln recipe describe --name "$(basename "$RECIPE" .toml)" --out "$OUT/described.toml"; then
  diff -u "$RECIPE" "$OUT/described.toml" > "$OUT/recipe-drift.txt" && say "the image's pair is the recipe's (describe: no drift)" \
    || say "the image's pair differs from the recipe: $OUT/recipe-drift.txt"
else
  say "torchkiln recipe describe failed (see above); verifying against the committed recipe anyway"
fi

# Every area; --require-cuda: a CUDA check that cannot run fails (here, a GPU machine, that is CUDA broken).
say "torchkiln verify --require-cuda --recipe $(basename "$RECIPE") (limit ${VERIFY_TIMEOUT}s)"
timeout --kill-after=20 "$VERIFY_TIMEOUT" "$PYTHON" -m torchkiln verify --require-cuda --recipe "$RECIPE" \
  --report "$OUT/report" > "$OUT/report/verify.log" 2>&1
status=$?
tail -n 40 "$OUT/report/verify.log"
[[ $status -eq 124 || $status -eq 137 ]] && say "verify ran past ${VERIFY_TIMEOUT}s and was stopped"
if [[ -f "$OUT/report/summary.md" ]]; then
  sed -n '1,/^## Checks per area/p' "$OUT/report/summary.md" | head -n 60
fi
say "verify exit status $status"
rm -rf "$WORK"
exit "$status"
