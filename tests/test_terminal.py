"""The terminal (dslc.report.terminal): progress and colour on a terminal, nothing of either
when piped or with NO_COLOR, none ever in --json and --format outputs, tables that align.

Each command runs as a user runs it, with its standard output and error each on a
pseudo-terminal of its own (pty.openpty, 200 columns, TERM=xterm) or a file.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pty = pytest.importorskip("pty")
fcntl = pytest.importorskip("fcntl")
termios = pytest.importorskip("termios")
import select  # noqa: E402  (after the skips: a platform without pty has no select on it either)
import struct  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BAD = ROOT / "tests" / "cases" / "unknown_key.plan"
SGR = re.compile(rb"\x1b\[[0-9;]*m")  # a colour or a style (bold)
CONTROL = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")  # any escape a terminal acts on
TIMEOUT = 120


@dataclass
class Run:
    rc: int
    out: bytes
    err: bytes


def _env(no_color: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
    env |= {"TERM": "xterm", "COLUMNS": "200", "LINES": "50", "PYTHONPATH": str(ROOT)}
    if no_color:
        env["NO_COLOR"] = "1"
    return env


def run(*args: str, tty: tuple[str, ...] = ("stdout", "stderr"), no_color: bool = False) -> Run:
    """``python -m dslc ARGS`` with the streams in ``tty`` on a pseudo-terminal each (the
    others in a file), read until the command exits; a pty turns "\\n" into "\\r\\n"."""
    fds, files, got = {}, {}, {}
    for name in ("stdout", "stderr"):
        if name in tty:
            master, slave = pty.openpty()
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
            fds[name], files[name], got[name] = master, slave, bytearray()
        else:
            files[name] = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "dslc", *args], cwd=ROOT, env=_env(no_color), stdin=subprocess.DEVNULL,
                            stdout=files["stdout"], stderr=files["stderr"])
    for name in fds:
        os.close(files[name])  # the child holds the slave side: its exit ends the reads (EIO)
    deadline = time.monotonic() + TIMEOUT
    try:
        open_ = dict(fds)
        while open_:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"dslc {' '.join(args)} ran past {TIMEOUT} s")
            ready, _, _ = select.select(list(open_.values()), [], [], 1.0)
            for name in [n for n, fd in open_.items() if fd in ready]:
                try:
                    chunk = os.read(open_[name], 65536)
                except OSError:  # EIO: every slave side closed (Linux)
                    chunk = b""
                if chunk:
                    got[name] += chunk
                else:
                    del open_[name]
        rc = proc.wait(timeout=TIMEOUT)
    finally:
        for fd in fds.values():
            os.close(fd)
        if proc.poll() is None:
            proc.kill()
    for name, f in files.items():
        if name not in fds:
            f.seek(0)
            got[name] = f.read()
            f.close()
    return Run(rc, bytes(got["stdout"]), bytes(got["stderr"]))


def piped(*args: str) -> Run:
    r = subprocess.run([sys.executable, "-m", "dslc", *args], cwd=ROOT, env=_env(False), capture_output=True,
                       stdin=subprocess.DEVNULL, timeout=TIMEOUT)
    return Run(r.returncode, r.stdout, r.stderr)


def plain(b: bytes) -> str:
    """What a terminal shows of ``b`` line by line, without its escapes and carriage returns."""
    return CONTROL.sub(b"", b).replace(b"\r\n", b"\n").decode()


def quiet(r: Run) -> None:
    """Off a terminal: no redraw, no escape, on either stream."""
    for stream in (r.out, r.err):
        assert b"\r" not in stream and b"\x1b" not in stream, stream[:300]


# --------------------------------------------------------------------------
# progress


def test_search_draws_a_bar_on_a_terminal_only():
    r = run("search", "plans/tiny_demo.plan")
    assert r.rc == 0, r.err
    assert b"searching the layouts of tiny_demo" in r.err and b"\x1b[" in r.err
    assert "dslc: tiny_demo on 4 × cpu" in plain(r.err)  # the summary stays, after the bar
    p = piped("search", "plans/tiny_demo.plan")
    assert p.rc == 0 and b"searching the layouts" not in p.err
    quiet(p)


def test_search_table_on_a_wide_terminal_is_at_most_120_columns():
    """A 200-column terminal: the table of a 1,024-GPU search takes 120 at most (it took all 200,
    wrapping its last column), its rows a line each and their changes under them."""
    r = run("search", "plans/llama3_70b.plan", "--gpus", "1024", "-q")
    assert r.rc == 0, r.err
    lines = SGR.sub(b"", r.out).decode().replace("\r\n", "\n").splitlines()
    assert lines and max(len(line.rstrip()) for line in lines) <= 120, lines


def test_compile_of_several_plans_draws_a_bar_and_keeps_its_lines(tmp_path):
    r = run("compile", "plans/tiny_demo.plan", "plans/tiny_moe.plan", "-o", str(tmp_path / "tty"))
    assert r.rc == 0, r.err
    assert b"compiling" in r.err and b"\x1b[" in r.err
    shown = plain(r.err)
    for name in ("tiny_demo", "tiny_moe"):  # printed above the bar, whole
        assert f"wrote {tmp_path / 'tty' / name}/\n" in shown
    assert shown.rstrip().endswith("dslc: wrote 2 plans")
    # off a terminal: the lines CI parses, exactly, and nothing else
    p = piped("compile", "plans/tiny_demo.plan", "plans/tiny_moe.plan", "-o", str(tmp_path / "pipe"))
    assert p.rc == 0
    assert p.err.decode() == "".join(f"wrote {tmp_path / 'pipe' / n}/\n" for n in ("tiny_demo", "tiny_moe")) + "dslc: wrote 2 plans\n"
    quiet(p)


def test_schedule_draws_a_spinner_on_a_terminal_only():
    r = run("schedule", "plans/llama3_70b.plan")
    assert r.rc == 0, r.err
    assert b"scheduling llama3_70b" in r.err and b"\x1b[" in r.err
    assert plain(r.out).startswith("llama3_70b: interleaved_1f1b")
    p = piped("schedule", "plans/llama3_70b.plan")
    assert p.rc == 0 and p.err == b""
    assert p.out.decode() == plain(r.out)  # the grid is the same; it fits in 80 columns
    quiet(p)


# --------------------------------------------------------------------------
# colour


def test_diagnostics_are_coloured_on_a_terminal_only():
    r = run("lint", str(BAD))
    assert r.rc == 1
    assert b"\x1b[1;31merror[E010]\x1b[0m" in r.out  # error red, as before rich drew it
    text = plain(r.out)
    assert piped("lint", str(BAD)).out.decode() == text  # the same text, uncoloured
    assert "error[E010]: unknown key 'hiden'" in text
    n = run("lint", str(BAD), no_color=True)
    assert n.rc == 1 and not SGR.search(n.out) and plain(n.out) == text
    quiet(piped("lint", str(BAD)))


def test_no_color_keeps_the_bar_but_drops_every_style():
    r = run("search", "plans/tiny_demo.plan", no_color=True)
    assert r.rc == 0
    assert b"searching the layouts of tiny_demo" in r.err  # progress is not colour
    assert not SGR.search(r.out) and not SGR.search(r.err)
    assert SGR.search(run("search", "plans/tiny_demo.plan").out)  # the table's header is bold


@pytest.mark.parametrize("args", [
    ("lint", "--format", "json", str(BAD)),
    ("lint", "--format", "sarif", str(BAD)),
    ("lint", "--format", "github", str(BAD)),
    ("search", "--json", "plans/tiny_demo.plan"),
    ("schedule", "--json", "plans/tiny_demo.plan"),
    ("explain", "--json", "plans/tiny_demo.plan"),
], ids=lambda a: "-".join(a[:3]).replace("/", "_"))
def test_machine_outputs_never_hold_an_escape(args):
    r = run(*args, tty=("stdout",))
    assert r.rc in (0, 1), r.err
    assert r.out.strip() and b"\x1b" not in r.out


# --------------------------------------------------------------------------
# tables


def _table(text: str) -> list[str]:
    """The search table's header and rows (the rule under the header left out)."""
    lines = [line for line in text.splitlines() if line.strip()]
    head = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#") and "layout" in line)
    return [lines[head]] + [line for line in lines[head + 1:] if line.strip() and not set(line.strip()) <= {"─", "━"}]


@pytest.mark.parametrize("where", ["tty", "pipe"])
def test_search_table_columns_align(where):
    """Every row's cell starts at its header's column (left-aligned columns) or ends at it
    (right-aligned ones), on a terminal and off it."""
    from dslc.report.search import COLUMNS, RIGHT, SPARE

    r = run("search", "--top", "5", "plans/tiny_demo.plan", tty=("stdout",)) if where == "tty" else piped("search", "--top", "5", "plans/tiny_demo.plan")
    assert r.rc == 0
    head, *rows = _table(plain(r.out) if where == "tty" else r.out.decode())
    assert len(rows) >= 5
    at = 0
    for name in (c for c in COLUMNS if c not in SPARE):  # the columns every table has
        start = head.index(name, at)
        end = at = start + len(name)
        for row in rows:
            row = row.ljust(len(head))
            if name in RIGHT:
                assert row[end - 1] != " " and row[end:end + 1] in (" ", ""), (name, row)
            else:
                assert row[start] != " " and (start == 0 or row[start - 1] == " "), (name, row)


def test_progress_off_a_terminal_says_only_its_lines(capsys):
    """What verify and compile draw with: off a terminal, only what they log, one line each."""
    from dslc.report.terminal import colour, interactive, progress

    with progress("verifying p", total=2) as bar:
        bar.advance(0, "the serial script")
        bar.log("ran the serial script (1 process, seed 0): 1.0 s")
        bar.advance(1, "the parallel script")
        bar.total(3)
    assert capsys.readouterr() == ("", "ran the serial script (1 process, seed 0): 1.0 s\n")
    assert not interactive() and not colour()


@pytest.mark.parametrize("value, on", [("1", False), ("", True), ("0", False)])
def test_no_color_set_and_not_empty_turns_colour_off(monkeypatch, value, on):
    """https://no-color.org: NO_COLOR set to anything but the empty string."""
    from dslc.report import terminal

    class Tty:
        def isatty(self):
            return True

    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setenv("NO_COLOR", value)
    assert terminal.colour(Tty()) is on and terminal.interactive(Tty())
