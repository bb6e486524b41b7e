"""Every number lint accepts is one the rest of the pipeline accepts (issue 10).

A number out of its stated range (front/defaults.py BOUNDS, docs/language.md) is a
diagnostic at the value, never an internal error (exit 3) or a refusal by compile; the
largest accepted sizes run in seconds; JSON output holds no NaN or Infinity."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dslc import codegen
from dslc.cli import main
from dslc.codes import CODES
from dslc.cost import deadlock, schedule
from dslc.cost.time import timing
from dslc.cost.topology import Topology
from dslc.driver import load_text
from dslc.front.defaults import BOUNDS, DEFAULTS, MAX_RANKS, MAX_SCHEDULE
from dslc.front.schema import written
from dslc.report import explain
from dslc.report.draw import to_json as schedule_json
from dslc.units import resolve

DOC = (Path(__file__).resolve().parents[1] / "docs" / "language.md").read_text()

BASE = """\
cluster c {
    nodes = 1
    gpus_per_node = 2
    device = h100_sxm
    link nvlink { scope = node; bandwidth = 450 GB/s; latency = 2 us }
}
plan p {
    model gpt2 { layers = 4; hidden = 128; heads = 4; vocab = 256; seq_len = 64 }
    cluster = c
    mesh { pp = 2 on nvlink }
    pipeline { microbatches = 4 }
    train { steps = 10; micro_batch = 1 }
}
"""


def plan_text(**subs: str) -> str:
    """BASE with each ``old=new`` replacement (keys name the text to replace)."""
    text = BASE
    for old, new in subs.values():
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


def lint(tmp_path, text: str, capsys, command: str = "lint") -> tuple[int, str]:
    path = tmp_path / "t.plan"
    path.write_text(text)
    code = main([command, str(path)])
    out = capsys.readouterr()
    return code, out.out + out.err


def at(text: str, needle: str) -> str:
    """``line:col`` of the first ``needle`` in ``text`` (1-based, as diagnostics print)."""
    i = text.index(needle)
    line = text.count("\n", 0, i) + 1
    return f"{line}:{i - text.rfind(chr(10), 0, i)}"


def assert_diagnostic(tmp_path, capsys, text: str, code: str, needle: str) -> str:
    rc, out = lint(tmp_path, text, capsys)
    assert rc == 1, out
    assert f"t.plan:{at(text, needle)}: error[{code}]" in out, out
    assert "internal error" not in out
    return out


# ---------------------------------------------------------------------------- finding 1


def test_huge_integer_is_out_of_range_not_an_internal_error(tmp_path, capsys):
    big = "1" + "0" * 400
    text = plan_text(h=("hidden = 128", f"hidden = {big}"))
    out = assert_diagnostic(tmp_path, capsys, text, "E015", big)
    assert "'hidden' must be between 1 and 1048576" in out


def test_infinite_device_memory_is_out_of_range(tmp_path, capsys):
    text = plan_text(m=("device = h100_sxm", "device = h100_sxm; device_memory = 1e999 GiB"))
    out = assert_diagnostic(tmp_path, capsys, text, "E015", "1e999 GiB")
    assert "1 MiB and 1024 TiB" in out


def test_subnormal_peak_flops_is_out_of_range(tmp_path, capsys):
    text = plan_text(m=("device = h100_sxm", "device = h100_sxm; peak_flops = 1e-320 FLOP/s"))
    assert_diagnostic(tmp_path, capsys, text, "E015", "1e-320")


@pytest.mark.parametrize("sub, needle", [
    (("micro_batch = 1", "micro_batch = 1; optimizer adamw { lr = 1e999 }"), "1e999"),
    (("micro_batch = 1", "micro_batch = 1; seed = 9223372036854775808"), "9223372036854775808"),
    (("micro_batch = 1", "micro_batch = 1; optimizer adamw { betas = (1" + "0" * 400 + ", 0.9) }"), "(1"),
    (("micro_batch = 1", "micro_batch = 1; grad_clip = 1" + "0" * 400), "1" + "0" * 400),
    (("bandwidth = 450 GB/s", "bandwidth = 1" + "0" * 400 + " GB/s"), "1" + "0" * 400),
    (("latency = 2 us", "latency = 1e999 s"), "1e999"),
    (("seq_len = 64", "seq_len = 64; norm_eps = 1e-320"), "1e-320"),
])
def test_numbers_compile_would_refuse_are_lint_errors(tmp_path, capsys, sub, needle):
    assert_diagnostic(tmp_path, capsys, plan_text(s=sub), "E015", needle)


def test_largest_seed_compiles(tmp_path):
    text = plan_text(s=("micro_batch = 1", f"micro_batch = 1; seed = {2**63 - 1}"))
    res = load_text(text, str(tmp_path / "t.plan"))
    assert not [d for d in res.diagnostics if d.is_error]
    files = codegen.render(res.plans[0], tmp_path / "gen")
    assert str(2**63 - 1) in "".join(files.values())


@pytest.mark.parametrize("edge", [0, 1])
def test_every_float_at_its_edge_explains_and_compiles(tmp_path, edge):
    """Each float key at the low (then the high) end of its range: finite estimates, finite
    JSON, a script."""
    def val(key):
        return written(BOUNDS[key][edge])

    text = plan_text(
        m=("model gpt2 {", f"model llama {{ norm_eps = {val('model.norm_eps')}; rope_theta = {val('model.rope_theta')}; dropout = {val('model.dropout')};"),
        t=("micro_batch = 1", f"micro_batch = 1; grad_clip = {val('train.grad_clip')}; optimizer adamw {{ lr = {val('optimizer.lr')}; "
                              f"eps = {val('optimizer.eps')}; weight_decay = {val('optimizer.weight_decay')} }}; lr_schedule cosine {{ min_lr = {val('lr_schedule.min_lr')} }}"),
        c=("device = h100_sxm", f"device = h100_sxm; peak_flops = {val('cluster.peak_flops')}; device_memory = {BOUNDS['cluster.device_memory'][1]}"),
        b=("bandwidth = 450 GB/s; latency = 2 us", f"bandwidth = {val('link.bandwidth')}; latency = {val('link.latency')}"),
    )
    res = load_text(text, str(tmp_path / "t.plan"))
    assert not [d.message for d in res.diagnostics if d.is_error]
    plan = res.plans[0]
    json.dumps(explain.to_json(explain.explain(plan)), allow_nan=False)
    assert explain.explain(plan).timing.step > 0
    if plan.model.dropout == 0:  # dropout with tp is the generator's own refusal
        codegen.render(plan, tmp_path / "gen")


def test_too_many_microbatches_is_a_diagnostic(tmp_path, capsys):
    text = plan_text(m=("microbatches = 4", "microbatches = 100000"))
    assert_diagnostic(tmp_path, capsys, text, "E015", "100000")


def test_schedule_longer_than_the_maximum_is_a_diagnostic(tmp_path, capsys):
    m = MAX_SCHEDULE // 2 + 2  # within the key's range, but pp × m is over
    text = plan_text(m=("microbatches = 4", f"microbatches = {m}"))
    out = assert_diagnostic(tmp_path, capsys, text, "E058", f"microbatches = {m}")
    assert str(MAX_SCHEDULE) in out


def test_schedule_derived_from_a_huge_global_batch_is_a_diagnostic(tmp_path, capsys):
    text = plan_text(m=("pipeline { microbatches = 4 }", ""), g=("micro_batch = 1", f"micro_batch = 1; global_batch = {2**40}"))
    assert_diagnostic(tmp_path, capsys, text, "E058", "global_batch =")


def test_largest_schedule_runs_in_seconds(tmp_path, capsys):
    """pp = 2 with MAX_SCHEDULE / 2 micro-batches: schedule (verified, simulated, drawn),
    explain and compile each take a few seconds (about 2-8 s each on one core)."""
    text = plan_text(m=("microbatches = 4", f"microbatches = {MAX_SCHEDULE // 2}"))
    path = tmp_path / "t.plan"
    path.write_text(text)
    for argv in (["schedule", str(path), "--json"], ["explain", str(path), "--json"], ["compile", "-o", str(tmp_path / "gen"), str(path)]):
        start = time.perf_counter()
        assert main(argv) == 0, capsys.readouterr().err
        assert time.perf_counter() - start < 30, argv
    capsys.readouterr()


def cluster_of(ranks: int, gpn: int = 8) -> str:
    return plan_text(n=("nodes = 1", f"nodes = {ranks // gpn}"), g=("gpus_per_node = 2", f"gpus_per_node = {gpn}"),
                     ib=("}\nplan", "    link ib { scope = cluster; bandwidth = 50 GB/s }\n}\nplan"),
                     mesh=("mesh { pp = 2 on nvlink }", f"mesh {{ dp = {ranks // 16} on ib; pp = 2 on ib; tp = 8 on nvlink }}"),
                     heads=("heads = 4", "heads = 8"))


def test_too_many_ranks_is_a_diagnostic(tmp_path, capsys):
    """Nodes and GPUs per node each in range, their product over (a 10⁹-rank mesh used to
    exhaust memory in explain)."""
    text = cluster_of(2 * MAX_RANKS)
    out = assert_diagnostic(tmp_path, capsys, text, "E037", "c {")
    assert str(MAX_RANKS) in out
    text = cluster_of(10**9)
    assert_diagnostic(tmp_path, capsys, text, "E015", str(10**9 // 8))


def test_largest_cluster_explains_and_compiles_in_seconds(tmp_path, capsys):
    """About 1 s each, with tied embeddings over pp (the script used to list every
    pipeline's embedding group as a literal, world / pp pairs, which black took minutes to
    format at this size; the script builds them at run time now)."""
    path = tmp_path / "t.plan"
    path.write_text(cluster_of(MAX_RANKS))
    for argv in (["explain", str(path), "--json"], ["compile", "-o", str(tmp_path / "gen"), str(path)]):
        start = time.perf_counter()
        assert main(argv) == 0, capsys.readouterr().err
        assert time.perf_counter() - start < 30, argv
    capsys.readouterr()


# ---------------------------------------------------------------------------- finding 2


def test_gpipe_bubble_is_worded_as_a_ratio_not_a_percentage_over_100(tmp_path, capsys):
    text = plan_text(m=("pipeline { microbatches = 4 }", "pipeline { schedule = gpipe; microbatches = 1 }"),
                     g=("mesh { pp = 2 on nvlink }", "mesh { pp = 2 on nvlink }"))
    text = text.replace("gpus_per_node = 2", "gpus_per_node = 4").replace("pp = 2 on", "pp = 4 on")
    rc, out = lint(tmp_path, text, capsys)
    (line,) = [x for x in out.splitlines() if "W055" in x]
    assert not [p for p in re.findall(r"(\d+) ?%", line) if int(p) > 100], line
    assert "3×" in line and "75%" in line, line


# ---------------------------------------------------------------------------- finding 3


def strict_json(text: str):
    def refuse(name):
        raise AssertionError(f"JSON holds {name}")

    return json.loads(text, parse_constant=refuse)


def test_json_at_the_extremes_is_finite(tmp_path, capsys):
    text = plan_text(f=("device = h100_sxm", "device = h100_sxm; peak_flops = 1 GFLOP/s; device_memory = 1024 TiB"),
                     b=("bandwidth = 450 GB/s", "bandwidth = 1 MB/s"))
    for command in ("explain", "schedule"):
        path = tmp_path / "t.plan"
        path.write_text(text)
        assert main([command, str(path), "--json"]) == 0
        strict_json(capsys.readouterr().out)


# ---------------------------------------------------------------------------- the table


def test_every_bound_is_stated_in_the_docs():
    limits = DOC[DOC.index("## Limits"):DOC.index("## Diagnostics")]
    for key, (lo, hi) in BOUNDS.items():
        assert f"| `{key}` | {written(lo)} | {written(hi)} |" in limits, key
    assert str(MAX_RANKS) in limits and str(MAX_SCHEDULE) in limits


def test_every_default_is_within_its_bound():
    for key, value in DEFAULTS.items():
        if key in BOUNDS and isinstance(value, (int, float)) and not isinstance(value, bool):
            lo, hi = (resolve(b) if isinstance(b, str) else b for b in BOUNDS[key])
            assert lo <= value <= hi, key


def test_new_codes_are_catalogued():
    assert {"E037", "E058"} <= set(CODES)


# ---------------------------------------------------------------------------- property

# Values for the numeric keys of BASE: typical, at and just beyond each edge, absurd.
EDGES = ["0", "1", "2", "3", "-1", "0.5", "1e-320", "1e999", "1" + "0" * 30, str(2**63), "1e-12", "100", "1e12"]


def field_values():
    return st.sampled_from(EDGES)


KEYS = {  # key → how the value is written into BASE
    "peak_flops": ("device = h100_sxm", "device = h100_sxm; peak_flops = {} TFLOP/s"),
    "device_memory": ("device = h100_sxm", "device = h100_sxm; device_memory = {} GiB"),
    "bandwidth": ("bandwidth = 450 GB/s", "bandwidth = {} GB/s"),
    "latency": ("latency = 2 us", "latency = {} us"),
    "layers": ("layers = 4", "layers = {}"),
    "microbatches": ("microbatches = 4", "microbatches = {}"),
    "lr": ("micro_batch = 1", "micro_batch = 1; optimizer adamw {{ lr = {} }}"),
    "seed": ("steps = 10", "steps = 10; seed = {}"),
    "grad_clip": ("steps = 10", "steps = 10; grad_clip = {}"),
    "steps": ("steps = 10", "steps = {}"),
    "seq_len": ("seq_len = 64", "seq_len = {}"),
    "vocab": ("vocab = 256", "vocab = {}"),
    "micro_batch": ("micro_batch = 1", "micro_batch = {}"),
    "eps": ("steps = 10", "steps = 10; optimizer adamw {{ eps = {} }}"),
}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(sorted(KEYS)), field_values(), max_size=3))
def test_what_lint_accepts_explain_schedule_and_compile_accept(tmp_path, values):
    text = BASE
    for key, value in values.items():
        old, new = KEYS[key]
        text = text.replace(old, new.format(value), 1)
    res = load_text(text, "<t>")
    if any(d.is_error for d in res.diagnostics):
        return
    plan = res.plans[0]
    json.dumps(explain.to_json(explain.explain(plan)), allow_nan=False)
    pl = plan.pipeline
    acts = schedule.build(pl.schedule, plan.pp, pl.microbatches, pl.virtual_stages)
    assert not deadlock.verify(acts)
    t, _ = timing(plan, Topology.of(plan), acts=acts)
    sim = schedule.simulate(acts, t.t_f * 1e3, t.t_b * 1e3, t.t_w * 1e3, t.t_comm * 1e3)
    json.dumps(schedule_json(plan, acts, sim, t), allow_nan=False)
    codegen.render(plan, tmp_path / "gen")
