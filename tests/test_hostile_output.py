"""Issue 10: what ``dslc compile`` writes, for plans, file names and output folders an
attacker chose. The generated files must never run code the plan's author put in a
name, and a compile writes only the files dslc owns."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dslc import codegen
from dslc.cli import main
from dslc.driver import load_paths

PLAN = """
cluster one {{
    nodes = 1
    gpus_per_node = 1
    device = cpu
    link shm {{ scope = node; bandwidth = 10 GB/s; latency = 10 us }}
}}
model m {{ arch = gpt2; layers = 1; hidden = 32; heads = 2; vocab = 256; seq_len = 8 }}
plan {name} {{
    model = m
    cluster = one
    train {{ steps = 1; micro_batch = 1; global_batch = 1; data = {data} }}
}}
"""

# PEP 263: a comment on line 1 or 2 that says "coding: raw_unicode_escape" makes
# Python decode \u000a as a line break, so the code between two of them runs.
# Python reads line 1 before it knows the encoding, so the payload runs from line 2 (the
# regenerate command, shell-quoted: the payload has no quote for shlex to change).
PAYLOAD = "import os; os.mkdir(os.environ[chr(72)+chr(79)+chr(77)+chr(69)]+chr(47)+chr(112))"
CODING = f"p coding:raw_unicode_escape \\u000a{PAYLOAD}\\u000a#"


def _plan(folder: Path, stem: str, name: str = "p", data: str = "synthetic") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}.plan"
    path.write_text(PLAN.format(name=name, data=data), encoding="utf-8")
    return path


def _run_help(script: Path, home: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HOME=str(home), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run(
        [sys.executable, str(script), "--help"], cwd=home, env=env,
        capture_output=True, text=True, timeout=120, check=False,
    )


def _tree(root: Path, skip: Path) -> dict[str, bytes]:
    """Every file under ``root`` (outside ``skip``) with its content."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == skip or skip in Path(dirpath).parents:
            dirnames[:] = []
            continue
        out[dirpath] = b"<dir>"
        for f in filenames:
            p = Path(dirpath, f)
            out[str(p)] = p.read_bytes()
    return out


@pytest.mark.parametrize("where", ["file", "folder", "output"])
def test_a_name_cannot_declare_the_scripts_encoding(tmp_path, where):
    """Finding 1: the payload in a file, folder or -o name stays a comment when the
    script runs (it did run on ba52072: the name reached line 1 of train.py)."""
    home = tmp_path / "home"
    home.mkdir()
    folder = tmp_path / (CODING if where == "folder" else "plans")
    plan = _plan(folder, CODING if where == "file" else "x")
    out = tmp_path / (CODING if where == "output" else "gen")
    assert main(["compile", str(plan), "-o", str(out)]) == 0
    result = _run_help(out / "p" / "train.py", home)
    assert not (home / "p").exists()
    assert result.returncode == 0, result.stderr
    for script in (out / "p" / "train.py", out / "p" / "launch.sh"):
        head = script.read_text(encoding="utf-8").splitlines()[:2]
        assert "coding" not in "".join(head), head


def test_comments_are_ascii_without_control_characters(tmp_path):
    folder = tmp_path / "pläne\tx"
    plan = _plan(folder, "naïve\u2028name")
    assert main(["compile", str(plan), "-o", str(tmp_path / "gen")]) == 0
    for f in ("train.py", "launch.sh"):
        text = (tmp_path / "gen" / "p" / f).read_text(encoding="utf-8")
        for line in text.splitlines():
            if line.lstrip().startswith("#"):
                assert line.isascii() and line.isprintable(), line


def test_a_recompile_keeps_what_dslc_did_not_write(tmp_path):
    """Finding 2: checkpoints and notes in generated/<plan>/ survive a recompile."""
    plan = _plan(tmp_path / "plans", "x")
    out = tmp_path / "gen"
    assert main(["compile", str(plan), "-o", str(out)]) == 0
    kept = {out / "p" / "ckpt" / "step_10.pt": b"weights", out / "p" / "notes.md": b"mine"}
    for path, data in kept.items():
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
    (out / "p" / "train.py").write_text("# edited\n")
    assert main(["compile", str(plan), "-o", str(out)]) == 0
    for path, data in kept.items():
        assert path.read_bytes() == data
    assert (out / "p" / "train.py").read_text().startswith("# @generated")
    written = codegen.render(load_paths([plan]).program.plans[0], out)
    assert sorted(p.name for p in (out / "p").iterdir()) == sorted(["ckpt", "notes.md", *written])


def test_an_output_folder_holding_plans_is_refused(tmp_path, capsys):
    """Finding 2: `dslc compile plans/x.plan -o plans` deleted the imports in plans/x/."""
    plans = tmp_path / "plans"
    shared = plans / "p" / "shared.plan"
    shared.parent.mkdir(parents=True)
    shared.write_text("// imported by x.plan\n")
    plan = plans / "x.plan"
    plan.write_text('import "p/shared.plan"\n' + PLAN.format(name="p", data="synthetic"))
    before = _tree(tmp_path, skip=tmp_path / "nothing")
    assert main(["compile", str(plan), "-o", str(plans)]) == 2
    err = capsys.readouterr().err
    assert "plan" in err and err.count("\n") == 1, err
    assert _tree(tmp_path, skip=tmp_path / "nothing") == before


def test_a_linked_output_folder_is_refused(tmp_path, capsys):
    """A pull request can commit generated/p as a link to a folder elsewhere."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "gen").mkdir()
    (tmp_path / "gen" / "p").symlink_to(elsewhere)
    plan = _plan(tmp_path / "plans", "x")
    assert main(["compile", str(plan), "-o", str(tmp_path / "gen")]) == 2
    assert list(elsewhere.iterdir()) == []
    assert "link" in capsys.readouterr().err


def test_a_file_that_was_a_link_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    plan = _plan(tmp_path / "plans", "x")
    out = tmp_path / "gen"
    (out / "p").mkdir(parents=True)
    (out / "p" / "train.py").symlink_to(victim)
    assert main(["compile", str(plan), "-o", str(out)]) == 0
    assert victim.read_text() == "precious"
    assert not (out / "p" / "train.py").is_symlink()


def test_a_stale_schedule_sidecar_is_removed_only_when_dslc_wrote_it(tmp_path, golden_plans):
    """A plan that no longer pipelines drops its schedule.json; a user's file of that
    name (not one dslc wrote) stays."""
    out = tmp_path / "gen"
    piped = golden_plans["gpt2pp_pp2_1f1b"]
    codegen.write(piped, out)
    sidecar = out / piped.name / "schedule.json"
    assert sidecar.exists()
    serial = golden_plans["gpt2_serial"]
    target = out / serial.name
    target.mkdir()
    (target / "schedule.json").write_text(sidecar.read_text().replace(piped.name, serial.name))
    codegen.write(serial, out)
    assert not (target / "schedule.json").exists()
    (target / "schedule.json").write_text('{"mine": true}')
    codegen.write(serial, out)
    assert (target / "schedule.json").read_text() == '{"mine": true}'


def test_two_files_defining_one_plan_name_are_refused(tmp_path, capsys):
    """Finding 8: both compiled to gen/p/, so `--check` found one of them stale forever."""
    a = _plan(tmp_path / "plans", "a")
    b = _plan(tmp_path / "plans", "b")
    assert main(["compile", str(a), str(b), "-o", str(tmp_path / "gen")]) == 1
    err = capsys.readouterr().err
    assert "E017" in err and "b.plan" in err and "a.plan" in err
    assert not (tmp_path / "gen").exists()


def test_a_long_plan_name_compiles(tmp_path):
    """Finding 8: a 250-character name failed with "File name too long" (the temporary
    folder's name added to it)."""
    name = "p" * 250
    plan = _plan(tmp_path / "plans", "x", name=name)
    assert main(["compile", str(plan), "-o", str(tmp_path / "gen")]) == 0
    assert (tmp_path / "gen" / name / "train.py").exists()


_NAME = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"), min_size=1, max_size=40
).filter(lambda s: s not in (".", ".."))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stem=_NAME, folder=_NAME, output=_NAME, data=_NAME, imported=_NAME)
def test_hostile_names_compile_to_scripts_that_only_start(
    tmp_path_factory, run_script, stem, folder, output, data, imported
):
    """The fuzz test of issue 10: any file, folder, output, import and data-file name
    compiles (or is refused with a message), and ``python train.py --help`` of what was
    written changes nothing outside the output folder. (The script runs in a child of
    run_script's fork server, torch imported: the names reach the script's own code the
    same way; the real interpreter reads them in the encoding test above.)"""
    sandbox = tmp_path_factory.mktemp("fuzz")
    home = sandbox / "home"
    home.mkdir()
    try:
        plan = _plan(sandbox / folder, stem, data=f'text("{_escape(data)}")')
        (plan.parent / imported).write_text("// definitions shared by plans\n")
        plan.write_text(f'import "{_escape(imported)}"\n' + plan.read_text())
    except OSError:  # a name the file system refuses (too long in bytes)
        return
    out = sandbox / "out" / output
    before = _tree(sandbox, skip=out.parent)
    code = main(["compile", str(plan), "-o", str(out)])
    event(f"dslc compile exits {code}")
    assert code in (0, 1, 2)
    if code == 0:
        result = run_script(out / "p" / "train.py", 1, "--help", cwd=home, env={"HOME": str(home)}, timeout=120)
        assert result.returncode == 0, result.stderr
    assert _tree(sandbox, skip=out.parent) == before


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


# -- data files at lint time (finding 5) -------------------------------------------------


def _lint(plan: Path, capsys) -> tuple[int, str]:
    code = main(["lint", str(plan)])
    return code, capsys.readouterr().out


def test_lint_refuses_token_ids_past_the_vocab(tmp_path, capsys):
    """On ba52072 lint passed this plan and the serial script failed with an IndexError."""
    import numpy as np

    ids = np.arange(64, dtype="<u2")
    ids[40] = 300
    (tmp_path / "plans").mkdir()
    ids.tofile(tmp_path / "plans" / "ids.bin")
    plan = _plan(tmp_path / "plans", "x", data='tokens("ids.bin")')
    code, out = _lint(plan, capsys)
    assert code == 1 and "E084" in out and "token id 300, not below vocab = 256" in out
    assert f"{plan}:" in out  # at the data key's line
    ids[40] = 255
    ids.tofile(tmp_path / "plans" / "ids.bin")
    assert _lint(plan, capsys)[0] == 0


@pytest.mark.parametrize("size", [7, 15])
def test_lint_refuses_a_data_file_the_script_cannot_read(tmp_path, capsys, size):
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "ids.bin").write_bytes(bytes(size))  # odd, or < seq_len + 1 ids
    plan = _plan(tmp_path / "plans", "x", data='tokens("ids.bin")')
    code, out = _lint(plan, capsys)
    assert code == 1 and "E085" in out and f"has {size} bytes" in out


def test_lint_does_not_open_a_fifo_named_as_data(tmp_path, capsys):
    (tmp_path / "plans").mkdir()
    os.mkfifo(tmp_path / "plans" / "ids.bin")
    plan = _plan(tmp_path / "plans", "x", data='tokens("ids.bin")')
    code, out = _lint(plan, capsys)
    assert code == 1 and "E085" in out and "not a regular file" in out


def test_lint_refuses_a_vocab_the_data_cannot_match(tmp_path, capsys):
    """This passed lint and was refused by compile ("cannot be compiled yet")."""
    plan = _plan(tmp_path / "plans", "x", data='text("t.txt")')
    plan.write_text(plan.read_text().replace("vocab = 256", "vocab = 200"))
    code, out = _lint(plan, capsys)
    assert code == 1 and "E084" in out and "byte-level (ids 0–255) but vocab = 200" in out


def test_every_diagnostic_is_escaped_where_it_is_made():
    """explain printed diagnostics' messages raw: escaping lives in Diagnostic itself now,
    so no renderer can forget it."""
    from dslc.diagnostics import warning

    d = warning("W083", None, "data file a\x1b[2Kb\rc not found", "hint\u202e")
    assert d.message == "data file a\\x1b[2Kb\\x0dc not found" and d.hint == "hint\\u202e"
