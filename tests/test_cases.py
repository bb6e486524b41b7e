"""The bad-plan corpus: each tests/cases/<name>.plan comes with
<name>.expected, one line per diagnostic (`CODE line:col`) that the author of
the case meant it to produce. The linter must report exactly those errors and
warnings, at those places, and exit with the matching code."""

from __future__ import annotations

from pathlib import Path

import pytest

from dslc.cli import main
from dslc.driver import load_paths, load_text

CASES = Path(__file__).parent / "cases"
PLANS = sorted(CASES.glob("*.plan"))


def expected(plan: Path) -> list[tuple[str, str]]:
    text = plan.with_suffix(".expected").read_text()
    return sorted(tuple(line.split()) for line in text.splitlines() if line.strip())


def test_corpus_is_large():
    assert len(PLANS) >= 40
    codes = {code for p in PLANS for code, _ in expected(p)}
    assert len(codes) >= 40, sorted(codes)


@pytest.mark.parametrize("plan", PLANS, ids=[p.stem for p in PLANS])
def test_case(plan: Path, capsys):
    result = load_paths([plan])
    got = sorted(
        (d.code, f"{d.span.line}:{d.span.col}")
        for d in result.diagnostics
        if d.severity.value != "note" and d.span and Path(d.span.file) == plan
    )
    assert got == expected(plan)
    has_error = any(code.startswith("E") for code, _ in expected(plan))
    assert main(["lint", str(plan)]) == (1 if has_error else 0)
    assert main(["lint", "--strict", str(plan)]) == 1
    out = capsys.readouterr().out
    code, where = expected(plan)[0]
    assert f"{plan}:{where}: " in out and f"[{code}]" in out


MOE = """cluster c {{ nodes = 1; gpus_per_node = 2; device = cpu; link shm {{ scope = node; bandwidth = 10 GB/s }} }}
plan p {{
    model {arch} {{ layers = 2; hidden = 64; heads = 4; vocab = 256; seq_len = 32{model} }}
    cluster = c
    mesh {{ dp = 2 on shm }}
    {experts}
}}
"""


@pytest.mark.parametrize("arch, model, experts, want", [
    ("mixtral", "; experts = 4", "", ("topk_softmax", 0.0, 0.0)),
    ("mixtral", "; experts = 4; router = softmax_topk; z_loss_weight = 0.001; capacity_factor = 1.25", "", ("softmax_topk", 0.001, 1.25)),
    ("mixtral", "", "experts { count = 4; router = softmax_topk; z_loss_weight = 0.01; capacity_factor = 2 }", ("softmax_topk", 0.01, 2.0)),
    ("llama", "", "", ("", 0.0, 0.0)),
])
def test_router_keys_reach_the_ir(arch, model, experts, want):
    """router, z_loss_weight and capacity_factor, from the model or the plan's experts block;
    left out: Mixtral's top-k-then-softmax router, no z-loss, dropless (0.0)."""
    res = load_text(MOE.format(arch=arch, model=model, experts=experts), "<t>")
    assert not [d.message for d in res.diagnostics if d.is_error]
    m = res.plans[0].model
    assert (m.router, m.z_loss_weight, m.capacity_factor) == want


SPELLED = """cluster c {{ nodes = 1; gpus_per_node = 2; device = cpu; link shm {{ scope = node; bandwidth = 10 GB/s }} }}
plan p {{
    model llama {{ layers = 2; hidden = 64; heads = 4; vocab = 256; seq_len = 32{model} }}
    cluster = c
    mesh {{ dp = 2 on shm }}
    {plan}
}}
"""


@pytest.mark.parametrize("model, plan, want", [
    ("", "train { grad_accum = 4 }",
     "unknown key 'grad_accum' in train; help: gradient accumulation is `pipeline { microbatches = N }` "
     "(left out: global_batch / (micro_batch × dp × ep))"),
    ("", "train { accumulation_steps = 4 }", "help: gradient accumulation is `pipeline { microbatches = N }`"),
    ("", "train { microbatches = 4 }", "help: micro-batches per step are `pipeline { microbatches = N }`"),
    ("", "pipeline { micro_batch = 2 }", "help: the micro-batch size is `train { micro_batch = N }`"),
    ("", "train { batch_size = 8 }", "help: the batch is `train { micro_batch = N }`"),
    ("", "train { lr = 1e-3 }", "help: the learning rate is the optimizer's: `train { optimizer adamw { lr = 3e-4 } }`"),
    ("", "tp = 2", "unknown key 'tp' in plan 'p'; help: mesh axes are placed in the plan's mesh: `mesh { tp = N on LINK }`"),
    ("", "data_parallel { dp = 2 }", "help: mesh axes are placed in the plan's mesh: `mesh { dp = N on LINK }`"),
    ("", "train { activation_checkpointing = true }", "help: activation checkpointing is `train { recompute = full }` (or `selective`)"),
    ("", "fsdp { }", "unknown block 'fsdp' in plan 'p'; help: FSDP is `data_parallel { zero = 3 }`"),
    ("; num_layers = 2", "", "unknown key 'num_layers' in model 'llama'; help: the number of transformer blocks is the model's `layers = N`"),
    ("; max_position_embeddings = 32", "", "help: the sequence length is the model's `seq_len = N`"),
    ("; hiden = 64", "", "unknown key 'hiden' in model 'llama'; help: did you mean 'hidden'?"),  # a typo: the guess
])
def test_a_key_spelled_elsewhere_says_where(model, plan, want):
    """E010/E016 for a key the language writes elsewhere (ELSEWHERE) names that place,
    not the nearest spelling: grad_accum is not grad_clip."""
    res = load_text(SPELLED.format(model=model, plan=plan), "<t>")
    shown = [f"{d.message}; help: {d.hint}" for d in res.diagnostics if d.code in ("E010", "E016")]
    assert len(shown) == 1 and want in shown[0], shown


def test_real_keys_win_over_the_table():
    """A key of the table that the block does know is read, not flagged."""
    from dslc.front.schema import ELSEWHERE

    plan = "pipeline { microbatches = 2 }\n    data_parallel { zero = 1 }\n    train { micro_batch = 1; optimizer adamw { lr = 1e-3; weight_decay = 0.0 } }"
    assert {"microbatches", "zero", "micro_batch", "lr", "weight_decay", "dp"} <= ELSEWHERE.keys()
    res = load_text(SPELLED.format(model="", plan=plan), "<t>")
    assert not [d.message for d in res.diagnostics if d.is_error]
    assert res.plans[0].train.optimizer.lr == 1e-3 and res.plans[0].pipeline.microbatches == 2


STAGE = """cluster c {{ nodes = 1; gpus_per_node = 2; device = cpu; link shm {{ scope = node; bandwidth = 10 GB/s }} }}
plan p {{
    model {arch} {{ layers = 4; hidden = 64; heads = 4; vocab = 256; seq_len = 32{model} }}
    cluster = c
    {plan}
    train {{ steps = 1{train} }}
}}
"""


def test_head_dim_is_a_model_key():
    """head_dim apart from hidden / heads (Gemma, Qwen3): q is heads·head_dim wide, k and v
    kv_heads·head_dim, o_proj maps q back to hidden; left out it is hidden / heads, and
    then hidden must divide (E040)."""
    from dslc import arch

    res = load_text(STAGE.format(arch="llama", model="; kv_heads = 2; head_dim = 24", plan="mesh { dp = 2 on shm }", train=""), "<t>")
    assert not [d.message for d in res.diagnostics if d.is_error]
    m = res.plans[0].model
    assert m.head_dim == 24 and arch.widths(m) == (96, 48, m.ffn) and arch.widths(m, 2) == (48, 24, m.ffn // 2)
    shapes = {w.name: w.shape for w in arch.weights(m)}
    assert shapes["blocks.{i}.attn.q_proj.weight"] == (96, 64) and shapes["blocks.{i}.attn.k_proj.weight"] == (48, 64)
    assert shapes["blocks.{i}.attn.o_proj.weight"] == (64, 96)
    assert load_text(STAGE.format(arch="llama", model="", plan="mesh { dp = 2 on shm }", train=""), "<t>").plans[0].model.head_dim == 16
    odd = STAGE.format(arch="gpt2", model="", plan="mesh { dp = 2 on shm }", train="").replace("heads = 4", "heads = 6")
    assert [d.code for d in load_text(odd, "<t>").diagnostics if d.is_error] == ["E040"]
    given = odd.replace("heads = 6", "heads = 6; head_dim = 10")
    res = load_text(given, "<t>")
    assert not [d.message for d in res.diagnostics if d.is_error]
    # Hugging Face: LlamaConfig's head_dim; GPT-2's heads are n_embd / n_head, so no export
    assert arch.hf.config(arch.of(m), m)["head_dim"] == 24 and not arch.hf.exportable(m)
    assert "n_embd / n_head" in arch.hf.exportable(res.plans[0].model)


@pytest.mark.parametrize("arch_, seq, want", [("llama", 128, (128, 128)), ("llama", 16, (16, 16)), ("gpt2", 16, (16, 32))])
def test_train_seq_len_is_the_stage_length(arch_, seq, want):
    """train { seq_len } replaces the model's for the plan; gpt2's position table keeps the
    model's 32 rows (max_positions), and checks of seq_len point at the override."""
    from dslc import arch

    text = STAGE.format(arch=arch_, model="", plan="mesh { tp = 2 on shm }\n    tensor_parallel { sequence_parallel = true }", train=f"; seq_len = {seq}")
    res = load_text(text, "<t>")
    assert not [d.message for d in res.diagnostics if d.is_error]
    m = res.plans[0].model
    assert (m.seq_len, m.max_positions) == want
    assert all(w.shape == (32, 64) for w in arch.weights(m) if w.name == "wpe.weight")
    bad = load_text(text.replace(f"seq_len = {seq}", "seq_len = 33"), "<t>")
    (e061,) = [d for d in bad.diagnostics if d.code == "E061"]
    assert e061.span.line == 6  # at the train block's seq_len, not the model's


def test_e052_names_every_empty_middle_chunk():
    """The first chunk (the embedding) and the last (the loss) may have no layers; every
    other empty chunk is named, with its pp rank when there are virtual stages."""
    pipe = "mesh {{ pp = 2 on shm }}\n    pipeline {{ schedule = interleaved_1f1b; virtual_stages = 3; microbatches = 4; layers_per_stage = {split} }}"
    def e052(split: str) -> list[str]:
        res = load_text(STAGE.format(arch="llama", model="", plan=pipe.format(split=split), train=""), "<t>")
        return [d.message for d in res.diagnostics if d.code == "E052"]

    assert e052("[0, 1, 1, 1, 1, 0]") == []
    assert e052("[0, 0, 2, 0, 2, 0]") == ["layers_per_stage: chunk 1 (pp rank 1) has no layers, chunk 3 (pp rank 1) has no layers"]
    assert e052("[-1, 1, 1, 1, 1, 1]") == ["layers_per_stage: chunk 0 (pp rank 0) has -1 layers"]


def test_e052_in_a_v_names_the_rank_and_says_what_may_be_empty():
    """In a V (rank r holds chunks r and 2p−1−r) any chunk may be empty but every rank but
    rank 0 must hold a layer: the message names the chunks' V ranks, the hint says so."""
    pipe = "mesh {{ pp = 2 on shm }}\n    pipeline {{ schedule = zb_v; microbatches = 4; layers_per_stage = {split} }}"

    def e052(split: str) -> list[tuple[str, str | None]]:
        res = load_text(STAGE.format(arch="llama", model="", plan=pipe.format(split=split), train=""), "<t>")
        return [(d.message, d.hint) for d in res.diagnostics if d.code == "E052"]

    assert e052("[0, 2, 2, 0]") == e052("[2, 0, 2, 0]") == e052("[0, 2, 0, 2]") == []  # rank 1: chunks 1, 2
    ((message, hint),) = e052("[2, 0, 0, 2]")
    assert message == "layers_per_stage: pp rank 1 (chunks 1 and 2) has no layers"
    assert hint is not None and "in a V any chunk may have 0 layers" in hint and "rank 0" in hint
    ((message, _),) = e052("[-1, 5, 0, 0]")
    assert message.startswith("layers_per_stage: chunk 0 (pp rank 0) has -1 layers")
    ((message, _),) = e052("[2, 3, -1, 0]")
    assert "chunk 2 (pp rank 1) has -1 layers" in message  # chunk 2 sits on rank 1 in a V, not 2 % 2 = 0


def test_float8_on_a_cpu_is_a_note_that_it_is_emulated():
    """Notes stay out of the .expected files: N105, at the key, for the case's cpu plan only."""
    plan = CASES / "float8_without_fp8_tensor_cores.plan"
    notes = [(d.code, d.span.line) for d in load_paths([plan]).diagnostics if d.severity.value == "note"]
    assert notes == [("N105", 29)]


def test_offload_on_a_cluster_that_does_not_say_its_hosts_is_a_note():
    """N111 at the offload block, for the case's plan whose cluster has neither host_memory
    nor a pcie link; the cluster that gives both has none."""
    plan = CASES / "offload_beyond_host_memory.plan"
    notes = [(d.code, d.span.line) for d in load_paths([plan]).diagnostics if d.severity.value == "note"]
    assert notes == [("N111", 28)]
