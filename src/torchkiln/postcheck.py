"""Post-build check, run by the plan's ``checks:import`` step with a clean virtualenv's python.

Installs the wheels just built (from their wheelhouse, nothing else from torchkiln) and imports them in a
fresh interpreter: the versions must be the recipe's and CUDA must be compiled in exactly when the recipe
asked for it (``torch.cuda._is_compiled()``), so a build that "succeeded" with CUDA silently off is refused.

Standard library only: this file runs outside torchkiln's own environment.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

PROBE = r"""
import json, importlib
out = {}
torch = importlib.import_module("torch")
out["torch"] = torch.__version__
out["cuda_compiled"] = bool(torch.cuda._is_compiled())
out["cuda"] = torch.version.cuda
out["git_version"] = getattr(torch.version, "git_version", None)
try:
    tv = importlib.import_module("torchvision")
    out["torchvision"] = tv.__version__
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 10.0, 10.0]])
    out["nms"] = tv.ops.nms(boxes, torch.tensor([0.9, 0.8]), 0.5).tolist()
except ModuleNotFoundError:
    pass
print(json.dumps(out))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="check freshly built torch/torchvision wheels")
    parser.add_argument("--expect", action="append", default=[], metavar="PROJECT==VERSION")
    parser.add_argument("--wheelhouse", action="append", default=[], metavar="DIR")
    parser.add_argument("--accelerator", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--cuda", default=None, help="expected torch.version.cuda (major.minor)")
    args = parser.parse_args(argv)

    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    for wheelhouse in args.wheelhouse:
        pip += ["--find-links", wheelhouse]
    result = subprocess.run([*pip, *args.expect], check=False, capture_output=True, text=True)
    if result.returncode != 0:
        print(
            f"postcheck: installing {' '.join(args.expect)} failed:\n{result.stderr[-4000:]}", file=sys.stderr
        )
        return 1
    probe = subprocess.run(
        [sys.executable, "-c", PROBE], check=False, capture_output=True, text=True, cwd="/", timeout=600
    )
    if probe.returncode != 0:
        print(f"postcheck: importing the wheels failed:\n{probe.stderr[-4000:]}", file=sys.stderr)
        return 1
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    problems = []
    for item in args.expect:
        project, _, version = item.partition("==")
        if found.get(project) != version:
            problems.append(f"{project} version: expected {version}, got {found.get(project)}")
    want_cuda = args.accelerator == "cuda"
    if "torch" in found and found["cuda_compiled"] != want_cuda:
        problems.append(
            f"torch.cuda._is_compiled(): expected {want_cuda}, got {found['cuda_compiled']}"
            + (" (CUDA was silently compiled out: was nvcc on PATH / CUDA_HOME right?)" if want_cuda else "")
        )
    if args.cuda and found.get("cuda") != args.cuda:
        problems.append(f"torch.version.cuda: expected {args.cuda}, got {found.get('cuda')}")
    print(json.dumps(found))
    for line in problems:
        print(f"postcheck: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
