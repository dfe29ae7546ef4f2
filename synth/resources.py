"""Locate the grammars and topologies shipped with the package.

Installed, they are the packages ``synth.grammars`` and ``synth.topologies``; in a
source checkout they are the top-level folders ``grammars/`` and ``topologies/``.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parent.parent


def _folder(package: str, checkout_name: str) -> Path:
    try:
        return Path(str(importlib.resources.files(package)))
    except ModuleNotFoundError:  # running from a source checkout, not installed
        return _REPO_ROOT / checkout_name


def grammar_path(name: str) -> Path:
    """Path of the lark grammar ``name`` (e.g. ``"program.lark"``)."""
    return _folder("synth.grammars", "grammars") / name


def topologies_dir() -> Path:
    """Folder holding the shipped topology YAML files."""
    return _folder("synth.topologies", "topologies")
