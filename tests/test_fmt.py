"""``dslc fmt``: the repository's plans are formatted; formatting any plan (the example
plans laid out at random, plans of random blocks, values and comments, and fuzzed text)
is idempotent, keeps every comment, lowers to the same IR, and never raises anything but
a FormatError; the command checks, diffs and rewrites files as it says."""

from __future__ import annotations

import dataclasses
import functools
import os
import stat
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lark import Lark

from dslc.cli import main
from dslc.driver import load_text
from dslc.front import ast
from dslc.front.fmt import MAX_DEPTH, FormatError, format_text, number_text
from dslc.front.parse import _grammar_text, parse
from dslc.front.textedit import quote
from dslc.source import Span

ROOT = Path(__file__).resolve().parents[1]
FORMATTED = ["plans", "clusters", "benchmarks/published"]
EXAMPLES = sorted(p for d in FORMATTED for p in (ROOT / d).glob("*.plan"))
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_the_repositorys_plans_are_formatted(capsys):
    assert main(["fmt", "--check", *(str(ROOT / d) for d in FORMATTED)]) == 0, capsys.readouterr().err


# --------------------------------------------------------------------------
# the properties, on any text


@functools.cache
def lexer_parser():
    """The grammar's own parser, with a hand on every comment it lexes (fmt finds them its own way)."""
    return Lark(_grammar_text(), parser="lalr", lexer_callbacks={"COMMENT": lambda tok: SEEN.append(str(tok).rstrip())})


SEEN: list[str] = []


def comments(text: str) -> list[str]:
    SEEN.clear()
    lexer_parser().parse(text)
    return list(SEEN)


def stripped(x):
    """An IR or a diagnostic without its spans (the formatted file moves them)."""
    if isinstance(x, Span):
        return None
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__name__,) + tuple(stripped(getattr(x, f.name)) for f in dataclasses.fields(x))
    if isinstance(x, (list, tuple)):
        return tuple(stripped(v) for v in x)
    if isinstance(x, dict):
        return tuple((k, stripped(v)) for k, v in x.items())
    return x


def meaning(text: str, file: str):
    result = load_text(text, file, check=False)
    return stripped(result.program.plans), [(d.code, d.message) for d in result.diagnostics]


def holds(text: str, file: str) -> str | None:
    """The formatted text when ``text`` formats, after checking the properties; None when it does not parse."""
    try:
        out = format_text(text, file)
    except FormatError as e:
        assert parse(text, file)[0] is None or "deep" in str(e), f"a plan that parses was not formatted: {e}"
        return None
    assert format_text(out, file) == out, "fmt of formatted text changed it"
    assert comments(out) == comments(text)
    assert meaning(out, file) == meaning(text, file)
    assert not any(line != line.rstrip() for line in out.splitlines()), "trailing spaces"
    return out


# --------------------------------------------------------------------------
# the example plans, laid out at random

GAPS = st.sampled_from([" ", "  ", "\t", "\n", "\n\n", "\n  \n\t", " \n    "])
SEPARATORS = st.sampled_from(["; ", ";", "\n", "\n\n", " ;\n", "\n   ", ";;\n", "  ;  "])
NOTES = st.sampled_from(["// a note", "# hash {", '// "quoted" // twice', "//", "// µs ünïcode → 2 us", "#{}", "// x = 1; y { }"])


def respelled(draw, v) -> str:
    if isinstance(v, ast.Number):
        if isinstance(v.value, float):
            return draw(st.sampled_from([v.text, v.text.upper(), repr(v.value)]))
        return draw(st.sampled_from([v.text, f"{v.value:_}", f"+{v.value}" if v.value >= 0 else v.text]))
    if isinstance(v, ast.Quantity):
        unit = "µs" if v.unit == "us" and draw(st.booleans()) else v.unit
        number = v.value if isinstance(v.value, int) else repr(v.value)
        return f"{number}{draw(st.sampled_from(['', ' ', '  ', chr(9)]))}{unit}"
    if isinstance(v, ast.String):
        return quote(v.value)
    if isinstance(v, ast.Bool):
        return "true" if v.value else "false"
    if isinstance(v, ast.Ident):
        return v.name
    if isinstance(v, ast.Call):
        args = [respelled(draw, a) for a in v.args] + [f"{k.key}{draw(GAPS)}={draw(GAPS)}{respelled(draw, k.value)}" for k in v.keywords]
        return f"{v.name}({(',' + draw(GAPS)).join(args)})"
    if isinstance(v, ast.Tuple):
        return "(" + ("," + draw(GAPS)).join(respelled(draw, x) for x in v.items) + ")"
    if isinstance(v, ast.List):
        return "[" + draw(GAPS) + ("," + draw(GAPS)).join(respelled(draw, x) for x in v.items) + "]"
    return f"{v.name} every {respelled(draw, v.count)}"


def laid_out(draw, stmts, depth: int) -> str:
    parts = []
    for s in stmts:
        if draw(st.integers(0, 5)) == 0:
            parts.append("\n" + draw(NOTES) + "\n")
        if isinstance(s, ast.Import):
            parts.append(f'import "{s.path}"')
        elif isinstance(s, ast.Assign):
            parts.append(f"{s.key}{draw(GAPS)}={draw(st.sampled_from([' ', '', chr(9)]))}{respelled(draw, s.value)}")
        elif isinstance(s, ast.Axis):
            parts.append(f"{s.name} = {respelled(draw, s.size)}{draw(GAPS)}on {s.link}")
        else:
            head = s.kind if s.name is None else f"{s.kind}{draw(GAPS)}{s.name}"
            parts.append(f"{head}{draw(GAPS)}{{{draw(GAPS)}{laid_out(draw, s.body, depth + 1)}{draw(GAPS)}}}")
        if draw(st.integers(0, 4)) == 0:
            parts.append(" " + draw(NOTES) + "\n")
        parts.append(draw(SEPARATORS) if depth else "\n" + draw(st.sampled_from(["", "\n", ";\n"])))
    return "".join(parts)


@SETTINGS
@given(st.data(), st.sampled_from(EXAMPLES))
def test_an_example_plan_laid_out_at_random_formats_to_the_same_plan(data, path):
    tree, _ = parse(path.read_text(), str(path))
    text = laid_out(data.draw, tree.items, 0)
    out = holds(text, str(path))
    assert out is not None, text
    assert meaning(out, str(path)) == meaning(path.read_text(), str(path))


# --------------------------------------------------------------------------
# plans of random blocks, values and comments

NAMES = st.sampled_from(["plan", "model", "train", "mesh", "x", "link", "cluster", "optimizer", "a_1", "every", "on_off", "lr"])
ATOMS = st.one_of(
    st.sampled_from(["0", "-3", "1_000", ".5", "5.", "1.5E+9", "2e-05", "+7", "3e0", "0.0", "450GB/s", "2 us", "2µs", "80 GiB", "1.5e3 TFLOP/s",
                     "true", "false", "bf16", "1f1b", "zb_h1", '""', '"a\\"b"', '"// not a comment"', '"# nor this {"', "full every 2"]),
)
VALUES = st.recursive(ATOMS, lambda inner: st.one_of(
    st.lists(inner, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
    st.lists(inner, min_size=2, max_size=3).map(lambda xs: "(" + ",".join(xs) + ")"),
    st.tuples(NAMES, st.lists(inner, max_size=2), st.lists(st.tuples(NAMES, inner), max_size=2)).map(
        lambda t: f"{t[0]}({', '.join(t[1] + [f'{k}={v}' for k, v in t[2]])})"),
), max_leaves=6)
STATEMENTS = st.recursive(
    st.one_of(st.tuples(NAMES, VALUES).map(lambda t: f"{t[0]} = {t[1]}"),
              st.tuples(NAMES, st.sampled_from(["1", "16", "2"]), NAMES).map(lambda t: f"{t[0]} = {t[1]} on {t[2]}"),
              NOTES.map(lambda n: "\n" + n + "\n")),
    lambda inner: st.tuples(NAMES, st.sampled_from(["", " b", " x_2"]), st.lists(st.tuples(inner, SEPARATORS), max_size=4)).map(
        lambda t: f"{t[0]}{t[1]} {{" + "".join(s + sep for s, sep in t[2]) + "}"),
    max_leaves=12,
)


@SETTINGS
@given(st.lists(st.tuples(STATEMENTS.filter(lambda s: s.endswith("}")), GAPS, st.one_of(st.just(""), NOTES.map(lambda n: " " + n + "\n"))), max_size=4))
def test_a_random_plan_formats_idempotently_keeping_its_comments_and_meaning(items):
    holds("".join(s + gap + note for s, gap, note in items), "random.plan")


@SETTINGS
@given(st.data(), st.sampled_from(EXAMPLES))
def test_fuzzed_plan_text_formats_or_says_why_and_never_raises_anything_else(data, path):
    text = path.read_text()
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(text)))
        insert = data.draw(st.sampled_from(["", "\n", " ", "}", "{", ";", "//", "# c\n", '"', "= 1", "[", "(", "\r\n", "\t", "µ"]))
        cut = data.draw(st.integers(0, 3))
        text = text[:i] + insert + text[i + cut:]
    holds(text, str(path))


# --------------------------------------------------------------------------
# the layout itself

def test_the_layout_aligns_axes_blocks_and_comments_and_keeps_the_authors_lines():
    text = """// a plan
plan p{model=m;cluster=c
mesh {
  dp=16 on ib // outer
  tp = 8  on nvlink       // inner
    // under the inner one, on its own line
}
tensor_parallel{sequence_parallel=true}
data_parallel { zero=1 }
train { lr_list = [1,2,
  // inside a value
  3] ; steps=1_000 ; t = 2µs ; b = 450GB/s; e = 1.5E+09; h=.5
optimizer adamw {lr=3e-4}}
empty {
}
}
"""
    assert format_text(text, "p.plan") == """// a plan
plan p {
    model = m; cluster = c
    mesh {
        dp = 16 on ib      // outer
        tp = 8  on nvlink  // inner
        // under the inner one, on its own line
    }
    tensor_parallel { sequence_parallel = true }
    data_parallel   { zero = 1 }
    train {
        // inside a value
        lr_list = [1, 2, 3]; steps = 1_000; t = 2 us; b = 450 GB/s; e = 1.5e9; h = 0.5
        optimizer adamw { lr = 3e-4 }
    }
    empty {}
}
"""


@pytest.mark.parametrize("written, formatted", [
    ("1", "1"), ("+1", "1"), ("-0.5", "-0.5"), (".5", "0.5"), ("5.", "5.0"), ("1E+9", "1e9"), ("1.5e-04", "1.5e-4"),
    ("1_000_000", "1_000_000"), ("3e0", "3e0"), ("2E-00", "2e0"),
])
def test_numbers_are_spelled_one_way(written, formatted):
    assert number_text(written) == formatted
    assert float(written.replace("_", "")) == float(formatted.replace("_", ""))


def test_a_file_nested_past_the_limit_is_left_as_it_is():
    text = "plan p { x = " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + " }\n"
    with pytest.raises(FormatError, match="deep"):
        format_text(text, "deep.plan")


def test_windows_newlines_stay_windows_newlines():
    out = format_text("plan p {\r\n  x=1 // c\r\n}\r\n", "p.plan")
    assert out == "plan p {\r\n    x = 1  // c\r\n}\r\n"


@pytest.mark.parametrize("kind", ["comments", "blocks", "axes"])
def test_one_long_line_does_not_pad_every_line_after_it(kind):
    """Issue 50: a 4,000-character import before 5,000 commented imports (134 KB) became
    19.1 MiB, each line padded to the long one's width. A line more than ALIGN_SPREAD
    wider than its neighbours starts a column of its own; the rest still align."""
    long = "a" * 4000
    if kind == "comments":
        text = f'import "{long}.plan"  // the long one\n' + "".join(f'import "c{i}.plan"  // c\n' for i in range(5000))
    elif kind == "blocks":
        text = "cluster c {\n" + f"    link {long} {{ scope = node }}\n" + "".join(f"    link l{i} {{ scope = node }}\n" for i in range(2000)) + "}\n"
    else:
        text = "plan p {\n    mesh {\n" + f"        {long} = 1 on ib\n" + "".join(f"        dp = {i} on ib\n" for i in range(2000)) + "    }\n}\n"
    out = format_text(text, "p.plan")
    assert len(out) < 1.2 * len(text) and format_text(out, "p.plan") == out
    first, marker = {"comments": (1, "//"), "blocks": (2, "{"), "axes": (3, " on ")}[kind]
    short = out.splitlines()[first : first + 12]  # the 0th to the 11th short line: 1 and 2 digits
    assert len({line.index(marker) for line in short}) == 1, short  # still aligned among themselves


def test_a_text_longer_than_a_plan_given_or_formatted_is_e008(monkeypatch):
    """The bound lint holds plans to (4 MiB): a longer text (an editor's) is not formatted,
    and neither is one that formatting would make longer (made small here: 600 bytes)."""
    with pytest.raises(FormatError) as e:
        format_text("// x\n" * (1 << 20), "big.plan")
    assert e.value.diagnostic.code == "E008" and "5.0 MiB; a plan file may be at most 4 MiB" in str(e.value)
    import dslc.front.fmt as fmt

    monkeypatch.setattr(fmt, "MAX_BYTES", 600)
    text = "plan p {\n    " + "k" * 30 + "=1//\n" + "    a=1//\n" * 50 + "}\n"
    assert len(text) < 600
    with pytest.raises(FormatError) as e:
        format_text(text, "p.plan")
    assert e.value.diagnostic.code == "E008" and "formatted, the file is 0.0 MiB; a plan file may be at most" in str(e.value)


# --------------------------------------------------------------------------
# the command


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "clean.plan").write_text("plan a {\n    x = 1\n}\n")
    (tmp_path / "messy.plan").write_text("plan b{x=1}\n")
    (tmp_path / "broken.plan").write_text("plan c { x 1 }\n")
    return tmp_path


def test_check_names_the_files_that_would_change_and_writes_nothing(folder, capsys):
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert main(["fmt", "--check", str(folder / "clean.plan"), str(folder / "messy.plan")]) == 1
    err = capsys.readouterr().err
    assert f"would reformat {folder / 'messy.plan'}" in err and "clean.plan" not in err.replace("1 file already", "")
    assert main(["fmt", "--diff", str(folder)]) == 1  # the broken file
    out, err = capsys.readouterr()
    assert "-plan b{x=1}\n+plan b { x = 1 }\n" in out and "broken.plan:1:12: error[E001]" in err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert main(["fmt", "--check", str(folder / "clean.plan")]) == 0


def test_fmt_rewrites_in_place_through_links_with_the_files_mode_and_leaves_a_broken_file(folder, capsys):
    messy = folder / "messy.plan"
    os.chmod(messy, 0o640)
    link = folder / "link.plan"
    link.symlink_to(messy)
    broken = (folder / "broken.plan").read_bytes()
    assert main(["fmt", str(link), str(folder / "broken.plan")]) == 1
    assert link.is_symlink() and messy.read_text() == "plan b { x = 1 }\n"
    assert stat.S_IMODE(messy.stat().st_mode) == 0o640
    assert (folder / "broken.plan").read_bytes() == broken
    assert sorted(p.name for p in folder.iterdir()) == ["broken.plan", "clean.plan", "link.plan", "messy.plan"]  # no temporary left
    assert "reformatted" in capsys.readouterr().err


def test_fmt_of_a_folder_rewrites_no_file_outside_it_through_a_link(tmp_path, capsys):
    """Issue 50 item 9: `dslc fmt DIR` rewrote the file a link inside DIR leads to outside
    it (a pull request's folder may hold a link to any file the CI user can write), and
    `--diff` printed it whole. It is refused in one line (exit 2), never read, the other
    files formatted; a link to a file inside DIR, or a link named on the command line, is
    still followed."""
    folder, outside = tmp_path / "plans", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    (outside / "victim.plan").write_text("plan v{x=1} // secret\n")
    (folder / "out.plan").symlink_to("../outside/victim.plan")
    (folder / "mine.plan").write_text("plan m{x=1}\n")
    (folder / "to_mine.plan").symlink_to("mine.plan")
    (folder / "sub").symlink_to(outside, target_is_directory=True)  # a folder out: no walk through it
    assert main(["fmt", str(folder)]) == 2
    err = capsys.readouterr().err
    assert (outside / "victim.plan").read_text() == "plan v{x=1} // secret\n"
    assert f"dslc: error: {folder / 'out.plan'} is a symbolic link out of {folder}: not read" in err
    assert (folder / "mine.plan").read_text() == "plan m { x = 1 }\n" and (folder / "to_mine.plan").is_symlink()
    for flag in ("--check", "--diff"):
        assert main(["fmt", flag, str(folder)]) == 2  # nothing outside read, shown or written
        out, err = capsys.readouterr()
        assert "secret" not in out + err and "not read" in err
    assert main(["fmt", str(folder / "out.plan")]) == 0  # named: the file it leads to
    assert (outside / "victim.plan").read_text() == "plan v { x = 1 }  // secret\n"


def test_standard_input_goes_to_standard_output(monkeypatch, capsys):
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"plan b{x=1}\n")))
    assert main(["fmt", "-"]) == 0
    assert capsys.readouterr().out == "plan b { x = 1 }\n"


def test_bad_inputs_are_one_line(folder, capsys):
    assert main(["fmt", str(folder / "missing.plan")]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    (folder / "bin.plan").write_bytes(b"plan \0")
    assert main(["fmt", "--check", str(folder / "bin.plan")]) == 1
    assert "E004" in capsys.readouterr().err


def test_a_file_over_4_mib_is_e008_as_lint_says(tmp_path, capsys):
    """The reader returns no byte of a file past the bound: fmt said "already formatted",
    exit 0, where lint says E008."""
    with open(tmp_path / "big.plan", "wb") as f:
        f.truncate(5 << 20)  # sparse
    for args in (["--check"], ["--diff"], []):
        assert main(["fmt", *args, str(tmp_path / "big.plan")]) == 1
        err = capsys.readouterr().err
        assert "big.plan:1:1: error[E008]: file is 5.0 MiB; a plan file may be at most 4 MiB" in err and "already formatted" not in err
    assert (tmp_path / "big.plan").stat().st_size == 5 << 20


def test_the_pre_commit_hooks_run_fmt_on_plan_files():
    hooks = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    assert hooks["dslc-fmt"]["entry"] == "dslc fmt" and hooks["dslc-fmt-check"]["entry"] == "dslc fmt --check"
    assert all(h["files"] == r"\.plan$" and h["language"] == "python" for h in hooks.values())
    assert hooks["dslc-lint"]["entry"] == "dslc lint --strict"
