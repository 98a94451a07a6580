"""Nox sessions: the test suite on every Python from 3.9 to 3.13 found here, once with NumPy 1, and the docs."""

from __future__ import annotations

import os
from pathlib import Path

import nox

PYTHONS = ["3.9", "3.10", "3.11", "3.12", "3.13"]
NUMPY1_PYTHON = "3.12"  # the newest Python NumPy 1.26 supports

nox.options.sessions = ["tests", "tests_numpy1"]
nox.options.error_on_missing_interpreters = False  # run on the Pythons that are installed, skip the others
nox.options.reuse_existing_virtualenvs = True


def _find_pyenv_pythons() -> None:
    """Put pyenv's interpreters (not shims) on PATH so that nox finds python3.9 ... python3.13."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    bins = [str(path) for path in sorted((root / "versions").glob("3.*/bin")) if path.is_dir()]
    if bins:
        os.environ["PATH"] = os.pathsep.join([*bins, os.environ.get("PATH", "")])


_find_pyenv_pythons()


def _pytest(session: nox.Session) -> None:
    """Run pytest; arguments after `--` replace the default `-n 2 -q`."""
    session.run("python", "-m", "pytest", *(session.posargs or ["-n", "2", "-q"]))


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The whole test suite with the newest dependencies (torch from the registry: a CUDA build of several GB)."""
    if session.python == "3.9":  # Ray supports Python >= 3.10: its test says so and skips
        session.install(".[test,torch,gpu]")
    else:
        session.install(".[test,torch,gpu,ray]")
    session.install("--no-deps", "kserve>=0.15,<1", "six")  # its models only (tests/kserve_schema.py)
    _pytest(session)


@nox.session(python=NUMPY1_PYTHON)
def tests_numpy1(session: nox.Session) -> None:
    """The whole test suite with NumPy 1.x."""
    session.install(".[test,torch,gpu,ray]", "numpy<2")
    session.install("--no-deps", "kserve>=0.15,<1", "six")
    session.run("python", "-c", "import numpy, sys; sys.exit(not numpy.__version__.startswith('1.'))")
    _pytest(session)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site (mkdocs-material) with warnings as errors."""
    session.install("mkdocs-material")
    session.run("mkdocs", "build", "--strict", "--site-dir", str(Path(session.create_tmp()) / "site"))
