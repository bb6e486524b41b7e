"""A document linted as ``dslc lint`` lints its file, from the editor's text.

The text is read by :func:`dslc.driver.load_text` under the document's own path, so its
imports resolve relative to it, as on disk, and every diagnostic has the code and span
that ``dslc lint FILE`` gives once the file is saved. The imported files are read from disk.

Diagnostics of an imported file are shown at the document's import that reaches it (the
file's own problems are its own document's, when it is open): one diagnostic each, with
its code and severity, its place in the imported file in the message and as related
information. Notes of imported files are left to those files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from lsprotocol import types as lsp
from pygls import uris

from ..codes import FIT_CODES
from ..diagnostics import Diagnostic, Severity
from ..driver import load_text
from ..front import ast
from ..report import explain
from ..source import Span
from .positions import Text

_SEVERITY = {Severity.ERROR: lsp.DiagnosticSeverity.Error, Severity.WARNING: lsp.DiagnosticSeverity.Warning,
             Severity.NOTE: lsp.DiagnosticSeverity.Information}
_UNUSED = {"W022"}  # a definition no plan uses: greyed out


@dataclass(frozen=True)
class Definition:
    kind: str  # cluster, model, plan or link
    name: str
    file: str
    block: ast.Block


def uri_of(path: str) -> str:
    return uris.from_fs_path(os.path.abspath(path)) or path


class Analysis:
    """One version of a document's text, linted, with the definitions it can see."""

    def __init__(self, uri: str, text: str, encoding: str = "utf-16"):
        self.uri = uri
        # an untitled buffer has no folder: its imports are relative to the server's
        self.path = uris.to_fs_path(uri) or "untitled.plan"
        self.text = Text(text, encoding)
        self.result = load_text(text.encode("utf-8", "surrogatepass"), self.path)
        self.tree = self.result.asts.get(self.path)  # None: the text does not parse
        self.defs: dict[tuple[str, str], Definition] = {}
        for file, tree in self.result.asts.items():  # the document first, then its imports
            for item in tree.items if tree else ():
                if isinstance(item, ast.Block) and item.name is not None:
                    self.defs.setdefault((item.kind, item.name), Definition(item.kind, item.name, file, item))
        self._texts: dict[str, Text | None] = {self.path: self.text}
        self._explained: dict[str, object] = {}

    # -- files -------------------------------------------------------------------------

    def resolve(self, imported: str, importer: str | None = None) -> str:
        """The path of an import, relative to its file, as the loader finds it."""
        return os.path.normpath(os.path.join(os.path.dirname(importer or self.path), imported))

    def imports(self) -> list[tuple[ast.Import, str]]:
        """The document's imports and the path each names."""
        return [(i, self.resolve(i.path)) for i in (self.tree.items if self.tree else ()) if isinstance(i, ast.Import)]

    def import_at(self, offset: int) -> tuple[ast.Import, str] | None:
        """The document's import whose statement holds ``offset``, and the path it names."""
        for imp, path in self.imports():
            s = imp.span
            if self.text.span_offset(s.line, s.col) <= offset < self.text.span_offset(s.end_line, s.end_col):
                return imp, path
        return None

    def via(self, file: str) -> ast.Import | None:
        """The document's import through which ``file`` is read (directly or deeper)."""
        for imp, path in self.imports():
            seen, todo = set(), [path]
            while todo:
                here = todo.pop()
                if here == file:
                    return imp
                if here in seen:
                    continue
                seen.add(here)
                tree = self.result.asts.get(here)
                todo += [self.resolve(i.path, here) for i in (tree.items if tree else ()) if isinstance(i, ast.Import)]
        return None

    def relative(self, file: str) -> str:
        """A file as the document's imports name it: relative to the document's folder."""
        return os.path.relpath(file, os.path.dirname(os.path.abspath(self.path)))

    def text_of(self, file: str) -> Text | None:
        if file not in self._texts:
            text = self.result.sources.texts.get(file)
            self._texts[file] = Text(text, self.text.encoding) if text is not None else None
        return self._texts[file]

    def location(self, span: Span) -> lsp.Location:
        text = self.text_of(span.file)
        if text is not None:
            rng = text.range(span)
        else:  # a file that is not a plan: only its line and column are known
            rng = lsp.Range(lsp.Position(span.line - 1, span.col - 1), lsp.Position(span.line - 1, span.col - 1))
        return lsp.Location(uri_of(span.file), rng)

    # -- diagnostics -------------------------------------------------------------------

    def diagnostics(self) -> list[lsp.Diagnostic]:
        out = []
        for d in self.result.diagnostics:
            if d.span is None or d.span.file == self.path:
                rng = self.text.range(d.span) if d.span else lsp.Range(lsp.Position(0, 0), lsp.Position(0, 0))
                out.append(_diagnostic(d, rng, d.message))
            elif d.severity is not Severity.NOTE:
                imp = self.via(d.span.file)
                rng = self.text.range(imp.span) if imp else lsp.Range(lsp.Position(0, 0), lsp.Position(0, 0))
                where = self.relative(d.span.file)
                related = [lsp.DiagnosticRelatedInformation(self.location(d.span), d.message)]
                out.append(_diagnostic(d, rng, f"{where}:{d.span.line}:{d.span.col}: {d.message}", related))
        return out

    # -- plans -------------------------------------------------------------------------

    def plan(self, name: str):
        """The lowered plan of this name defined in the document, or None."""
        return next((p for p in self.result.own_plans if p.name == name), None)

    def explained(self, name: str) -> explain.Explanation | list[Diagnostic] | None:
        """``dslc explain``'s estimates of the plan, or the errors that stop them (as
        ``dslc explain`` stops at any but a plan that does not fit), or None without a plan."""
        if name not in self._explained:
            plan = self.plan(name)
            errors = [d for d in self.result.diagnostics if d.is_error and d.code not in FIT_CODES]
            if plan is None:
                self._explained[name] = errors or None
            elif errors and not self.result.clean(plan):
                self._explained[name] = errors
            else:
                self._explained[name] = explain.explain(plan)
        return self._explained[name]

    def cluster_of(self, plan: str | None) -> ast.Block | None:
        """The cluster block of a plan: inline, or the one its ``cluster = NAME`` names."""
        d = self.defs.get(("plan", plan)) if plan else None
        for st in d.block.body if d else ():
            if isinstance(st, ast.Block) and st.kind == "cluster":
                return st
            if isinstance(st, ast.Assign) and st.key == "cluster" and isinstance(st.value, ast.Ident):
                c = self.defs.get(("cluster", st.value.name))
                return c.block if c else None
        return None

    def links(self, plan: str | None) -> list[tuple[ast.Block, str]]:
        """The link blocks (with their files) a plan's mesh may name: its cluster's, or
        every cluster's when its cluster is not known yet."""
        cluster = self.cluster_of(plan)
        clusters = [cluster] if cluster else [d.block for d in self.defs.values() if d.kind == "cluster"]
        return [(st, c.span.file) for c in clusters for st in c.body if isinstance(st, ast.Block) and st.kind == "link" and st.name]


def _diagnostic(d: Diagnostic, rng: lsp.Range, message: str, related=None) -> lsp.Diagnostic:
    return lsp.Diagnostic(
        range=rng,
        message=message + (f"\nhelp: {d.hint}" if d.hint else ""),
        severity=_SEVERITY[d.severity],
        code=d.code,
        source="dslc",
        related_information=related,
        tags=[lsp.DiagnosticTag.Unnecessary] if d.code in _UNUSED else None,
    )
