"""The stand-in's Python package: importing it loads _C, which loads lib/libtorchlike_cuda.so and the CUDA libraries."""

from ._C import versions

__all__ = ["versions"]
