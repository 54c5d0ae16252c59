"""Runtime image sanity gate: fail the image build when it is not what the recipe asked for.

Like the gate in PyTorch's own Dockerfile (which exits 1 when CUDA came out disabled), but wider: the
installed torch/torchvision are exactly the wheels the build args name, CUDA is compiled in exactly when the
recipe is a CUDA recipe (and at the recipe's CUDA and cuDNN versions), the C++ ops of torchvision are
registered (the "operator torchvision::nms does not exist" mismatch), tensor math runs, and no compiler or
nvcc is on PATH, and the build args agree with the manifest of the build the wheels come from
(/opt/torchkiln/manifest.json, when the image has one: the bake file's runtime targets take their versions
from the recipe, so this is where a wheels stage that built something else is caught). Reads the build args
KILN_TORCH_VERSION, KILN_TORCHVISION_VERSION, KILN_TORCH_COMMIT, KILN_TORCHVISION_COMMIT, KILN_CUDA,
KILN_CUDNN and KILN_PROVENANCE. Runs with the image's Python.

The supply chain (docs/supply-chain.md): the image's own SBOM lists the installed torch at its version, and
the build's signed provenance statement, when the image carries one with its key, is signed by that key,
names exactly the installed wheels (sha256, version, commit, files) and binds the SBOMs and manifest kept
beside it. That one check is torchkiln's own (``torchkiln.verify.attestation``, what ``torchkiln verify
--provenance`` runs); everything else here imports no torchkiln: it checks the wheels, not torchkiln.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from importlib.metadata import version as installed
from pathlib import Path

KEPT = Path("/opt/torchkiln")
MANIFEST = KEPT / "manifest.json"
IMAGE_SBOM = KEPT / "image.cdx.json"
PROVENANCE_KEY = KEPT / "provenance-key.pub"


def manifest_problems(path: Path) -> list[str]:
    """Where the build args and the manifest of the wheels' build disagree (versions, commits)."""
    if not path.is_file():
        return []
    manifest = json.loads(path.read_text(encoding="utf-8"))
    wheels = {w.get("project"): w.get("version") for w in manifest.get("wheels", [])}
    sources = manifest.get("sources", {})
    problems = []
    for project, version_arg, commit_arg in (
        ("torch", "KILN_TORCH_VERSION", "KILN_TORCH_COMMIT"),
        ("torchvision", "KILN_TORCHVISION_VERSION", "KILN_TORCHVISION_COMMIT"),
    ):
        want = os.environ.get(version_arg, "")
        if want and wheels.get(project) != want:
            problems.append(f"the build args name {project} {want}, the manifest lists {wheels.get(project)}")
        commit = os.environ.get(commit_arg, "")
        recorded = (sources.get(project) or {}).get("commit") or ""
        if want and commit and recorded and commit != recorded:
            problems.append(f"the build args name {project} commit {commit}, the manifest records {recorded}")
    return problems


def sbom_problems(path: Path, want_torch: str) -> list[str]:
    """The image's SBOM is there and lists the installed torch at its version."""
    if not path.is_file():
        return [f"{path}: no SBOM of the image"]
    components = json.loads(path.read_text(encoding="utf-8")).get("components", [])
    listed = {c.get("name"): c.get("version") for c in components}
    if listed.get("torch") != want_torch:
        return [f"{path}: lists torch {listed.get('torch')}, {want_torch} is installed"]
    return []


def provenance_problems(statement_name: str) -> list[str]:
    """The signed statement kept in the image: its signature by the kept key, its subjects installed, its
    byproducts (SBOMs, manifest, lock file) unchanged beside it. Without a key: a note, not a problem."""
    if not statement_name:
        return []
    statement = KEPT / statement_name
    if not PROVENANCE_KEY.is_file():
        print(f"image sanity: {statement} not checked: no --provenance-key was given", file=sys.stderr)
        return []
    from torchkiln.artifacts.signing import load_envelope, load_public_key
    from torchkiln.verify.attestation import attestation_checks

    checks = attestation_checks(
        load_envelope(statement), load_public_key(PROVENANCE_KEY), str(statement), directory=KEPT
    )
    problems = [c.message for c in checks.values() if c.status == "fail"]
    if checks["byproducts"].status != "pass":
        problems.append(checks["byproducts"].message)
    return problems


def main() -> int:
    problems: list[str] = []
    want_torch = os.environ["KILN_TORCH_VERSION"]
    want_vision = os.environ.get("KILN_TORCHVISION_VERSION", "")
    want_cuda = os.environ.get("KILN_CUDA", "")
    want_cudnn = os.environ.get("KILN_CUDNN", "")

    import torch

    # The distribution pip installed (upstream's PyPI wheels carry no local label in their metadata while
    # torch.__version__ says 2.13.0+cu130): the one the build args name.
    if installed("torch") != want_torch:
        problems.append(f"torch {installed('torch')} is installed, the build args name {want_torch}")
    compiled = torch.cuda._is_compiled()
    if want_cuda and not compiled:
        problems.append(f"torch was built without CUDA but the recipe asks for CUDA {want_cuda}")
    if not want_cuda and compiled:
        problems.append(f"torch was built with CUDA {torch.version.cuda} but the recipe is a CPU recipe")
    if want_cuda and compiled and not (torch.version.cuda or "").startswith(want_cuda):
        problems.append(f"torch was built with CUDA {torch.version.cuda}, the recipe asks for {want_cuda}")
    if want_cudnn and compiled:
        got = torch.backends.cudnn.version()
        major, minor = (int(x) for x in want_cudnn.split(".")[:2])
        if got is None or (got // 10000, got // 100 % 100) != (major, minor):
            problems.append(f"cuDNN {got} loaded, the recipe pins {want_cudnn}")
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    if float((x @ x.T).trace()) != 506.0:
        problems.append("a 3x4 matmul gave a wrong result")

    if want_vision:
        import torchvision

        if installed("torchvision") != want_vision:
            problems.append(
                f"torchvision {installed('torchvision')} is installed, the build args name {want_vision}"
            )
        boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0]])
        try:
            keep = torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8]), 0.5)
        except RuntimeError as exc:  # operator torchvision::nms does not exist: a torch/vision mismatch
            problems.append(f"torchvision's C++ ops do not load against this torch: {exc}")
        else:
            if keep.tolist() != [0]:
                problems.append(f"torchvision.ops.nms kept {keep.tolist()}, expected [0]")

    problems += manifest_problems(MANIFEST)
    problems += sbom_problems(IMAGE_SBOM, want_torch)
    problems += provenance_problems(os.environ.get("KILN_PROVENANCE", ""))

    for tool in ("gcc", "g++", "cc", "c++", "nvcc"):
        if shutil.which(tool):
            problems.append(
                f"{tool} is on PATH ({shutil.which(tool)}): the runtime image must not carry a compiler"
            )

    for problem in problems:
        print(f"image sanity: {problem}", file=sys.stderr)
    if not problems:
        cuda = f"CUDA {torch.version.cuda}" if compiled else "CPU"
        vision = f", torchvision {torchvision.__version__}" if want_vision else ""
        print(f"image sanity: ok (torch {torch.__version__}, {cuda}{vision})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
