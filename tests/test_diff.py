"""``dslc diff``: its numbers are ``dslc explain --json``'s of each side (run as its own
process), for real plans changed the way a pull request changes them (tp 4 → 8, ZeRO 1 → 3,
a micro-batch that stops fitting); the diagnostics that appear and disappear; Markdown
that is a table, JSON for tools; ``--git HEAD~1`` in a repository of its own; and a bad
input is one line and exit 2."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dslc.cli import main
from dslc.report.diff_show import MARKER, code, text
from dslc.units import seconds

ROOT = Path(__file__).resolve().parent.parent
PLANS = ROOT / "plans"


def edited(src: Path, dst: Path, *changes: tuple[str, str]) -> Path:
    """``src``'s text with each (old, new) replaced once (each must be there), at ``dst``."""
    text = src.read_text()
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new, 1)
    dst.write_text(text)
    return dst


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                   cwd=repo, check=True, capture_output=True)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The plans, a git repository with two commits (and a copy of the first), and
    ``dslc explain --json`` of every file, from one process of its own: {path: doc}."""
    top = tmp_path_factory.mktemp("diff")
    d = top / "plans"
    d.mkdir()
    shutil.copytree(ROOT / "clusters", top / "clusters")
    f = {"8b": edited(PLANS / "llama3_8b.plan", d / "llama3_8b.plan")}
    f["8b_tp8"] = edited(f["8b"], d / "llama3_8b_tp8.plan", ("dp = 2 on ib", "dp = 1 on ib"), ("pp = 2 on nvlink", "pp = 2 on ib"),
                         ("tp = 4 on nvlink", "tp = 8 on nvlink"), ("microbatches = 16", "microbatches = 32"))
    f["70b"] = edited(PLANS / "llama3_70b.plan", d / "llama3_70b.plan")
    f["70b_zero3"] = edited(f["70b"], d / "llama3_70b_zero3.plan", ("zero = 1", "zero = 3"))
    f["70b_tp4"] = edited(f["70b"], d / "llama3_70b_tp4.plan", ("dp = 2 on ib", "dp = 4 on ib"), ("tp = 8 on nvlink", "tp = 4 on nvlink"),
                          ("microbatches = 32", "microbatches = 16"))
    f["70b_mb2"] = edited(f["70b"], d / "llama3_70b_mb2.plan", ("micro_batch = 1;", "micro_batch = 2;"), ("microbatches = 32", "microbatches = 16"))
    # a repository: a cluster file changes (every plan importing it), one plan file renamed, one
    # deleted, one added, one untouched; base/ is its first commit's files
    repo = top / "repo"
    (repo / "plans").mkdir(parents=True)
    shutil.copytree(ROOT / "clusters", repo / "clusters")
    for name in ("llama3_8b", "gpt2_124m_dp8", "tiny_demo", "tiny_moe"):
        shutil.copy(PLANS / f"{name}.plan", repo / "plans")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    shutil.copytree(repo, top / "base", ignore=shutil.ignore_patterns(".git"))
    edited(repo / "clusters" / "h100.plan", repo / "clusters" / "h100.plan", ("bandwidth = 400 Gb/s", "bandwidth = 200 Gb/s"))
    git(repo, "mv", "plans/gpt2_124m_dp8.plan", "plans/gpt2_small.plan")
    git(repo, "rm", "-q", "plans/tiny_moe.plan")
    edited(repo / "plans" / "tiny_demo.plan", repo / "plans" / "tiny_new.plan", ("plan tiny_demo", "plan tiny_new"))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "new")
    explained = [*f.values(), top / "base/plans/llama3_8b.plan", top / "base/plans/gpt2_124m_dp8.plan",
                 repo / "plans/llama3_8b.plan", repo / "plans/gpt2_small.plan"]
    r = subprocess.run([sys.executable, "-m", "dslc", "explain", "--json", *map(str, explained)], capture_output=True, cwd=ROOT, timeout=300)
    assert r.returncode == 1 and b"E090" in r.stderr, r.stderr.decode()  # 70b_tp4 and 70b_mb2 do not fit
    docs = {Path(doc["file"]).resolve(): doc for doc in json.loads(r.stdout)}
    return {"top": top, "files": f, "repo": repo, "explain": docs}


def diff(capsys, *args: str, err: list | None = None) -> tuple[int, str]:
    """The exit status and standard output of ``dslc diff ARGS``, run here; standard error
    goes to ``err`` (it must be empty unless the status is 2)."""
    status = main(["diff", *map(str, args)])
    out = capsys.readouterr()
    if err is not None:
        err.append(out.err)
    assert status == 2 or out.err == "", out.err
    return status, out.out


def as_json(capsys, *args) -> tuple[int, dict]:
    status, out = diff(capsys, "--format", "json", *args)
    return status, json.loads(out)


def expected(doc: dict, key: str):
    """What ``dslc explain --json`` says at a row's key, found here, not by the diff's code."""
    peak = max(s["total"] for s in doc["memory"])
    if key == "max(memory[].total)":
        return peak
    if key == "device_memory - max(memory[].total)":
        return doc["device_memory"] - peak
    if key == "memory[].fits":
        return "yes" if all(s["fits"] for s in doc["memory"]) else "NO"
    if m := re.fullmatch(r"busiest_links\[link=(\w+)\]\.(\w+)", key):
        return next((b[m[2]] for b in doc["busiest_links"] if b["link"] == m[1]), None)
    if m := re.fullmatch(r"memory\[(\d+)\]\.total", key):
        return doc["memory"][int(m[1])]["total"] if int(m[1]) < len(doc["memory"]) else None
    value = doc
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def check_against_explain(plan: dict, base: dict, new: dict) -> None:
    keys = {r["key"] for r in plan["rows"]}
    links = {f"busiest_links[link={b['link']}].{k}" for b in new["busiest_links"] for k in ("bytes_per_step", "seconds_per_step")}
    assert {"step_time_s", "tokens_per_s", "mfu", "pipeline.bubble_fraction", "max(memory[].total)", "memory[].fits",
            "memory[0].total", "layout.mesh", "world_size"} | links <= keys
    for r in plan["rows"]:
        assert r["base"] == expected(base, r["key"]), r
        assert r["new"] == expected(new, r["key"]), r
        if r["unit"] != "text":
            assert r["delta"] == pytest.approx(r["new"] - r["base"]), r
            if r["base"] and r["base"] * r["new"] >= 0:
                assert r["percent"] == pytest.approx(100 * (r["new"] - r["base"]) / abs(r["base"])), r


def step_line(docs: dict, base: Path, new: Path) -> str:
    """The headline's step times, as explain --json gives them for the two files."""
    a, b = (docs[p.resolve()]["step_time_s"] for p in (base, new))
    return f"llama3_70b: step {seconds(a)} → {seconds(b)} ({100 * (b - a) / a:+.1f} %)"


def row(plan: dict, key: str) -> dict:
    return next(r for r in plan["rows"] if r["key"] == key)


# ---------------------------------------------------------------------------- three real changes


def test_tp_4_to_8_against_explain(world, capsys):
    f, docs = world["files"], world["explain"]
    status, out = as_json(capsys, f["8b"], f["8b_tp8"])
    assert status == 0 and not out["errors_appear"]
    (plan,) = out["plans"]
    assert plan["status"] == "changed" and plan["plan"] == "llama3_8b"
    check_against_explain(plan, docs[f["8b"].resolve()], docs[f["8b_tp8"].resolve()])
    assert (row(plan, "layout.mesh")["base"], row(plan, "layout.mesh")["new"]) == ("dp2 × pp2 × tp4", "pp2 × tp8")
    assert row(plan, "busiest_links[link=nvlink].bytes_per_step")["delta"] > 0  # tp 8 moves more over NVLink
    assert plan["headline"].endswith("still fits") and plan["appeared"] == plan["disappeared"] == []


def test_tp_4_to_8_on_70b_now_fits_and_e090_disappears(world, capsys):
    f, docs = world["files"], world["explain"]
    status, out = as_json(capsys, f["70b_tp4"], f["70b"])
    (plan,) = out["plans"]
    assert status == 0 and plan["headline"].startswith(step_line(docs, f["70b_tp4"], f["70b"]) + ", now fits")
    check_against_explain(plan, docs[f["70b_tp4"].resolve()], docs[f["70b"].resolve()])
    assert [d["code"] for d in plan["disappeared"]] == ["E090"] and plan["appeared"] == []


def test_a_plan_that_still_does_not_fit_keeps_its_e090(world, capsys):
    """E090's message holds the numbers that change: across the sides it is one diagnostic."""
    f = world["files"]
    status, out = as_json(capsys, f["70b_mb2"], f["70b_tp4"])
    (plan,) = out["plans"]
    assert status == 0 and plan["appeared"] == plan["disappeared"] == []
    assert "still does not fit: stage 0 needs" in plan["headline"] and plan["base"]["errors"] == plan["new"]["errors"] == ["E090"]


def test_zero_1_to_3_against_explain(world, capsys):
    f, docs = world["files"], world["explain"]
    status, out = as_json(capsys, f["70b"], f["70b_zero3"])
    (plan,) = out["plans"]
    assert status == 0
    check_against_explain(plan, docs[f["70b"].resolve()], docs[f["70b_zero3"].resolve()])
    assert (row(plan, "layout.zero")["base"], row(plan, "layout.zero")["new"]) == ("1", "3")
    assert row(plan, "busiest_links[link=ib].bytes_per_step")["delta"] > 0  # ZeRO-3 gathers the weights over dp


def test_a_change_that_stops_fitting_is_exit_1_with_e090_appearing(world, capsys):
    f, docs = world["files"], world["explain"]
    status, out = as_json(capsys, f["70b"], f["70b_mb2"])
    (plan,) = out["plans"]
    assert status == 1 and out["errors_appear"]
    check_against_explain(plan, docs[f["70b"].resolve()], docs[f["70b_mb2"].resolve()])
    assert (plan["base"]["fits"], plan["new"]["fits"]) == (True, False)
    assert [d["code"] for d in plan["appeared"]] == ["E090"] and plan["appeared"][0]["fit"]
    assert "stops fitting: stage 0 needs" in plan["headline"]
    assert (row(plan, "memory[].fits")["base"], row(plan, "memory[].fits")["new"]) == ("yes", "NO")
    # the other way: the diagnostic disappears, the plan now fits, exit 0
    status, out = as_json(capsys, f["70b_mb2"], f["70b"])
    (plan,) = out["plans"]
    assert status == 0 and [d["code"] for d in plan["disappeared"]] == ["E090"] and "now fits" in plan["headline"]


def test_a_rule_broken_is_not_costed_and_a_plan_renamed_is_paired(world, capsys, tmp_path):
    f = world["files"]
    broken = edited(f["8b_tp8"], world["top"] / "plans" / "broken.plan", ("global_batch = 32", "global_batch = 48"))
    status, out = as_json(capsys, f["8b"], broken)
    (plan,) = out["plans"]
    assert status == 1 and plan["new"] == {"file": str(broken), "plan": "llama3_8b", "costed": False, "fits": None, "errors": ["E080"]}
    assert [d["code"] for d in plan["appeared"]] == ["E080"] and "now has errors (E080)" in plan["headline"]
    renamed = edited(f["8b"], world["top"] / "plans" / "renamed.plan", ("plan llama3_8b", "plan llama3_8b_v2"))
    status, out = as_json(capsys, f["8b"], renamed)
    assert status == 0 and out["plans"][0]["status"] == "renamed"
    assert out["plans"][0]["headline"].startswith("llama3_8b → llama3_8b_v2: renamed, no change in cost (step ")


# ---------------------------------------------------------------------------- formats


def test_markdown_is_a_comment_with_a_table_of_the_rows(world, capsys):
    f, docs = world["files"], world["explain"]
    status, out = diff(capsys, "--format", "markdown", f["70b"], f["70b_mb2"])
    assert status == 1 and out.startswith(MARKER + "\n")
    lines = out.splitlines()
    start = lines.index("| | base | new | change |")
    assert lines[start + 1] == "|:--|--:|--:|--:|"
    table = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        assert len(cells) == 4, line
        table[cells[0]] = cells[1:]
    base, new = docs[f["70b"].resolve()], docs[f["70b_mb2"].resolve()]
    assert table["step time"][:2] == [seconds(base["step_time_s"]), seconds(new["step_time_s"])]
    assert table["fits"][:2] == ["yes", "NO"]
    assert {"micro\\_batch", "memory per GPU (worst stage)", "tokens/s", "MFU", "bubble", "nvlink: busy time", "ib: traffic on its busiest link"} <= set(table)
    assert "Diagnostics that appear:" in out and "**error E090**" in out
    assert "<details><summary>" in out and "| stage 0 (20 layers) |" in out and "</details>" in out


def test_text_shows_the_headline_and_the_diagnostics(world, capsys):
    f = world["files"]
    status, out = diff(capsys, f["70b"], f["70b_mb2"])
    assert status == 1
    assert step_line(world["explain"], f["70b"], f["70b_mb2"]) + ", stops fitting" in out
    assert re.search(r"^fits +yes +NO$", out, re.M) and "+ error[E090]: pipeline stage 0 needs" in out


def test_markdown_keeps_what_a_plan_author_chose_in_code_spans():
    assert code("a|b") == "`a\\|b`"
    assert code("x`y") == "``x`y``" and code("`y") == "`` `y ``"
    assert code("\x1b[2J @you <img src=x>") == "`\\x1b[2J @you <img src=x>`"
    assert text("micro_batch <b> | *x*") == "micro\\_batch \\<b\\> \\| \\*x\\*"


# ---------------------------------------------------------------------------- --git


def test_git_head_1_in_a_repository_of_its_own(world, capsys, monkeypatch):
    repo, docs, top = world["repo"], world["explain"], world["top"]
    monkeypatch.chdir(repo / "plans")  # paths as seen from a folder of the repository
    status, out = as_json(capsys, "--git", "HEAD~1")
    assert status == 0 and out["new"] == "the working tree" and out["base"].startswith("HEAD~1 (")
    plans = {p["plan"]: p for p in out["plans"]}
    assert set(plans) == {"llama3_8b", "gpt2_124m_dp8", "tiny_moe", "tiny_new"}  # tiny_demo: nothing it reads changed
    assert (plans["tiny_moe"]["status"], plans["tiny_new"]["status"]) == ("removed", "added")
    gpt2 = plans["gpt2_124m_dp8"]  # a file renamed; one node: the slower InfiniBand changes nothing of it
    assert (gpt2["base"]["file"], gpt2["new"]["file"], gpt2["status"]) == ("gpt2_124m_dp8.plan", "gpt2_small.plan", "unchanged")
    # the base side is the first commit's files, imports too: explain of its copy
    for name, old, new in (("llama3_8b", "llama3_8b", "llama3_8b"), ("gpt2_124m_dp8", "gpt2_124m_dp8", "gpt2_small")):
        check_against_explain(plans[name], docs[(top / "base/plans" / f"{old}.plan").resolve()], docs[(repo / "plans" / f"{new}.plan").resolve()])
    assert row(plans["llama3_8b"], "busiest_links[link=ib].seconds_per_step")["delta"] > 0  # ib at half the bandwidth
    # only the folder asked for; markdown says when nothing changed there
    monkeypatch.chdir(repo)
    status, out = diff(capsys, "--git", "HEAD~1", "--format", "markdown", "clusters")
    assert status == 0 and out.startswith(MARKER) and "No plan changed." in out
    status, out = as_json(capsys, "--git", "HEAD~1", "--plan", "tiny_new")
    assert [p["plan"] for p in out["plans"]] == ["tiny_new"]


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("args, says", [
    (["missing.plan", "plans/llama3_8b.plan"], "no such file or directory: missing.plan"),
    (["plans/llama3_8b.plan"], "takes two plan files"),
    (["-", "-"], "only one side can be '-'"),
    (["plans", "plans/llama3_8b.plan"], "is a folder"),
    (["--git", "no-such-rev"], "no such commit"),
    (["--git=--output=x"], "not a revision"),
    (["--git", "HEAD", "/"], "outside the repository"),
    (["plans/llama3_8b.plan", "plans/llama3_8b.plan", "--plan", "nope"], "no plan named 'nope'"),
])
def test_bad_input_is_one_line_and_exit_2(world, capsys, monkeypatch, args, says):
    monkeypatch.chdir(world["repo"])
    errs: list[str] = []
    status, out = diff(capsys, *args, err=errs)
    (err,) = errs
    assert status == 2 and out == "" and err.count("\n") == 1 and says in err, err
    assert not (world["repo"] / "x").exists()


def test_not_a_git_repository_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert main(["diff", "--git", "HEAD"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dslc: error: --git: ") and "not in a git working tree" in err and err.count("\n") == 1


def test_one_side_from_stdin(world, capsys, monkeypatch):
    import io

    f = world["files"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(f["8b_tp8"].read_bytes())))
    monkeypatch.chdir(f["8b"].parent)  # the plan's import is relative to its folder
    status, out = as_json(capsys, f["8b"], "-")
    assert status == 0 and out["new"] == "<stdin>" and out["plans"][0]["status"] == "changed"


# ---------------------------------------------------------------------------- the CI example


def test_the_ci_example_is_yaml_that_posts_one_comment_and_the_readme_shows_it():
    ci = (ROOT / "docs" / "ci" / "dslc-diff.yml").read_text()
    doc = yaml.safe_load(ci)
    steps = doc["jobs"]["plan-cost"]["steps"]
    runs = "\n".join(s.get("run", "") for s in steps)
    assert "dslc diff --git" in runs and "--format markdown" in runs
    script = next(s["with"]["script"] for s in steps if s.get("uses", "").startswith("actions/github-script"))
    assert MARKER in script and "updateComment" in script and "createComment" in script
    assert ci in (ROOT / "README.md").read_text()


def test_a_file_broken_on_both_sides_says_so_instead_of_no_change(tmp_path, capsys):
    for name, steps in (("a.plan", 1), ("b.plan", 2)):  # both import a file that is not there
        (tmp_path / name).write_text(f'import "missing.plan"\nplan p {{ model = m; cluster = c; train {{ steps = {steps} }} }}\n')
    status, out = diff(capsys, tmp_path / "a.plan", tmp_path / "b.plan")
    assert status == 0 and "has errors on both sides (E005" in out and "not costed" in out


def test_a_link_out_of_the_repository_at_rev_is_not_followed(tmp_path, capsys, monkeypatch):
    """Issue 50 item 9: a plan committed at REV as a symbolic link (mode 120000) out of the
    repository was read from this machine, and the plan there (its cluster's name) reached
    the pull request's comment. A link of the commit is followed only inside the
    repository: the plan is refused in one line, an import through one is E005; neither
    shows a byte of the file outside. A link inside the repository is still followed."""
    outside, repo = tmp_path / "outside", tmp_path / "repo"
    outside.mkdir()
    (repo / "plans").mkdir(parents=True)
    (repo / "clusters").mkdir()
    demo = (PLANS / "tiny_demo.plan").read_text()
    secret = demo.replace("cpu4", "sekrit_cluster").replace("plan tiny_demo", "plan sekrit_plan")
    (outside / "secret.plan").write_text(secret)
    cluster, body = demo.split("plan tiny_demo", 1)
    (outside / "cluster.plan").write_text(cluster.replace("bandwidth = 10 GB/s", "bandwidth = 7 GB/s"))
    (repo / "plans" / "a.plan").symlink_to("../../outside/secret.plan")
    (repo / "clusters" / "c.plan").symlink_to("../../outside/cluster.plan")
    (repo / "clusters" / "in.plan").write_text(cluster)
    (repo / "clusters" / "inside.plan").symlink_to("in.plan")  # a link inside: followed
    b = 'import "../clusters/c.plan"\nplan b' + body
    (repo / "plans" / "b.plan").write_text(b)
    (repo / "plans" / "d.plan").write_text('import "../clusters/inside.plan"\nplan d' + body)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "links")
    # the working tree: a.plan a file of its own, the import a file of the repository's
    (repo / "plans" / "a.plan").unlink()
    (repo / "plans" / "a.plan").write_text(demo)
    (repo / "clusters" / "c.plan").unlink()
    (repo / "clusters" / "c.plan").write_text(cluster)
    (repo / "plans" / "b.plan").write_text(b + "\n")
    (repo / "plans" / "d.plan").write_text('import "../clusters/inside.plan"\nplan d' + body + "\n")
    monkeypatch.chdir(repo)
    errs: list[str] = []
    status, out = diff(capsys, "--git", "HEAD", "--format", "markdown", "plans/a.plan", err=errs)
    (err,) = errs
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert "plans/a.plan" in err and "a symbolic link out of the repository, not followed" in err
    assert "sekrit" not in err
    status, out = as_json(capsys, "--git", "HEAD", "plans/b.plan", "plans/d.plan")
    plans = {p["plan"]: p for p in out["plans"]}
    # the base side is not costed from the file outside (its link 7 GB/s, the repository's 10)
    assert plans["b"]["base"]["costed"] is False and "E005" in plans["b"]["base"]["errors"]
    assert "cannot read import ../clusters/c.plan: a symbolic link out of the repository, not followed" in json.dumps(out)
    assert plans["d"]["status"] == "unchanged"  # its import, a link inside, read from the commit


def test_a_link_out_of_the_repository_in_the_working_tree_is_not_followed(tmp_path, capsys, monkeypatch):
    """The working tree is the pull request's side: a plan added there as a symbolic link
    out of the repository (to a file of the CI machine's) is refused in one line as the
    commit's side refuses one, and its plan, cluster and costs reach no comment."""
    outside, repo = tmp_path / "outside", tmp_path / "repo"
    outside.mkdir()
    (repo / "plans").mkdir(parents=True)
    demo = (PLANS / "tiny_demo.plan").read_text()
    (outside / "secret.plan").write_text(demo.replace("cpu4", "sekrit_cluster").replace("plan tiny_demo", "plan sekrit_plan"))
    (repo / "plans" / "ok.plan").write_text(demo)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    (repo / "plans" / "x.plan").symlink_to("../../outside/secret.plan")
    monkeypatch.chdir(repo)
    errs: list[str] = []
    status, out = diff(capsys, "--git", "HEAD", "--format", "markdown", err=errs)
    (err,) = errs
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert "plans/x.plan" in err and "a symbolic link out of the repository, not followed" in err and "sekrit" not in err
