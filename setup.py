from setuptools import find_packages, setup

setup(
    name="ffpa_patch",
    version="0.1.0",
    description="FFPA head_dim-512 attention for stock Hugging Face Gemma4, by patching at run time",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["ffpa_patch", "ffpa_patch.*"]),
    package_data={"ffpa_patch": ["bootstrap/*.py"]},
    python_requires=">=3.10",
    install_requires=["torch>=2.5", "transformers>=5.5.0", "wrapt>=1.16", "packaging>=23"],
    extras_require={
        "ffpa": ["ffpa-attn==0.2.4"],
        "fa4": ["flash-attn-4>=4.0.0b36"],
        "test": ["pytest>=8", "accelerate>=1.1", "peft>=0.15", "trl>=0.20", "datasets>=3"],
    },
    entry_points={"console_scripts": ["ffpa-patch = ffpa_patch.cli:main"]},
)
