"""``dslc explain``: the time model (bubble fractions of the schedules), the report's
numbers agreeing with each other, the JSON contract, and scale."""

from __future__ import annotations

import json
from dataclasses import replace

import irbuild
import pytest
from irbuild import model

from dslc.cost import flops
from dslc.cost.memory import memory
from dslc.cost.schedule import build, simulate
from dslc.cost.time import timing
from dslc.cost.topology import Topology
from dslc.ir import Plan
from dslc.report import explain as report

LLAMA3_8B = model("llama", 32, 4096, 32, 128256, 8192, kv=8, ffn=14336, tie=False, name="llama3_8b", rope_theta=5e5)
TINY = model("gpt2", 8, 64, 4, 128, 32, ffn=256, dropout=0.1, name="tiny")
# layers whose work dwarfs the embedding and the head (vocab 256): every chunk costs nearly the same
WIDE = model("llama", 32, 4096, 32, 256, 4096, kv=8, ffn=14336, tie=False, name="wide")


def plan(mdl, *axes, m=8, zero=1, **kw):
    """irbuild.plan with this module's defaults: 8 micro-batches, ZeRO-1, plan "demo"."""
    return irbuild.plan(mdl, *axes, m=m, zero=zero, name="demo", **kw)


def llama_plan(**kw) -> Plan:
    return plan(LLAMA3_8B, ("dp", 2, "ib"), ("pp", 2, "nvlink"), ("tp", 4, "nvlink"), m=16, sp=True,
                schedule="interleaved_1f1b", v=2, recompute="selective", **kw)


# ---------------------------------------------------------------------------- bubbles


def _free_links(mdl, *axes, **kw):
    """A plan whose links cost nothing, so the bubble is the schedule's alone."""
    return plan(mdl, *axes, bandwidth=(1e30, 1e30), latency=(0.0, 0.0), **kw)


@pytest.mark.parametrize("schedule, p, m", [("1f1b", 4, 8), ("1f1b", 8, 32), ("gpipe", 4, 6)])
def test_bubble_is_p_minus_1_over_m(schedule, p, m):
    pl = _free_links(WIDE, ("pp", p, "ib"), m=m, schedule=schedule)
    t, _ = timing(pl, Topology.of(pl))
    assert t.bubble_fraction == pytest.approx((p - 1) / m, rel=0.05)  # Narayanan et al. SC21 §2.2


@pytest.mark.parametrize("p, v, m", [(4, 2, 8), (2, 4, 4)])
def test_interleaved_bubble_is_p_minus_1_over_vm(p, v, m):
    pl = _free_links(WIDE, ("pp", p, "ib"), m=m, schedule="interleaved_1f1b", v=v)
    t, _ = timing(pl, Topology.of(pl))
    assert t.bubble_fraction == pytest.approx((p - 1) / (v * m), rel=0.01)


def test_each_chunk_is_charged_its_own_work():
    """The chunk holding the head is heavier than the others; the others cost the same."""
    pl = _free_links(TINY, ("pp", 4, "ib"), m=8, schedule="interleaved_1f1b", v=2)
    t, _ = timing(pl, Topology.of(pl))
    forward = [f for f, _, _ in t.chunks]
    assert len(forward) == 8 and forward[-1] == max(forward) > forward[3]
    assert forward[1:-1] == pytest.approx([forward[1]] * 6, rel=1e-12)  # the embedding is on chunk 0


@pytest.mark.parametrize("p, layers", [(2, 64), (4, 32), (4, 80)])
def test_interleaved_step_falls_as_virtual_stages_grow(p, layers):
    """Balanced chunks (the layers split evenly): more virtual stages shrink the bubble and
    cost only more pp sends, so the step never grows (it did when every chunk was charged
    the head's chunk)."""
    mdl = replace(LLAMA3_8B, layers=layers)
    steps = [report.explain(plan(mdl, ("dp", 2, "ib"), ("pp", p, "nvlink"), ("tp", 8 // p, "nvlink"), m=16, sp=True,
                                 schedule="interleaved_1f1b" if v > 1 else "1f1b", v=v)).timing.step
             for v in (1, 2, 4, 8) if layers % (p * v) == 0]
    assert len(steps) >= 3 and all(b < a for a, b in zip(steps, steps[1:])), steps


@pytest.mark.parametrize("schedule, p, m", [("zb_v", 2, 4), ("zb_v", 4, 8), ("dualpipe_v", 2, 4), ("dualpipe_v", 4, 8)])
def test_v_schedules_explain_is_the_simulation_of_their_lists(schedule, p, m):
    """explain's bubble and activations in flight are those of simulating the compiled lists
    with each chunk's own F, B, W (nothing overlapped: dualpipe_v's F&B pair runs one after
    the other); both V schedules stay at or under ZB-H1's bubble and hold 2p (+1) chunks."""
    pl = _free_links(WIDE, ("pp", p, "ib"), m=m, schedule=schedule, v=2)
    t, sim = timing(pl, Topology.of(pl))
    f, b, w = (tuple(c[i] for c in t.chunks) for i in range(3))
    again = simulate(build(schedule, p, m, 2), f, b, w, t.t_comm)
    assert t.bubble_fraction == pytest.approx(again.bubble_fraction) and t.pipeline == pytest.approx(again.makespan)
    assert sim.peak_inflight == again.peak_inflight and max(again.peak_inflight) == 2 * p + (schedule == "dualpipe_v")
    zb = timing(_free_links(WIDE, ("pp", p, "ib"), m=m, schedule="zb_h1"), Topology.of(pl))[0]
    assert t.bubble_fraction <= zb.bubble_fraction * 1.02
    # the memory model finds the same chunks in flight from the schedule's shape alone
    assert [s.inflight for s in memory(pl)] == list(again.peak_inflight)


def test_zero_bubble_h1_idles_p_minus_1_times_tf_plus_tb_minus_tw():
    """Qi et al. 2023: ZB-H1's bubble is (p−1)(T_F + T_B − T_W)."""
    p, m = 4, 8
    pl = _free_links(WIDE, ("pp", p, "ib"), m=m, schedule="zb_h1")
    t, _ = timing(pl, Topology.of(pl))
    # W is the linears' weight gradients (one GEMM per forward GEMM), B the rest of the backward
    k = t.kernels
    assert t.t_w / t.t_f == pytest.approx(k.gemm / k.forward, rel=0.02)  # the head is small
    assert t.t_b + t.t_w == pytest.approx(k.backward / k.forward * t.t_f, rel=0.02)
    idle = t.pipeline - m * (t.t_f + t.t_b + t.t_w)
    assert idle == pytest.approx((p - 1) * (t.t_f + t.t_b - t.t_w), rel=0.02)


# ---------------------------------------------------------------------------- numbers agree


def test_step_time_tokens_and_mfu_agree():
    pl = llama_plan()
    doc = report.to_json(report.explain(pl))
    tokens = 1 * 16 * 2 * 8192
    assert doc["step_time_s"] == pytest.approx(doc["pipeline"]["makespan_s"] + doc["time"]["exposed_comm_s"] + doc["time"]["optimizer_s"])
    assert doc["tokens_per_s"] == pytest.approx(tokens / doc["step_time_s"])
    assert doc["mfu"] == pytest.approx(doc["flops_per_step"] / (doc["step_time_s"] * 16 * 989e12))
    assert 0 < doc["mfu"] < doc["time"]["calibration"]["gemm"]  # no kernel beats the GEMMs; communication only adds
    assert doc["hfu"] > doc["mfu"]  # selective recompute re-runs the attention core


def test_slower_links_make_a_slower_step():
    fast = report.explain(llama_plan()).timing.step
    slow = report.explain(llama_plan(bandwidth=(45e9, 5e9))).timing.step
    assert slow > fast


# ---------------------------------------------------------------------------- json


def test_json_contract():
    pl = llama_plan()
    doc = report.to_json(report.explain(pl))
    json.dumps(doc, allow_nan=False)
    for key in ("plan", "world_size", "params", "memory", "flops_per_step", "traffic", "pipeline", "step_time_s",
                "tokens_per_s", "mfu"):
        assert key in doc
    assert doc["plan"] == "demo" and doc["world_size"] == 16
    assert doc["params"]["total"] == 8_030_261_248
    assert doc["flops_per_step"] == flops.flops(pl).model
    assert [s["stage"] for s in doc["memory"]] == [0, 1]
    for s in doc["memory"]:
        states = s["params"] + s["grads"] + s["optimizer"]
        assert s["allocated"] == states + max(s["activations"] + s["unsharded"] + s["loss_chunk"] + s["ring_attention"], s["optimizer_temporaries"])
        assert s["allocated"] < s["reserved"] < s["total"]  # the caching allocator's reserve, then the CUDA context
        assert all(isinstance(s[k], int) for k in ("params", "grads", "optimizer", "activations", "allocated", "reserved", "total"))
    row_keys = {"axis", "collective", "calls_per_step", "payload_bytes_per_step", "wire_bytes_per_rank_per_step", "link",
                "seconds_per_step"}
    assert doc["traffic"] and all(row_keys <= set(r) for r in doc["traffic"])
    links = {(r["axis"], r["collective"]): r["link"] for r in doc["traffic"]}
    assert links["dp", "reduce_scatter"] == "ib" and links["tp", "all_gather"] == "nvlink" and links["pp", "send"] == "nvlink"
    assert 0 < doc["pipeline"]["bubble_fraction"] < 1
    assert {b["link"] for b in doc["busiest_links"]} == {"nvlink", "ib"}


def test_json_traffic_rows_are_the_busiest_stage_of_each_collective():
    pl = llama_plan()
    doc = report.to_json(report.explain(pl))
    for r in doc["traffic"]:
        same = [x["payload_bytes_per_step"] for st in doc["traffic_by_stage"] for x in st
                if (x["axis"], x["collective"], x["what"]) == (r["axis"], r["collective"], r["what"])]
        assert r["payload_bytes_per_step"] == max(same)


def test_json_has_no_nan_even_without_a_peak():
    doc = report.to_json(report.explain(plan(TINY, ("pp", 2, "ib"), peak=0.0)))
    text = json.dumps(doc, allow_nan=False)
    assert doc["step_time_s"] is None and doc["mfu"] is None and "NaN" not in text and "Infinity" not in text


def test_single_rank_plan():
    ex = report.explain(plan(TINY, m=4))
    assert ex.rows == () and ex.busiest == ()
    assert "(none: a single rank)" in report.render_text(ex)
    doc = report.to_json(ex)
    assert doc["world_size"] == 1 and doc["pipeline"]["bubble_fraction"] == 0.0


# ---------------------------------------------------------------------------- text


def test_text_report_has_every_section():
    text = report.render_text(report.explain(llama_plan()))
    for part in ("Memory per GPU", "Traffic per GPU per step", "Busiest link of each type", "Time per step", "MFU",
                 "tokens/s", "bubble", "GiB", "reduce_scatter", "ib NIC node"):
        assert part in text
    assert "error[E090]" not in text


def test_text_report_says_what_the_plan_reads():
    """The data line: synthetic, or the plan's files as it writes them, a blend's weights
    summing to 1, and the validation (issue 17)."""
    from dslc.ir import Data, Eval

    base = llama_plan()
    assert "\n  data     synthetic\n" in report.render_text(report.explain(base))
    a, b = (Data("tokens", f"{n}.bin", f"/d/{n}.bin", None) for n in "ab")
    val = Data("tokens", "val", "/d/val", None, dtype="uint32")
    train = replace(base.train, data=Data("blend", None, None, None, parts=((0.75, a), (0.25, b))), eval=Eval(200, 10, val, None))
    text = report.render_text(report.explain(replace(base, train=train)))
    want = ('  data     blend 0.75 tokens("a.bin") + 0.25 tokens("b.bin"); validation tokens("val", dtype = uint32),'
            " 10 global batches every 200 steps and after the last\n")
    assert want in text


def test_the_model_line_names_the_model_once():
    """`model llama { … }` is named once ("model    llama: …"); a model named apart from its
    arch says both ("model    llama3_8b (llama): …"), never "llama llama"."""
    base = llama_plan()
    same = replace(base, model=replace(base.model, name="llama"))
    assert "\n  model    llama: 32 layers" in report.render_text(report.explain(same))
    assert "\n  model    llama3_8b (llama): 32 layers" in report.render_text(report.explain(base))


def test_text_report_shows_the_memory_error():
    pl = plan(LLAMA3_8B, ("dp", 16, "ib"), zero=0, m=1)
    text = report.render_text(report.explain(pl))
    # 8.03 B params: zero 0 keeps 16Ψ = 120 GiB beside the 43 GiB of activations of an
    # 8192-token sequence; zero 2 keeps 2Ψ + 14Ψ/16 = 21.5 GiB, 73.4 GiB with the 1.2 GiB
    # chunk of the loss, the allocator's 6 % and the CUDA context (zero 1: 86 GiB, over)
    assert "error[E090]" in text and "help: it fits with any one of: zero = 2 (" in text and "zero = 1" not in text
    assert "NO" in text.split("Traffic")[0]


# ---------------------------------------------------------------------------- routing (MoE)


def _moe_plan(cf=0.0, **kw):
    mdl = model("mixtral", 4, 256, 8, 1024, 128, kv=4, ffn=512, tie=False, experts=8, top_k=2, cf=cf)
    return plan(mdl, ("dp", 2, "ib"), ("ep", 4, "ib"), ("tp", 2, "nvlink"), m=4, b=2, **kw)


def test_explain_states_dropless_routing_and_what_an_imbalance_costs():
    ex = report.explain(_moe_plan(sp=True))
    text = report.render_text(ex).split("Routing (mixture of experts)")[1]
    # 2 × 128 tokens per micro-batch, 128 per tp rank under SP, × top-2
    assert "dropless, uniform routing assumed" in text and "256 token slots per rank per MoE layer per micro-batch" in text
    assert "(8 int64)" in text and "bookkeeping, not counted" in text
    assert "load imbalance r" in text and "grow r×" in text
    lines = [ln.split() for ln in text.splitlines() if ln.split()[:1] in (["1"], ["1.5"], ["2"])]
    assert [ln[0] for ln in lines] == ["1", "1.5", "2"]
    doc = report.to_json(ex)["routing"]
    assert doc["mode"] == "dropless" and doc["capacity_per_sequence"] is None and doc["imbalance"] == 1.0
    assert doc["slots_per_rank_per_layer_per_microbatch"] == 256
    # 4 micro-batches × 4 layers × 4 all-to-alls × 256 slots × 256 hidden × 2 bytes
    assert doc["all_to_all_bytes_per_step"] == 4 * 4 * 4 * 256 * 256 * 2
    at = doc["at_imbalance"]
    assert [x["imbalance"] for x in at] == [1.5, 2.0]
    assert [x["all_to_all_bytes_per_step"] for x in at] == [3 * doc["all_to_all_bytes_per_step"] // 2, 2 * doc["all_to_all_bytes_per_step"]]
    step = report.to_json(ex)["step_time_s"]
    assert step < at[0]["step_time_s"] < at[1]["step_time_s"]


def test_explain_states_the_capacity_and_padded_buffers():
    ex = report.explain(_moe_plan(cf=1.25))
    text = report.render_text(ex)
    # C = ⌈1.25 · 2 · 128 / 8⌉ = 40; 8 experts × micro-batch 2 × 40 = 640 slots
    assert "capacity factor 1.25: C = 40 slots per expert per sequence, buffers padded" in text
    assert "640 token slots per rank per MoE layer per micro-batch" in text
    assert "bookkeeping" not in text  # no count exchange with a capacity
    doc = report.to_json(ex)["routing"]
    assert doc["mode"] == "capacity" and doc["capacity_per_sequence"] == 40 and doc["imbalance"] == 1.0
    assert doc["at_imbalance"] == []  # padded buffers: an imbalance costs dropped tokens, not time


def test_dense_plans_have_no_routing():
    ex = report.explain(llama_plan())
    assert "Routing" not in report.render_text(ex) and report.to_json(ex)["routing"] is None


# ---------------------------------------------------------------------------- scale and front end


def test_explain_at_131072_gpus_uses_classes():
    pl = plan(replace(LLAMA3_8B, layers=96), ("dp", 1024, "ib"), ("pp", 16, "ib"), ("tp", 8, "nvlink"), m=32, sp=True)
    ex = report.explain(pl)
    assert ex.plan.world_size == 131072
    dp = next(r for r in ex.rows if r.comm.axis == "dp")
    assert dp.comm.group == 1024 and dp.link == "ib"
    assert len(ex.topo.classes("dp")) == 1
    assert "graph" not in ex.topo.__dict__  # the networkx graph is not built to explain


def test_explain_a_plan_from_text():
    from dslc.driver import load_text

    text = """
cluster dgx_h100 {
    nodes = 2
    gpus_per_node = 8
    device = h100_sxm
    link nvlink { scope = node; bandwidth = 450 GB/s; latency = 2 us }
    link ib     { scope = cluster; bandwidth = 50 GB/s; latency = 8 us }
}
plan llama3_8b {
    model llama { layers = 32; hidden = 4096; heads = 32; kv_heads = 8; ffn = 14336; vocab = 128256; seq_len = 8192 }
    cluster = dgx_h100
    mesh { dp = 2 on ib; pp = 2 on nvlink; tp = 4 on nvlink }
    tensor_parallel { sequence_parallel = true }
    data_parallel { zero = 1 }
    pipeline { schedule = interleaved_1f1b; virtual_stages = 2; microbatches = 16 }
    train { micro_batch = 1; global_batch = 32; precision = bf16; recompute = selective }
}
"""
    result = load_text(text, "llama.plan")
    assert [d for d in result.diagnostics if d.is_error] == []
    (pl,) = result.plans
    doc = report.to_json(report.explain(pl))
    assert doc["params"]["total"] == 8_030_261_248 and doc["world_size"] == 16


@pytest.mark.parametrize("device, nodes, gpn, links, mesh", [
    # H800: H100's compute and memory, NVLink at 200 GB/s a direction (written, as its docs say)
    ("h800", 2, 8, "link nvlink { bandwidth = 200 GB/s }\n    link ib { }", "dp = 2 on ib; tp = 8 on nvlink"),
    # GB200 NVL72: one NVLink 5 domain of 72 GPUs, the catalog's nvlink5
    ("gb200", 1, 72, "link nvlink5 { }", "dp = 9 on nvlink5; tp = 8 on nvlink5"),
])
def test_a_plan_on_each_new_device_explains(device, nodes, gpn, links, mesh):
    from dslc.catalog import DEVICES, LINKS
    from dslc.driver import load_text

    text = f"""
cluster c {{
    nodes = {nodes}; gpus_per_node = {gpn}; device = {device}
    {links}
}}
plan llama3_8b {{
    model llama {{ layers = 32; hidden = 4096; heads = 32; kv_heads = 8; ffn = 14336; vocab = 128256; seq_len = 8192 }}
    cluster = c
    mesh {{ {mesh} }}
    tensor_parallel {{ sequence_parallel = true }}
    data_parallel {{ zero = 1 }}
    train {{ micro_batch = 1; precision = bf16; recompute = selective }}
}}
"""
    result = load_text(text, "p.plan")
    assert [d.message for d in result.diagnostics if d.is_error] == []
    (pl,) = result.plans
    assert pl.cluster.device.peak_flops == DEVICES[device].peak_flops and pl.cluster.device.memory == DEVICES[device].memory
    ex = report.explain(pl)
    assert f"× {gpn} {device} (" in report.render_text(ex) and ex.timing.step > 0
    assert report.to_json(ex)["params"]["total"] == 8_030_261_248
    fast = max(lk.bandwidth for lk in pl.cluster.links)  # per direction: 400 GB/s and 1.8 TB/s both ways
    assert fast == {"h800": 200e9, "gb200": LINKS["nvlink5"][1]}[device] and LINKS["nvlink5"][1] == 900e9
