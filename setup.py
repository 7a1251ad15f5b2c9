import ast
import re
import runpy

from setuptools import find_packages, setup

# One place for the version (ffpa_patch/__init__.py), one for the core's supported ranges
# (ffpa_patch/versions.py) and one for the kernels' (ffpa_patch/kernels/catalog.py), read without
# importing the package (importing it activates the patch; the catalog imports nothing).
VERSION = re.search(r'^__version__ = "([^"]+)"', open("ffpa_patch/__init__.py", encoding="utf-8").read(), re.M).group(1)
_versions = ast.parse(open("ffpa_patch/versions.py", encoding="utf-8").read())
CORE = next(ast.literal_eval(node.value) for node in _versions.body
            if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "CORE")
KERNEL_EXTRAS = runpy.run_path("ffpa_patch/kernels/catalog.py")["extras"]()

setup(
    name="ffpa_patch",
    version=VERSION,
    description="FFPA head_dim-512 attention for stock Hugging Face Gemma4, by patching at run time",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",  # an SPDX expression; setuptools >= 77 deprecates the license classifier beside it
    license_files=["LICENSE"],
    packages=find_packages(include=["ffpa_patch", "ffpa_patch.*"]),
    package_data={"ffpa_patch": ["bootstrap/*.py"]},
    python_requires=">=3.10",
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
    # Lower bounds only: outside versions.py's ranges ffpa_patch stays off and says so, rather
    # than making pip refuse a newer Transformers.
    install_requires=[f"torch{CORE['torch']}", "transformers>=5.5.0", "wrapt>=1.16", "packaging>=23"],
    extras_require={
        **KERNEL_EXTRAS,  # "ffpa": ffpa-attn, "fa4": flash-attn-4 (their catalog rows)
        "test": ["pytest>=8", "accelerate>=1.1", "peft>=0.15", "trl>=0.20", "datasets>=3", "build>=1"],
    },
    entry_points={"console_scripts": ["ffpa-patch = ffpa_patch.cli:main"]},
)
