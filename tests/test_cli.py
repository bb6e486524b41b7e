"""The CLI as a user meets it: exit codes, output formats, bad input."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dslc.cli import main
from dslc.driver import load_text

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "cases"
BAD = CASES / "many_errors_one_run.plan"


def run(*args: str, stdin: bytes | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dslc", *args], input=stdin, capture_output=True, cwd=cwd, timeout=120)


def test_example_plans_lint_clean():
    r = run("lint", "plans", "clusters")
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()
    assert r.stdout == b""


def test_text_format_shows_line_caret_and_help(capsys):
    assert main(["lint", str(CASES / "unknown_key.plan")]) == 1
    out = capsys.readouterr().out
    rel = CASES / "unknown_key.plan"
    lines = out.splitlines()
    head = lines.index(f"{rel}:10:30: error[E010]: unknown key 'hiden' in model 'gpt2'")
    source, caret = lines[head + 1], lines[head + 2]
    assert source.endswith("    model gpt2 { layers = 2; hiden = 64; heads = 4; vocab = 256; seq_len = 32 }")
    assert caret.index("^") == source.index("hiden") and caret.count("^") == len("hiden")
    assert "help: did you mean 'hidden'?" in out
    assert "\033[" not in out  # no colour when not a terminal


def test_all_errors_in_one_run(capsys):
    main(["lint", "--format", "json", str(BAD)])
    codes = sorted(d["code"] for d in json.loads(capsys.readouterr().out))
    assert codes == ["E019", "E031", "E040", "E081"]


@pytest.mark.parametrize("case", ["unplaced_axis_hides_nothing", "unused_definitions_checked", "cluster_by_name_and_inline"])
def test_compile_names_every_error_lint_does(case, tmp_path, capsys):
    """Issue 49: an error hid others (E036 hid E030 and E080, W022 an unused cluster's E019,
    E011 came with a bogus E018), each seen only once the one before was fixed. One run
    names them all (tests/cases holds where), and compile names what lint does."""
    plan = str(CASES / f"{case}.plan")
    assert main(["lint", "-q", plan]) == 1
    linted = capsys.readouterr().out
    assert main(["compile", "-q", plan, "-o", str(tmp_path)]) == 1
    compiled = capsys.readouterr().err
    assert compiled.startswith(linted) and "not compiled:" in compiled[len(linted):]
    assert linted.count("error[") == sum(code.startswith("E") for code in (CASES / f"{case}.expected").read_text().split()[::2])


PAIRED = """cluster c { nodes = 1; gpus_per_node = 4; device = cpu; link shm { scope = node; bandwidth = 10 GB/s; latency = 5 us } }
plan p {
    model llama { layers = 4; hidden = 64; heads = 4; vocab = 256; seq_len = 32 }
    cluster = c
    mesh { dp = 2 on shm; tp = 2 on shm }
    data_parallel { zero = 1 }
    train { micro_batch = 1; global_batch = 2; data = synthetic }
}
"""
# errors of the lowering: the text they change, and which errors of HIDDEN they hold back
# (those whose rule reads what the error left unknown)
HIDERS = {
    "E036 tp on no link": ("tp = 2 on shm", "tp = 2", set()),  # its size still counts
    "E019 device": ("device = cpu", "device = h100", set()),
    "E019 data": ("data = synthetic", 'data = bogus("x")', set()),
    "E012 layers": ("layers = 4; ", "", set()),  # the model's other keys are known
    "E012 nodes": ("nodes = 1; ", "", {"E030"}),
    "E018 model": ("model llama {", "model = m  // llama {", {"E041", "E100"}),
    "E018 cluster": ("cluster = c", "cluster = d", {"E030"}),
    "E011 cluster": ("cluster = c\n", "cluster = c\n    cluster c { nodes = 1; gpus_per_node = 4; device = cpu }\n", {"E030"}),
    "E033 mesh": ("dp = 2 on shm", "dq = 2 on shm", {"E030", "E080", "E041", "E100"}),
    "E013 micro_batch": ("micro_batch = 1;", "micro_batch = 1.5;", {"E080"}),  # not read as its default, 1
}
HIDDEN = {  # errors of the checks
    "E030": ("gpus_per_node = 4", "gpus_per_node = 8"),
    "E080": ("global_batch = 2", "global_batch = 3"),
    "E041": ("hidden = 64; heads = 4", "hidden = 96; heads = 3"),
    "E081": ("zero = 1", "zero = 7"),
    "E100": ("seq_len = 32 }", "seq_len = 32; dropout = 0.1 }"),  # its rule read the precision first
}


@pytest.mark.parametrize("hider, hidden", [(a, b) for a in HIDERS for b in HIDDEN], ids=lambda x: x.replace(" ", "_"))
def test_an_error_hides_only_what_depends_on_it(hider, hidden):
    """Issue 49: two errors in one plan are both reported, unless the second's rule reads a
    part that the first left unknown: then it waits for the fix (no error about a guess)."""
    old_a, new_a, holds = HIDERS[hider]
    old_b, new_b = HIDDEN[hidden]

    def codes(text: str) -> set[str]:
        return {d.code for d in load_text(text, "<t>").diagnostics if d.severity.value != "note"}

    assert codes(PAIRED) == set() and codes(PAIRED.replace(old_b, new_b)) == {hidden}
    alone = codes(PAIRED.replace(old_a, new_a))
    assert hider.split()[0] in alone and hidden not in alone
    both = codes(PAIRED.replace(old_a, new_a).replace(old_b, new_b))
    assert both == alone | ({hidden} - holds)


APART = """cluster c { nodes = 2; gpus_per_node = 4; device = cpu
    link shm { scope = node; bandwidth = 10 GB/s; latency = 5 us }
    link net { scope = cluster; bandwidth = 1 GB/s; latency = 10 us } }
plan p {
    model MODEL
    cluster = c
    mesh { MESH }
    EXTRA
    train { micro_batch = 1; data = synthetic }
}
"""
LLAMA = "llama { layers = 4; hidden = 64; heads = 4; vocab = 256; seq_len = 32 }"


@pytest.mark.parametrize("kept, model, mesh, extra, spoiled", [
    ("W055", LLAMA, "pp = 2 on shm", "pipeline { schedule = gpipe; microbatches = 2 }", "layers"),  # after the layers' split
    ("W064", LLAMA, "dp = 4 on shm; cp = 2 on net", "context_parallel { method = ulysses }", "hidden"),  # after E045's heads
    ("E076", LLAMA.replace("llama", "mixtral").replace(" }", "; experts = 4; top_k = 2 }"), "tp = 2 on shm; ep = 2 on net", "", "layers"),
])
def test_a_rule_goes_on_past_a_part_that_reads_what_an_error_spoiled(kept, model, mesh, extra, spoiled):
    """A rule stopped at the first unknown value it read: W055 after the model's layers (the
    layers' split over the stages), W064 after the heads (E045), E076 after E077's layers.
    Such a part is set apart (unknown.unless_unknown), and the rule goes on."""
    text = APART.replace("MODEL", model).replace("MESH", mesh).replace("EXTRA", extra)

    def codes(text: str) -> set[str]:
        return {d.code for d in load_text(text, "<t>").diagnostics if d.severity.value != "note"}

    assert kept in codes(text)
    assert {"E013", kept} <= codes(re.sub(rf"\b{spoiled} = \d+", f'{spoiled} = "x"', text, count=1))


def test_json_format(capsys):
    assert main(["lint", "--format", "json", str(BAD)]) == 1
    diags = json.loads(capsys.readouterr().out)
    assert {"code", "severity", "message", "file", "line", "col", "end_line", "end_col"} <= set(diags[0])
    assert all(d["file"] == str(BAD) for d in diags)


def test_github_format(capsys):
    assert main(["lint", "--format", "github", str(BAD)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    for line in lines:
        assert line.startswith(f"::error file={BAD},line=")
        assert ",title=E0" in line and "::" in line[2:]


def test_sarif_format_has_the_required_fields(capsys):
    """SARIF 2.1.0 as GitHub code scanning reads it: version, $schema,
    runs[].tool.driver.name and rules, results[] with ruleId, level, message.text
    and a physical location with a region."""
    assert main(["lint", "--format", "sarif", str(BAD)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["version"] == "2.1.0" and "sarif" in doc["$schema"]
    (run_,) = doc["runs"]
    driver = run_["tool"]["driver"]
    assert driver["name"] == "dslc" and driver["version"]
    rule_ids = [r["id"] for r in driver["rules"]]
    assert rule_ids == sorted(set(rule_ids))
    assert len(run_["results"]) == 4
    for res in run_["results"]:
        assert res["level"] in ("error", "warning", "note")
        assert res["message"]["text"]
        assert rule_ids[res["ruleIndex"]] == res["ruleId"]
        loc = res["locations"][0]["physicalLocation"]
        assert not os.path.isabs(loc["artifactLocation"]["uri"])
        region = loc["region"]
        assert region["startLine"] >= 1 and region["startColumn"] >= 1
        assert region["endColumn"] > region["startColumn"] or region["endLine"] > region["startLine"]


def test_sarif_validates_against_schema(capsys):
    jsonschema = pytest.importorskip("jsonschema")
    main(["lint", "--format", "sarif", str(BAD)])
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SARIF_SUBSET)


# The parts of the SARIF 2.1.0 schema that a result file must satisfy
# (required properties and enums, from the OASIS standard, section 3).
SARIF_SUBSET = {
    "type": "object",
    "required": ["version", "runs"],
    "properties": {
        "version": {"enum": ["2.1.0"]},
        "runs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["tool"],
                "properties": {
                    "tool": {
                        "type": "object",
                        "required": ["driver"],
                        "properties": {
                            "driver": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {
                                    "rules": {
                                        "type": "array",
                                        "items": {"type": "object", "required": ["id"]},
                                    }
                                },
                            }
                        },
                    },
                    "results": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["message"],
                            "properties": {
                                "level": {"enum": ["none", "note", "warning", "error"]},
                                "message": {"type": "object", "required": ["text"]},
                                "locations": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "properties": {
                                            "physicalLocation": {
                                                "type": "object",
                                                "properties": {
                                                    "region": {
                                                        "type": "object",
                                                        "properties": {
                                                            "startLine": {"type": "integer", "minimum": 1},
                                                            "startColumn": {"type": "integer", "minimum": 1},
                                                        },
                                                    }
                                                },
                                            }
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def test_strict_fails_on_warnings():
    plan = CASES / "vocab_padded.plan"
    assert main(["lint", str(plan)]) == 0
    assert main(["lint", "--strict", str(plan)]) == 1


def test_stdin():
    text = (CASES / "unknown_key.plan").read_bytes()
    r = run("lint", "-", stdin=text)
    assert r.returncode == 1
    assert b"<stdin>:10:30: error[E010]" in r.stdout
    ok = (ROOT / "tests" / "cases" / "vocab_padded.plan").read_bytes()
    assert run("lint", "-", stdin=ok).returncode == 0


def test_directory_is_searched_recursively(tmp_path):
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    (sub / "x.plan").write_bytes((CASES / "zero_stage.plan").read_bytes())
    r = run("lint", str(tmp_path))
    assert r.returncode == 1 and b"E081" in r.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["lint", "does/not/exist.plan"], b"no such file or directory: does/not/exist.plan"),
        (["lint", "docs"], b"no .plan files under docs"),
        (["lint", "--format", "xml", "plans"], b"invalid choice"),
        (["frobnicate"], b"invalid choice"),
        (["compile", "plans/llama3_8b.plan", "--plan", "nope"], b"no plan named 'nope'"),
    ],
)
def test_usage_and_io_errors_exit_2(args, needle):
    r = run(*args)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr
    assert b"Traceback" not in r.stderr


def test_unreadable_file(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads every file")
    f = tmp_path / "secret.plan"
    f.write_text("plan p { }")
    f.chmod(0)
    r = run("lint", str(f))
    assert r.returncode == 2 and b"permission denied" in r.stderr


@pytest.mark.parametrize(
    "name, data, code",
    [
        ("empty", b"", 0),
        ("binary", bytes(range(256)) * 4, 1),
        ("bad_utf8", b"plan p { x = \xc3\x28 }", 1),
        ("garbage", os.urandom(10 * 1024 * 1024), 1),
        ("nested", b"plan p " + b"a { " * 10_000 + b"}" * 10_000, 1),
        ("nested_parens", b"plan p { x = " + b"(" * 10_000 + b")" * 10_000 + b" }", 1),
        ("only_comments", b"// nothing here\n# nor here\n", 0),
    ],
)
def test_hostile_files_give_diagnostics_not_tracebacks(tmp_path, name, data, code):
    f = tmp_path / f"{name}.plan"
    f.write_bytes(data)
    r = run("lint", str(f))
    assert r.returncode == code, r.stdout + r.stderr
    assert b"Traceback" not in r.stderr + r.stdout
    assert r.stdout.count(b"\n") < 50  # one diagnostic, not a flood


def test_directory_given_as_import(tmp_path):
    (tmp_path / "d.plan").mkdir()
    f = tmp_path / "x.plan"
    f.write_text('import "d.plan"\n')
    r = run("lint", str(f))
    assert r.returncode == 1 and b"E005" in r.stdout


def test_version():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith(b"dslc ")


def test_python_m_and_console_script_agree():
    exe = Path(sys.executable).with_name("dslc")
    r = subprocess.run([str(exe), "lint", str(BAD)], capture_output=True)
    assert r.returncode == 1 and r.stdout == run("lint", str(BAD)).stdout


def test_main_renders_to_stdout_for_lint():
    buf = io.StringIO()
    old = sys.stdout
    sys.stdout = buf
    try:
        main(["lint", "--format", "json", str(CASES / "zero_stage.plan")])
    finally:
        sys.stdout = old
    assert json.loads(buf.getvalue())[0]["code"] == "E081"


def test_dslc_alone_lists_its_commands():
    r = run()
    assert r.returncode == 2 and all(c in r.stderr.decode() for c in ("lint", "compile", "explain", "verify"))


def test_schedule_text_json_and_picture(tmp_path):
    """dslc schedule on a 3D plan: a verified, simulated timeline as a text grid,
    as JSON (every action of every rank) and as a picture."""
    r = run("schedule", "plans/llama3_8b.plan", "-o", str(tmp_path / "s.png"))
    assert r.returncode == 0, r.stderr
    grid = r.stdout.decode().splitlines()
    rows = [line.split()[:2] for line in grid if line.startswith("rank")]
    assert rows[:2] == [["rank", "0"], ["rank", "1"]] and rows == rows[:2] * (len(rows) // 2)  # bands of 2 rows
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads(run("schedule", "--json", "plans/llama3_8b.plan").stdout)
    assert (doc["pp"], doc["microbatches"], doc["virtual_stages"]) == (2, 16, 2)
    for rank in doc["ranks"]:
        computes = [a for a in rank["actions"] if a["kind"] in ("F", "B")]
        # every micro-batch runs forward and backward once on each of the rank's 2 chunks
        assert len(computes) == 2 * 16 * 2
        assert all(a["end_ms"] >= a["start_ms"] for a in rank["actions"])
    # interleaved: (p−1)/(v·m) = 1/32 with equal chunks; the head's chunk is heavier, and p2p adds
    assert 1 / 32 < doc["bubble_fraction"] < 1 / 8
    bad = run("schedule", "plans/llama3_8b.plan", "-o", str(tmp_path / "s.gif"))
    assert bad.returncode == 2 and b"Traceback" not in bad.stderr


def test_schedule_says_what_it_proved_and_when_there_is_no_pipeline(tmp_path):
    """The README promises schedules proven deadlock-free: the text says so, with what the
    proof covered, and the JSON carries it. A plan without pp has nothing to schedule: one
    line saying so, not a one-rank "1f1b" timeline; no picture is drawn of it."""
    out = run("schedule", "plans/llama3_8b.plan").stdout.decode()
    proof = [line for line in out.splitlines() if "deadlock-free" in line]
    assert len(proof) == 1 and "2 ranks" in proof[0], out
    doc = json.loads(run("schedule", "--json", "plans/llama3_8b.plan").stdout)
    actions = sum(len(rank["actions"]) for rank in doc["ranks"])
    assert doc["deadlock_free"] is True and f"{actions} actions" in proof[0]
    flat = run("schedule", "plans/tiny_demo.plan")
    assert flat.returncode == 0 and "rank 0" not in flat.stdout.decode()
    assert "no pipeline" in flat.stdout.decode() and "pp = 1" in flat.stdout.decode()
    assert json.loads(run("schedule", "--json", "plans/tiny_demo.plan").stdout)["schedule"] is None
    drawn = run("schedule", "plans/tiny_demo.plan", "-o", str(tmp_path / "s.png"))
    assert drawn.returncode == 2 and "no pipeline" in drawn.stderr.decode() and not (tmp_path / "s.png").exists()


GOOD = """cluster c {{ nodes = 1; gpus_per_node = 2; device = cpu; link shm {{ scope = node; bandwidth = 10 GB/s; latency = 10 us }} }}
plan {name} {{
    model gpt2 {{ layers = 2; hidden = 64; heads = 4; vocab = 256; seq_len = 32{model} }}
    cluster = c
    mesh {{ {axis} = 2 on shm }}
}}
"""


def test_compile_writes_every_clean_plan_and_names_the_rest(tmp_path):
    """A folder of plans: every plan that lints clean and can be generated is written; one
    with lint errors (E090), one with what the generator cannot emit yet (E100, a lint error
    too) and a file that does not parse
    are not, and each is named at the end. The exit code says something failed."""
    src = tmp_path / "plans"
    src.mkdir()
    (src / "a_good.plan").write_text(GOOD.format(name="good", model="", axis="dp"))
    (src / "big.plan").write_bytes((CASES / "out_of_memory.plan").read_bytes())
    (src / "dropout.plan").write_text(GOOD.format(name="dropout_tp", model="; dropout = 0.1", axis="tp"))
    (src / "broken.plan").write_text("plan broken {\n")
    # a key mistyped in a plan: the plan is named, once, not its file as well
    (src / "typo.plan").write_text(GOOD.format(name="typo", model="; layer = 2", axis="dp"))
    (src / "z_good.plan").write_text(GOOD.format(name="other", model="", axis="dp"))
    out = tmp_path / "out"
    r = run("compile", str(src), "-o", str(out))
    assert r.returncode == 1
    assert sorted(p.name for p in out.iterdir()) == ["good", "other"]
    assert (out / "good" / "train.py").is_file() and (out / "other" / "launch.sh").is_file()
    err = r.stderr.decode()
    assert "error[E090]" in err and "error[E003]" in err and "error[E100]: dropout = 0.1 with tp = 2 is not supported yet" in err
    tail = err.splitlines()[-5:]
    assert tail == [
        f"not compiled: {src / 'big.plan'}: plan 'too_big' has errors",
        f"not compiled: {src / 'broken.plan'}: the file has errors",
        f"not compiled: {src / 'dropout.plan'}: plan 'dropout_tp' has errors",
        f"not compiled: {src / 'typo.plan'}: plan 'typo' has errors",
        "dslc: wrote 2 plans; not compiled: 3 plans, 1 file",
    ], err
    # --check agrees: the clean plans are up to date, the rest named, and it still fails
    r = run("compile", "--check", str(src), "-o", str(out))
    assert r.returncode == 1 and b"stale" not in r.stderr and b"not compiled: " in r.stderr


def test_compile_names_each_plan_it_did_not_write(tmp_path):
    """A file of three plans: one with a check's error (E080), one whose cluster is unknown
    (E018: checked as a partial plan, never compiled) and a clean one, not compiled either
    as its file has errors. Each is named, once, and counted: the partial one was left out
    ("2 plans")."""
    text = GOOD.format(name="a", model="", axis="dp") + "\n".join(
        GOOD.format(name=n, model="", axis="dp").split("\n", 1)[1] for n in ("b", "d"))
    text = text.replace("mesh { dp = 2 on shm }\n}", "mesh { dp = 2 on shm }\n    train { global_batch = 3 }\n}", 1)
    text = text.replace("plan b {\n    model gpt2 { layers = 2; hidden = 64; heads = 4; vocab = 256; seq_len = 32 }\n    cluster = c",
                        "plan b {\n    model gpt2 { layers = 2; hidden = 64; heads = 4; vocab = 256; seq_len = 32 }\n    cluster = zzz")
    (tmp_path / "three.plan").write_text(text)
    r = run("compile", str(tmp_path / "three.plan"), "-o", str(tmp_path / "out"))
    err = r.stderr.decode()
    assert "error[E080]" in err and "error[E018]" in err, err
    assert err.splitlines()[-4:] == [
        f"not compiled: {tmp_path / 'three.plan'}: plan '{n}' has errors" for n in "abd"] + [
        "dslc: wrote 0 plans; not compiled: 3 plans",
    ], err


def test_compile_of_clean_plans_says_what_it_wrote(tmp_path):
    src = tmp_path / "p.plan"
    src.write_text(GOOD.format(name="good", model="", axis="dp"))
    r = run("compile", str(src), "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert r.stderr.decode().splitlines() == [f"wrote {tmp_path / 'out' / 'good'}/", "dslc: wrote 1 plan"]


TOO_BIG = """
cluster one_node { nodes = 1; gpus_per_node = 8; device = h100_sxm; link nvlink { scope = node } }
plan too_big {
    model llama { layers = 32; hidden = 4096; heads = 32; kv_heads = 8; ffn = 14336; vocab = 128256; seq_len = 8192 }
    cluster = one_node
    mesh { dp = 8 on nvlink }
    train { micro_batch = 4; global_batch = 32; precision = bf16; optimizer adamw { lr = 3e-4 } }
}
"""


def test_explain_reports_a_plan_that_does_not_fit_and_exits_1(tmp_path, capsys):
    """The report a user needs to see why: the memory table with fits = NO, the E090
    diagnostic under it and on stderr at the plan's line; --json too, diagnostics inside."""
    plan = tmp_path / "too_big.plan"
    plan.write_text(TOO_BIG)
    assert main(["explain", str(plan)]) == 1
    out, err = capsys.readouterr()
    table = out[out.index("Memory per GPU"):out.index("Traffic per GPU")]
    assert " NO" in table and "error[E090]" in table and "Time per step" in out
    assert f"{plan}:3:1: error[E090]" in err
    assert main(["explain", "--json", str(plan)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["memory"][0]["fits"] is False and [d["code"] for d in doc["diagnostics"]] == ["E090"]
    assert doc["memory"][0]["total"] > doc["device_memory"] and doc["step_time_s"] > 0


def test_explain_still_refuses_a_plan_with_other_errors(tmp_path, capsys):
    plan = tmp_path / "bad.plan"
    plan.write_text(TOO_BIG.replace("kv_heads = 8", "kv_heads = 7"))
    assert main(["explain", str(plan)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "error[" in err


# -- issue 34: what a new user meets ------------------------------------------------

LIBRARY = """\
cluster a {
    nodes = 1
    gpus_per_node = 8
    device = h100
    link nv { scope = node; latency = 2 us }
}
model m { arch = llama; layers = 4; hidden = 30; heads = 4; vocab = 96; seq_len = 16 }
"""


def test_a_file_of_clusters_and_models_only_is_checked(tmp_path, capsys):
    """A library file (no plan): its clusters and models are lowered and checked on their
    own, not passed with "ok: 0 plans"; the device's family comes first in the hint."""
    lib = tmp_path / "lib.plan"
    lib.write_text(LIBRARY)
    assert main(["lint", "--strict", str(lib)]) == 1
    out = capsys.readouterr().out
    found = sorted((line.split(": ")[1].split("]")[0], line.split(": ")[0].rsplit(":", 2)[1]) for line in out.splitlines() if "error[" in line)
    assert found == [("error[E012", "5"), ("error[E019", "4"), ("error[E040", "7"), ("error[E046", "7")], out
    assert "help: did you mean 'h100_sxm' or 'h100_pcie'?" in out
    lib.write_text(LIBRARY.replace("h100", "h100_sxm").replace("latency", "bandwidth = 450 GB/s; latency").replace("30", "32"))
    assert main(["lint", "--strict", str(lib)]) == 0
    assert capsys.readouterr().err == "ok: 0 plans in 1 file, and 2 cluster or model definitions no plan uses\n"


@pytest.mark.parametrize("text, message, hint", [
    ("plan p {\n  model m { arch = gpt2\n  train { steps = 1\n",
     "unexpected end of file: 3 blocks are not closed: train (opened at 3:9), model 'm' (opened at 2:11), plan 'p' (opened at 1:8)",
     "add 3 '}', innermost first"),
    ('plan p {\n  train { data = text("}") } // }\n',
     "unexpected end of file: block plan 'p' (opened at 1:8) is not closed", "add '}' where the block ends"),
])
def test_an_unclosed_block_is_named_with_where_it_opened(tmp_path, capsys, text, message, hint):
    path = tmp_path / "open.plan"
    path.write_text(text)
    assert main(["lint", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"error[E003]: {message}\n" in out and f"help: {hint}\n" in out, out


def test_a_repeated_note_is_said_once_with_a_count_and_quiet_hides_notes(tmp_path, capsys):
    """Eight clusters each with an nvlink of the catalog's bandwidth: N021 once, counted."""
    text = "".join(f"cluster c{i} {{ nodes = 1; gpus_per_node = 8; device = h100_sxm; link nvlink {{ scope = node; latency = 2 us }} }}\n" for i in range(8))
    path = tmp_path / "lib.plan"
    path.write_text(text)
    assert main(["lint", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("note[N021]") == 1
    col = text.splitlines()[1].index("link nvlink") + 1  # N021 is at the link block
    assert f"note: said 8 times; also at {path}:2:{col}, {path}:3:{col}, {path}:4:{col}, …\n" in out, out
    assert main(["lint", "--quiet", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("ok: 0 plans in 1 file")
    assert main(["lint", "--format", "json", str(path)]) == 0  # tools get every one
    assert len(json.loads(capsys.readouterr().out)) == 8


def test_explain_takes_several_files_as_a_folder(tmp_path, capsys):
    assert main(["explain", str(ROOT / "plans" / "tiny_demo.plan"), str(ROOT / "plans" / "llama3_8b.plan")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("plan tiny_demo (") and "\n\nplan llama3_8b (" in out


def test_compile_writes_the_plans_of_the_file_not_of_its_imports(tmp_path):
    """A plan that imports another plan file to share its cluster compiles itself only;
    explain says only its own plans too."""
    base = (ROOT / "plans" / "tiny_demo.plan").read_text().replace("../data/verse.txt", str(ROOT / "data" / "verse.txt"))
    (tmp_path / "base.plan").write_text(base)
    (tmp_path / "more.plan").write_text('import "base.plan"\nplan more {\n'
                                        "    model gpt2 { layers = 3; hidden = 128; heads = 4; vocab = 256; seq_len = 64 }\n"
                                        "    cluster = cpu4\n    mesh { dp = 4 on shm }\n"
                                        "    train { steps = 10; micro_batch = 4; global_batch = 16; precision = fp32; data = synthetic }\n}\n")
    out = tmp_path / "out"
    r = run("compile", str(tmp_path / "more.plan"), "-o", str(out))
    assert r.returncode == 0, r.stderr.decode()
    assert sorted(p.name for p in out.iterdir()) == ["more"]
    r = run("explain", str(tmp_path / "more.plan"))
    assert r.returncode == 0 and r.stdout.decode().count("\nplan ") + r.stdout.decode().startswith("plan ") == 1
    # the two files together: both written, each once (issue 49 item 2: a file given and
    # also imported was counted, written and named twice)
    r = run("compile", str(tmp_path / "more.plan"), str(tmp_path / "base.plan"), "-o", str(out))
    assert r.returncode == 0 and sorted(p.name for p in out.iterdir()) == ["more", "tiny_demo"]
    err = r.stderr.decode()
    assert err.count("tiny_demo/") == 1 and "dslc: wrote 2 plans" in err, err
    r = run("lint", str(tmp_path / "more.plan"), str(tmp_path / "base.plan"))
    assert r.returncode == 0 and "ok: 2 plans in 2 files" in r.stderr.decode(), r.stderr.decode()
    (tmp_path / "more.plan").write_text((tmp_path / "more.plan").read_text().replace("hidden = 128", "hidden = 130"))
    r = run("compile", str(tmp_path / "more.plan"), str(tmp_path / "base.plan"), "-o", str(out))
    err = r.stderr.decode()
    assert r.returncode == 1 and "dslc: wrote 1 plan; not compiled: 1 plan" in err and err.count("not compiled: ") == 2, err


@pytest.mark.parametrize("files, needle", [
    (None, "no such folder"),
    ({}, "no run.json"),
    ({"run.json": "{"}, "run.json: cannot read it"),
    ({"run.json": '{"world_size": "x"}'}, "not a run file of a generated script"),
    ({"run.json": '{"world_size": 2, "mesh": [["dp", 2]]}'}, "the watchdog never fired"),
    ({"run.json": '{"world_size": 2, "mesh": [["dp", 2]]}', "state.rank1.json": "\xff"}, "state.rank1.json: cannot read it"),
    ({"run.json": '{"world_size": 2, "mesh": [["dp", 2]]}', "state.rank0.json": '{"time": "x"}'}, "not a state file of the watchdog"),
])
def test_doctor_refuses_what_is_not_a_stopped_run_in_one_line(tmp_path, capsys, files, needle):
    """dslc doctor RUN_DIR: a folder the watchdog did not write is one line, exit 2
    (tests/test_checkpoint.py runs the watchdog and reads what it wrote)."""
    run_dir = tmp_path / "run"
    if files is not None:
        run_dir.mkdir()
        for name, text in files.items():
            (run_dir / name).write_text(text, encoding="latin-1")
    assert main(["doctor", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err


def test_doctor_names_the_first_rank_to_stop_when_every_rank_wrote(tmp_path, capsys):
    """No rank silent and none raised (a rank stuck outside a collective, its watchdog
    alive): the first to stop is named, with the end of its stack."""
    (tmp_path / "run.json").write_text(json.dumps({"plan": "p", "world_size": 2, "mesh": [["dp", 2]]}))
    for rank, t, calling in ((0, 10.0, "reading the data"), (1, 11.0, "all_reduce over dp")):
        (tmp_path / f"state.rank{rank}.json").write_text(json.dumps({
            "rank": rank, "host": "h", "coords": {"dp": rank}, "why": "hang", "message": "no progress for 3.0 s (limit 2 s)",
            "step": 4, "doing": None, "done": {"step": 3}, "calling": calling, "groups": {"dp": [0, 1]}, "time": t,
            "stack": ['  File "train.py", line 9, in main\n    x = next(batches)\n'],
        }))
    assert main(["doctor", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "the first to stop was rank 0 (dp=0 on h), in reading the data" in out
    assert "x = next(batches)" in out and "rank 1 (dp=1 on h): no progress for 3.0 s (limit 2 s); in all_reduce over dp (group [0, 1])" in out
