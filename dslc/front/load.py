"""Reading plan files: bytes → text → AST for a root file and its transitive imports.

A *unit* of compilation is one root file with its imports, depth first; an import
path is relative to the importing file. A missing import is E005, a cycle E006,
reported at the import where it starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..diagnostics import Diagnostic, error, warning
from ..source import Sources, Span
from . import ast
from .parse import decode, parse


@dataclass
class Unit:
    root: str
    files: list[str] = field(default_factory=list)  # root first, then imports (DFS)


class Loader:
    def __init__(self, sources: Sources, diags: list[Diagnostic]):
        self.sources = sources
        self.diags = diags
        self.asts: dict[str, ast.File | None] = {}

    def read(self, path: str, data: bytes | None = None) -> ast.File | None:
        if path in self.asts:
            return self.asts[path]
        if data is None:
            data = Path(path).read_bytes()
        text, d = decode(data, path)
        tree = None
        if text is not None:
            self.sources.texts[path] = text
            tree, d = parse(text, path)
        self.diags.extend(d)
        self.asts[path] = tree
        return tree

    def unit(self, root: str) -> Unit:
        unit = Unit(root)
        self._visit(root, unit, stack=[], via=[])
        return unit

    def _visit(self, path: str, unit: Unit, stack: list[str], via: list[ast.Import]) -> None:
        """Depth-first over imports; ``via[i]`` is the import in ``stack[i]``
        that led on, so a cycle is reported where it starts."""
        if path in unit.files:
            return
        unit.files.append(path)
        tree = self.asts.get(path)
        if tree is None:
            return
        if not tree.items and not self.sources.texts.get(path, "").strip():
            self.diags.append(warning("W023", Span.point(path), "empty file: no cluster, model or plan"))
        base = os.path.dirname(path)
        for item in tree.items:
            if not isinstance(item, ast.Import):
                continue
            target = os.path.normpath(os.path.join(base, item.path))
            chain = stack + [path]
            if target in chain:
                k = chain.index(target)
                files = " → ".join(chain[k:] + [target])
                blame = (via + [item])[k]
                self.diags.append(error("E006", blame.span, f"import cycle: {files}", "move the shared definitions into a file both can import"))
                continue
            if target not in self.asts:
                try:
                    self.read(target)
                except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                    self.asts[target] = None
                    self.diags.append(error("E005", item.span, f"import not found: {item.path}", f"looked for {target} (paths are relative to the importing file)"))
                    continue
                except OSError as e:
                    self.asts[target] = None
                    self.diags.append(error("E005", item.span, f"cannot read import {item.path}: {e.strerror}"))
                    continue
            self._visit(target, unit, chain, via + [item])
