"""torchkiln: build PyTorch and torchvision from pinned sources, and prove the result works."""

__version__ = "0.1.0"
