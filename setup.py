"""The package list, which pyproject.toml cannot state beside a ``package-dir`` mapping: every
``vramkit*`` package of the source tree, plus ``vramkit.conf`` and ``vramkit.corpora``, whose
files are the repository's ``conf/`` and ``corpora/`` (pyproject.toml, ``[tool.setuptools]``)."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["vramkit*"]), "vramkit.conf", "vramkit.corpora"])
