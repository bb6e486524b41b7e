"""What every command of the command line reads and prints first: the plan files (with
their imports, or standard input), their diagnostics, the plans asked for, and the one
error that is the user's (:class:`UsageError`, exit 2)."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ..diagnostics import Diagnostic, Severity, has_errors
from ..driver import LoadResult, load_paths, load_text
from ..front.parse import MAX_BYTES
from ..report.diagnostics import RENDERERS, render_text
from ..report.terminal import colour
from ..source import Sources


class UsageError(Exception):
    """A one-line usage or I/O error (exit 2)."""


# --------------------------------------------------------------------------
# inputs


def expand(paths: Sequence[str]) -> list[str]:
    """Files as given; directories searched recursively for ``*.plan``."""
    out: list[str] = []
    for p in paths:
        if p == "-":
            out.append(p)
        elif os.path.isdir(p):
            found = sorted(str(f) for f in Path(p).rglob("*.plan") if f.is_file())
            if not found:
                raise UsageError(f"no .plan files under {p}")
            out.extend(found)
        elif os.path.exists(p):
            out.append(p)
        else:
            raise UsageError(f"no such file or directory: {p}")
    return out


def load(paths: Sequence[str]) -> LoadResult:
    """Read the files with their imports. A root that cannot be read (missing, a
    directory, a FIFO or device: the loader never opens those) is a one-line error;
    standard input is read up to one byte past the size limit, never to its end."""
    files = expand(paths)
    try:
        if files == ["-"]:
            return load_text(sys.stdin.buffer.read(MAX_BYTES + 1), "<stdin>")
        if "-" in files:
            raise UsageError("'-' (standard input) cannot be mixed with files")
        return load_paths(files)
    except PermissionError as e:
        raise UsageError(f"cannot read {e.filename}: permission denied") from None
    except IsADirectoryError as e:
        raise UsageError(f"{e.filename} is a directory") from None
    except OSError as e:
        raise UsageError(f"cannot read {e.filename or ''}: {e.strerror}") from None


def emit(diags: list[Diagnostic], sources: Sources, fmt: str = "text", stream=None, quiet: bool = False) -> None:
    """Print ``diags`` (``quiet``: not the notes) in ``fmt``, to standard error by default."""
    stream = stream or sys.stderr
    if quiet:
        diags = [d for d in diags if d.severity is not Severity.NOTE]
    if fmt == "text":
        stream.write(render_text(diags, sources, colour=colour(stream)))
    else:
        stream.write(RENDERERS[fmt](diags, sources))


def pick(result: LoadResult, name: str | None):
    """The plans defined in the files given (not in their imports), or the one named."""
    plans = result.own_plans
    if name is not None:
        chosen = [p for p in plans if p.name == name]
        if not chosen:
            raise UsageError(f"no plan named {name!r} (plans: {', '.join(p.name for p in plans) or 'none'})")
        return chosen
    if not plans and not has_errors(result.diagnostics):
        raise UsageError("no plan in the given files (only clusters or models?)")
    return list(plans)


def load_plans(paths: Sequence[str], name: str | None, quiet: bool = False):
    """Load, print the diagnostics to stderr, and pick the plans: (result, plans),
    or None when the plans have errors (the caller exits 1)."""
    result = load(paths)
    emit(result.diagnostics, result.sources, quiet=quiet)
    if has_errors(result.diagnostics):
        return None
    return result, pick(result, name)


# --------------------------------------------------------------------------
# outputs


def write_whole(path: str, text: str, mode: int | None = None) -> None:
    """``text`` at ``path``, whole or not at all: a temporary file beside it, renamed over
    it. ``mode``: its permission bits (by default a new file's, 0666 less the umask, not
    the temporary file's 0600). Newlines are written as they are in ``text``. ``OSError``
    propagates, with nothing left behind."""
    if mode is None:
        mask = os.umask(0)
        os.umask(mask)
        mode = 0o666 & ~mask
    temp = None
    try:
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", newline="", dir=os.path.dirname(os.path.abspath(path)),
                                         prefix=f".{os.path.basename(path)}.", suffix=".tmp", delete=False) as f:
            temp = f.name
            f.write(text)
        os.chmod(temp, mode)
        os.replace(temp, path)
    except OSError:
        if temp is not None and os.path.exists(temp):
            os.unlink(temp)
        raise
