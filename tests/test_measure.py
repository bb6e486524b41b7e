"""Measured against predicted: `train.py --measure` on small plans against `dslc explain`.

Each plan is compiled and trained for one step under torchrun (CPU, gloo) with
``--measure``; every rank writes what it sent (payload bytes by axis and collective,
counted inside the one wrapper per kind), the model state it holds after the
optimizer step and the bytes autograd saved per micro-batch. The predictions come
from dslc.traffic.rank_payload (exact), dslc.estimate.memory (exact for parameters,
gradients and optimizer state; within 10 % for activations, with the estimator's
default SDPA setting and the plan's recompute and dropout) and report.to_json
(``params.total``, the generated model's real parameter count)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dslc import codegen
from dslc.cost import memory as est
from dslc.cost import recompute, traffic
from dslc.driver import load_text
from dslc.groups import replica_group
from dslc.ir import Offload
from dslc.report import explain as report

pytestmark = pytest.mark.slow

ACTIVATION_RTOL = 0.10


def _variant(plan, name, precision=None, recompute=None, zero=None, every=1, capacity_factor=None, offload=None, offload_optimizer=False):
    train, model = plan.train, plan.model
    if offload is not None:  # activation offload on or off
        train = dataclasses.replace(train, offload=Offload(False, True, None) if offload else None)
    if offload_optimizer:  # train { offload { optimizer = true } }
        train = dataclasses.replace(train, offload=Offload(True, False, None))
    if capacity_factor:  # padded all-to-alls: every micro-batch sends and saves the same
        model = dataclasses.replace(model, capacity_factor=capacity_factor)
    if precision:
        train = dataclasses.replace(train, precision=precision)
    if recompute:
        train = dataclasses.replace(train, recompute=recompute, recompute_every=every)
    dp = plan.data_parallel
    if zero is not None:
        dp = dataclasses.replace(dp, zero=zero)
    return dataclasses.replace(plan, name=name, model=model, train=train, data_parallel=dp)


# name -> (golden plan, changes): together they cover fp32 and 16-bit state, ZeRO-0/1,
# plain tp and sequence parallel, no/selective/full recompute, gpt2 and llama (GQA).
PLANS = {
    "serial": ("llama_serial", {"precision": "bf16"}),
    "dp2": ("gpt2_dp2_zero1", {"precision": "bf16"}),
    "tp2_sp": ("llama_tp2_sp", {}),
    "dp2_tp2": ("gpt2_dp2_tp2", {"recompute": "full"}),
    "dp2_tp2_sp_zero1": (
        "llama_dp2_tp2_sp_zero1",
        {"precision": "fp16", "recompute": "full"},
    ),
    # mixture of experts: with a capacity every all-to-all is padded, so exact (ep alone in
    # bf16, with tp + sp and full recompute, in a pipeline); dropless with dp x ep, ZeRO-1
    "moe_ep2_cap": ("mixtralcap_ep2", {"precision": "bf16"}),
    "moe_ep2_tp2_sp_cap": ("mixtralcap_ep2_tp2_sp", {"recompute": "full"}),
    "moe_pp2_ep2_cap": ("mixtralcap_pp2_ep2", {}),
    "moe_dp2_ep2_zero1": ("mixtral_dp2_ep2_zero1", {}),
    # ZeRO-2 and 3 with experts (their buckets and units over dp, their own group): ZeRO-2,
    # ZeRO-3 in bf16 with full recompute; with tp + sp (the experts' group dp x tp adds their tp
    # partial sums: ZeRO-3, and ZeRO-1 sharding them over tp); HSDP (2 replicas of dp_shard 2)
    "moe_dp2_ep2_zero2_cap": ("mixtral_dp2_ep2_zero2", {"capacity_factor": 1.0}),
    "moe_dp2_ep2_zero3_cap": ("mixtral_dp2_ep2_zero3", {"precision": "bf16", "recompute": "full", "capacity_factor": 1.0}),
    "moe_dp2_ep2_tp2_sp_zero3_cap": ("mixtral_dp2_ep2_tp2_sp_zero3", {"capacity_factor": 1.0}),
    "moe_dp2_ep2_tp2_sp_zero1_cap": ("mixtral_dp2_ep2_tp2_sp_zero3", {"zero": 1, "capacity_factor": 1.0}),
    "moe_dp4_ep2_zero3_shard2_cap": ("mixtral_dp4_ep2_zero3_shard2", {"capacity_factor": 1.0}),
    # experts under cp: ring (two chunks a rank) and Ulysses with ep and a capacity, over
    # tp with sp (the counts gathered over tp, then cp)
    "moe_cp2_ep2_cap": ("mixtralcap_cp2_ep2", {"precision": "bf16"}),
    "moe_cp2_ep2_ulysses_cap": ("mixtralcap_cp2_ep2_ulysses", {}),
    "moe_cp2_tp2_sp_cap": ("mixtralcap_cp2_tp2_sp", {"recompute": "full"}),
    # DeepSeek-style (a dense first block, a shared expert) with a capacity: a pipeline whose
    # first stage holds the dense block and one MoE block; the dense MLP split over tp with sp
    "deepseek_pp2_ep2_cap": ("deepseek_pp2_ep2", {"capacity_factor": 1.0}),
    "deepseek_ep2_tp2_sp_cap": ("deepseek_ep2_tp2_sp", {"precision": "bf16", "capacity_factor": 1.0}),
    # head_dim apart from hidden / heads: q, k, v, o and what they save split over tp by heads;
    # a pipeline whose first and last chunks hold no layers (the embedding, the head alone)
    "tp2_head_dim": ("llamahd_tp2", {"precision": "bf16"}),
    "pp4_edges": ("llamapp_pp4_edges", {}),
    # a V (zb_v): two chunks per rank, the turn without a message, rank 0 holding both ends
    # (tied embeddings: one wte, no tied-gradient all-reduce over pp); dualpipe_v with experts
    "pp2_zb_v_tied": ("gpt2pp_pp2_zb_v", {}),
    "moe_pp2_ep2_dualpipe_v": ("mixtral_pp2_ep2_dualpipe_v", {}),
    # ZeRO-2 and 3: 2 micro-batches accumulating, in bf16; one micro-batch over 4 ranks; with
    # tp + sp; kept gathered until backward with full recompute; a tied pipeline (1f1b) and an
    # interleaved one with reshard_after_forward = false
    "dp2_zero2": ("gpt2_dp2_zero2", {"precision": "bf16"}),
    "dp4_zero2": ("llama_dp4_zero2", {}),
    "dp4_zero3": ("llama_dp4_zero3", {}),
    "dp2_tp2_sp_zero3": ("gpt2_dp2_tp2_sp_zero3", {"precision": "bf16"}),
    "dp2_zero3_full": ("llama_dp2_zero3_full", {}),
    "dp2_pp2_zero3_tied": ("gpt2pp_dp2_pp2_zero3", {}),
    "dp2_pp2_interleaved_zero3": ("llamapp_dp2_pp2_interleaved_zero3", {}),
    # zb_h1: weights freed after B, the gradients held until the step's last W
    "dp2_pp2_zero3_zb_h1": ("llamapp_dp2_pp2_zero3_zb_h1", {}),
    "dp2_pp2_zero3_dualpipe_v": ("llamapp_dp2_pp2_zero3_dualpipe_v", {"recompute": "none"}),  # a V: two chunks' units
    # cp in an interleaved and a zb_h1 pipeline; ep with zb_h1 (a capacity: exact)
    "cp2_pp2_zb_h1": ("llamapp_cp2_pp2_zb_h1", {}),
    "moe_pp2_ep2_zb_h1_cap": ("mixtral_pp2_ep2_zb_h1", {"capacity_factor": 1.0}),
    # HSDP: shard groups of 2 dp ranks, 2 replicas all-reducing the reduced shards (ZeRO-3
    # per unit, ZeRO-2 in bf16 per bucket)
    "dp4_zero3_shard2": ("llama_dp4_zero3_shard2", {}),
    "dp4_zero2_shard2": ("llama_dp4_zero2_shard2", {"precision": "bf16"}),
    # context parallel: ring passes in bf16 (the dK, dV accumulators travel in fp32), cp4 with
    # full recompute (the ring runs again), Ulysses, with tp + sp and selective recompute
    # (which leaves the ring alone), in a pipeline, and under ZeRO-3 over the cp ranks
    "cp2_ring": ("llama_cp2", {"precision": "bf16"}),
    "cp4_ring_full": ("llama_cp4", {"recompute": "full"}),
    "cp2_ulysses": ("gpt2_cp2_ulysses", {"precision": "bf16"}),
    "cp2_tp2_sp_selective": ("llama_cp2_tp2_sp", {"recompute": "selective"}),
    "cp2_pp2": ("llamapp_cp2_pp2", {}),
    "cp2_zero3": ("gpt2_cp2_zero3", {}),
    # recompute policies: op-level selective checkpointing (kept matmul and attention outputs
    # pass no autograd hook) with tp + sp on llama (GQA), on gpt2 with tp alone (biases: addmm)
    # and with Ulysses and ring attention; full every 2 on one process, and in a pipeline
    # whose stages hold layers [1, 3] (stage 1 recomputes two of its three blocks)
    "tp2_sp_selective_ops": ("llama_tp2_sp", {"recompute": "selective_ops"}),
    "dp2_tp2_selective_ops": ("gpt2_dp2_tp2", {"recompute": "selective_ops"}),
    "cp2_ulysses_selective_ops": ("gpt2_cp2_ulysses", {"recompute": "selective_ops"}),
    "cp2_ring_selective_ops": ("llama_cp2", {"recompute": "selective_ops"}),
    # selective_ops with experts (each expert weight one matmul of the count): the loop of
    # matmuls (dropless), batched over ep with tp + sp (capacity), a dense block and shared
    # experts in a pipeline
    "moe_selective_ops": ("mixtral_serial", {"recompute": "selective_ops"}),
    "moe_ep2_tp2_sp_selective_ops_cap": ("mixtralcap_ep2_tp2_sp", {"recompute": "selective_ops"}),
    "deepseek_pp2_ep2_selective_ops_cap": ("deepseek_pp2_ep2", {"capacity_factor": 1.0, "recompute": "selective_ops"}),
    "serial_full_every2": ("llama_serial", {"recompute": "full", "every": 2}),
    "pp2_gpipe_full_every2": ("gpt2pp_pp2_gpipe", {"recompute": "full", "every": 2}),
}

# activation offload: name -> (golden plan, changes), each measured beside the same plan
# without offload (name + "_kept"): no recompute, full every 2 (block 1 recomputed, its
# input moved), selective in a pipeline (four forwards in flight on stage 0), ep and ZeRO-3
OFFLOADED = {
    "offload_serial": ("llama_serial", {"recompute": "full", "every": 2, "offload": True}),
    "offload_pp2_selective": ("llamapp_pp2_offload_selective", {}),
    "offload_ep2_zero3": ("mixtral_ep2_zero3_offload", {}),
}
OFFLOADED_KEPT = {f"{name}_kept": (base, {**kw, "offload": False}) for name, (base, kw) in OFFLOADED.items()}

# Pipeline plans, written out here. zb_h1 with tp: its W pass must not run the tp
# collectives of the backward a second time.
PIPELINE_SOURCE = """
cluster cpu1 {
    nodes = 1
    gpus_per_node = 1
    device = cpu
    link shm { scope = node; bandwidth = 10 GB/s; latency = 10 us }
}
cluster cpu2 {
    nodes = 1
    gpus_per_node = 2
    device = cpu
    link shm { scope = node; bandwidth = 10 GB/s; latency = 10 us }
}
cluster cpu4 {
    nodes = 1
    gpus_per_node = 4
    device = cpu
    link shm { scope = node; bandwidth = 10 GB/s; latency = 10 us }
}
cluster cpu8 {
    nodes = 1
    gpus_per_node = 8
    device = cpu
    link shm { scope = node; bandwidth = 10 GB/s; latency = 10 us }
}
model gpt2_tiny { arch = gpt2; layers = 4; hidden = 64; heads = 4; vocab = 256; seq_len = 32 }
model llama_vocab { arch = llama; layers = 2; hidden = 32; heads = 4; kv_heads = 2; vocab = 8192; seq_len = 256 }
plan loss_large_vocab {
    model = llama_vocab
    cluster = cpu1
    train {
        steps = 1; micro_batch = 4; global_batch = 4; precision = bf16; seed = 7
        optimizer adamw { lr = 1e-3 }
        data = synthetic
    }
}
plan pp2_1f1b {
    model = gpt2_tiny
    cluster = cpu2
    mesh { pp = 2 on shm }
    pipeline { schedule = 1f1b; microbatches = 4 }
    train {
        steps = 1; micro_batch = 2; global_batch = 8; precision = bf16; seed = 7
        optimizer adamw { lr = 1e-3 }
        data = synthetic
    }
}
plan pp2_tp2_zb_h1 {
    model = gpt2_tiny
    cluster = cpu4
    mesh { pp = 2 on shm; tp = 2 on shm }
    tensor_parallel { sequence_parallel = true }
    pipeline { schedule = zb_h1; microbatches = 4 }
    train {
        steps = 1; micro_batch = 2; global_batch = 8; precision = fp32; seed = 7
        optimizer adamw { lr = 1e-3 }
        data = synthetic
    }
}
plan dp2_pp2_tp2 {
    model = gpt2_tiny
    cluster = cpu8
    mesh { dp = 2 on shm; pp = 2 on shm; tp = 2 on shm }
    tensor_parallel { sequence_parallel = true }
    data_parallel { zero = 1 }
    pipeline { schedule = 1f1b; microbatches = 4 }
    train {
        steps = 1; micro_batch = 1; global_batch = 8; precision = fp32; seed = 7
        recompute = selective
        optimizer adamw { lr = 1e-3 }
        data = synthetic
    }
}
"""


@pytest.fixture(scope="module")
def pipeline_plans():
    res = load_text(PIPELINE_SOURCE, "tests/test_measure.py")
    errors = [f"{d.span}: {d.code} {d.message}" for d in res.diagnostics if d.is_error]
    assert not errors, errors
    return {p.name: p for p in res.program.plans}


# optimizer offload: each a plan of PLANS (the key after "host_optimizer_") with the optimizer in
# host memory, held to that plan's measured state (ZeRO-1 in fp16: staging and the loss
# scale; tp + sp in fp32 without data parallelism: no buckets, no staging)
HOST_OPTIMIZER = {f"host_optimizer_{name}": (PLANS[name][0], {**PLANS[name][1], "offload_optimizer": True}) for name in ("dp2_tp2_sp_zero1", "tp2_sp")}


@pytest.fixture(scope="module")
def plans(golden_plans, pipeline_plans):
    every = {**PLANS, **OFFLOADED, **OFFLOADED_KEPT, **HOST_OPTIMIZER}
    out = {name: _variant(golden_plans[base], name, **kw) for name, (base, kw) in every.items()}
    return {**out, **pipeline_plans}


@pytest.fixture(scope="module")
def measured(plans, run_script, run_programs, unformatted, tmp_path_factory):
    """measured(name) -> (plan, [record of rank 0, 1, ...]), running each plan once: the
    first time a plan of a world size is asked for, with every plan of that size that
    has not run yet (one job, run_programs); one that did not finish there, on its own."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("measure")
    cache = {}

    def flags(name):
        return ["--steps", "1", "--measure", root / f"{name}.json"]

    def keep(name):
        plan = plans[name]
        if plan.world_size == 1:
            files = [root / f"{name}.json"]
        else:
            files = [root / f"{name}.rank{r}.json" for r in range(plan.world_size)]
        cache[name] = (plan, [json.loads(f.read_text()) for f in files])

    def measure(name):
        if name not in cache:
            size = plans[name].world_size
            batch = [name] + [n for n, p in plans.items() if n != name and n not in cache and p.world_size == size]
            with unformatted():
                jobs = [(codegen.write(plans[n], root), flags(n)) for n in batch]
            done = run_programs(jobs, size)
            for n, (folder, _) in zip(batch, jobs):
                if folder in done:
                    keep(n)
        if name not in cache:
            plan = plans[name]
            with unformatted():
                script = codegen.write(plan, root) / "train.py"
            run = run_script(script, plan.world_size, *flags(name))
            assert (
                run.returncode == 0
            ), f"{name} failed:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
            keep(name)
        return cache[name]

    return measure


def _comm(record, table="comm"):
    """{(axis, kind): bytes} of the measured step."""
    # the validation loss (golden plans with eval) is counted apart from the step
    assert set(record[table]) <= {"0", "validation"}, f"calls outside the step: {record[table]}"
    return {(r["axis"], r["kind"]): r["bytes"] for r in record[table].get("0", [])}


def _stage(plan, rank):
    return plan.mesh.coords(rank)["pp"] if plan.pp > 1 else 0


# loss_large_vocab: the logits (1024 tokens × 8192) dwarf the blocks' activations; the loss
# saves dx and dW, not them, and holds one chunk of them at once
ALL = [*PLANS, "pp2_1f1b", "pp2_tp2_zb_h1", "dp2_pp2_tp2", "loss_large_vocab"]


@pytest.fixture(params=ALL)
def case(request, measured):
    return measured(request.param)  # every plan here compiles: a refusal fails the test


def _dropless_ep(plan):
    return plan.model.is_moe and not plan.model.capacity_factor and plan.ep > 1


def test_payload_per_axis_and_kind_equals_the_prediction(case):
    """Exact for every collective; dropless routing sends what the router chose, so
    there the ep all-to-all is checked in total: each rank dispatches all its choices,
    so the sum over ranks equals the uniform-routing prediction."""
    plan, records = case
    routed = ("ep", "all_to_all")
    for rank, record in enumerate(records):
        assert record["rank"] == rank
        got, want = _comm(record), traffic.rank_payload(plan, rank)
        if _dropless_ep(plan):
            got.pop(routed), want.pop(routed)
        assert got == want, f"{plan.name} rank {rank}"
    if _dropless_ep(plan):
        got = sum(_comm(r)[routed] for r in records)
        assert got == sum(traffic.rank_payload(plan, r)[routed] for r in range(plan.world_size))
    if plan.world_size > 1:  # the comparison above is not between two empty tables
        assert all(_comm(r) for r in records)


def test_only_scalars_are_left_out_of_the_traffic(case):
    """The tagged reductions (logged loss, grad norm) are fp32 scalars; a MoE plan adds
    its bookkeeping: the routing statistics (float64: aux, z where it is trained, then per
    layer the choices of each expert and those dropped), the tokens per expert (int64)
    before a dropless dispatch, and the tp slices' (SP) and cp ranks' choices per sequence,
    choice and expert (with cp, per chunk a rank holds: two with a load-balanced ring)."""
    plan, records = case
    m = plan.model
    bookkeeping = {}
    if m.is_moe:
        losses = 1 + (m.z_loss_weight > 0)  # aux, and z where it is trained
        bookkeeping["all_reduce"] = 8 * (losses + (m.layers - m.dense_layers) * (m.experts + 1))  # MoE layers only
        bookkeeping["all_to_all"] = 8 * m.experts
        c = plan.context_parallel
        chunks = 2 if plan.cp > 1 and c.method == "ring" and c.load_balance else 1
        for axis in ("tp", "cp"):
            size = plan.mesh.size(axis)
            bookkeeping[(axis, "all_gather")] = 8 * size * chunks * plan.train.micro_batch * m.top_k * m.experts
    for record in records:
        for row in record["scalar_comm"].get("0", []):  # n calls: some scalars, some bookkeeping
            n, other = row["calls"], bookkeeping.get((row["axis"], row["kind"]), bookkeeping.get(row["kind"], 4))
            assert any(row["bytes"] == 4 * (n - b) + other * b for b in range(n + 1)), row


def test_model_state_bytes_equal_the_prediction(case):
    """Parameters, gradients and optimizer state (fp32 master weights + Adam moments for
    16-bit plans) of the worst rank of every stage, exactly; ZeRO-1 shards the optimizer
    state, so no rank holds more than the worst and the shards add up to the whole."""
    plan, records = case
    predicted = est.memory(plan)
    for stage, want in enumerate(predicted):
        states = [r["state"] for rank, r in enumerate(records) if _stage(plan, rank) == stage]
        for key in ("params", "grads", "optimizer"):
            got = [s[key] for s in states]
            assert max(got) == getattr(want, key), f"{plan.name} stage {stage} {key}: {got}"
    stage_params = est.stage_params(plan)
    k = est.state_bytes_per_param(plan)[2]
    groups = {}  # the ranks of one stage: each tp rank's dp (cp, ep) ranks shard the same params
    for r in records:
        groups.setdefault(_stage(plan, r["rank"]), []).append(r)
    for stage, ranks in groups.items():
        held = [r["state"]["optimizer"] for r in ranks]
        if plan.data_parallel.zero and est.group_size(plan, est.grad_group(plan, False)) > 1:  # the shards add up to
            # the whole, unpadded (each ep rank's own experts, sharded over tp too when tp is in their group)
            sp, replicas = stage_params[stage], est.group_size(plan, replica_group(plan))  # HSDP
            experts = sp.expert * plan.ep * (1 if "tp" in est.grad_group(plan, True) else plan.tp)
            assert sum(held) == (sp.dense * plan.tp + experts) * k * replicas, held
        else:  # every dp replica holds the same
            by_tp = {}
            for r in ranks:
                by_tp.setdefault(r["coords"].get("tp", 0), set()).add(json.dumps(r["state"]))
            assert all(len(states) == 1 for states in by_tp.values()), by_tp


def test_unsharded_bytes_are_within_10_percent(case):
    """ZeRO-2/3: the most bytes of gathered weights and unsharded gradients a rank held at
    once in the step (every allocation and free counted by the script) against
    memory.transient_bytes; nothing for ZeRO-0/1, whose gradients are whole."""
    plan, records = case
    predicted = est.memory(plan)
    for rank, record in enumerate(records):
        want = predicted[_stage(plan, rank)].transient
        if plan.data_parallel.zero < 2:
            assert want == 0 and "transient" not in record["state"]
            continue
        got = record["state"]["transient"]
        assert abs(got - want) <= ACTIVATION_RTOL * want, f"{plan.name} rank {rank}: {got} vs {want}"


def test_saved_activation_bytes_are_within_10_percent(case):
    plan, records = case
    embedding, head = est.edge_activation_bytes(plan)
    for rank, record in enumerate(records):
        stage = _stage(plan, rank)
        layers = recompute.stage_layer_ids(plan, stage)  # full every N: each block its own bytes
        want = len(layers) * est.layer_activation_bytes(plan, layer=layers)
        want += embedding if stage == 0 else 0
        want += head if stage == plan.last_stage else 0  # pp − 1, or 0 in a V
        saved = record["saved_per_microbatch"]  # one per forward: micro-batch and chunk
        assert len(saved) == plan.microbatches * plan.pipeline.virtual_stages, saved
        if plan.pipeline.virtual_stages == 1:
            assert len(set(saved)) == 1, saved
        got = sum(saved) / plan.microbatches  # every chunk of the rank, per micro-batch
        # the embedding saves its token ids, a view of the step's int64 batch: data, which
        # explain does not count (all a first chunk of no layers saves)
        ids = 8 * plan.microbatches * plan.train.micro_batch * (plan.model.seq_len + 1) if stage == 0 else 0
        assert abs(got - want) <= ACTIVATION_RTOL * want + ids, f"{plan.name} rank {rank}: {got} vs {want}"


def test_loss_chunk_bytes_are_within_10_percent(case):
    """The most bytes the chunked loss held at once beyond what it kept (dx, dW, the
    loss), counted storage by storage in its forward, against the memory model's buffers
    of the last stage (dslc.cost.loss.buffer_bytes)."""
    plan, records = case
    want = est.memory(plan)[plan.last_stage].buffers
    for rank, record in enumerate(records):
        if _stage(plan, rank) == plan.last_stage:
            got = record["peaks"]["loss"]
            assert abs(got - want) <= ACTIVATION_RTOL * want, f"{plan.name} rank {rank}: {got} vs {want}"


def test_params_total_is_the_generated_models_parameter_count(case):
    plan, records = case
    total = report.to_json(report.explain(plan))["params"]["total"]
    assert {r["param_count"] for r in records} == {total}


@pytest.mark.parametrize("name", OFFLOADED)
def test_offloaded_activations_come_back_byte_for_byte(name, measured):
    """Per forward (micro-batch and chunk) of every rank: what went to the host comes back
    in its backward, byte for byte, none of it a weight; with what stayed on the device it
    is what autograd saved, which is what the same plan saves without offload."""
    plan, records = measured(name)
    _, kept = measured(name + "_kept")
    assert len(records) == len(kept) == plan.world_size
    for record, ref in zip(records, kept):
        moved = record["offload"]["activations"]
        d2h, h2d = moved["d2h_per_microbatch"], moved["h2d_per_microbatch"]
        stayed, saved = moved["device_saved_per_microbatch"], record["saved_per_microbatch"]
        assert len(d2h) == len(saved) == plan.microbatches * plan.pipeline.virtual_stages
        assert d2h == h2d and min(d2h) > 0, moved
        assert [a + b for a, b in zip(d2h, stayed)] == saved == ref["saved_per_microbatch"]
        assert "offload" not in ref
        # explain's bytes out and back per step: within the activations' 10 %, as saved bytes are
        want = est.memory(plan)[_stage(plan, record["rank"])].host_activations
        assert want.d2h == want.h2d and abs(sum(d2h) - want.d2h) <= ACTIVATION_RTOL * want.d2h, (sum(d2h), want)


def test_measuring_costs_nothing_without_the_flag(golden_plans, pipeline_plans):
    """Without --measure METER is off, and every use of it but the switch that turns it
    on (METER.start, behind the flag) sits behind a test of METER.on: the training path
    gains one `if METER.on` per collective and per micro-batch, in every module."""
    import ast

    for plan in (
        golden_plans["gpt2_dp2_tp2_sp"],
        golden_plans["llama_dp2_tp2_sp_zero1"],
        pipeline_plans["dp2_pp2_tp2"],
        golden_plans["llama_dp2_tp2_sp_offload"],
    ):
        uses = 0
        for name, source in codegen.render(plan, layout=False).items():  # the code, not its layout
            if not name.endswith(".py"):
                continue
            tree = ast.parse(source)
            parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
            for use in ast.walk(tree):
                if not (isinstance(use, ast.Attribute) and getattr(use.value, "id", None) == "METER"):
                    continue
                uses += 1
                node, guarded = use, use.attr in ("on", "start")
                while node in parents and not guarded:
                    node = parents[node]
                    test = getattr(node, "test", None)
                    guarded = isinstance(node, (ast.If, ast.IfExp)) and "METER.on" in ast.unparse(test)
                assert guarded, f"{plan.name}: {name} line {use.lineno} uses METER unguarded"
                if use.attr == "start":
                    assert "args.measure" in ast.unparse(parents[parents[parents[use]]].test)
        assert uses >= 5


@pytest.mark.parametrize("name", sorted(HOST_OPTIMIZER))
def test_optimizer_offload_bytes(name, measured):
    """With the optimizer in host memory, the device holds none of its state, and the host
    holds, for the n elements this rank's optimizer steps (n = the fp32 master bytes / 4, the
    same plan's optimizer state without offload / (4 + 8) in 16 bits, / 8 in fp32: Adam's
    two moments), with w the working dtype's bytes: master 4n, moments 8n, grads 4n,
    staging n·w (16 bits only; fp32 copies go straight to the masters and their gradients);
    each step copies n·w bytes each way; the worst rank's, as dslc explain says."""
    plan, records = measured(name)
    _, plain = measured(name.removeprefix("host_optimizer_"))
    w = 4 if plan.train.precision == "fp32" else 2
    for got, ref in zip(records, plain):
        assert got["rank"] == ref["rank"]
        assert got["state"]["optimizer"] == got["state"]["optimizer_step_counters"] == 0, got["state"]
        assert got["state"]["params"] == ref["state"]["params"] and got["state"]["grads"] == ref["state"]["grads"]
        n = ref["state"]["optimizer"] // (8 + 4 * (w == 2))
        assert n > 0
        want = {"host": {"master": 4 * n, "moments": 8 * n, "grads": 4 * n, "staging": n * w if w == 2 else 0}, "d2h": n * w, "h2d": n * w}
        assert got["offload"] == {"optimizer": want}, (got["rank"], got["offload"], want)
    for stage, predicted in enumerate(est.memory(plan)):  # and dslc explain's, of the worst rank
        host = predicted.host_optimizer
        assert predicted.optimizer == predicted.step_temp == 0  # as the device's state measured above
        moved = [r["offload"]["optimizer"] for r in records if _stage(plan, r["rank"]) == stage]
        assert max(m["d2h"] for m in moved) == host.d2h and max(m["h2d"] for m in moved) == host.h2d
        for key in ("master", "moments", "grads", "staging"):
            assert max(m["host"][key] for m in moved) == getattr(host, key), (stage, key, moved, host)
