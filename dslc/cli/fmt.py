"""``dslc fmt``: plan files rewritten in the one layout of :mod:`dslc.front.fmt`, or with
``--check`` and ``--diff`` only said to need it (CI, pre-commit, review).

A file is replaced whole or not at all (:func:`dslc.cli.inputs.write_whole`), through a
link to the file it leads to, with its permissions; one that cannot be formatted (a
syntax error, nesting too deep) is named and left as it is. Exit codes: 0 done (or
nothing to do), 1 a file that does not parse, or with ``--check`` a file that would
change, 2 a file that cannot be read or written.
"""

from __future__ import annotations

import difflib
import os
import sys

from ..front.fmt import FormatError, format_text
from ..front.load import linked, read_text, unquoted
from ..front.parse import MAX_BYTES, decode
from ..reading import inside, within
from ..source import Sources
from .inputs import UsageError, emit, expand, write_whole


class _IOFailed(Exception):
    """A file that could not be read or written: one line, exit 2."""


def run(args) -> int:
    files = expand(args.paths)
    folders = [p for p in args.paths if p != "-" and os.path.isdir(p)]
    if "-" in files and len(files) > 1:
        raise UsageError("'-' (standard input) cannot be mixed with files")
    changed, kept, failed, io_failed = [], 0, 0, 0
    for path in files:
        name = "<stdin>" if path == "-" else path
        try:
            if path != "-":
                _confined(path, args.paths, folders)
            text, st, problems = _read(path)
        except _IOFailed as e:
            print(f"dslc: error: {e}", file=sys.stderr)
            io_failed += 1
            continue
        # through a symbolic link a plan may be any file (a secret): its text is never
        # quoted, as lint quotes none of it
        hidden = path != "-" and linked(path)
        if text is None:  # binary, not UTF-8 or too large
            emit([unquoted(d) for d in problems] if hidden else problems, Sources())
            failed += 1
            continue
        try:
            out = format_text(text, name)
        except FormatError as e:
            if e.diagnostic is not None and hidden:
                emit([unquoted(e.diagnostic)], Sources())
            elif e.diagnostic is not None:
                emit([e.diagnostic], Sources({name: text}, {name}))
            else:
                print(f"dslc: error: {e}", file=sys.stderr)
            failed += 1
            continue
        if path == "-" and not (args.check or args.diff):
            sys.stdout.write(out)
        if out == text:
            kept += 1
            continue
        changed.append(name)
        if args.diff:
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), out.splitlines(True), f"{name} (as written)", f"{name} (formatted)"))
        if args.check or args.diff or path == "-":
            if args.check:
                print(f"would reformat {name}", file=sys.stderr)
            continue
        try:
            _write(path, out, st)
        except _IOFailed as e:
            print(f"dslc: error: {e}", file=sys.stderr)
            io_failed += 1
            continue
        if not args.quiet:
            print(f"reformatted {name}", file=sys.stderr)
    if not args.quiet and files != ["-"]:
        print(f"dslc: {_summary(len(changed), kept, failed + io_failed, args.check or args.diff)}", file=sys.stderr)
    return 2 if io_failed else 1 if failed or (args.check and changed) else 0


def _summary(changed: int, kept: int, failed: int, dry: bool) -> str:
    def files(n):
        return f"{n} file{'s' * (n != 1)}"

    parts = [f"{files(changed)} {'would be ' if dry else ''}reformatted"] * bool(changed)
    parts += [f"{files(kept)} already formatted"] * bool(kept) + [f"{files(failed)} left as {'it is' if failed == 1 else 'they are'} (errors above)"] * bool(failed)
    return ", ".join(parts) or "no files"


def _read(path: str):
    """(text, status, []) of a plan file, or (None, status, diagnostics) when it is not
    UTF-8 text of a plan's size; standard input has no status."""
    if path == "-":
        text, diags = decode(sys.stdin.buffer.read(MAX_BYTES + 1), "<stdin>")
        return text, None, diags
    try:
        return read_text(path)
    except OSError as e:
        raise _IOFailed(f"cannot read {path}: {e.strerror or e}") from None


def _confined(path: str, named: list[str], folders: list[str]) -> None:
    """A file found in a folder given (not named itself) is read, shown and rewritten only
    when it is in that folder, links followed: a link in a pull request's folder may lead
    to any file this user can read or write."""
    found_in = [f for f in folders if within(path, f)] if path not in named else []
    if found_in and not any(inside(path, f) for f in found_in):
        raise _IOFailed(f"{path} is a symbolic link out of {found_in[0]}: not read (name it to format the file it leads to)")


def _write(path: str, text: str, st: os.stat_result) -> None:
    """``text`` over the file at ``path`` (the file a link leads to), unless it changed since it was read."""
    real = os.path.realpath(path)
    try:
        now = os.stat(real)
        if (now.st_mtime_ns, now.st_size, now.st_ino) != (st.st_mtime_ns, st.st_size, st.st_ino):
            raise _IOFailed(f"{path} changed while it was formatted; left as it is")
        if not os.access(real, os.W_OK):
            raise _IOFailed(f"cannot write {path}: permission denied")
        write_whole(real, text, now.st_mode & 0o7777)
    except OSError as e:
        raise _IOFailed(f"cannot write {path}: {e.strerror or e}") from None
