"""``dslc search``: the layouts it ranks pass lint and fit, the plan it writes is the layout
it ranked first, and published layouts stand near the top of its ranking (or the README
says why not, and the reason is checked here)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.cells import cell_len

from dslc import cli, search
from dslc.driver import lint, load_paths, load_text
from dslc.report import search as report
from dslc.search import batch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import published  # noqa: E402

RUNS = {r.plan: r for r in published.RUNS}


def _plan(path: Path, name: str | None = None):
    res = load_paths([path], check=False)
    return next(p for p in res.program.plans if name is None or p.name == name)


# --------------------------------------------------------------------------- the command


def test_search_prints_its_table_and_writes_a_plan_that_lints_clean_and_explains_to_its_row(tmp_path, capsys):
    out = tmp_path / "sub" / "fastest.plan"
    out.parent.mkdir()
    code = cli.main(["search", str(ROOT / "plans/llama3_70b.plan"), "--top", "5", "--json", "-o", str(out)])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert [row["rank"] for row in doc["layouts"]] == [1, 2, 3, 4, 5]
    steps = [row["step_s"] for row in doc["layouts"]]
    assert steps == sorted(steps) and doc["as_written"]["step_s"] >= steps[0]
    assert doc["as_written"]["busiest_link"]["link"] in ("nvlink", "ib")
    assert all(row["memory_bytes"] + row["headroom_bytes"] == 80 * 2**30 and row["headroom_bytes"] >= 0 for row in doc["layouts"])
    # the written plan: read back as a user's file, lint finds nothing, and explain gives
    # the step the table printed for the first row
    res = load_paths([out])
    assert [d for d in res.diagnostics if d.severity.value in ("error", "warning")] == []
    (plan,) = res.own_plans
    assert plan.name == "fastest" and plan.world_size == 64
    assert cli.main(["explain", str(out), "--json"]) == 0
    explained = json.loads(capsys.readouterr().out)
    assert explained["step_time_s"] == pytest.approx(steps[0], rel=1e-12)
    best = doc["layouts"][0]
    assert [(a.name, a.size, a.link) for a in plan.mesh.axes] == [(a["axis"], a["size"], a["link"]) for a in best["mesh"]]
    assert plan.train.micro_batch == int(best["layout"]["micro_batch"]) and plan.microbatches == best["microbatches"]


ONE_GPU = """
cluster one_h100 {
    nodes = 1
    gpus_per_node = 1
    device = h100_sxm
    host_memory = 2 TB
    link pcie { scope = node; bandwidth = 50 GB/s; latency = 5 us }
}

plan llama8b {
    model llama { layers = 32; hidden = 4096; heads = 32; kv_heads = 8; ffn = 14336; vocab = 128256; seq_len = 4096 }
    cluster = one_h100
    train {
        steps = 100
        global_batch = 8
    }
}
"""


@pytest.mark.parametrize("written", ["", "offload { optimizer = false }"])
def test_search_offloads_a_model_that_fits_only_with_offload_and_writes_it(tmp_path, capsys, written):
    """Llama 3 8B on one H100: 16 GB of bf16 weights, as much of gradients and 96 GB of
    Adam's state and master weights fit with no recompute, micro-batch or ZeRO stage, so
    the search offloads; the fastest layout keeps the optimizer on the host, its plan file
    writes the offload block (or rewrites the one that offloads nothing), lints clean and
    explains to its row."""
    src, out = tmp_path / "big.plan", tmp_path / "offloaded.plan"
    src.write_text(ONE_GPU.replace("global_batch = 8\n", f"global_batch = 8\n        {written}\n"))
    assert cli.main(["search", str(src), "--top", "3", "--json", "-o", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out)
    best = doc["layouts"][0]
    assert best["layout"]["offload"].startswith("optimizer"), best["layout"]
    assert all("offload" in row["layout"] for row in doc["layouts"])  # nothing fits without
    res = load_paths([out])
    assert [d for d in res.diagnostics if d.severity.value in ("error", "warning")] == []
    (plan,) = res.own_plans
    assert plan.train.offload is not None and plan.train.offload.optimizer
    assert "offload { optimizer = true" in out.read_text() and "optimizer = false" not in out.read_text()
    assert cli.main(["explain", str(out), "--json"]) == 0
    explained = json.loads(capsys.readouterr().out)
    assert explained["step_time_s"] == pytest.approx(best["step_s"], rel=1e-12)
    assert explained["offload"]["stages"][0]["master_host_bytes"] > 0


def test_search_table_shows_the_plan_as_written_below_the_fastest(capsys):
    assert cli.main(["search", str(ROOT / "plans/tiny_demo.plan"), "--top", "3", "-q"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0].split()[:3] == ["#", "layout", "schedule"]
    ranks = [line.split()[0] for line in lines[2:] if line.strip()]
    assert ranks == ["1", "2", "3", "plan"]
    assert "(as written)" in lines[-1] and not any(line != line.rstrip() for line in lines)
    assert "tiny_demo on 4 × cpu" in captured.err and "layouts costed" in captured.err


def test_the_plan_as_written_is_shown_once(capsys):
    """tiny_moe's own layout ranks 3: its row says "(as written)", and no second row of it
    follows the table (the ranked copy was a plan equal in layout, not in every field)."""
    assert cli.main(["search", str(ROOT / "plans/tiny_moe.plan"), "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum("(as written)" in line for line in lines) == 1
    assert not any(line.startswith("plan ") for line in lines)


def test_every_table_search_prints_fits_in_120_columns(capsys):
    """At 1,024 GPUs four axes and long lists of changes made the table about 220 columns
    wide: now each row is a line of at most 120 columns with its changes wrapped on lines of
    their own under it; a small plan's table keeps a row a line, its changes in a column."""
    assert cli.main(["search", str(ROOT / "plans/llama3_70b.plan"), "--gpus", "1024", "--top", "12", "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(cell_len(line) for line in lines) <= 120 and len(lines[0]) >= 100
    ranks = [line.split()[0] for line in lines[2:] if line[:4].strip()]
    assert ranks == [str(i) for i in range(1, 13)], lines
    under = " ".join(" ".join(line.split()) for line in lines[3:5])
    assert cli.main(["search", str(ROOT / "plans/llama3_70b.plan"), "--gpus", "1024", "--top", "1", "-q", "--json"]) == 0
    changes = json.loads(capsys.readouterr().out)["layouts"][0]["changes"]
    assert len(changes) > 2 and all(c in under for c in changes), (changes, under)  # the first row's changes, under it
    assert cli.main(["search", str(ROOT / "plans/tiny_demo.plan"), "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(cell_len(line) for line in lines) <= 120 and lines[0].rstrip().endswith("differs from the plan as written")


@pytest.mark.parametrize("argv, code, message", [
    (["--gpus", "12"], 2, "is not a whole number of h100_8x8's nodes of 8 GPUs"),
    (["--gpus", "0"], 2, "--gpus must be at least 1"),
    (["--gpus", "1000000000000000"], 2, "at most 262144 GPUs (2¹⁸, E037)"),  # was still running after 20 s
    (["--gpus", "262152"], 2, "at most 262144 GPUs"),  # a whole number of nodes, one node too many
    (["--top", "0"], 2, "--top must be at least 1"),
    (["--fix", "tp"], 2, "--fix takes"),
])
def test_search_usage_errors_are_one_line(argv, code, message, capsys):
    assert cli.main(["search", str(ROOT / "plans/llama3_70b.plan"), *argv]) == code
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_the_written_plan_is_named_after_its_file_made_whole_and_never_the_input(tmp_path, capsys):
    demo = ROOT / "plans/tiny_demo.plan"
    mask = os.umask(0o022)
    try:
        assert cli.main(["search", str(demo), "-q", "--top", "1", "-o", str(tmp_path / "true.plan")]) == 0
    finally:
        os.umask(mask)
    written = tmp_path / "true.plan"
    assert re.search(r"^plan tiny_demo_searched \{", written.read_text(), re.MULTILINE)  # `true` is a keyword
    assert written.stat().st_mode & 0o777 == 0o644 and os.listdir(tmp_path) == ["true.plan"]
    before = demo.read_bytes()
    for target, message in ((demo, "is the plan being searched"), (tmp_path / "no" / "x.plan", "no folder"),
                            (tmp_path, "it is a folder")):
        capsys.readouterr()
        assert cli.main(["search", str(demo), "-q", "-o", str(target)]) == 2
        err = capsys.readouterr().err
        assert message in err and "layouts costed" not in err  # refused before the search
    assert demo.read_bytes() == before


def test_the_written_plan_is_never_a_file_the_plan_imports(tmp_path, capsys):
    """``-o`` naming the plan's own import (by name, link or hard link) is refused in one line
    before the search, as the plan itself is, and the import is left as it was (it was an
    internal error, WriteError: the written plan would import itself)."""
    (tmp_path / "cl.plan").write_bytes((ROOT / "clusters/h100.plan").read_bytes())
    text = (ROOT / "plans/llama3_70b.plan").read_text().replace("../clusters/h100.plan", "cl.plan")
    (tmp_path / "p.plan").write_text(text)
    (tmp_path / "link.plan").symlink_to("cl.plan")
    os.link(tmp_path / "cl.plan", tmp_path / "hard.plan")
    before = (tmp_path / "cl.plan").read_bytes()
    for target in ("cl.plan", "link.plan", "hard.plan"):
        capsys.readouterr()
        assert cli.main(["search", str(tmp_path / "p.plan"), "-q", "-o", str(tmp_path / target)]) == 2
        err = capsys.readouterr().err
        assert "a file the plan being searched imports" in err and len(err.strip().splitlines()) == 1, err
        assert "internal error" not in err and "layouts costed" not in err
    assert (tmp_path / "cl.plan").read_bytes() == before


AT_THE_BOUNDS = """
cluster big {
    nodes = 32768
    gpus_per_node = 8
    device = h100_sxm
    link nvlink { scope = node;    bandwidth = 450 GB/s; latency = 2 us }
    link ib     { scope = cluster; bandwidth = 400 Gb/s; latency = 8 us }
}
plan huge {
    model MODEL {
        layers = 65536; hidden = 4096; heads = 32; kv_heads = 8
        ffn = 14336; vocab = 32000; seq_len = 65536
    }
    EXPERTS
    cluster = big
    mesh { MESH }
    train { steps = 10; micro_batch = 1; global_batch = BATCH; precision = bf16; data = synthetic }
}
"""


@pytest.mark.parametrize("model, experts, mesh, batch", [
    ("mixtral", "experts { count = 65536; top_k = 2 }", "dp = 262144 on ib", 2**33),  # 8,165 shapes: still going after 45 s
    ("llama", "", "dp = 32768 on ib; tp = 8 on nvlink", 2**15),  # every memory test walks 65,536 layers
])
def test_a_plan_at_every_bound_is_searched_within_the_bounds(tmp_path, model, experts, mesh, batch):
    """2¹⁸ GPUs, 65,536 layers (and experts): the search probes at most MAX_DEGREES degree
    combinations and stops at its work bound, says so, and ends in seconds (here about 6 and
    16 s on 2 shared cores; it ran for minutes)."""
    text = AT_THE_BOUNDS.replace("MODEL", model).replace("EXPERTS", experts).replace("MESH", mesh).replace("BATCH", str(batch))
    (tmp_path / "huge.plan").write_text(text)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "dslc", "search", str(tmp_path / "huge.plan"), "-q", "--json"],
                          capture_output=True, text=True, env=env, timeout=90)
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    assert "more degree combinations not probed (the search's bound)" in done.stderr, done.stderr[-400:]
    took = float(re.search(r", in ([0-9.]+) s;", done.stderr).group(1))
    assert took < 45, done.stderr[-400:]  # the issue's: still enumerating after 45 s (64 s on main's code here)
    if done.returncode == 0:
        assert json.loads(done.stdout)["unprobed_degrees"] > 0


def test_search_takes_a_plan_that_does_not_fit_and_refuses_one_with_other_errors(tmp_path, capsys):
    text = (ROOT / "plans/llama3_70b.plan").read_text().replace("zero = 1", "zero = 0").replace("recompute = selective", "recompute = none")
    (tmp_path / "big.plan").write_text(text.replace("../clusters", str(ROOT / "clusters")))
    assert cli.main(["search", str(tmp_path / "big.plan"), "--top", "1", "-q", "--fix", "mesh"]) == 0
    captured = capsys.readouterr()
    assert "E090" in captured.err and "does not fit or does not pass the rules" in captured.err
    (tmp_path / "bad.plan").write_text(text.replace("../clusters", str(ROOT / "clusters")).replace("heads = 64", "heads = 63"))
    assert cli.main(["search", str(tmp_path / "bad.plan")]) == 1


def test_the_summary_names_the_rule_or_the_memory_that_refused_the_plan_as_written(tmp_path, capsys):
    """Not "does not fit or does not pass the rules" alone: the code and message of each rule
    (E030 for a mesh of 64 ranks on --gpus 128), or E090's figures, on the summary's line
    and in the JSON."""
    assert cli.main(["search", str(ROOT / "plans/llama3_70b.plan"), "--gpus", "128", "--top", "1", "-q", "--json"]) == 0
    captured = capsys.readouterr()
    (line,) = [x for x in captured.err.splitlines() if x.startswith("dslc: llama3_70b on 128")]
    assert "(E030: mesh has 64 ranks (dp=2 × pp=4 × tp=8) but cluster 'h100_8x8' has 128 GPUs (16 nodes × 8))" in line
    assert [r["code"] for r in json.loads(captured.out)["as_written_refused"]] == ["E030"]
    text = (ROOT / "plans/llama3_70b.plan").read_text().replace("zero = 1", "zero = 0").replace("recompute = selective", "recompute = none")
    (tmp_path / "big.plan").write_text(text.replace("../clusters", str(ROOT / "clusters")))
    assert cli.main(["search", str(tmp_path / "big.plan"), "--top", "1", "-q", "--fix", "mesh"]) == 0
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("dslc: llama3_70b on 64")]
    assert re.search(r"the rules on these GPUs \(E090: needs 8\d\.\d GiB per GPU but h100_sxm has 80\.0 GiB\)", line), line


def test_a_batch_that_holds_the_layouts_back_is_said_and_a_larger_one_offered_not_taken(tmp_path, capsys):
    """64 sequences on 1,024 GPUs: the fastest layout splits sequences and layers over the
    GPUs dp cannot take, and its pipeline idles; the search says so, keeps the plan's batch
    (each layout, and the plan it writes, at 64), and offers the batch at which the layouts
    are not held back with the MFU a search there finds, the same as --global-batch finds."""
    plan = ROOT / "plans/llama3_70b.plan"
    assert cli.main(["search", str(plan), "--gpus", "1024", "--top", "1", "-q", "--json", "-o", str(tmp_path / "kept.plan")]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    advice = doc["batch_limits"]
    assert doc["global_batch"] == 64 and advice["offered_global_batch"] == 1024
    assert advice["limits"][0].startswith("64 sequences a step on 1024 GPUs: at most 64 data-parallel ranks")
    assert advice["offered_mfu"] > (1 + batch.GAIN) * advice["mfu"] and advice["mfu"] == doc["layouts"][0]["mfu"]
    assert "dslc: the global batch holds these layouts back: 64 sequences a step on 1024 GPUs" in captured.err
    assert "the search keeps the plan's global_batch = 64, a training setting" in captured.err
    assert "--global-batch 1024 searches at 1024" in captured.err
    assert _plan(tmp_path / "kept.plan").train.global_batch == 64  # not changed silently
    # the offer holds: --global-batch 1024 finds that MFU, and writes the batch with the layout
    out = tmp_path / "big.plan"
    assert cli.main(["search", str(plan), "--gpus", "1024", "--top", "1", "-q", "--json", "--global-batch", "1024", "-o", str(out)]) == 0
    captured = capsys.readouterr()
    found = json.loads(captured.out)["layouts"][0]["mfu"]  # the whole search; the offer's is a floor when cut short
    assert found == pytest.approx(advice["offered_mfu"], rel=1e-12) if not advice["offered_mfu_at_least"] else found > advice["offered_mfu"]
    assert "dslc: searched at global_batch = 1024 (--global-batch; the plan writes 64)" in captured.err
    assert "//          global_batch 64→1024\n" in out.read_text() and _plan(out).train.global_batch == 1024
    assert [d for d in load_paths([out]).diagnostics if d.severity.value in ("error", "warning")] == []
    # a batch that holds nothing back: not a word of it
    assert cli.main(["search", str(ROOT / "plans/tiny_demo.plan"), "-q", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["batch_limits"] is None and "global batch" not in captured.err
    assert cli.main(["search", str(plan), "--global-batch", "0"]) == 2
    assert "--global-batch must be from 1 to" in capsys.readouterr().err


def test_the_offer_is_searched_within_what_is_left_of_the_work_bound(capsys):
    """The search at the offered batch (more micro-batches: a costlier estimate of each
    layout) spends at most OFFER_WORK, and only what the plan's search left of WORK; one cut
    short says its MFU is a floor ("at least"), below what the whole search finds."""
    plan = _plan(ROOT / "plans/llama3_70b.plan")
    result = search.search(plan, gpus=1024)
    offered = batch.advise(plan, result, 1024)
    short = batch.advise(plan, dataclasses.replace(result, work=search.WORK - 6 * 10**5), 1024)
    whole = search.search(dataclasses.replace(plan, train=dataclasses.replace(plan.train, global_batch=1024)), 1024)
    assert whole.work > batch.OFFER_WORK and offered.at_least and short.at_least and short.offered == offered.offered == 1024
    assert (1 + batch.GAIN) * short.mfu < short.offered_mfu <= offered.offered_mfu < whole.ranked[0].timing.mfu
    lines = report.batch_lines(result, short, 64)
    assert "the fastest layout reaches at least" in lines[-1]


def test_the_batch_that_lifts_the_limits_follows_the_rule():
    """A sequence a GPU, and a pipeline whose bubble b, shrinking as 1/m, is under IDLE of its
    time: the smallest power-of-two multiple of the batch that does both."""

    plan = _plan(ROOT / "plans/llama3_70b.plan")
    result = search.search(plan, gpus=1024)
    best = result.ranked[0]
    b = best.timing.bubble_fraction
    k = max(4, math.ceil(math.log2(b / (batch.IDLE / (1 - batch.IDLE)))) if best.plan.pp > 1 and b / (1 + b) >= batch.IDLE else 4)
    assert batch.batch_that_lifts(result) == 64 << k
    assert batch.limits(search.search(_plan(ROOT / "plans/tiny_demo.plan"))) == ()


def test_fixed_settings_are_kept_as_written():
    plan = _plan(ROOT / "plans/llama3_70b.plan")
    found = search.search(plan, fixed=frozenset({"mesh", "recompute"})).ranked
    assert found and all((f.plan.dp, f.plan.pp, f.plan.tp, f.plan.cp) == (2, 4, 8, 1) for f in found)
    assert {f.plan.train.recompute for f in found} == {"selective"}


def test_more_gpus_scale_the_cluster_by_whole_nodes():
    plan = _plan(ROOT / "plans/llama3_8b.plan")
    result = search.search(plan, gpus=4 * plan.cluster.world_size)
    assert result.plan.cluster.nodes == 4 * plan.cluster.nodes and result.ranked
    assert all(f.plan.world_size == 4 * plan.cluster.world_size for f in result.ranked)
    assert result.own is None  # its mesh has a quarter of the ranks


# --------------------------------------------------------------------------- every candidate passes lint


@st.composite
def small_plans(draw):
    """A model and cluster small enough to search in a second: a llama or a mixture of
    experts, 1-4 nodes of 1-8 devices with a node and a cluster link, a global batch."""
    moe = draw(st.booleans())
    heads = draw(st.sampled_from([4, 8, 16]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8, 16) if heads % h == 0]))
    layers = draw(st.integers(2, 12))
    hidden = heads * draw(st.sampled_from([16, 32, 64]))
    nodes, gpn = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2, 4, 8]))
    batch = draw(st.sampled_from([8, 16, 32, 64]))
    memory = draw(st.sampled_from(["80 GiB", "2 GiB", "200 MiB"]))
    experts = f"; experts = {draw(st.sampled_from([2, 4, 8]))}; top_k = 2" if moe else ""
    text = f"""
    cluster c {{
        nodes = {nodes}; gpus_per_node = {gpn}; device = h100_sxm; device_memory = {memory}
        link nv {{ scope = node; bandwidth = 450 GB/s; latency = 2 us }}
        link ib {{ scope = cluster; bandwidth = 50 GB/s; latency = 8 us }}
    }}
    plan p {{
        model {'mixtral' if moe else 'llama'} {{ layers = {layers}; hidden = {hidden}; heads = {heads}; kv_heads = {kv}; ffn = {2 * hidden}; vocab = 512; seq_len = {draw(st.sampled_from([256, 1024, 4096]))}{experts} }}
        cluster = c
        mesh {{ dp = {nodes * gpn} on {'ib' if nodes > 1 else 'nv'} }}
        train {{ micro_batch = 1; global_batch = {batch}; precision = bf16 }}
    }}
    """
    res = load_text(text, "random.plan", check=False)
    assert not [d for d in res.diagnostics if d.is_error], res.diagnostics
    return res.program.plans[0]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_plans())
def test_every_layout_the_search_proposes_passes_lint_and_fits(plan):
    result = search.search(plan, beam=3)
    steps = [f.timing.step for f in result.ranked]
    assert steps == sorted(steps)
    for f in result.ranked:
        diags = [d for d in lint(f.plan) if d.severity.value in ("error", "warning")]
        assert diags == [], (search.knobs(f.plan), [(d.code, d.message) for d in diags])
        assert f.plan.world_size == plan.cluster.world_size and f.headroom >= 0
        assert f.plan.model == plan.model and f.plan.train.global_batch == plan.train.global_batch


# --------------------------------------------------------------------------- published layouts


def _within(result, top: int = 5, slack: float = 0.10) -> tuple[bool, str]:
    """Whether the plan as written is among the ``top`` distinct fastest layouts or within
    ``slack`` of the fastest step, and where it stands."""
    own, best = result.own, result.ranked[0]
    shown = report.rows(result, top)
    ratio = own.timing.step / best.timing.step
    where = f"rank {report.own_rank(result)}, {ratio:.3f}× the fastest ({search.layout_label(best.plan)}: {', '.join(best.changes)})"
    return any(r.found.plan == own.plan for r in shown) or ratio <= 1 + slack, where


def _search(run, plan, **kw):
    return search.search(plan, settings=run.settings, **kw)


def _no_dropout(plan):
    """The model without dropout: dslc's script refuses dropout with tp (E100), so a layout
    with tp could not be proposed; dropout changes no cost the estimate sees."""
    return dataclasses.replace(plan, model=dataclasses.replace(plan.model, dropout=0.0))


def test_torchtitan_llama3_8b_on_128_h100s_is_within_10_percent_of_the_best():
    run = RUNS["titan_8b_fsdp128"]
    ok, where = _within(_search(run, _plan(ROOT / "benchmarks/published/torchtitan.plan", run.plan)))
    assert ok, where


def test_korthikanti_175b_is_within_10_percent_of_the_best_without_dropout():
    run = RUNS["ko_175b_selective_sp"]
    plan = _plan(ROOT / "benchmarks/published/megatron_a100.plan", run.plan)
    assert [d.code for d in lint(plan) if d.is_error] == ["E100"]  # dropout with tp: the script refuses it
    ok, where = _within(_search(run, _no_dropout(plan)))
    assert ok, where


def test_sc21_1_7b_is_within_10_percent_at_the_recompute_sc21_used():
    """SC21 recomputed every layer (Megatron had nothing lighter in 2021): the search, free
    to keep the activations of a 1.7B model, finds that faster; at full recompute the
    published layout is within 10 %."""
    run = RUNS["sc21_1_7b"]
    plan = _plan(ROOT / "benchmarks/published/megatron_a100.plan", run.plan)
    ok, where = _within(_search(run, plan))
    assert not ok and plan.train.recompute == "full", where  # else the README's reason is stale
    ok, where = _within(_search(run, plan, fixed=frozenset({"recompute"})))
    assert ok, where


def test_sc21_18b_is_not_near_the_top_and_its_own_estimate_is_held_to_what_sc21_measured():
    """With everything SC21 held (full recompute, no ZeRO, no sequence parallelism, one
    sequence a micro-batch), the search still prefers tp 4 × pp 2 to the published tp 8
    alone, by about 12 %; the published layout's own estimate is within 15 % of SC21's measured step
    (tests/test_published.py), so the disagreement is over layouts SC21 did not run."""
    run = RUNS["sc21_18b"]
    plan = _no_dropout(_plan(ROOT / "benchmarks/published/megatron_a100.plan", run.plan))
    result = _search(run, plan, fixed=frozenset({"recompute", "zero", "schedule", "micro_batch", "sp"}))
    ok, where = _within(result)
    assert not ok, f"now {where}: update the README's published-layout table"
    assert abs(result.own.timing.step / run.step - 1) <= 0.15
    assert result.ranked[0].plan.tp < plan.tp and result.ranked[0].plan.pp > 1


def test_llama3_405b_on_16k_gpus_is_in_the_top_5_at_the_settings_meta_chose():
    """Meta's layout (Dubey et al. 2024, Table 4) is among the 5 fastest the search finds over
    every mesh of 16,384 GPUs when zero, recompute, schedule and micro-batch are held as Meta
    ran them (the virtual stages, which the paper does not give, at the plan's 2). Free to
    choose those too, the search takes more virtual stages, cp and no recompute: the
    estimate puts Meta's layout at 26 % MFU where Meta measured 38 % (a pipeline bubble of
    half the compute at 16 micro-batches over 16 stages, and ZeRO-3's exposed gathers)."""
    plan = _plan(ROOT / "benchmarks/published/llama3_405b.plan")
    result = search.search(plan, fixed=frozenset({"zero", "recompute", "schedule", "micro_batch"}))
    ok, where = _within(result, slack=0.0)
    assert ok, where
    measured = 0.38  # Table 4's BF16 MFU at 16,384 GPUs and 8K context
    assert result.own.timing.mfu < measured - 0.08, f"MFU {result.own.timing.mfu:.3f}: update the README"
