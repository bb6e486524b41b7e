"""Reading plan files: bytes → text → AST for a root file and its transitive imports.

A *unit* of compilation is one root file with its imports, depth first; an import
path is relative to the importing file. A missing import is E005, a cycle E006,
reported at the import where it starts.

Plans come from pull requests and ``dslc lint`` runs in CI, so an import may name any
file on the machine. Reading is safe on all of them:

- only regular files are read, at most ``MAX_BYTES + 1`` bytes of each: a FIFO would
  block and ``/dev/zero`` never ends (E007, E008 at the import);
- imports nest at most :data:`MAX_IMPORT_DEPTH` deep (E009), walked with an explicit
  stack, so no chain of files exhausts Python's;
- a file is known by its device and inode, so one file reached by two paths (``a.plan``,
  ``./sub/../a.plan``, a symlink) is read once and defines its names once;
- no text of an imported file reaches the log: when it is not a plan, E007 at the
  import says where it stops being one and quotes nothing, and only the files named on
  the command line are quoted (:class:`Sources`).

Files come from this machine (:class:`Files`) unless the loader is given another
reader: ``dslc diff --git`` reads a commit's files, with the same bounds.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from .. import reading
from ..codes import CODES
from ..diagnostics import Diagnostic, error, warning
from ..reading import NotAFile
from ..source import Sources, Span
from . import ast
from .parse import MAX_BYTES, decode, parse, too_large_text

MAX_IMPORT_DEPTH = 64  # files in one chain of imports, the root included

# What an import of a file that cannot be read as a plan says, at the import: {p} the
# path as the import wrote it, {r} the reason (never a byte of the file's text).
_SAYS = {
    "E005": "import not found: {p} is {r}",
    "E007": "imported file {p} is not a plan file: {r}",
    "E008": "imported file {p} {r}",
}


def read_bytes(path: str) -> tuple[bytes, os.stat_result]:
    """The bytes of the plan file at ``path``, at most ``MAX_BYTES + 1`` of them (none
    when its size is already larger), and its status: :mod:`dslc.reading`'s bounds."""
    return reading.read_bytes(path, MAX_BYTES)


def read_text(path: str) -> tuple[str | None, os.stat_result, list[Diagnostic]]:
    """The text of the plan file at ``path`` and its status, or None and why not (E004 not
    UTF-8, E008 too large): the one bounded read and decoding of every reader of a plan
    (the loader, fmt, the language server). OSError when it cannot be read at all."""
    data, st = read_bytes(path)
    text, diags = decode(data, path, st.st_size)
    return text, st, diags


def linked(path: str) -> bool:
    """Whether ``path`` reaches its file through a symbolic link: then the file may be any
    file on the machine (a plan's folder comes from a pull request), and its text is never
    quoted, by lint, fmt or the language server alike."""
    return os.path.realpath(path) != os.path.abspath(path)


@dataclass(frozen=True)
class Read:
    """A file as :class:`Files` read it: at most ``MAX_BYTES + 1`` bytes (none when
    ``size`` already says it is larger), its identity, and whether it was reached through
    a symbolic link (then never quoted)."""

    data: bytes
    size: int
    key: object
    linked: bool = False


class Files:
    """Where the loader finds files: this machine's (the default). ``dslc diff --git``
    passes another, which reads a commit's files (:mod:`dslc.cli.git`)."""

    def identity(self, path: str) -> object:
        """What tells one file from another (two paths, one file); OSError as ``os.stat``
        raises it when there is no such file."""
        st = os.stat(path)
        return (st.st_dev, st.st_ino)

    def read(self, path: str) -> Read:
        """The file's bytes; OSError (IsADirectoryError, NotAFile, ...) when it is not one."""
        data, st = read_bytes(path)
        return Read(data, st.st_size, (st.st_dev, st.st_ino), linked(path))


@dataclass
class Unit:
    root: str
    files: list[str] = field(default_factory=list)  # root first, then imports (DFS)


@dataclass
class _File:
    path: str  # the path it was first reached by: its name in every diagnostic
    tree: ast.File | None
    problem: tuple[str, str, str | None] | None = None  # (code, reason, hint) for each import of it


class Loader:
    def __init__(self, sources: Sources, diags: list[Diagnostic], files: Files | None = None):
        self.sources = sources
        self.diags = diags
        self.files = files or Files()
        self.asts: dict[str, ast.File | None] = {}  # by the file's path in diagnostics
        self._files: dict[object, _File] = {}  # by identity: (device, inode)
        self._roots: dict[str, object] = {}  # a root's path as given → its identity

    def read(self, path: str, data: bytes | None = None) -> ast.File | None:
        """Read a root file (``data``: its text, for standard input and tests). Its
        problems are reported at their place and its lines may be quoted; ``OSError``
        (missing, a directory, a FIFO) propagates, for the CLI to say in one line."""
        if data is not None:  # standard input, or an editor's unsaved text of the file at path
            try:
                key: object = self.files.identity(path)  # so an import of that file is this text (a cycle, not a second file)
            except OSError:
                key = ("text", path)
            quoted, size = True, None
        else:
            got = self.files.read(path)
            data, key, size = got.data, got.key, got.size
            quoted = not got.linked  # through a symlink a root may be any file, as an import may
        self._roots[path] = key
        if key in self._files:
            return self._files[key].tree
        tree, diags = self._parse(path, data, size)
        if quoted:
            self.sources.quoted.add(path)
        else:
            diags = [unquoted(d) for d in diags]
        self.diags.extend(diags)
        self._add(key, _File(path, tree))
        return tree

    def unit(self, root: str) -> Unit:
        """The root and its imports, depth first, walked with an explicit stack. A frame
        is (file, its imports still to visit, the import that led to it), so a cycle is
        reported at the import in the chain where it starts."""
        key = self._roots[root]
        unit = Unit(self._files[key].path)
        done: set[object] = set()
        frames: list[tuple[object, Iterator[ast.Import], ast.Import | None]] = []

        def enter(key: object, via: ast.Import | None) -> None:
            f = self._files[key]
            done.add(key)
            unit.files.append(f.path)
            if f.tree is None:
                return
            if not f.tree.items and not self.sources.texts.get(f.path, "").strip():
                self.diags.append(warning("W023", Span.point(f.path), "empty file: no cluster, model or plan"))
            imports = (i for i in f.tree.items if isinstance(i, ast.Import))
            frames.append((key, imports, via))

        enter(key, None)
        while frames:
            here, imports, _ = frames[-1]
            item = next(imports, None)
            if item is None:
                frames.pop()
                continue
            found = self._locate(item, self._files[here].path)
            if found is None:
                continue
            target, path = found
            chain = [k for k, _, _ in frames]
            if target in chain:
                k = chain.index(target)
                files = " → ".join([self._files[c].path for c in chain[k:]] + [self._files[target].path])
                blame = frames[k + 1][2] if k + 1 < len(frames) else item
                self.diags.append(error("E006", blame.span, f"import cycle: {files}", "move the shared definitions into a file both can import"))
            elif len(frames) >= MAX_IMPORT_DEPTH and target not in done:
                self.diags.append(error(
                    "E009", item.span,
                    f"import {item.path} would nest imports {len(frames) + 1} files deep; "
                    f"at most {MAX_IMPORT_DEPTH} may be",
                    f"the chain starts at {unit.root}: import the shared files from fewer levels",
                ))
            elif self._read_import(target, path, item) and target not in done:
                enter(target, item)
        return unit

    # -- imports ---------------------------------------------------------------

    def _locate(self, item: ast.Import, importer: str) -> tuple[object, str] | None:
        """The identity of the file an import names and its path, or None after an E005
        at the import. Only ``stat``: nothing is opened yet."""
        bad = "a NUL byte" if "\0" in item.path else None
        try:
            os.fsencode(item.path)
        except UnicodeEncodeError:
            bad = "a character no file name can hold (a lone surrogate)"
        if bad:
            self.diags.append(error("E005", item.span, f"import not found: the path holds {bad}"))
            return None
        path = os.path.normpath(os.path.join(os.path.dirname(importer), item.path))
        try:
            key = self.files.identity(path)
        except (FileNotFoundError, NotADirectoryError):
            self.diags.append(error("E005", item.span, f"import not found: {item.path}", f"looked for {path} (paths are relative to the importing file)"))
            return None
        except OSError as e:
            self.diags.append(error("E005", item.span, f"cannot read import {item.path}: {e.strerror}"))
            return None
        return key, path

    def _read_import(self, key: object, path: str, item: ast.Import) -> bool:
        """Read an imported file once; report at ``item`` when it is not a plan, as
        at every other import of it. Whether its definitions join the unit."""
        f = self._files.get(key)
        if f is None:
            f = self._add(key, self._read_file(path))
        if f.problem is None:
            return True
        code, reason, hint = f.problem
        self.diags.append(error(code, item.span, _SAYS[code].format(p=item.path, r=reason), hint))
        return False

    def _read_file(self, path: str) -> _File:
        try:
            got = self.files.read(path)
        except IsADirectoryError:
            return _File(path, None, ("E005", "a directory", "an import names a plan file"))
        except NotAFile as e:
            return _File(path, None, ("E007", f"it is {e.kind}", "an import names a regular file"))
        except OSError as e:
            return _File(path, None, ("E007", f"it cannot be read ({e.strerror})", None))
        tree, diags = self._parse(path, got.data, got.size)
        if tree is not None:
            self.diags.extend(diags)
            return _File(path, tree)
        self.sources.texts.pop(path, None)  # never quoted: keep no copy of it
        d = next(d for d in diags if d.is_error)
        if d.code == "E008":
            size = max(got.size, len(got.data))
            return _File(path, None, ("E008", too_large_text(size if size > MAX_BYTES else None), None))
        where = f"{CODES[d.code]} at line {d.span.line}, column {d.span.col}"
        hint = f"dslc never shows an imported file's text; `dslc lint {path}` shows the error"
        return _File(path, None, ("E007", where, hint))

    # -- both ------------------------------------------------------------------

    def _parse(self, path: str, data: bytes, size: int | None) -> tuple[ast.File | None, list[Diagnostic]]:
        text, diags = decode(data, path, size)
        if text is None:
            return None, diags
        self.sources.texts[path] = text
        return parse(text, path)

    def _add(self, key: object, f: _File) -> _File:
        self._files[key] = f
        self.asts[f.path] = f.tree
        return f


def unquoted(d: Diagnostic) -> Diagnostic:
    """A reading or syntax diagnostic of a file that is not quoted: the message names
    what is wrong, never the token or byte that is (it could be a password)."""
    message = f"{CODES[d.code]} (the file is reached through a symbolic link: its text is not shown)"
    return Diagnostic(d.code, d.severity, d.span, message, d.hint)
