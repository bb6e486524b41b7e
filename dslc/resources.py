"""Where the grammar and templates are: next to the package in a checkout,
inside it (``dslc/grammar``, ``dslc/templates``) once installed from a wheel."""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def resource_dir(name: str) -> Path:
    for candidate in (_PKG / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"dslc is installed without its {name}/ folder")
