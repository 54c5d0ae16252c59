"""Stands in for torchvision's image extension in tests/test_bundle.py: a package whose ``image`` module links
libpng, libjpeg and libwebp from the system (as torchvision's setup.py links them) and reports their versions."""

from setuptools import Extension, setup

setup(
    name="kiln_vision",
    version="0.28.0",
    packages=["kiln_vision"],
    ext_modules=[Extension("kiln_vision.image", ["image.c"], libraries=["png", "jpeg", "webp"])],
)
