"""dslc verify: the shrinker over every plan (no runs), the comparison on hand-made runs,
and (slow: multi-process runs) verify on plans/ with a pipeline and with experts, and on a
generated script broken on purpose."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dslc import cli, verify
from dslc.driver import lint, load_paths
from dslc.verify.compare import compare
from dslc.verify.shrink import shrink

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted((ROOT / "plans").glob("*.plan")) + sorted((ROOT / "tests" / "golden").glob("*.plan"))


@pytest.fixture(scope="module")
def every_plan():
    result = load_paths(FILES)
    assert not [d for d in result.diagnostics if d.is_error]
    return result.program.plans


@pytest.mark.parametrize("procs", [8, 4])
def test_every_plan_shrinks_to_a_clean_plan_of_the_same_layout(every_plan, procs):
    """Every plan of plans/ and tests/golden/ shrinks to plans that lint clean, within the
    processes allowed, that keep the axes (in order, each degree a divisor of the plan's),
    the schedule, ZeRO stage, cp method, experts and recompute policy; the serial twin has
    the same model, global batch and micro-batch on one process."""
    assert len(every_plan) > 90
    for plan in every_plan:
        s = shrink(plan, procs)
        small, serial = s.plan, s.serial
        for p in (small, serial):
            errors = [f"{d.code} {d.message}" for d in lint(p) if d.is_error]
            assert not errors, (plan.name, p.name, errors)
        assert small.world_size <= procs and small.world_size == small.cluster.world_size
        names = [a.name for a in small.mesh.axes]
        assert names == [a.name for a in plan.mesh.axes if a.name in names]
        assert all(plan.mesh.size(a.name) % a.size == 0 for a in small.mesh.axes)
        if plan.world_size <= procs:
            assert [(a.name, a.size) for a in small.mesh.axes] == [(a.name, a.size) for a in plan.mesh.axes]
        else:
            assert any("does not fit" in n for n in s.notes)
        if small.pp > 1:
            assert small.pipeline.schedule == plan.pipeline.schedule
            assert small.pipeline.virtual_stages == plan.pipeline.virtual_stages
        assert small.data_parallel.zero == plan.data_parallel.zero
        assert small.data_parallel.reshard_after_forward == plan.data_parallel.reshard_after_forward
        assert small.context_parallel == plan.context_parallel
        assert small.tensor_parallel.sequence_parallel == (plan.tensor_parallel.sequence_parallel and small.tp > 1)
        m, mm = small.model, plan.model
        assert (m.arch, m.experts, m.top_k, m.capacity_factor, m.router, m.shared_experts, m.tie_embeddings) == (
            mm.arch, mm.experts, mm.top_k, mm.capacity_factor, mm.router, mm.shared_experts, mm.tie_embeddings)
        assert (m.kv_heads < m.heads) == (mm.kv_heads < mm.heads) and bool(m.dense_layers) == bool(mm.dense_layers)
        t, tt = small.train, plan.train
        assert (t.recompute, t.recompute_every, t.optimizer, t.grad_clip, t.seed) == (
            tt.recompute, tt.recompute_every, tt.optimizer, tt.grad_clip, tt.seed)
        assert t.precision == "fp32" and t.data.kind == "synthetic" and not (t.checkpoint or t.init or t.eval)
        assert m.layers <= 12 and m.hidden <= 128 and m.seq_len <= 64 and t.global_batch <= 32
        assert serial.world_size == 1 and serial.model == m and serial.train.global_batch == t.global_batch
        assert serial.train.micro_batch == t.micro_batch and serial.microbatches * t.micro_batch == t.global_batch
        if plan.pipeline.layers_per_stage and small.pp == plan.pp:
            shape = [n == 0 for n in plan.pipeline.layers_per_stage]
            assert [n == 0 for n in small.pipeline.layers_per_stage] == shape


def test_a_large_mesh_keeps_every_axis_and_says_what_it_reduced(every_plan):
    plans = {p.name: p for p in every_plan}
    s = shrink(plans["llama3_70b"])
    assert [(a.name, a.size) for a in s.plan.mesh.axes] == [("dp", 2), ("pp", 2), ("tp", 2)]
    assert "pp 4 → 2, tp 8 → 2" in s.notes[0]
    s = shrink(plans["mixtral_8x7b"])  # the evenest cut: both halved, not ep quartered
    assert [(a.name, a.size) for a in s.plan.mesh.axes] == [("pp", 2), ("ep", 4)]
    assert any("bf16 run in fp32" in n for n in s.notes)


def test_compare_passes_within_the_bound_and_names_the_first_step_and_tensor():
    import torch

    ref = [4.0, 3.9, 3.8]
    w = {"a": torch.ones(3), "b": torch.zeros(2, 2)}
    ok = compare([4.0, 3.9 * (1 + 5e-6), 3.8], ref, {k: v + 5e-6 for k, v in w.items()}, w)
    assert ok.passed and ok.first_bad_step is None and ok.summary().startswith("PASS")
    bad_w = {"a": torch.tensor([1.0, 1.0 + 3e-4, 1.0]), "b": torch.zeros(2, 2) + 2e-5}
    bad = compare([4.0, 3.9, 3.8 * 1.001], ref, bad_w, w)
    assert not bad.passed and bad.first_bad_step == 3
    assert bad.bad_tensors == ("a", "b") and bad.max_tensor == "a" and bad.max_diff == pytest.approx(3e-4, rel=1e-3)
    assert "step 3" in bad.summary() and "in a (by" in bad.summary()
    nan = compare([4.0, math.nan, 3.8], ref, w, w)
    assert not nan.passed and nan.first_bad_step == 2
    nan_w = compare(ref, ref, {"a": torch.full((3,), math.nan), "b": w["b"]}, w)
    assert not nan_w.passed and nan_w.bad_tensors == ("a",) and nan_w.max_diff == math.inf
    short = compare(ref[:2], ref, w, {**w, "c": torch.ones(1)})
    assert not short.passed and len(short.problems) == 2


def test_the_json_report_holds_a_nan(every_plan):
    import torch

    plan = next(p for p in every_plan if p.name == "tiny_demo")
    w = {"a": torch.ones(2)}
    outcome = verify.Outcome(plan.name, shrink(plan), compare([math.nan], [4.0], {"a": torch.full((2,), math.inf)}, w))
    doc = json.loads(json.dumps(outcome.to_json(), allow_nan=False))
    assert doc["steps"][0]["parallel"] == "nan" and doc["weights"]["max_diff"] == "inf" and not doc["passed"]


def test_a_one_process_plan_is_its_own_serial_model(every_plan, capsys):
    plan = next(p for p in every_plan if p.name == "long_context_serial")
    outcome = verify.verify(plan)
    assert outcome.passed and outcome.comparison is None


@pytest.mark.slow
@pytest.mark.parametrize("name, procs", [("llama3_70b", 8), ("mixtral_8x7b", 4)])
def test_verify_passes_on_a_plan_of_the_examples(name, procs, capsys):
    """plans/llama3_70b.plan (dp 2 × pp 4 interleaved × tp 8 + sp, ZeRO-1: shrunk to
    2 × 2 × 2) and plans/mixtral_8x7b.plan (pp 4 × ep 8, capacity, recompute full: shrunk
    to pp 2 × ep 2 in 4 processes, to keep the suite short) pass: exit 0, every step and
    the weights within 1e-5."""
    code = cli.main(["verify", str(ROOT / "plans" / f"{name}.plan"), "--json", "--max-procs", str(procs)])
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert code == 0, out.err
    assert doc["passed"] and doc["processes"] == procs and doc["first_bad_step"] is None
    assert len(doc["steps"]) == 3 and all(s["rel_diff"] <= 1e-5 for s in doc["steps"])
    assert doc["weights"]["tensors"] > 10 and doc["weights"]["max_diff"] < 1e-5
    assert f"ran the parallel script ({procs} processes)" in out.err
    if name == "mixtral_8x7b":
        assert doc["router_margin"] >= verify.MARGIN


def drop_dp_gradient_reduction(folder: Path) -> None:
    """The bug: data parallel's bucketed gradient all-reduce goes over tp, not dp."""
    path = folder / "data_parallel.py"
    text = path.read_text()
    old = "return all_reduce(self.grad, self.group, async_op=True)"
    assert old in text
    path.write_text(text.replace(old, 'return all_reduce(self.grad, "tp", async_op=True)'))


@pytest.mark.slow
def test_a_broken_script_fails_naming_the_step_and_tensor(every_plan, tmp_path):
    """tiny_demo (dp 2 × tp 2 + sp) with its gradients reduced over the wrong axis: the
    first step's loss still matches (the weights are the same until the first update),
    the second does not, and the weights differ."""
    from dslc.verify.show import render_text

    plan = next(p for p in every_plan if p.name == "tiny_demo")
    outcome = verify.verify(plan, patch=drop_dp_gradient_reduction, keep=tmp_path)
    c = outcome.comparison
    assert not outcome.passed and c.first_bad_step == 2 and c.steps[0].ok()
    assert c.bad_tensors and c.max_tensor in c.bad_tensors and c.max_diff > 1e-4
    text = "\n".join(line for line, _ in render_text(outcome))
    assert "FAIL: the loss first differs at step 2" in text and c.max_tensor in text
    assert (tmp_path / "tiny_demo" / "tiny_demo_verify" / "train.py").exists()  # --keep


@pytest.mark.slow
def test_a_crash_exits_2_with_the_failing_rank_s_error(every_plan, tmp_path):
    def crash(folder: Path) -> None:
        path = folder / "train.py"
        path.write_text(path.read_text().replace("args = parser.parse_args()", 'args = parser.parse_args()\nif os.environ["RANK"] == "1":\n    raise SystemExit("boom on rank 1")', 1))

    plan = next(p for p in every_plan if p.name == "tiny_demo")
    with pytest.raises(verify.RunFailed) as e:
        verify.verify(plan, max_procs=2, patch=crash)
    assert "parallel script (2 processes) failed" in str(e.value) and "boom on rank 1" in e.value.tail
