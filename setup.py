import re

from setuptools import find_packages, setup

# One place for the version: ffpa_patch/__init__.py (read, not imported: importing activates the patch).
VERSION = re.search(r'^__version__ = "([^"]+)"', open("ffpa_patch/__init__.py", encoding="utf-8").read(), re.M).group(1)

setup(
    name="ffpa_patch",
    version=VERSION,
    description="FFPA head_dim-512 attention for stock Hugging Face Gemma4, by patching at run time",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["ffpa_patch", "ffpa_patch.*"]),
    package_data={"ffpa_patch": ["bootstrap/*.py"]},
    python_requires=">=3.10",
    # No license has been chosen yet (README, "License"); none is declared until one is.
    keywords=["gemma4", "attention", "transformers", "ffpa", "flash-attention", "cutedsl", "hopper", "blackwell"],
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Science/Research",
        "Intended Audience :: Developers",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Environment :: GPU :: NVIDIA CUDA",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    install_requires=["torch>=2.5", "transformers>=5.5.0", "wrapt>=1.16", "packaging>=23"],
    extras_require={
        "ffpa": ["ffpa-attn==0.2.4"],
        "fa4": ["flash-attn-4>=4.0.0b36"],
        "test": ["pytest>=8", "accelerate>=1.1", "peft>=0.15", "trl>=0.20", "datasets>=3"],
    },
    entry_points={"console_scripts": ["ffpa-patch = ffpa_patch.cli:main"]},
)
