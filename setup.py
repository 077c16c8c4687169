"""The package layout, which pyproject.toml cannot state with automatic discovery: the repository keeps
conf/ and analysis/ at its top, and the installed packages are posenc_lab (with its configs as
posenc_lab.conf, found by posenc_lab.config_dir) and posenc_lab_analysis. Everything else: pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["posenc_lab", "posenc_lab.*"]),
        "posenc_lab.conf",
        "posenc_lab_analysis",
        *(f"posenc_lab_analysis.{p}" for p in find_packages("analysis")),  # sections
    ],
    package_dir={"posenc_lab.conf": "conf", "posenc_lab_analysis": "analysis"},
)
