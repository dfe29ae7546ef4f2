"""Locate the grammars, topologies, transformer models and compute profiles
shipped with the package.

Installed, they are the folders ``synth/grammars``, ``synth/topologies``,
``synth/models`` and ``synth/profiles`` (the packages of pyproject.toml); in a
source checkout they are the top-level folders ``grammars/``, ``topologies/``,
``models/`` and ``profiles/``.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _folder(name: str) -> Path:
    installed = _PACKAGE / name
    return installed if installed.is_dir() else _PACKAGE.parent / name


def grammar_path(name: str) -> Path:
    """Path of the lark grammar ``name`` (e.g. ``"program.lark"``)."""
    return _folder("grammars") / name


def topologies_dir() -> Path:
    """Folder holding the shipped topology YAML files."""
    return _folder("topologies")


def models_dir() -> Path:
    """Folder holding the shipped transformer model YAML files (job planner)."""
    return _folder("models")


def profiles_dir() -> Path:
    """Folder holding the shipped compute profiles (``*.compute.json``) and the
    NCCL corpus calibration (``nccl-calibration.json``, :mod:`synth.cost.shared`)."""
    return _folder("profiles")
