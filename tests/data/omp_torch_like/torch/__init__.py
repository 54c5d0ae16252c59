"""The stand-in's Python package: importing it loads _C, which loads lib/libtorch_cpu.so and its OpenMP runtime."""

from ._C import parallel

__all__ = ["parallel"]
