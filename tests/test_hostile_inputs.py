"""Issue 10: the front end on plans an attacker wrote. ``dslc lint`` runs in CI on
pull requests, so a plan's imports may name any file on the machine: reading must be
bounded (no device, FIFO or endless chain makes it hang or exhaust memory), every
failure is a diagnostic at the import (exit 1, never a traceback or exit 3), an
imported file that is not a plan is reported without one byte of its text, and no
diagnostic writes raw control characters to the log."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from dslc.driver import load_text

ROOT = Path(__file__).resolve().parents[1]
SECRET = "hunter2-SECRET-0xC0FFEE"

PLAN = """\
cluster c {
    nodes = 1
    gpus_per_node = 1
    device = cpu
    link shm { scope = node; bandwidth = 10 GB/s; latency = 5 us }
}
plan p {
    model gpt2 { layers = 2; hidden = 64; heads = 4; vocab = 256; seq_len = 32 }
    cluster = c
    mesh { dp = 1 on shm }
%s}
"""
MODEL = "arch = gpt2; layers = 2; hidden = 64; heads = 4; vocab = 256; seq_len = 32"
USES_M = (PLAN % "").replace(f"model gpt2 {{ {MODEL.split('; ', 1)[1]} }}", "model = m")
assert "model = m" in USES_M


RUN = {}  # the session's fork server (conftest's run_script), for lint below


@pytest.fixture(autouse=True)
def _server(run_script):
    RUN["dslc"] = run_script.dslc


def lint(*args: str, cwd: Path = ROOT, stdin=None) -> subprocess.CompletedProcess:
    """``dslc lint`` as CI runs it, in a child with a time and memory bound (stdin: a
    file's path)."""
    return RUN["dslc"]("lint", *args, cwd=cwd, stdin=stdin)


def diagnosed(r: subprocess.CompletedProcess, code: str, where: str) -> None:
    """Exit 1 with ``code`` at ``where`` (file:line:col), and no internal error."""
    out = (r.stdout + r.stderr).decode(errors="replace")
    assert r.returncode == 1, out
    assert f"{where}: error[{code}]" in out, out
    assert "Traceback" not in out and "internal error" not in out


# --------------------------------------------------------------------------
# 1. reading is bounded: devices, FIFOs, deep chains, odd paths


def test_import_of_dev_zero_is_refused_before_reading(tmp_path):
    (tmp_path / "main.plan").write_text('import "/dev/zero";\n')
    diagnosed(lint("main.plan", cwd=tmp_path), "E007", "main.plan:1:1")


def test_import_of_a_fifo_does_not_block(tmp_path):
    os.mkfifo(tmp_path / "pipe.plan")
    (tmp_path / "main.plan").write_text('\n  import "pipe.plan"\n')
    diagnosed(lint("main.plan", cwd=tmp_path), "E007", "main.plan:2:3")


@pytest.mark.parametrize("name", ["fifo", "/dev/zero"])
def test_root_that_is_not_a_regular_file_is_a_usage_error(tmp_path, name):
    if name == "fifo":
        os.mkfifo(tmp_path / "fifo")
    r = lint(name, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert b"not a regular file" in r.stderr and b"Traceback" not in r.stderr


def test_standard_input_is_read_with_a_bound():
    r = lint("-", stdin="/dev/zero")
    diagnosed(r, "E008", "<stdin>:1:1")


def test_oversized_import_is_refused_at_the_import(tmp_path):
    with open(tmp_path / "big.plan", "wb") as f:
        f.truncate(64 << 20)  # sparse: 64 MiB that cost nothing to make
    (tmp_path / "main.plan").write_text('import "big.plan"\n')
    diagnosed(lint("main.plan", cwd=tmp_path), "E008", "main.plan:1:1")


def test_a_file_of_too_many_tokens_is_refused_where_they_pass_the_bound(tmp_path):
    """1.3 MB of tokens (within 4 MiB) took Lark 16 s to parse and lint 60 s to report (a
    fuzzed plan): parsing stops at token 65,537, in the file given and at an import."""
    block, columns = "model m { layers = 1 }\n", [1, 7, 9, 11, 18, 20, 22]  # its 7 tokens
    (tmp_path / "big.plan").write_text(block * 60_000)
    (tmp_path / "main.plan").write_text('import "big.plan"\n')
    diagnosed(lint("big.plan", cwd=tmp_path), "E008", f"big.plan:{65_536 // 7 + 1}:{columns[65_536 % 7]}")
    r = lint("main.plan", cwd=tmp_path)
    diagnosed(r, "E008", "main.plan:1:1")
    assert b"imported file big.plan has more than 65,536 tokens" in r.stdout


def _chain(tmp_path: Path, n: int) -> None:
    for i in range(n - 1):
        (tmp_path / f"f{i}.plan").write_text(f'import "f{i + 1}.plan"\n')
    (tmp_path / f"f{n - 1}.plan").write_text(PLAN % "")


def test_import_chain_of_1200_files_is_cut_at_the_stated_depth(tmp_path):
    from dslc.front.load import MAX_IMPORT_DEPTH

    _chain(tmp_path, 1200)
    # f0 is depth 1; the import in f63 would open depth 65
    diagnosed(lint("f0.plan", cwd=tmp_path), "E009", f"f{MAX_IMPORT_DEPTH - 1}.plan:1:1")


def test_import_chain_at_the_stated_depth_is_fine(tmp_path):
    from dslc.front.load import MAX_IMPORT_DEPTH

    _chain(tmp_path, MAX_IMPORT_DEPTH)
    r = lint("f0.plan", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize(
    "path, code",
    [
        (r"\x4.plan", "E005"),  # an escape Python does not know
        (r"a\x00.plan", "E005"),  # a NUL byte: no file has this name
        (r"\ud800.plan", "E005"),  # a lone surrogate: not encodable as a path
        ("", "E005"),  # the importing file's own folder
        ("x" * 5000, "E005"),  # longer than any file name
    ],
)
def test_import_paths_that_name_no_file(tmp_path, path, code):
    (tmp_path / "main.plan").write_text(f'// odd path\nimport "{path}"\n')
    diagnosed(lint("main.plan", cwd=tmp_path), code, "main.plan:2:1")


# --------------------------------------------------------------------------
# 2. an imported file that is not a plan: reported, never echoed

NOT_PLANS = {
    "assignment": f"password = {SECRET}\n",
    "ini": f"[default]\naws_secret_access_key = {SECRET}\n",
    "token": f"{SECRET}\n",
    "name": f"token {SECRET}\n",
    "string": f'"{SECRET}"\n',
    "unclosed": f"secret {{ {SECRET}_x = 1\n",
    "binary": f"{SECRET}\0\n",
    "latin1": f"{SECRET} \xe9t\xe9\n".encode("latin-1"),
}


@pytest.mark.parametrize("fmt", ["text", "json", "github", "sarif"])
@pytest.mark.parametrize("kind", sorted(NOT_PLANS))
def test_imported_non_plan_is_reported_without_its_content(tmp_path, kind, fmt):
    home = tmp_path / "home" / ".config"
    home.mkdir(parents=True)
    data = NOT_PLANS[kind]
    (home / "credentials").write_bytes(data if isinstance(data, bytes) else data.encode())
    repo = tmp_path / "repo" / "plans"
    repo.mkdir(parents=True)
    (repo / "main.plan").write_text(
        'import "../../home/.config/credentials"\n'
        f'import "{home / "credentials"}"\n' + PLAN % ""
    )
    r = lint("--format", fmt, "plans/main.plan", cwd=tmp_path / "repo")
    out = (r.stdout + r.stderr).decode(errors="replace")
    assert r.returncode == 1, out
    assert SECRET not in out and "C0FFEE" not in out
    if fmt == "text":
        assert "plans/main.plan:1:1: error[E007]" in out, out
        assert "is not a plan file" in out


def test_imported_plan_errors_are_located_but_not_quoted(tmp_path):
    """An imported file that parses gets its diagnostics at its own lines, but the
    text output quotes only the files named on the command line."""
    (tmp_path / "lib.plan").write_text(f"model m {{ {MODEL}; not_a_key = 1 }}\n")
    (tmp_path / "main.plan").write_text('import "lib.plan"\n' + USES_M)
    r = lint("main.plan", cwd=tmp_path)
    out = r.stdout.decode()
    assert r.returncode == 1 and "lib.plan:1:" in out and "error[E010]" in out
    assert "arch = gpt2" not in out


@pytest.mark.parametrize("command", [("lint",), ("fmt", "--check"), ("fmt", "--diff"), ("fmt",)])
def test_symlinked_root_is_not_echoed(tmp_path, command):
    """`dslc lint plans/` or `dslc fmt --check plans/evil.plan` in CI: a plan in the pull
    request may be a symlink to a secret; dslc shows where its error is, not what it says
    (fmt quotes what lint quotes, and leaves the file as it is; `fmt plans/` reads no file
    linked out of plans/ at all: tests/test_fmt.py)."""
    (tmp_path / "secret").write_text(f"url = https://me:{SECRET}@example.com\n")
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "evil.plan").symlink_to(tmp_path / "secret")
    r = RUN["dslc"](*command, "plans" if command == ("lint",) else "plans/evil.plan", cwd=tmp_path)
    out = (r.stdout + r.stderr).decode()
    assert r.returncode == 1 and "plans/evil.plan:1:" in out, out
    assert SECRET not in out and "Traceback" not in out
    assert (tmp_path / "secret").read_text() == f"url = https://me:{SECRET}@example.com\n"


def test_a_long_line_of_many_errors_is_quoted_in_windows(tmp_path):
    """5,000 unknown keys on one line: each error quotes at most 200 characters around
    its own place (with its caret under it), not the whole line nor an indent as long as
    the line, so the log grows with the errors, not with errors × the line (134 MB)."""
    keys = "; ".join(f"k{i} = 1" for i in range(5000))
    (tmp_path / "many.plan").write_text((PLAN % "").replace("seq_len = 32 }", f"seq_len = 32; {keys} }}"))
    r = lint("many.plan", cwd=tmp_path)
    out = r.stdout.decode()
    lines = out.splitlines()
    assert r.returncode == 1 and out.count("error[E010]") == 5000
    assert len(out) < 5000 * 700 and max(map(len, lines)) < 260, (len(out), max(map(len, lines)))
    i = next(i for i, line in enumerate(lines) if "unknown key 'k4000'" in line)
    quote, caret = lines[i + 1], lines[i + 2]
    at = caret.index("^")
    assert quote[at : at + 5] == "k4000" and caret[at:] == "^^^^^", (quote, caret)


def test_root_syntax_error_still_shows_the_line(tmp_path):
    (tmp_path / "main.plan").write_text("plan p { layers 32 }\n")
    r = lint("main.plan", cwd=tmp_path)
    out = r.stdout.decode()
    assert r.returncode == 1 and "main.plan:1:17: error[E001]" in out
    assert "plan p { layers 32 }" in out


# --------------------------------------------------------------------------
# 3. no raw control characters in any output format

CONTROLS = [c.encode() for c in "\x1b\r\x07\x08\x9b\u202e"]


@pytest.mark.parametrize("fmt", ["text", "json", "github", "sarif"])
def test_control_characters_never_reach_the_terminal(tmp_path, fmt):
    raw = "\x1b[2J\r\x07\x08\u009b\u202e"
    train = (
        '    train { data = tokens("\\x1b[2J\\rok: 1 plan\\x1b[0m") }\n'  # escapes: W083's message
        f'    not_a_key = "{raw}"\n'  # raw: E010's quoted source line
    )
    name = "p\x1b[31m.plan"
    (tmp_path / name).write_text(PLAN % train)
    r = lint("--format", fmt, name, cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    for c in CONTROLS:
        assert c not in r.stdout + r.stderr, (c, r.stdout)
    if fmt == "json":
        codes = {d["code"] for d in json.loads(r.stdout)}
        assert "W083" in codes


@pytest.mark.parametrize("fmt", ["text", "github"])
def test_lone_surrogate_in_a_message_is_escaped(tmp_path, fmt):
    (tmp_path / "main.plan").write_text(PLAN % '    train { data = tokens("\\ud800.bin") }\n')
    r = lint("--format", fmt, "main.plan", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr  # W083 is a warning
    assert b"W083" in r.stdout and b"\\ud800" in r.stdout


def test_lines_end_only_at_newlines(tmp_path):
    """Lark counts lines by '\\n'; the quoted line must be the same line, whatever
    other line breaks (CR, FF, U+2028) the text holds."""
    (tmp_path / "main.plan").write_text("// a\rb\x0cc\u2028d\nplan p { layers 32 }\n")
    r = lint("main.plan", cwd=tmp_path)
    lines = r.stdout.decode().splitlines()
    assert lines[0].startswith("main.plan:2:17: error[E001]")
    assert lines[1].endswith("| plan p { layers 32 }")


# --------------------------------------------------------------------------
# 4. one file is one file, whatever path leads to it


def test_one_file_under_several_paths_is_read_once(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "lib.plan").write_text(
f"model m {{ {MODEL} }}\n")
    (tmp_path / "alias.plan").symlink_to("lib.plan")
    (tmp_path / "main.plan").write_text(
        'import "lib.plan"\n'
        'import "./sub/../lib.plan"\n'
        'import "alias.plan"\n'
        f'import "{tmp_path / "lib.plan"}"\n'
        + USES_M
    )
    r = lint("main.plan", cwd=tmp_path)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()


def test_cycle_through_a_symlink_is_a_cycle(tmp_path):
    (tmp_path / "a.plan").write_text('import "b.plan"\n')
    (tmp_path / "b.plan").write_text('import "link.plan"\n')
    (tmp_path / "link.plan").symlink_to("a.plan")
    diagnosed(lint("a.plan", cwd=tmp_path), "E006", "a.plan:1:1")


def test_a_files_text_given_in_place_of_the_disks_is_that_file_to_its_imports(tmp_path, monkeypatch):
    """An editor's unsaved text (dslc lsp) of a file in a cycle: one cycle, not the disk's copy as a second file (E017)."""
    saved = 'import "b.plan"\nplan p { model = m; cluster = c }\n'
    (tmp_path / "a.plan").write_text(saved)
    (tmp_path / "b.plan").write_text('import "a.plan"\n')
    monkeypatch.chdir(tmp_path)
    unsaved = saved.replace("plan p {", "plan p {\n    // being typed\n")
    codes = sorted({d.code for d in load_text(unsaved, "a.plan").diagnostics})
    assert "E006" in codes and "E017" not in codes, codes
