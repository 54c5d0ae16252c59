"""Stands in for torchvision's setup.py in torchkiln's build tests.

Like torchvision's, it takes its version from BUILD_VERSION, pins torch to PYTORCH_VERSION and imports the
torch of the build env while building. Nothing is compiled; it records the build env it saw, and where
torch.utils.cpp_extension would take torch's headers from (kiln_vision/build_env.json), so a test can check
that the pairing variables reached the build.
"""

import json
import os
from pathlib import Path

import torch
import torch.utils.cpp_extension
from setuptools import setup

SEEN = ("BUILD_VERSION", "PYTORCH_VERSION", "FORCE_CUDA", "MAX_JOBS", "VIRTUAL_ENV", "TORCH_CUDA_ARCH_LIST")
SEEN += tuple(f"TORCHVISION_USE_{part}" for part in ("PNG", "JPEG", "WEBP", "NVJPEG", "VIDEO_CODEC", "FFMPEG"))
record = {name: os.environ.get(name) for name in SEEN}
record["torch_at_build"] = torch.__version__
# where cpp_extension (torchvision's compiler) takes torch's headers from: one path for every Python
record["torch_include"] = torch.utils.cpp_extension.include_paths()[0]
(Path(__file__).parent / "kiln_vision" / "build_env.json").write_text(json.dumps(record, sort_keys=True))

setup(
    version=os.environ["BUILD_VERSION"],
    install_requires=[f"torch=={os.environ['PYTORCH_VERSION']}"],
)
