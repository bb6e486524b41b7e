"""The terminal: progress of a long command (``search``, ``verify``, ``schedule`` of a
large plan, ``compile`` of a folder) and the colour of what it prints.

Progress is drawn on standard error only when it is a terminal (not ``TERM=dumb``), and
vanishes when the work is done: a command piped to a file or run in CI prints exactly
what it prints without it. Colour needs a terminal too and is off when ``NO_COLOR`` is
set to anything but the empty string (https://no-color.org); ``--json`` and ``--format``
outputs never have it. rich draws both (a bar that redraws itself, the width of the
terminal, tables that align whatever their cells hold).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO


def interactive(stream: IO | None = None) -> bool:
    """Whether ``stream`` (standard error by default) is a terminal that redraws a line."""
    stream = stream if stream is not None else sys.stderr
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):  # a closed or stand-in stream
        return False


def colour(stream: IO | None = None) -> bool:
    """Whether to colour what goes to ``stream``: a terminal, and no ``NO_COLOR``."""
    return interactive(stream) and not os.environ.get("NO_COLOR")


def console(stream: IO | None = None):
    """A rich console writing to ``stream`` (standard output by default) that colours and
    redraws only as :func:`colour` and :func:`interactive` say."""
    from rich.console import Console

    stream = stream if stream is not None else sys.stdout
    tty = interactive(stream)
    # off a terminal nothing wraps: a table is as wide as its cells, a line as long as it is;
    # no colour system: no style at all (NO_COLOR drops bold too, as the diagnostics do)
    return Console(file=stream, force_terminal=tty, force_interactive=tty, color_system="auto" if colour(stream) else None,
                   highlight=False, emoji=False, markup=False, width=None if tty else 10_000)


def show(renderable, stream: IO | None = None) -> None:
    """Print a rich renderable (a table) to ``stream`` (standard output by default): as
    the terminal draws it, or off a terminal as plain lines with no trailing blanks."""
    out = console(stream)
    if out.is_terminal:
        out.print(renderable)
        return
    with out.capture() as captured:
        out.print(renderable)
    out.file.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


class Progress:
    """What a long command says of its work: :meth:`advance` after each item (with what
    it was), :meth:`total` once known. On anything but a terminal, it says nothing."""

    def total(self, n: int | None) -> None:
        pass

    def advance(self, n: int = 1, note: str = "") -> None:
        pass

    def log(self, line: str) -> None:
        """A line that stays (above the bar on a terminal, on standard error elsewhere)."""
        print(line, file=sys.stderr, flush=True)


class _Bar(Progress):
    def __init__(self, progress, task, label: str):
        self._progress, self._task, self._label = progress, task, label

    def total(self, n: int | None) -> None:
        self._progress.update(self._task, total=n)

    def advance(self, n: int = 1, note: str = "") -> None:
        label = f"{self._label}: {note}" if note else self._label
        self._progress.update(self._task, advance=n, description=label)

    def log(self, line: str) -> None:
        self._progress.console.print(line, soft_wrap=True)  # as long as it is, as off a terminal


@contextmanager
def progress(label: str, total: int | None = None) -> Iterator[Progress]:
    """A bar on standard error for ``label`` (a spinner while ``total`` is unknown), gone
    when the block ends; a :class:`Progress` that draws nothing off a terminal."""
    if not interactive(sys.stderr):
        yield Progress()
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.progress import Progress as Bar

    columns = (SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Bar(*columns, console=console(sys.stderr), transient=True) as bar:
        yield _Bar(bar, bar.add_task(label, total=total), label)
