"""The VS Code extension (editors/vscode/): its manifest names files that exist and a
command dslc has, and its TextMate grammar scopes the example plans as the parser reads
them: every comment and string of plans/*.plan and clusters/*.plan as such, and nothing
else. The grammar's regular expressions are run by Python's ``re`` here (they use only
what it shares with VS Code's Oniguruma), with TextMate's rule: at each place the
pattern that matches first wins, and the earlier pattern of a tie."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dslc.cli import parser

ROOT = Path(__file__).resolve().parent.parent
VSCODE = ROOT / "editors" / "vscode"
MANIFEST = json.loads((VSCODE / "package.json").read_text())
GRAMMAR = json.loads((VSCODE / "syntaxes" / "plan.tmLanguage.json").read_text())
PLANS = sorted((ROOT / "plans").glob("*.plan")) + sorted((ROOT / "clusters").glob("*.plan"))


def test_the_manifest_names_files_that_exist_and_dslcs_command():
    contributes = MANIFEST["contributes"]
    (language,) = contributes["languages"]
    (grammar,) = contributes["grammars"]
    assert (VSCODE / MANIFEST["main"]).is_file()
    assert (VSCODE / grammar["path"]).is_file() and (VSCODE / language["configuration"]).is_file()
    assert language["extensions"] == [".plan"] and grammar["language"] == language["id"]
    assert grammar["scopeName"] == GRAMMAR["scopeName"]
    assert f"onLanguage:{language['id']}" in MANIFEST["activationEvents"]
    assert "vscode-languageclient" in MANIFEST["dependencies"] and MANIFEST["engines"]["vscode"]
    extension = (VSCODE / MANIFEST["main"]).read_text()
    assert 'args: ["lsp"]' in extension and "lsp" in parser()._subparsers._group_actions[0].choices
    assert 'getConfiguration("dslc").get("path")' in extension and "dslc.path" in contributes["configuration"]["properties"]
    config = json.loads((VSCODE / language["configuration"]).read_text())
    for rule in (config["wordPattern"], *config["indentationRules"].values()):
        re.compile(rule)


# -- a TextMate tokenizer, enough for this grammar ------------------------------------------


def rules(patterns: list[dict]) -> list[dict]:
    """The patterns with every include replaced by what it names."""
    out = []
    for p in patterns:
        if "include" in p:
            out += rules([GRAMMAR["repository"][p["include"].removeprefix("#")]])
        elif "match" in p or "begin" in p:
            out.append(p)
        else:
            out += rules(p["patterns"])
    return out


RULES = rules(GRAMMAR["patterns"])


def all_regexes(patterns) -> list[str]:
    found = []
    for p in patterns:
        found += [p[k] for k in ("match", "begin", "end") if k in p]
        found += all_regexes(p.get("patterns", []))
    return found


@pytest.mark.parametrize("regex", all_regexes(GRAMMAR["patterns"]) + all_regexes(GRAMMAR["repository"].values()))
def test_every_regex_compiles(regex):
    re.compile(regex)


def first(patterns: list[dict], line: str, pos: int, key: str = "match"):
    """The pattern that matches earliest at or after ``pos`` (the earlier of a tie)."""
    best = None
    for p in patterns:
        m = re.compile(p.get(key) or p["begin"]).search(line, pos)
        if m and (best is None or m.start() < best[1].start()):
            best = (p, m)
    return best


def scopes(line: str) -> list[list[str]]:
    """The scopes of each character of ``line``."""
    out: list[list[str]] = [[] for _ in line]

    def mark(name, start, end):
        for i in range(start, end):
            out[i].append(name)

    def captures(p, m, key="captures"):
        for group, c in p.get(key, {}).items():
            if m.group(int(group)) is not None:
                mark(c["name"], m.start(int(group)), m.end(int(group)))

    pos = 0
    while pos < len(line) and (found := first(RULES, line, pos)):
        p, m = found
        if "match" in p:
            mark(p.get("name"), m.start(), m.end()) if p.get("name") else None
            captures(p, m)
            pos = max(m.end(), m.start() + 1)
            continue
        captures(p, m, "beginCaptures")
        inside, end = m.end(), None
        while end is None:  # the end pattern wins a tie with the patterns inside
            e = re.compile(p["end"]).search(line, inside)
            inner = first(rules(p.get("patterns", [])), line, inside)
            if inner and inner[1].start() < e.start():
                captures(inner[0], inner[1])
                mark(inner[0]["name"], inner[1].start(), inner[1].end())
                inside = max(inner[1].end(), inner[1].start() + 1)
            else:
                end = e
        captures(p, end, "endCaptures")
        mark(p["name"], m.start(), end.end())
        pos = max(end.end(), m.start() + 1)
    return out


def lark_terminal(name: str) -> re.Pattern:
    """A terminal's regular expression, as grammar/plan.lark writes it."""
    text = (ROOT / "grammar" / "plan.lark").read_text()
    return re.compile(re.search(rf"^{name}(?:\.\d+)?: /(.*)/$", text, re.MULTILINE).group(1))


def parser_view(line: str) -> list[str | None]:
    """Each character as the parser's lexer sees it: "string", "comment" or None."""
    string, comment = lark_terminal("STRING"), lark_terminal("COMMENT")
    out: list[str | None] = [None] * len(line)
    pos = 0
    while pos < len(line):
        for kind, rx in (("string", string), ("comment", comment)):
            if m := rx.match(line, pos):
                out[m.start():m.end()] = [kind] * (m.end() - m.start())
                pos = m.end()
                break
        else:
            pos += 1
    return out


@pytest.mark.parametrize("path", PLANS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_comments_and_strings_are_scoped_as_the_parser_reads_them(path):
    seen = 0
    for n, line in enumerate(path.read_text().split("\n"), start=1):
        got = scopes(line)
        for i, kind in enumerate(parser_view(line)):
            scoped = {s.split(".")[0] for s in got[i]} & {"string", "comment"}
            assert scoped == ({kind} if kind else set()), f"{path.name}:{n}:{i + 1}: {line!r}: {got[i]}"
            seen += kind is not None
    assert seen  # every example has a comment or a string


def scope_of(line: str, word: str, nth: int = 0) -> list[str]:
    starts = [m.start() for m in re.finditer(re.escape(word), line)]
    return scopes(line)[starts[nth]]


@pytest.mark.parametrize("line, word, scope", [
    ('import "../clusters/h100.plan"  // the cluster', "import", "keyword.control.import.dslc-plan"),
    ("cluster h100_8x8 {", "cluster", "storage.type.block.dslc-plan"),
    ("cluster h100_8x8 {", "h100_8x8", "entity.name.type.dslc-plan"),
    ("    train { optimizer adamw { lr = 3e-4 } }", "optimizer", "storage.type.block.dslc-plan"),
    ("    train { optimizer adamw { lr = 3e-4 } }", "adamw", "entity.name.type.dslc-plan"),
    ("    train { optimizer adamw { lr = 3e-4 } }", "lr", "variable.other.property.dslc-plan"),
    ("    train { optimizer adamw { lr = 3e-4 } }", "3e-4", "constant.numeric.dslc-plan"),
    ("        tp = 8 on nvlink", "tp", "variable.other.property.dslc-plan"),
    ("        tp = 8 on nvlink", "8", "constant.numeric.dslc-plan"),
    ("        tp = 8 on nvlink", "on", "keyword.other.on.dslc-plan"),
    ("        tp = 8 on nvlink", "nvlink", "variable.other.constant.link.dslc-plan"),
    ("    link ib { bandwidth = 400 Gb/s; latency = 8 us }", "400", "constant.numeric.dslc-plan"),
    ("    link ib { bandwidth = 400 Gb/s; latency = 8 us }", "Gb/s", "keyword.other.unit.dslc-plan"),
    ("    link ib { bandwidth = 400 Gb/s; latency = 8 us }", "us", "keyword.other.unit.dslc-plan"),
    ("    recompute = full every 2", "every", "keyword.other.every.dslc-plan"),
    ("    checkpoint { every = 200 }", "every", "variable.other.property.dslc-plan"),
    ("    tensor_parallel { sequence_parallel = true }", "true", "constant.language.boolean.dslc-plan"),
    ('    data = tokens("a.bin", dtype = uint32)', "tokens", "support.function.dslc-plan"),
    ('    dir = "a\\"b"  # done', '\\"', "constant.character.escape.dslc-plan"),
    ('    zero = 1  # a "quote" // in a comment', "quote", "comment.line.number-sign.dslc-plan"),
    ('    dir = "ckpt//x#1"', "x#1", "string.quoted.double.dslc-plan"),
])
def test_a_line_is_scoped_as_a_reader_expects(line, word, scope):
    assert scope in scope_of(line, word)


@pytest.mark.parametrize("line, word", [("    schedule = 1f1b", "1f1b"), ("    precision = bf16", "16"), ("    device = h100_sxm", "100")])
def test_names_with_digits_are_not_numbers(line, word):
    assert not any(s.startswith("constant.numeric") for s in scope_of(line, word))
