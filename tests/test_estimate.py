"""The estimator against the published formulas, on the papers' own model configurations.

Every expected value is computed here from the paper's formula (or counted by hand from
the architecture), never taken from the estimator's output.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from math import ceil
from pathlib import Path

import pytest
from irbuild import model, plan

from dslc import arch, fit
from dslc.cost import flops, traffic
from dslc.cost import memory as est
from dslc.cost.compute import rates
from dslc.cost.estimate import estimate
from dslc.cost.recompute import shares
from dslc.driver import load_paths
from dslc.ir import Plan

# ---------------------------------------------------------------------------- parameters

SC21 = [  # Narayanan et al. SC21, Table 1: (heads, hidden, layers, billions of parameters)
    (24, 2304, 24, 1.7), (32, 3072, 30, 3.6), (32, 4096, 36, 7.5), (48, 6144, 40, 18.4), (64, 8192, 48, 39.1),
    (80, 10240, 60, 76.1), (96, 12288, 80, 145.6), (128, 16384, 96, 310.1), (128, 20480, 105, 529.6), (160, 25600, 128, 1008.0),
]


@pytest.mark.parametrize("a, h, l, billions", SC21)
def test_gpt_parameter_count_is_sc21_plus_the_final_layernorm(a, h, l, billions):
    V, s = 51200, 2048
    total = arch.params(model("gpt2", l, h, a, V, s)).total
    closed = 12 * l * h * h + 13 * l * h + (V + s) * h  # 12lh²(1 + 13/(12h) + (V+s)/(12lh)), in integers
    assert total == closed + 2 * h  # the paper leaves out the final LayerNorm's weight and bias
    assert arch.sc21_params(l, h, V, s) == pytest.approx(closed, rel=1e-12)
    assert abs(total / 1e9 - billions) < 0.05  # the table's rounding


def test_gpt2_small_has_its_published_124_439_808_parameters():
    assert arch.params(model("gpt2", 12, 768, 12, 50257, 1024)).total == 124_439_808


def test_llama3_8b_gqa_swiglu_untied():
    h, l, V, f, kv = 4096, 32, 128256, 14336, 8 * 128
    per_layer = h * h + 2 * h * kv + h * h + 3 * h * f + 2 * h  # q, k, v, o; gate, up, down; 2 RMSNorms
    expected = V * h + l * per_layer + h + V * h  # embedding, layers, final norm, head
    assert expected == 8_030_261_248  # the count Meta publishes for Llama 3 8B
    assert arch.params(model("llama", l, h, 32, V, 8192, kv=8, ffn=f, tie=False)).total == expected


def test_gemma_7b_head_dim_apart_from_hidden():
    """Gemma 7B: 16 heads of head_dim 256 (q is 4096 wide) on hidden 3072; q, k, v, o, the
    FLOPs and the saved activations follow heads·head_dim, not hidden."""
    h, l, V, f, a, d = 3072, 28, 256000, 24576, 16, 256
    per_layer = h * a * d * 2 + 2 * h * a * d + 3 * h * f + 2 * h  # q, o; k, v; gated MLP; 2 RMSNorms
    gemma = model("llama", l, h, a, V, 8192, ffn=f, tie=True, head_dim=d)
    assert arch.params(gemma).total == l * per_layer + V * h + h == 8_537_680_896  # Gemma 7B's 8.54B
    assert arch.attention_matmul_flops(gemma, 2) == 2 * h * (a * d // 2 * 3) + 2 * (a * d // 2) * h
    small = model("llama", 2, 64, 4, 128, 32, kv=2, head_dim=24)
    wide = plan(small, ("tp", 2, "nvlink"), precision="fp32")
    narrow = plan(replace(small, head_dim=16), ("tp", 2, "nvlink"), precision="fp32")
    T, e = 32, 4  # tokens, bytes: q, k, v and the o_proj input are saved, each by its width
    delta = est.layer_activation_bytes(wide) - est.layer_activation_bytes(narrow)
    assert delta == T * e * (2 * (48 - 32) + 2 * (24 - 16))


def test_mixtral_8x7b_router_and_experts():
    h, l, V, f, kv, E = 4096, 32, 32000, 14336, 8 * 128, 8
    per_layer = 2 * h * h + 2 * h * kv + h * E + E * 3 * h * f + 2 * h
    expected = 2 * V * h + l * per_layer + h
    mixtral = model("mixtral", l, h, 32, V, 4096, kv=8, ffn=f, tie=False, experts=E, top_k=2)
    assert arch.params(mixtral).total == expected
    assert expected == 46_702_792_704  # Mixtral 8x7B's published "46.7B total parameters"


def test_deepseek_dense_prefix_and_shared_experts_counted_by_block():
    """A dense first block (MLP dense_ffn wide, split over tp) and a shared expert (one
    SwiGLU MLP of shared·ffn, whole on every rank) in each MoE block, counted by hand; the
    ep all-to-alls run in the MoE blocks only, each pipeline stage holds its own kinds."""
    h, l, V, f, fd, E, kv = 64, 4, 128, 96, 160, 8, 2 * 16
    base = model("mixtral", l, h, 4, V, 32, kv=2, ffn=f, tie=False, experts=E, top_k=2)
    ds = replace(base, dense_layers=1, dense_ffn=fd, shared_experts=2)
    attn = 2 * h * h + 2 * h * kv + 2 * h  # q, o; k, v; two norms
    moe, dense = attn + h * E + 3 * h * 2 * f + E * 3 * h * f, attn + 3 * h * fd
    assert arch.params(ds).total == 2 * V * h + h + 3 * moe + dense
    mm_moe = 2 * (h * h + 2 * h * kv + h * h) + (2 + 2) * 3 * 2 * h * f + 2 * h * E  # top-2 + 2 shared
    mm_dense = 2 * (h * h + 2 * h * kv + h * h) + 3 * 2 * h * fd
    assert flops.chunk_flops(plan(ds, ("pp", 2, "ib"), m=2), [0, 1])[0] == mm_dense + mm_moe
    p = plan(ds, ("pp", 2, "ib"), ("ep", 2, "ib"), m=2)
    s0, s1 = est.stage_params(p)
    assert s0.expert == s1.expert // 2 == E * 3 * h * f // 2  # one MoE block on stage 0, two on 1
    a2a = [traffic.rank_payload(p, r)[("ep", "all_to_all")] for r in (0, 2)]
    assert 2 * a2a[0] == a2a[1] > 0
    sharded, replicated, _ = arch.layers_params(ds, 2, [0, 1])
    assert replicated == 4 * h + h * E + 3 * h * 2 * f  # norms, router, shared experts: whole


def test_stage_params_add_up_to_the_model_over_tp_and_pp():
    mdl = model("llama", 8, 256, 8, 1024, 64, kv=4, ffn=512, tie=False)
    p = plan(mdl, ("pp", 4, "ib"), ("tp", 4, "nvlink"))
    stages = est.stage_params(p)
    # sharded weights are split 4 ways, norms are replicated on every tp rank
    assert sum((s.dense - s.tp_replicated) * 4 + s.tp_replicated for s in stages) == arch.params(mdl).total
    assert stages[1].dense == 2 * (256 * (256 + 2 * 128) // 4 + 256 * 256 // 4 + 3 * 256 * 512 // 4 + 2 * 256)


def test_first_and_last_chunks_of_no_layers_hold_the_embedding_and_the_head():
    """layers_per_stage = [0, 4, 4, 0]: stage 0 holds the embedding alone, stage 3 the final
    norm and head alone; the memory model and the schedule run them."""
    mdl = model("llama", 8, 256, 8, 1024, 64, kv=4, ffn=512, tie=False)
    p = plan(mdl, ("pp", 4, "ib"), m=4)
    p = replace(p, pipeline=replace(p.pipeline, layers_per_stage=(0, 4, 4, 0)))
    stages = est.stage_params(p)
    layer = 256 * 256 * 2 + 2 * 256 * 128 + 3 * 256 * 512 + 2 * 256  # q, o; k, v; MLP; norms
    assert [s.dense for s in stages] == [1024 * 256, 4 * layer, 4 * layer, 256 + 1024 * 256]
    assert sum(s.dense for s in stages) == arch.params(mdl).total
    mem = est.memory(p)
    assert [m.layers for m in mem] == [0, 4, 4, 0] and mem[0].activations == 0 < mem[3].activations


# ---------------------------------------------------------------------------- FLOPs

GPT3 = {"l": 96, "h": 12288, "a": 96, "V": 51200, "s": 2048}


def gpt3_plan(recompute: str) -> Plan:
    c = GPT3
    return plan(model("gpt2", c["l"], c["h"], c["a"], c["V"], c["s"]), ("dp", 4, "ib"), ("pp", 8, "ib"), ("tp", 8, "nvlink"),
                m=384, recompute=recompute)


def test_gpt3_flops_match_narayanan():
    """SC21 counts the attention square whole (4·s·h a token and layer forward): so does
    causal=False, with which published FLOP rates are read. dslc's MFU counts the causal
    half, 2·s·h, what the fused kernels compute and the step time charges."""
    B, s, l, h, V = 4 * 384, GPT3["s"], GPT3["l"], GPT3["h"], GPT3["V"]
    square = flops.flops(gpt3_plan("full"), causal=False)
    assert square.hardware == pytest.approx(96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)), rel=1e-12)
    assert flops.narayanan_flops(B, s, l, h, V) == pytest.approx(square.hardware, rel=1e-12)
    assert square.model == pytest.approx(72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h)), rel=1e-12)
    # causal: s/(12h) where SC21 has s/(6h), in the 3 passes and in the recomputed forward
    full = flops.flops(gpt3_plan("full"))
    assert full.hardware == pytest.approx(96 * B * s * l * h * h * (1 + s / (12 * h) + V / (16 * l * h)), rel=1e-12)
    assert full.model == pytest.approx(72 * B * s * l * h * h * (1 + s / (12 * h) + V / (12 * l * h)), rel=1e-12)
    none = flops.flops(gpt3_plan("none"))
    assert none.hardware == none.model == full.model
    # selective recompute re-runs the attention core, 2·s·h FLOPs per token per layer
    assert flops.flops(gpt3_plan("selective")).hardware == pytest.approx(full.model + 2 * B * s * l * s * h, rel=1e-12)


def test_llama_and_mixtral_flops_are_six_per_matmul_weight_per_token_plus_attention():
    h, l, V, f, kv, s = 4096, 32, 128256, 14336, 1024, 8192
    llama = plan(model("llama", l, h, 32, V, s, kv=8, ffn=f, tie=False), ("dp", 8, "ib"), m=4)
    tokens = 8 * 4 * s
    weights = l * (h * (h + 2 * kv) + h * h + 3 * h * f) + h * V
    assert flops.flops(llama).model == pytest.approx(6 * tokens * weights + 3 * tokens * l * 2 * s * h, rel=1e-12)
    E, k = 8, 2
    mix = plan(model("mixtral", l, h, 32, 32000, s, kv=8, ffn=f, tie=False, experts=E, top_k=k), ("dp", 2, "ib"), ("ep", 4, "ib"), m=4)
    weights = l * (h * (h + 2 * kv) + h * h + k * 3 * h * f + h * E) + h * 32000  # only top_k experts run per token
    assert flops.flops(mix).model == pytest.approx(6 * tokens * weights + 3 * tokens * l * 2 * s * h, rel=1e-12)



ROOT = Path(__file__).resolve().parents[1]


def _every_published_and_example_plan():
    return load_paths(sorted(ROOT.glob("plans/*.plan")) + sorted(ROOT.glob("benchmarks/published/*.plan")), check=False).plans


@pytest.mark.parametrize("p", _every_published_and_example_plan(), ids=lambda p: p.name)
def test_hfu_never_exceeds_the_fastest_kernel_rate_the_estimate_assumes(p):
    """One FLOP convention on both sides: the hardware FLOPs (the causal attention core,
    recompute included) over the step can be no faster than the kernels are charged, so
    HFU stays below the best of the GEMM and attention rates (before, the core counted the
    whole square while the time charged its causal half: 65 % HFU for llama3_8b_128k)."""
    e, r = estimate(p), rates(p)
    _, attention_share, _ = shares(p)
    core = sum(n * arch.layer_flops(km, p.model.seq_len)[1] for n, km in arch.kinds(p.model))
    A = flops.batch_tokens(p) * core * (3 + attention_share)  # the attention core's, recompute included
    G = e.flops.hardware - A  # GEMMs, at most r.gemm of the peak whatever their shape (of the fp8 peak with float8)
    gemm = r.gemm * (r.fp8 / r.peak if r.fp8 else 1.0)
    fastest = (G + A) / (G / gemm + A / r.attention)  # no elementwise work, no communication
    assert e.timing.mfu <= e.timing.hfu <= fastest

# ---------------------------------------------------------------------------- model states (ZeRO)


def test_zero_paper_figure_1_numbers():
    """Rajbhandari et al. 2020, Fig. 1: Ψ = 7.5B, N_d = 64, K = 12."""
    psi, n = 7_500_000_000, 64
    rows = [sum(est.zero_state(psi, n, z, 2, 2, 12)) for z in range(4)]
    assert rows == [16 * psi, 4 * psi + 12 * psi // n, 2 * psi + 14 * psi // n, 16 * psi // n]
    assert [round(x / 1e9, 1) for x in rows] == [120.0, 31.4, 16.6, 1.9]


def test_bytes_per_parameter_by_precision_and_optimizer():
    mdl = model()
    assert est.state_bytes_per_param(plan(mdl, ("dp", 2, "ib"), precision="bf16")) == (2, 2, 12)  # ZeRO's 2+2+12
    assert est.state_bytes_per_param(plan(mdl, ("dp", 2, "ib"), precision="fp32")) == (4, 4, 8)  # weights are the master
    assert est.state_bytes_per_param(plan(mdl, ("dp", 2, "ib"), optimizer="sgd", momentum=0.9)) == (2, 2, 8)
    assert est.state_bytes_per_param(plan(mdl, ("dp", 2, "ib"), optimizer="sgd", precision="fp32")) == (4, 4, 0)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_memory_model_states_over_dp(zero):
    mdl = model("gpt2", 2, 64, 4, 1000, 32)
    P = arch.params(mdl).total
    n = 8
    (mem,) = est.memory(plan(mdl, ("dp", n, "ib"), zero=zero))
    shard = -(-P // n)
    assert mem.params == 2 * (shard if zero == 3 else P)
    assert mem.grads == 2 * (shard if zero >= 2 else P)
    assert mem.optimizer == 12 * (shard if zero >= 1 else P)


def test_expert_states_are_sharded_over_dp_only_and_dense_over_dp_and_ep():
    mdl = model("mixtral", 2, 64, 4, 128, 32, kv=2, ffn=96, tie=False, experts=8, top_k=2)
    (mem,) = est.memory(plan(mdl, ("dp", 2, "ib"), ("ep", 4, "ib"), zero=1))
    pr = arch.params(mdl)
    expert = pr.layers * pr.experts // 4  # 2 of the 8 experts of each layer
    dense = pr.total - pr.layers * pr.experts
    assert mem.params == 2 * (dense + expert)
    assert mem.optimizer == 12 * (ceil(dense / 8) + ceil(expert / 2))


# ---------------------------------------------------------------------------- activations (Korthikanti et al.)

KORTHIKANTI = {  # Table 3: heads, hidden, layers, micro-batch; s = 2048, t = 8
    "22B": (64, 6144, 48, 4), "175B": (96, 12288, 96, 1), "530B": (128, 20480, 105, 1), "1T": (160, 25600, 128, 1),
}


def _paper_plan(name, t, sp, recompute, pp=1, **kw):
    a, h, l, b = KORTHIKANTI[name]
    mdl = model("gpt2", l, h, a, 51200, 2048, dropout=0.1)
    axes = [("pp", pp, "ib")] if pp > 1 else []
    return plan(mdl, *axes, ("tp", t, "nvlink"), sp=sp, recompute=recompute, b=b, **kw)


@pytest.mark.parametrize("name", list(KORTHIKANTI))
@pytest.mark.parametrize(
    "t, sp, recompute, formula",
    [
        (1, False, "none", lambda s, b, h, a, t: s * b * h * (34 + Fraction(5 * a * s, h))),
        (8, False, "none", lambda s, b, h, a, t: s * b * h * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t))),
        (8, True, "none", lambda s, b, h, a, t: Fraction(s * b * h, t) * (34 + Fraction(5 * a * s, h))),
        (8, False, "selective", lambda s, b, h, a, t: s * b * h * (10 + Fraction(24, t))),
        (8, True, "selective", lambda s, b, h, a, t: Fraction(s * b * h * 34, t)),
        (1, False, "full", lambda s, b, h, a, t: 2 * s * b * h),
    ],
    ids=["no-parallel", "tp", "tp+sp", "tp+selective", "tp+sp+selective", "full"],
)
def test_activations_per_layer_reproduce_the_paper(name, t, sp, recompute, formula):
    a, h, _, b = KORTHIKANTI[name]
    got = est.layer_activation_bytes(_paper_plan(name, t, sp, recompute), est.PAPER)
    assert got == formula(2048, b, h, a, t)


def test_full_recompute_under_sp_keeps_the_sharded_layer_input():
    _a, h, _, b = KORTHIKANTI["175B"]
    assert est.layer_activation_bytes(_paper_plan("175B", 8, True, "full"), est.PAPER) == 2 * 2048 * b * h // 8


def test_sdpa_keeps_no_scores_only_a_fp32_logsumexp():
    a, h, _, b = KORTHIKANTI["175B"]
    s, t = 2048, 8
    sdpa = est.Settings(attention="sdpa", dropout=True, sp_inputs="shard")  # Megatron's SP inputs
    got = est.layer_activation_bytes(_paper_plan("175B", t, True, "none"), sdpa)
    assert got == s * b * h * 34 // t + (a // t) * s * b * 4


def test_sequence_parallel_linears_that_save_the_gathered_input_keep_t_times_more():
    """The generated script's column-parallel linears save their all-gathered input (q/k/v
    and MLP: 2 of the paper's 34 bytes per s·b·h/t become 2·t), Megatron's only the shard."""
    _a, h, _, b = KORTHIKANTI["175B"]
    s, t = 2048, 8
    pl = _paper_plan("175B", t, True, "none")
    gathered = est.layer_activation_bytes(pl, est.Settings(dropout=True))
    shard = est.layer_activation_bytes(pl, est.Settings(dropout=True, sp_inputs="shard"))
    assert gathered - shard == 2 * 2 * s * b * h * (t - 1) // t


def test_first_1f1b_stage_holds_p_microbatches_of_its_layers():
    """530B with t = 8, p = 35 (Korthikanti et al. §5): the first stage holds p micro-batches
    of L/p layers — sbhL/t·(34 + 5as/h) — plus the input-embedding dropout mask sbh·p/t
    (§4.3); stage i holds p − i micro-batches."""
    a, h, l, b = KORTHIKANTI["530B"]
    s, t, p = 2048, 8, 35
    mem = est.memory(_paper_plan("530B", t, True, "none", pp=p, m=2 * p), est.PAPER)
    per_layer = Fraction(s * b * h, t) * (34 + Fraction(5 * a * s, h))
    assert mem[0].inflight == p
    assert mem[0].activations == l * per_layer + s * b * h * p // t
    for i in (1, 17, 33):
        assert mem[i].inflight == p - i
        assert mem[i].activations == (p - i) * (l // p) * per_layer


def test_interleaving_multiplies_the_first_stage_by_1_plus_p_minus_1_over_pv():
    _a, h, l, b = KORTHIKANTI["175B"]
    s, t, p, v = 2048, 8, 8, 3
    pl = _paper_plan("175B", t, True, "selective", pp=p, m=16, schedule="interleaved_1f1b", v=v)
    mem = est.memory(pl, est.PAPER)
    assert mem[0].inflight == p * v + p - 1
    layers = l * (1 + Fraction(p - 1, p * v)) * Fraction(s * b * h * 34, t)
    embedding_masks = ceil(mem[0].inflight / v) * s * b * h // t  # micro-batches in flight in chunk 0
    assert mem[0].activations - embedding_masks == layers


def test_gpipe_holds_every_microbatch_on_every_stage():
    mem = est.memory(_paper_plan("22B", 8, True, "selective", pp=4, m=12, schedule="gpipe"), est.PAPER)
    assert [s.inflight for s in mem] == [12] * 4
    _a, h, l, b = KORTHIKANTI["22B"]
    assert mem[1].activations == 12 * (l // 4) * 2048 * b * h * 34 // 8


# ---------------------------------------------------------------------------- traffic


def _llama(**kw):
    return model("llama", 4, 256, 8, 1000, 64, kv=4, ffn=512, tie=False, **kw)


def test_tp_all_reduces_embedding_head_and_loss():
    m, b, s, h, l, t, V = 3, 2, 64, 256, 4, 4, 1000
    p = plan(_llama(), ("dp", 2, "ib"), ("tp", t, "nvlink"), m=m, b=b)
    got = traffic.rank_payload(p, 5)
    S = b * s * h * 2
    # per layer 2 forward + 2 backward; embedding output (fwd); head input grad (bwd); 3 fp32 loss reductions
    assert got[("tp", "all_reduce")] == m * (l * 4 * S + S + S + 3 * b * s * 4)
    local = l * (h * (h + 2 * 128) // t + h * h // t + 3 * h * 512 // t + 2 * h) + 2 * (V // t) * h + h
    assert got[("dp", "all_reduce")] == 2 * local
    assert set(got) == {("tp", "all_reduce"), ("dp", "all_reduce")}


def test_sequence_parallel_turns_each_all_reduce_into_a_gather_scatter_pair():
    m, b, s, h, l, t = 2, 1, 64, 256, 4, 4
    p = plan(_llama(), ("tp", t, "nvlink"), m=m, b=b, sp=True)
    rows = {(c.axis, c.kind, c.what): c for c in traffic.stage_traffic(p, 0)}
    S = b * s * h * 2
    assert rows["tp", "all_gather", "layer activations"].payload == m * l * 4 * S
    assert rows["tp", "reduce_scatter", "layer activations"].payload == m * l * 4 * S
    assert rows["tp", "all_gather", "layer activations"].wire == m * l * 4 * S * 3 / 4
    replicated = l * 2 * h + h  # RMSNorm weights: their grads differ per sequence shard
    assert rows["tp", "all_reduce", "grads of tp-replicated weights (SP)"].payload == replicated * 2


def test_sequence_parallel_reduces_the_grads_of_gpt2_positions_too():
    """gpt2's learned positions are replicated over tp; under SP each rank adds only its
    slice of the sequence, so their grads are partial like the norms' and biases'."""
    l, h, s = 2, 64, 32
    p = plan(model("gpt2", l=l, h=h, s=s), ("tp", 2, "nvlink"), sp=True)
    row = next(c for c in traffic.stage_traffic(p, 0) if c.what.startswith("grads of tp-replicated"))
    per_layer = 2 * 2 * h + 2 * h  # two LayerNorms (weight, bias), out-projection and MLP-out biases
    assert row.payload == (l * per_layer + 2 * h + s * h) * 2


def test_full_recompute_under_sp_re_runs_every_gather_but_not_the_mlp_exit():
    p = plan(_llama(), ("tp", 2, "nvlink"), m=1, sp=True, recompute="full")
    rows = {c.kind: c for c in traffic.stage_traffic(p, 0) if c.what == "layer activations"}
    assert rows["all_gather"].calls == 4 * 6 and rows["reduce_scatter"].calls == 4 * 5


def test_full_recompute_repeats_the_forward_all_reduces():
    p = plan(_llama(), ("tp", 2, "nvlink"), m=1, recompute="full")
    row = next(c for c in traffic.stage_traffic(p, 0) if c.what == "layer activations")
    # 2 forward + 2 backward per layer, and the recomputed forward's first all-reduce: the
    # generated script's checkpoint stops before the MLP's (nothing in the layer saves it)
    assert row.calls == 4 * 5


def test_pipeline_sends_one_activation_per_boundary_per_microbatch():
    """SC21 §3.2: b·s·h per micro-batch per boundary, each way; interleaving adds boundaries."""
    m, b, s, h = 8, 1, 64, 256
    S = b * s * h * 2
    p = plan(_llama(), ("pp", 4, "ib"), ("tp", 2, "nvlink"), m=m)
    sends = [traffic.rank_payload(p, r * 2).get(("pp", "send"), 0) for r in range(4)]
    assert sends == [m * S, 2 * m * S, 2 * m * S, m * S]
    pi = plan(model("llama", 8, 256, 8, 1000, 64, kv=4, ffn=512, tie=False), ("pp", 4, "ib"), ("tp", 2, "nvlink"),
              m=m, sp=True, schedule="interleaved_1f1b", v=2)
    total = sum(c.payload for st in traffic.traffic(pi) for c in st if c.axis == "pp" and c.kind == "send")
    assert total == 2 * (4 * 2 - 1) * m * S // 2  # (p·v − 1) boundaries each way, SP shard of t = 2


def test_tied_embedding_grads_are_all_reduced_between_first_and_last_stage():
    mdl = model("gpt2", 4, 64, 4, 100, 32)
    p = plan(mdl, ("pp", 4, "ib"), m=4)
    tied = [c.payload for st in traffic.traffic(p) for c in st if c.what == "tied embedding grads"]
    assert tied == [100 * 64 * 2, 100 * 64 * 2]


def test_zero_shards_are_padded_to_the_group():
    mdl = model("gpt2", 2, 64, 4, 1001, 32)
    P = arch.params(mdl).total
    p = plan(mdl, ("dp", 8, "ib"), zero=1)
    got = traffic.rank_payload(p, 0)
    assert got[("dp", "reduce_scatter")] == got[("dp", "all_gather")] == 8 * ceil(P / 8) * 2
    # zero 3: per unit (a block, or the rest: embeddings, final norm), each padded; every
    # block gathered in each micro-batch's forward and again in its backward, the rest once
    p3 = plan(mdl, ("dp", 8, "ib"), zero=3)
    block = sum(arch.layer_params(mdl))
    m, rest = p3.microbatches, P - 2 * block
    got = traffic.rank_payload(p3, 0)
    assert got[("dp", "all_gather")] == (m * 2 * 2 * 8 * ceil(block / 8) + 8 * ceil(rest / 8)) * 2
    assert got[("dp", "reduce_scatter")] == (2 * 8 * ceil(block / 8) + 8 * ceil(rest / 8)) * 2
    kept = plan(mdl, ("dp", 8, "ib"), zero=3)
    kept = replace(kept, data_parallel=replace(kept.data_parallel, reshard_after_forward=False))
    assert traffic.rank_payload(kept, 0)[("dp", "all_gather")] == (m * 2 * 8 * ceil(block / 8) + 8 * ceil(rest / 8)) * 2


@pytest.mark.parametrize("zero", [1, 3])
def test_hsdp_shards_over_the_shard_group_and_all_reduces_the_shards_over_replicas(zero):
    """dp = 16 over 2 nodes with shard = 8: the states are 1/8 per rank, ZeRO's collectives
    run over the 8 ranks of a node (dp_shard, on nvlink), and each reduced shard (per
    unit for zero 3) is all-reduced over the 2 replicas (dp_replicate, across nodes)."""
    from dslc.cost.topology import Topology

    mdl = model("llama", 2, 64, 4, 1000, 32)
    P, block = arch.params(mdl).total, sum(arch.layer_params(mdl))
    p = plan(mdl, ("dp", 16, "ib"), zero=zero)
    p = replace(p, data_parallel=replace(p.data_parallel, shard=8))
    (mem,) = est.memory(p)
    assert mem.optimizer == 12 * (2 * ceil(block / 8) + ceil((P - 2 * block) / 8) if zero == 3 else ceil(P / 8))
    got = traffic.rank_payload(p, 0)
    assert {axis for axis, _ in got} == {"dp_shard", "dp_replicate"}
    shards = 2 * ceil(block / 8) + ceil((P - 2 * block) / 8) if zero == 3 else ceil(P / 8)
    assert got[("dp_replicate", "all_reduce")] == shards * 2  # one per unit (bf16)
    assert got[("dp_shard", "reduce_scatter")] == 8 * shards * 2
    topo = Topology.of(p)
    assert topo.route(("dp_shard",)).link == "nvlink" and not topo.route(("dp_shard",)).crosses_nodes
    assert topo.route(("dp_replicate",)).link == "ib"


def test_ulysses_all_to_alls_and_grads_over_dp_and_cp():
    m, b, s, h, l = 2, 1, 64, 256, 4
    p = plan(_llama(), ("dp", 2, "ib"), ("cp", 4, "nvlink"), m=m, b=b, cp="ulysses")
    T = b * s // 4
    got = traffic.rank_payload(p, 0)
    assert got[("cp", "all_to_all")] == m * l * 4 * (T * h * 2 + T * 128 * 2)  # q+out and k+v, fwd and bwd
    assert ("dp+cp", "all_reduce") in got


def test_ring_attention_passes_kv_blocks():
    m, b, s, l, cp = 1, 1, 64, 4, 4
    p = plan(_llama(), ("cp", cp, "nvlink"), m=m, b=b, cp="ring")
    block = b * s // cp * 128 * 2  # K or V of the local sequence: kv_heads·head_dim = 128
    # forward K, V (cp − 1 passes each); backward K, V again and dK, dV home (cp passes, fp32)
    fwd, bwd = 2 * (cp - 1) * block, 2 * (cp - 1) * block + 2 * cp * 2 * block
    assert traffic.rank_payload(p, 0)[("cp", "send")] == m * l * (fwd + bwd)


def test_expert_all_to_all_per_moe_layer():
    m, b, s, h, l, k = 2, 1, 32, 64, 2, 2
    mdl = model("mixtral", l, h, 4, 128, s, kv=2, ffn=96, tie=False, experts=8, top_k=k)
    got = traffic.rank_payload(plan(mdl, ("dp", 2, "ib"), ("ep", 4, "ib"), m=m, b=b), 0)
    assert got[("ep", "all_to_all")] == m * l * 4 * b * s * k * h * 2  # dispatch + combine, fwd + bwd
    assert {k for k, _ in got} == {"ep", "dp", "dp+ep"}  # experts over dp, dense over dp×ep
    capped = replace(mdl, capacity_factor=1.25)
    got = traffic.rank_payload(plan(capped, ("dp", 2, "ib"), ("ep", 4, "ib"), m=m, b=b), 0)
    assert got[("ep", "all_to_all")] == m * l * 4 * 8 * ceil(1.25 * b * s * k / 8) * h * 2


# ---------------------------------------------------------------------------- mixture of experts
# The generated script routes each sequence as one group (GShard): with a capacity factor
# every expert takes at most C = ⌈cf·top_k·s/E⌉ slots per sequence and every rank sends a
# padded (E, b·C, h) buffer; dropless, a rank sends its tokens × top_k. Experts are whole
# on every tp rank.


def _moe(cf=0.0, l=2, s=32, E=8, k=2):
    return model("mixtral", l, 64, 4, 128, s, kv=2, ffn=96, tie=False, experts=E, top_k=k, cf=cf)


def test_capacity_is_per_sequence_and_the_buffer_is_padded():
    b, m, l, h = 2, 2, 2, 64
    p = plan(_moe(cf=1.1), ("dp", 2, "ib"), ("ep", 4, "ib"), m=m, b=b)
    # C = ⌈1.1 · 2 · 32 / 8⌉ = ⌈8.8⌉ = 9 slots per expert per sequence
    assert est.expert_capacity(p) == 9
    # the padded buffer: 8 experts × (micro_batch 2 × C 9) = 144 slots per rank per layer per micro-batch
    assert est.routed_slots(p) == 144
    # 2 micro-batches × 2 layers × 4 all-to-alls (dispatch, combine, fwd and bwd) × 144 · 64 · 2 bytes
    assert traffic.rank_payload(p, 0)[("ep", "all_to_all")] == 2 * 2 * 4 * 144 * 64 * 2 == m * l * 4 * 144 * h * 2


def test_capacity_is_the_same_padded_buffer_under_tp_and_sequence_parallel():
    for sp in (False, True):
        p = plan(_moe(cf=1.1), ("ep", 4, "ib"), ("tp", 2, "nvlink"), b=2, sp=sp)
        assert est.routed_slots(p) == 8 * 2 * 9  # a tp rank's slice may take a whole sequence's capacity


def test_capacity_uses_the_written_decimal():
    # 1.1 · 2 · 100 / 4 = 55 exactly (floats give 55.00000000000001, which would round up to 56)
    p = plan(_moe(cf=1.1, s=100, E=4), ("ep", 4, "ib"))
    assert est.expert_capacity(p) == 55 and est.routed_slots(p) == 4 * 1 * 55


def test_dropless_routes_the_tokens_a_rank_holds_times_top_k():
    b, s, k = 2, 32, 2
    assert est.expert_capacity(plan(_moe(), ("ep", 4, "ib"), b=b)) is None
    assert est.routed_slots(plan(_moe(), ("ep", 4, "ib"), b=b)) == b * s * k == 128
    # tp without SP: every tp rank holds (and routes) all 64 tokens
    assert est.routed_slots(plan(_moe(), ("ep", 4, "ib"), ("tp", 2, "nvlink"), b=b)) == 128
    # SP: each tp rank routes its slice, 64 / 2 = 32 tokens × top-2
    p = plan(_moe(), ("ep", 4, "ib"), ("tp", 2, "nvlink"), b=b, sp=True)
    assert est.routed_slots(p) == 32 * 2 == 64
    assert traffic.rank_payload(p, 0)[("ep", "all_to_all")] == 1 * 2 * 4 * 64 * 64 * 2  # m · l · 4 · slots · h · e
    # cp: the rank holds 64 / 2 tokens of the micro-batch
    assert est.routed_slots(plan(_moe(), ("ep", 4, "ib"), ("cp", 2, "nvlink"), b=b)) == 64


def test_imbalance_scales_dropless_slots_on_the_busiest_ep_rank_only():
    p = plan(_moe(), ("ep", 4, "ib"), b=2)
    assert est.routed_slots(p, 1.5) == 192 and est.routed_slots(p, 2.0) == 256  # 128 × r
    assert est.routed_slots(plan(_moe(), ("dp", 4, "ib"), b=2), 2.0) == 128  # ep = 1: one rank has every expert
    assert est.routed_slots(plan(_moe(cf=1.1), ("ep", 4, "ib"), b=2), 2.0) == 144  # padded: unchanged


def test_experts_are_whole_on_every_tp_rank():
    mdl = _moe()
    experts = [w for w in arch.weights(mdl, 2) if w.part == "expert"]
    assert {w.shape for w in experts} == {(96, 64), (64, 96)} and {w.tp_dim for w in experts} == {None}
    (sp,) = est.stage_params(plan(mdl, ("ep", 4, "ib"), ("tp", 2, "nvlink")))
    # 2 layers × 8 experts × 3 matrices of 64 × 96, over ep = 4 (not over tp)
    assert sp.expert == 2 * 8 * 3 * 64 * 96 // 4 == 73_728


def test_expert_states_over_dp_with_tp():
    mdl = _moe()
    (mem,) = est.memory(plan(mdl, ("dp", 2, "ib"), ("ep", 4, "ib"), ("tp", 2, "nvlink"), zero=1))
    expert = 73_728  # as above: whole experts, 2 of the 8 per layer
    # dense per tp rank: vocab-parallel embedding and head 2 · 64 · 64, final norm 64, per layer
    # q 32·64, k and v 16·64 each, o 64·32, 2 norms 2·64 and the router 8·64
    dense = 2 * 64 * 64 + 64 + 2 * (32 * 64 + 2 * 16 * 64 + 64 * 32 + 2 * 64 + 8 * 64)
    assert mem.params == 2 * (dense + expert)
    assert mem.optimizer == 12 * (ceil(dense / 8) + ceil(expert / 2))  # dense over dp×ep, experts over dp


def test_moe_layers_have_only_the_attention_tp_collectives():
    m, l, b, s, h = 2, 2, 1, 32, 64
    rows = {c.what: c for c in traffic.stage_traffic(plan(_moe(), ("ep", 4, "ib"), ("tp", 2, "nvlink"), m=m, b=b), 0)}
    # 1 all-reduce forward (attention output) + 1 backward per layer per micro-batch; the MoE block has none
    assert rows["layer activations"].calls == m * l * 2 and rows["layer activations"].bytes_per_call == b * s * h * 2
    p = plan(_moe(), ("ep", 4, "ib"), ("tp", 2, "nvlink"), m=m, b=b, sp=True)
    rows = {(c.kind, c.what): c for c in traffic.stage_traffic(p, 0)}
    assert rows["all_gather", "layer activations"].calls == m * l * 2
    assert rows["reduce_scatter", "layer activations"].calls == m * l * 2
    # SP: the grads of the dense weights whole on every tp rank are summed over tp once per step:
    # 2 layers × (2 norms + router) (2·64 + 8·64) and the final norm 64; the 73 728 expert weights'
    # partial sums are added by their buckets, whose group is tp (no dp): one all-reduce per step
    assert rows["all_reduce", "grads of tp-replicated weights (SP)"].payload == (2 * (2 * 64 + 8 * 64) + 64) * 2
    experts = [c for c in traffic.stage_traffic(p, 0) if c.what == "expert grads"]
    assert [(c.axis, c.kind, c.payload) for c in experts] == [("tp", "all_reduce", 73_728 * 2)]


def test_moe_layer_activations_by_hand():
    """tp = 2 without SP, no recompute, no dropout, fused attention, b = 2, s = 32: T = 64."""
    p = plan(_moe(), ("ep", 4, "ib"), ("tp", 2, "nvlink"), b=2)
    T, h, e = 64, 64, 2
    norms_and_inputs = 4 * T * h * e  # 2 norm inputs, the qkv input, the router input
    attention = T * (32 + 2 * 16) * e + T * 32 * e + 2 * T * 4  # q, k, v; out-proj input; lse of 2 heads
    router = T * 8 * 4  # fp32 logits
    experts = 128 * (h + 4 * 96 + h) * e  # 128 slots = choices: input, SwiGLU (gate, up, silu, product) at the full ffn; the output weighed
    assert est.layer_activation_bytes(p) == norms_and_inputs + attention + router + experts == 178_688
    # SP: the rank's 32-token slice is routed (not all-gathered); capacity pads the experts'
    # input and SwiGLU to 144 slots, while the outputs weighed stay one per choice (64)
    sp = plan(_moe(), ("ep", 4, "ib"), ("tp", 2, "nvlink"), b=2, sp=True)
    capped = plan(_moe(cf=1.1), ("ep", 4, "ib"), ("tp", 2, "nvlink"), b=2, sp=True)
    assert est.layer_activation_bytes(capped) - est.layer_activation_bytes(sp) == (144 - 64) * (h + 4 * 96) * e


def test_expert_flops_follow_the_routed_slots():
    p = plan(_moe(), ("ep", 4, "ib"), ("tp", 2, "nvlink"), b=2)
    dense, core, experts = flops.layer_rank_flops(p)
    assert experts == 128 * 2 * 3 * 64 * 96  # 128 slots × 3 whole SwiGLU matrices, even with tp = 2
    # attention on the tp shard (q 32, kv 16) and the router for all 64 tokens
    assert dense == 64 * (2 * 64 * (32 + 2 * 16) + 2 * 32 * 64) + 64 * 2 * 64 * 8
    assert flops.layer_rank_flops(p, 2.0)[2] == 2 * experts


# ---------------------------------------------------------------------------- E090


def test_memory_error_names_the_breakdown_and_what_would_fit():
    h, l, V, f = 4096, 32, 128256, 14336
    p = plan(model("llama", l, h, 32, V, 2048, kv=8, ffn=f, tie=False), ("dp", 16, "ib"), zero=0, m=1)
    (d,) = fit.fit_diagnostics(p)
    assert d.code == "E090" and d.span == p.span and d.is_error
    assert "params 15.0 GiB" in d.message and "optimizer 89.7 GiB" in d.message  # 2 and 12 bytes × 8.03 B
    assert "zero = 1 (" in d.hint and "recompute" not in d.hint
    fixed = replace(p, data_parallel=replace(p.data_parallel, zero=1))
    assert fit.fit_diagnostics(fixed) == []


def test_memory_error_when_nothing_single_fits():
    p = plan(model("gpt2", 96, 12288, 96, 51200, 2048), ("dp", 8, "ib"), zero=0, m=1)
    (d,) = fit.fit_diagnostics(p)
    # 16 bytes × 175 B params need 2.6 TB: even sharded 8 ways (zero 3, or tp 8) it is > 300 GiB
    assert "no single change" in d.hint and "closest: " in d.hint and "add GPUs" in d.hint


# torchtitan's Llama 3.1 405B run on 512 H100s: FSDP 8 x TP 8 x PP 8 (interleaved)
TITAN_405B = """
cluster h100_64x8 {
    nodes = 64; gpus_per_node = 8; device = h100_sxm
    link nvlink { scope = node; bandwidth = 450 GB/s; latency = 2 us }
    link ib { scope = cluster; bandwidth = 50 GB/s; latency = 8 us }
}
plan llama31_405b {
    model llama {
        layers = 126; hidden = 16384; heads = 128; kv_heads = 8
        ffn = 53248; vocab = 128256; seq_len = 8192; rope_theta = 500000
    }
    cluster = h100_64x8
    mesh { dp = 8 on ib; pp = 8 on ib; tp = 8 on nvlink }
    tensor_parallel { sequence_parallel = true }
    data_parallel { zero = 3; reshard_after_forward = RESHARD }
    pipeline { schedule = SCHEDULE; virtual_stages = V; microbatches = 16 }
    train { micro_batch = 1; global_batch = 128; precision = bf16; recompute = full }
}
"""


def _titan(schedule="interleaved_1f1b", v=2, reshard="true"):
    from dslc.driver import load_text

    text = TITAN_405B.replace("SCHEDULE", schedule).replace("RESHARD", reshard).replace("= V;", f"= {v};")
    res = load_text(text, "titan.plan")
    assert not [d for d in res.diagnostics if d.is_error]
    return res.program.plans[0]


@pytest.mark.parametrize("schedule, v", [("interleaved_1f1b", 2), ("1f1b", 1)])
def test_zero3_pipeline_gathers_every_block_per_micro_batch_and_chunk(schedule, v):
    """The published FSDP x TP x PP layout: each rank gathers each of its blocks in every
    micro-batch's forward and again in its backward (16 micro-batches, v chunks of
    126 / (8 v) layers), its embeddings or head once; and reduces each unit once."""
    p = _titan(schedule, v)
    e, n, m = 2, 8, 16
    sharded, rep, _ = arch.layer_params(p.model, 8)
    block = n * ceil((sharded + rep) / n) * e  # a block's flat buffer, padded to the group
    for stage in range(8):
        layers = sum(p.stage_layers()[c * 8 + stage] for c in range(v))
        rows = {(c.kind, c.what): c for c in traffic.stage_traffic(p, stage) if c.axis == "dp"}
        fwd, bwd = rows["all_gather", "block params (forward)"], rows["all_gather", "block params (backward)"]
        assert fwd.calls == bwd.calls == m * layers and fwd.bytes_per_call == block
        assert rows["reduce_scatter", "block grads"].calls == layers
        outer = rows.get(("all_gather", "outer unit params (embeddings, head)"))
        assert (outer is not None and outer.calls == 1) == (stage in (0, 7))


def test_zero3_pipeline_without_resharding_follows_the_schedule():
    """reshard_after_forward = false: a chunk stays gathered from a forward until the next
    backward of the chunk frees it (16 blocks a stage). 1f1b on stage 7 (no warm-up) runs
    F B F B ...: one gather per micro-batch, in its forward. Stage 0 runs F0..F7 (F0
    gathers), then B0 F8 B1 F9 ... B7 F15 (each B frees, each F gathers again; B1..B7
    find the blocks gathered), then B8..B15: B8 finds them gathered by F15, B9..B15
    gather each. Forward 9, backward 7 gathers of every block."""
    p = _titan("1f1b", 1, "false")
    assert est.chunk_layers(p)[7] == [15] and est.chunk_layers(p)[0] == [16]  # one chunk each
    assert traffic.chunk_gathers(p, 7) == [(16, 0)]  # of each of its blocks
    assert traffic.chunk_gathers(p, 0) == [(9, 7)]


# ---------------------------------------------------------------------------- recompute policies


def _policy(p: Plan, recompute: str, every: int = 1) -> Plan:
    return replace(p, train=replace(p.train, recompute=recompute, recompute_every=every))


@pytest.mark.parametrize("arch_name", ["llama", "gpt2"])
def test_selective_ops_keeps_the_input_every_other_matmul_and_the_attention_output(arch_name):
    """torchtitan's op-level policy, counted by hand: the block input, the 1st, 3rd, …
    matmul outputs (llama q, k, v, o, gate, up, down: q, v, gate, down; gpt2 q, k, v, o, up,
    down: q, v, up), SDPA's output and fp32 log-sum-exp."""
    h, a, kv, f, b, s, e = 256, 8, 4, 512, 2, 64, 2
    mdl = _llama() if arch_name == "llama" else model("gpt2", 4, h, a, 1000, s, ffn=f)
    p = _policy(plan(mdl, ("dp", 2, "nvlink"), b=b), "selective_ops")
    T, q, kvw = b * s, h, h * kv // a if arch_name == "llama" else h
    kept = q + kvw + (f + h if arch_name == "llama" else f)
    assert est.layer_activation_bytes(p) == T * e * (h + kept) + T * q * e + a * T * 4


def test_full_every_n_recomputes_every_nth_block_and_each_stage_holds_its_own():
    """full every 2 on 4 layers: blocks 1 and 3 keep their input, 0 and 2 everything; the
    mean over the blocks; a pipeline split [1, 3] holds 1 kept block on stage 0, and on
    stage 1 one kept and two recomputed."""
    p = plan(_llama(), ("pp", 2, "ib"), m=4, schedule="gpipe")
    p = replace(p, pipeline=replace(p.pipeline, layers_per_stage=(1, 3)))
    none, full, every = (_policy(p, r, n) for r, n in (("none", 1), ("full", 1), ("full", 2)))
    kept, recomputed = est.layer_activation_bytes(none), est.layer_activation_bytes(full)
    assert [est.layer_activation_bytes(every, layer=i) for i in range(4)] == [kept, recomputed] * 2
    assert est.layer_activation_bytes(every) == (kept + recomputed) / 2
    held = [s.inflight for s in est.memory(every)]
    emb, head = est.edge_activation_bytes(every)
    acts = [s.activations for s in est.memory(every)]
    assert acts[0] == held[0] * (kept + emb)
    assert acts[1] == held[1] * (kept + 2 * recomputed + head)


def test_recomputed_flops_follow_the_policy():
    """HFU's extra FLOPs per layer and token: selective the core, selective_ops the 2nd,
    4th, 6th matmul (llama: k, o, up), full everything, full every 2 half of that."""
    p = plan(_llama(), ("dp", 2, "nvlink"))
    h, kv, f = 256, 128, 512
    mm, core = arch.layer_flops(p.model, p.model.seq_len)
    tokens, l = flops.batch_tokens(p), p.model.layers
    extra = {(r, n): (flops.flops(_policy(p, r, n)).hardware - flops.flops(p).hardware) / (tokens * l)
             for r, n in (("selective", 1), ("selective_ops", 1), ("full", 1), ("full", 2))}
    assert extra["selective", 1] == core
    assert extra["selective_ops", 1] == pytest.approx(2 * h * kv + 2 * h * h + 2 * h * f)
    assert extra["full", 1] == mm + core and extra["full", 2] == pytest.approx((mm + core) / 2)


def test_recomputed_blocks_repeat_their_forward_collectives():
    """tp all-reduces (no SP): 4 per layer and micro-batch, plus the one a re-run forward
    repeats (selective_ops re-runs as full does); full every 2 on 2 of the 4 layers."""
    p = plan(_llama(), ("tp", 2, "nvlink"), m=1)
    calls = {(r, n): next(c for c in traffic.stage_traffic(_policy(p, r, n), 0) if c.what == "layer activations").calls
             for r, n in (("none", 1), ("selective_ops", 1), ("full", 1), ("full", 2))}
    assert calls == {("none", 1): 16, ("selective_ops", 1): 20, ("full", 1): 20, ("full", 2): 18}


@pytest.mark.parametrize("cuda_name, device", [
    ("NVIDIA H100 80GB HBM3", "h100_sxm"),
    ("NVIDIA H100 PCIe", "h100_pcie"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA A100-SXM4-40GB", "a100_40g"),
    ("NVIDIA A100-PCIE-40GB", "a100_40g"),
    ("NVIDIA A100-SXM4-80GB", "a100_80g"),
    ("NVIDIA GB200", "gb200"),
    ("NVIDIA GeForce RTX 4090", None),
])
def test_a_gpu_is_found_in_the_catalog_by_its_cuda_name(cuda_name, device):
    """The gpu tests and benchmarks/gpu_mfu.py take the MFU's peak from the catalog entry
    of the GPU torch reports (names as torch.cuda.get_device_name prints them)."""
    from dslc.catalog import DEVICES, device_of_cuda_name

    assert device_of_cuda_name(cuda_name) == device
    assert device is None or device in DEVICES


# ---------------------------------------------------------------------------- float8


def _float8(p: Plan, recipe="tensorwise", fp8=1979e12, compile=None) -> Plan:
    cluster = replace(p.cluster, device=replace(p.cluster.device, fp8_flops=fp8))
    return replace(p, cluster=cluster, train=replace(p.train, float8=recipe, compile=compile))


@pytest.mark.parametrize("compiled, tp", [(True, 2), (False, 2), (True, 1)])
def test_float8_runs_the_blocks_linears_at_the_fp8_peak_and_pays_for_their_casts(compiled, tp):
    """A dense llama block on a tp rank: its seven linears' GEMMs at the fp8 peak (half
    the time at twice the peak); the elementwise work grows by the casts of each linear's
    input and weight, counted here by hand from the block's shapes: e + 1 bytes an element
    compiled (the amax fused into the producer), 2·e + 1 eagerly, and under tp, whose
    amax reductions the script runs outside the compiled graph (float8_linear)."""
    from dslc.cost.compute import layer_kernels

    h, f, T = 256, 768, 4 * 64
    bf16 = plan(model("llama", h=h, a=8, kv=4, ffn=f, s=64), *[("tp", tp, "nvlink")] * (tp > 1), b=4)
    fp8 = _float8(bf16, compile=compiled)
    k0, k8 = layer_kernels(bf16, rates(bf16)), layer_kernels(fp8, rates(fp8))
    assert k8.gemm == pytest.approx(k0.gemm * 989 / 1979)
    q, kv = h // tp, h // 2 // tp  # q and o: 8 heads of 32; k and v: 4 heads
    inputs = T * (3 * h + q + 2 * h + f // tp)  # q, k, v, gate, up read h wide; o reads q; down reads f / tp
    weights = 2 * h * q + 2 * h * kv + 3 * h * f // tp
    per_element = 2 + 1 if compiled and tp == 1 else 2 * 2 + 1
    assert (k8.elementwise - k0.elementwise) * rates(fp8).bandwidth == pytest.approx(per_element * (inputs + weights))
    assert (k8.attention, k8.loss) == (k0.attention, k0.loss)


def test_float8_leaves_the_router_and_memory_as_they_were_and_shortens_the_step():
    """The router's GEMM stays at the bf16 peak (torchao's linears are the blocks' projections
    and the experts); the memory is the plan's without fp8: torchao keeps each linear's
    high-precision input and weight for backward and its fp8 copies are transient."""
    moe = plan(model("mixtral", l=4, h=4096, a=32, kv=8, ffn=14336, s=4096, experts=8, top_k=2), ("ep", 8, "nvlink"))
    fp8 = _float8(moe)
    e0, e8 = estimate(moe), estimate(fp8)
    assert [s.total for s in e8.memory] == [s.total for s in e0.memory]
    assert e8.timing.step < e0.timing.step and e8.timing.mfu > e0.timing.mfu
    router = 2 * 4096 * 4096 * 8  # FLOPs of its forward GEMM
    r0, r8 = rates(moe), rates(fp8)
    assert r8.gemm_seconds(router, 4096, 4096, 8) == r0.gemm_seconds(router, 4096, 4096, 8)  # only fp8=True GEMMs speed up
    assert r8.gemm_seconds(router, 4096, 4096, 8, fp8=True) == pytest.approx(r0.gemm_seconds(router, 4096, 4096, 8) * 989 / 1979)


def test_float8_routed_experts_compute_grad_weight_at_the_plan_s_peak():
    """The routed experts run on torchao's rowwise_with_gw_hp recipe (float8.py): forward
    and grad_input at the fp8 peak, grad_weight in high precision, at the plan's peak: a
    MoE layer's backward is 2× its forward GEMMs plus the experts' bf16 GEMM time less their fp8 time."""
    from dslc.cost.compute import layer_kernels
    from dslc.cost.memory import routed_slots

    moe = plan(model("mixtral", l=4, h=4096, a=32, kv=8, ffn=14336, s=4096, experts=8, top_k=2), ("ep", 8, "nvlink"))
    fp8 = _float8(moe)
    r0, r8 = rates(moe), rates(fp8)
    k0, k8 = layer_kernels(moe, r0), layer_kernels(fp8, r8)
    slots = routed_slots(moe, 1.0)
    per_expert = max(1, slots * 8 // 8)
    experts = [w for w in arch.weights(moe.model, 1) if w.part == "expert"]
    bf16 = sum(r0.gemm_seconds(2 * slots * w.numel, per_expert, *w.shape) for w in experts)  # forward, one GEMM each
    assert len(experts) == 3 and bf16 > 0
    rest = k8.attention_backward * k8.attention + 2 * k8.elementwise
    fp8_gemm = bf16 * 989 / 1979  # at the fp8 peak
    assert k8.backward == pytest.approx(2 * k8.gemm + bf16 - fp8_gemm + rest)  # grad_weight at bf16's, not fp8's
    assert k0.backward == pytest.approx(2 * k0.gemm + k0.attention_backward * k0.attention + 2 * k0.elementwise)


def test_float8_does_not_pay_on_a_small_model():
    """At hidden 256 the casts' passes over each input and weight cost more than the GEMMs
    save: explain says fp8 slows such a plan down (torchao reports its speed-ups from
    hidden 4096 on)."""
    small = plan(model("llama", h=256, a=8, kv=4, ffn=768, s=256), ("dp", 2, "nvlink"), b=4)
    assert estimate(_float8(small)).timing.step > estimate(small).timing.step


def test_float8_on_a_cpu_emulates_at_the_plan_s_own_rate():
    """No fp8 peak (cpu: torchao's emulation): the GEMMs cost what they cost without fp8."""
    p = plan(model("llama", h=128, a=4, s=32), ("tp", 2, "nvlink"))
    p8 = _float8(p, fp8=0.0)
    from dslc.cost.compute import layer_kernels

    assert layer_kernels(p8, rates(p8)).gemm == layer_kernels(p, rates(p)).gemm


def test_ep_dispatch_runs_behind_the_shared_experts(monkeypatch):
    """expert_parallel.py's dispatch starts the tokens' all-to-all and the shared experts
    run before arrive() waits for it: explain hides forward's dispatch behind their three
    GEMMs (what they do not cover stays exposed); combine, and both exchanges in backward,
    stay exposed. The bytes are those of the layer without shared experts."""
    from dslc.cost.time import timing
    from dslc.cost.topology import Topology

    L, b, s, h, f = 2, 4, 512, 1024, 1024
    bare = model("mixtral", L, h, 16, 128, s, kv=4, ffn=f, tie=False, experts=8, top_k=2)
    p = plan(replace(bare, shared_experts=1), ("ep", 8, "ib"), b=b)
    specs = [sp for sp in traffic.layer_specs(p) if sp.axes == ("ep",)]
    assert sorted((sp.fwd, sp.bwd, sp.overlap) for sp in specs) == [(1, 0, "shared"), (1, 2, "exposed")]
    assert traffic.rank_payload(p, 0)[("ep", "all_to_all")] == traffic.rank_payload(plan(bare, ("ep", 8, "ib"), b=b), 0)[("ep", "all_to_all")]
    topo = Topology.of(p)
    t_f = timing(p, topo)[0].chunks[0][0]
    dispatch = traffic.to_comm(p, specs[0] if specs[0].overlap == "shared" else specs[1], 1).seconds(topo)
    r, T = rates(p), b * s
    shared = 3 * r.gemm_seconds(2 * T * h * f, T, h, f)  # gate, up and down on the rank's tokens
    assert 0 < shared and 0 < dispatch
    real = traffic.layer_specs
    monkeypatch.setattr(traffic, "layer_specs", lambda *a, **k: [replace(sp, overlap="exposed") for sp in real(*a, **k)])
    exposed = timing(p, topo)[0].chunks[0][0]
    assert exposed - t_f == pytest.approx(L * min(dispatch, shared))


def _offload(p: Plan, optimizer=False, activations=False) -> Plan:
    from dslc.ir import Offload

    return replace(p, train=replace(p.train, offload=Offload(optimizer, activations, None)))


@pytest.mark.parametrize("precision, optimizer, moments", [("bf16", "adamw", 8), ("fp32", "adamw", 8), ("fp32", "sgd", 4)])
def test_optimizer_offload_moves_the_optimizer_s_shard_to_the_host(precision, optimizer, moments):
    """ZeRO-1 over dp4: the rank's optimizer steps n = ⌈params / 4⌉ of them. With offload the
    device holds no optimizer state and no step temporaries, the rest as before; the host
    holds an fp32 master copy (4n, under fp32 too), the moments, fp32 gradients (4n) and,
    in 16-bit, a staging buffer in bf16 (2n); each step copies the gradients out and the
    weights back in the working precision."""
    base = plan(model("llama", l=4, h=512, a=8, kv=4, V=1024, s=256), ("dp", 4, "nvlink"), zero=1, precision=precision,
                optimizer=optimizer, momentum=0.9)
    n = ceil(arch.params(base.model).total / 4)
    before, after = est.memory(base)[0], est.memory(_offload(base, optimizer=True))[0]
    assert (after.optimizer, after.step_temp) == (0, 0) and before.optimizer > 0
    assert (after.params, after.grads, after.activations) == (before.params, before.grads, before.activations)
    w = 2 if precision == "bf16" else 4
    host = after.host_optimizer
    assert (host.master, host.moments, host.grads, host.staging) == (4 * n, moments * n, 4 * n, 2 * n if w == 2 else 0)
    assert (host.d2h, host.h2d, host.activations) == (w * n, w * n, 0)
    if precision == "bf16":  # what the device held is what the host holds now, and more
        assert host.master + host.moments == before.optimizer


@pytest.mark.parametrize("pp, m", [(1, 1), (2, 4)])
def test_activation_offload_keeps_two_blocks_on_the_device_and_the_rest_on_the_host(pp, m):
    """Each forward's blocks go to the host and come back one block ahead of their backward:
    the device holds two blocks' saved tensors and the edges' (embedding, head), the host
    what the device held of the blocks (1f1b's first stage: pp forwards in flight), and
    every forward of every micro-batch copies its blocks out and back."""
    axes = [("pp", pp, "nvlink")] if pp > 1 else []
    base = plan(model("llama", l=4, h=512, a=8, kv=4, V=1024, s=256), *axes, m=m)
    per_layer = est.layer_activation_bytes(base)
    emb, head = est.edge_activation_bytes(base)
    layers = 4 // pp
    before, after = est.memory(base)[0], est.memory(_offload(base, activations=True))[0]
    held = before.inflight  # forwards in flight on the first stage at its peak
    assert held == (pp if pp > 1 else 1)
    edges = held * emb + (head if pp == 1 else 0)
    assert before.activations == round(held * layers * per_layer) + edges
    assert after.activations == round(2 * per_layer) + edges
    host = after.host_activations
    assert host.activations == round(held * layers * per_layer)
    assert host.d2h == host.h2d == round(m * layers * per_layer)
    assert after.host_optimizer.total == 0 and after.optimizer == before.optimizer


def test_offload_s_time_is_the_host_step_and_what_pcie_does_not_hide():
    """A small model's copies outlast its compute: the step grows by the host's optimizer
    step and by the copies the backward does not hide, and the device's optimizer step is
    gone. The host step passes over its n parameters (bf16 AdamW, clipping on): the
    gradients widened from bf16 staging (2n read, 4n written), their norm (4n), the clip
    (8n), the fused AdamW (master, m, v and the gradient read: 16n; master, m, v written:
    12n), the masters rounded into staging (4n read, 2n written): 52n bytes, at the node's
    host bandwidth shared by its 8 GPUs. Gradients go out behind the last backward as
    their buckets are reduced; the weights come back before the device runs anything."""
    from dslc import catalog
    from dslc.ir import Link

    base = plan(model("llama", l=2, h=256, a=4, V=512, s=128), ("dp", 8, "nvlink"), zero=3)
    pcie = Link("pcie", "node", 20e9, 5e-6, base.span)
    base = replace(base, cluster=replace(base.cluster, links=base.cluster.links + (pcie,)))
    off = _offload(base, optimizer=True)
    t0, t1 = estimate(base).timing, estimate(off).timing
    host = est.memory(off)[0].host_optimizer
    n = host.master // 4
    assert t1.optimizer == 0 and t0.optimizer > 0
    assert t1.offload.host_step == pytest.approx(52 * n / (catalog.HOST_BANDWIDTH / 8))
    assert t1.offload.d2h == pytest.approx(2 * n / 20e9)
    b = t1.chunks[0][1]  # the last (only) micro-batch's backward
    assert t1.offload.exposed == pytest.approx(max(0, 2 * n / 20e9 - b) + 2 * n / 20e9)
    assert t1.step == pytest.approx(t0.step - t0.optimizer + t1.offload.host_step + t1.offload.exposed)
    slow = replace(off, cluster=replace(off.cluster, host_bandwidth=100e9))  # the cluster's own host_bandwidth
    assert estimate(slow).timing.offload.host_step == pytest.approx(t1.offload.host_step * catalog.HOST_BANDWIDTH / 100e9)


def test_without_data_parallelism_the_gradients_go_out_after_the_backward():
    """No buckets mark a part of the gradients as reduced early: all of their copy out is
    exposed, as the copy back is."""
    base = plan(model("llama", l=2, h=256, a=4, V=512, s=128), ("tp", 2, "nvlink"))
    t = estimate(_offload(base, optimizer=True)).timing.offload
    assert t.exposed == pytest.approx(t.d2h + t.h2d)


def test_activation_offload_exposes_the_round_trip_of_each_forward_s_last_block():
    """The last block of a forward goes out as the forward ends and comes back as its
    backward begins: two copies of one block per micro-batch exposed, on top of what the
    forward and backward do not hide of the others."""
    base = plan(model("llama", l=4, h=512, a=8, kv=4, V=1024, s=256), ("dp", 2, "nvlink"), m=2)
    e = estimate(_offload(base, activations=True))
    t, act = e.timing.offload, e.memory[0].host_activations
    block = act.d2h / (2 * 4)  # 2 micro-batches of 4 blocks
    bw = 32e9  # the catalog's pcie: this cluster has none
    f, b = e.timing.chunks[0][0], e.timing.chunks[0][1]
    assert t.exposed == pytest.approx(max(0, act.d2h / bw - 2 * f) + max(0, act.h2d / bw - 2 * b) + 2 * 2 * block / bw)


def test_an_optimizer_without_state_has_no_step_temporaries():
    """SGD without momentum keeps no state: its step allocates nothing per parameter."""
    p = plan(model("llama", l=2, h=256, a=4, V=512, s=128), ("dp", 2, "nvlink"), precision="fp32", optimizer="sgd", momentum=0.0)
    assert [(s.optimizer, s.step_temp) for s in est.memory(p)] == [(0, 0)]
