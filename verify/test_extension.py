"""Area release: a CUDA extension builds against this torch with nvcc, loads and runs.

What users of a source build do first, and what breaks when its headers, CUDA_HOME, C++ ABI or CUDA version
are not what torch says (pytorch's ``test_cpp_extensions_jit``; upstream's ``check_binary.sh`` builds a C++
extension). A fresh process (``helpers/cuda_extension.py``) compiles a kernel and its binding with
``torch.utils.cpp_extension.load_inline`` (nvcc, ninja, the host compiler) for the device's capability, loads
it, runs it on ``cuda:0`` and compares with torch's own result; the toolkit that compiled it must be the CUDA
torch was built with (major.minor). Needs a GPU: on a machine without one it skips as ``no_gpu`` (fails under
``--require-cuda``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from torchkiln.verify import proc

pytestmark = [pytest.mark.release, pytest.mark.cuda]
BUILD_TIMEOUT_S = 420.0  # one nvcc pass for one arch and the binding's C++: 1-3 minutes


def test_cuda_extension_builds_loads_and_runs(
    helpers: Path, child_env: dict[str, str], tmp_path: Path
) -> None:
    argv = [sys.executable, str(helpers / "cuda_extension.py"), str(tmp_path / "build")]
    (tmp_path / "build").mkdir()
    result = proc.run(argv, timeout=BUILD_TIMEOUT_S, env=child_env)
    assert not result.timed_out, (
        f"the extension build did not finish within {BUILD_TIMEOUT_S:.0f} s\n{result.describe()}"
    )
    assert result.returncode == 0, result.describe()
    out = json.loads(result.stdout.strip().splitlines()[-1])
    if "error" in out:
        pytest.fail(
            f"building or running a CUDA extension failed: {out['error']}\n{out['traceback']}", pytrace=False
        )
    assert out["built_with_cuda"] == torch.version.cuda, (
        f"nvcc ({out['nvcc']}, CUDA_HOME {out['cuda_home']}) is CUDA {out['built_with_cuda']}, torch is built "
        f"with CUDA {torch.version.cuda}"
    )
    assert out["matches"], f"the extension's kernel on {out['arch']} gave other numbers than torch: {out}"
