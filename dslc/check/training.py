"""The training settings: the batch (E080), the ZeRO stage and its shard (E078, E081,
W079, W089, W102), what the script cannot do yet (E100), fp16 and compile (W082, W103),
fp8 (E104, N105, E106, E107), offload (N111), and the Hugging Face checkpoint a plan starts from (E048, E049)."""

from __future__ import annotations

from .. import arch
from ..diagnostics import error, note, warning
from ..front.recompute import EAGER_POLICIES
from ..ir import Plan
from ..pipeline_shapes import SPLIT_BACKWARD
from ..unknown import unless_unknown


def batch(plan: Plan):
    t = plan.train
    ranks = plan.data_parallel_size
    expected = t.micro_batch * plan.microbatches * ranks
    if t.global_batch != expected:
        parts = f"micro_batch={t.micro_batch} × microbatches={plan.microbatches} × dp={plan.dp}" + (f" × ep={plan.ep}" if plan.ep > 1 else "")
        yield error("E080", plan.where("train.global_batch", "pipeline.microbatches"), f"global_batch={t.global_batch} but {parts} = {expected}", "ep ranks take their own data like dp ranks" if plan.ep > 1 else f"set global_batch = {expected} or change the micro-batch count")


def zero(plan: Plan):
    z = plan.data_parallel.zero
    if z not in (0, 1, 2, 3):
        yield error("E081", plan.where("data_parallel.zero"), f"zero must be 0, 1, 2 or 3, got {z}", "0 replicates, 1 shards optimizer state, 2 also gradients, 3 also parameters")
    yield from _zero(plan, z)


def training(plan: Plan):  # each apart: an unknown device leaves the default precision and compile unknown
    t = plan.train
    with unless_unknown():
        if t.precision == "fp16" and t.loss_scale == "none":
            yield warning("W082", plan.where("train.loss_scale", "train.precision"), "fp16 without loss scaling: small gradients underflow to zero", "use loss_scale = dynamic, or precision = bf16")
    with unless_unknown():
        if t.compile and t.recompute in EAGER_POLICIES:
            yield warning("W103", plan.where("train.compile"), f"compile = true with recompute = {t.recompute}: the script runs its blocks eagerly", "selective_ops picks the ops to keep as they are dispatched; selective or full recompute compiles")
    if t.float8 and plan.pp > 1 and plan.pipeline.schedule in SPLIT_BACKWARD:
        yield error("E100", plan.where("train.float8", "pipeline.schedule"), f"float8 with schedule = {plan.pipeline.schedule} is not supported yet: "
                    "its W step would compute the weight gradients in high precision", "use 1f1b, interleaved_1f1b or gpipe, or leave float8 out")
    if plan.model.dropout > 0 and plan.tp > 1:
        yield error("E100", plan.where("model.dropout", "mesh.tp"), f"dropout = {plan.model.dropout} with tp = {plan.tp} is not supported yet: "
                    "the tp ranks would need a shared dropout RNG", "set dropout = 0, or leave tp out")


def offload(plan: Plan):
    """``offload``: what the cluster does not say of its hosts, the figures explain then
    goes without (host memory) or takes from the catalog (the PCIe link)."""
    o, c = plan.train.offload, plan.cluster
    if not (o and (o.optimizer or o.activations)):
        return
    with unless_unknown():
        missing = [what for what, gone in (("its host memory", c.host_memory is None), ("a pcie link", c.link("pcie") is None)) if gone]
        if missing:
            yield note("N111", plan.where("train.offload"), f"offload on cluster '{c.name}', which does not give {' or '.join(missing)}: "
                       + ("lint cannot check that the host holds what is offloaded" if c.host_memory is None else "")
                       + ("; " if len(missing) == 2 else "") + ("explain copies over the catalog's PCIe 4.0 x16" if c.link("pcie") is None else ""),
                       "add " + " and ".join(fix for fix, gone in (("`host_memory = 2 TB`", c.host_memory is None),
                                                                   ("`link pcie { scope = node; bandwidth = 50 GB/s }` (PCIe 5.0 x16)", c.link("pcie") is None)) if gone)
                       + " to the cluster, with its own figures")


def float8(plan: Plan):
    """``float8``: torchao's float8 training on top of bf16 or fp32 weights, on a device
    with fp8 tensor cores, or emulated on cpu (tests)."""
    if not plan.train.float8:
        return
    at, device = plan.where("train.float8"), plan.cluster.device
    with unless_unknown():
        if plan.train.precision == "fp16":
            yield error("E104", plan.where("train.float8", "train.precision"), "float8 with precision = fp16: torchao's float8 training casts bf16 or fp32 tensors",
                        "set precision = bf16 (the weights, gradients and non-GEMM math stay bf16; the linears' GEMMs run in fp8)")
    with unless_unknown():
        if device.name == "cpu":
            yield note("N105", at, "float8 on cpu runs torchao's emulation: the GEMMs' inputs are rounded to fp8 as on a GPU, the products computed in "
                       "fp32: the numbers of an fp8 run, not its speed")
        elif not device.fp8_flops:
            yield error("E106", at, f"float8 on {device.name}, which has no fp8 tensor cores",
                        "leave float8 out, or plan for a device with them (h100_sxm, h200, b200; or set fp8_flops in the cluster)")
        elif odd := [w for w in arch.float8_weights(plan.model, plan.tp) if any(d % arch.FLOAT8_ALIGN for d in w.shape)]:
            # torchao pads a GEMM's inner dim (PAD_INNER_DIM), never its outer ones
            w = odd[0]
            yield error("E107", at, f"float8 with {w.name.replace('{i}', 'i')} of {w.shape[0]}×{w.shape[1]}"
                        + (f" per tp rank (tp = {plan.tp})" if plan.tp > 1 else "") + ": torch._scaled_mm multiplies only dims that are multiples of 16",
                        "pick widths (hidden, heads × head_dim, kv_heads × head_dim, ffn) whose share per tp rank is a multiple of 16, or leave float8 out")


def _zero(plan: Plan, z: int):
    """What the generated script cannot honour of a ZeRO stage, and sharding with no one to
    shard over (the group: dp × cp × ep, the ranks that hold the same dense weights)."""
    at = plan.where("data_parallel.zero")
    if z >= 2 and plan.dp * plan.cp * plan.ep == 1:
        yield warning("W089", at, f"zero = {z} over a data-parallel group of one rank: nothing is sharded", "ZeRO shards the model state over the dp ranks: add a dp axis, or use zero = 0")
    shard = plan.data_parallel.shard
    if shard and plan.dp % shard:
        yield error("E078", plan.where("data_parallel.shard"), f"shard = {shard} does not divide dp = {plan.dp}: ZeRO shards over groups of {shard} consecutive dp ranks and replicates over dp / shard",
                    f"use a divisor of {plan.dp}, or leave shard out to shard over every dp rank")
    elif shard and not z:
        yield warning("W079", plan.where("data_parallel.shard"), f"shard = {shard} with zero = 0: every rank holds the whole model state, there is nothing to shard", "set zero = 1, 2 or 3 (zero = 3 with shard is HSDP)")
    if z != 3 and "data_parallel.reshard_after_forward" in plan.spans:
        yield warning("W102", plan.where("data_parallel.reshard_after_forward"), f"reshard_after_forward has no effect with zero = {z}", "only zero = 3 gathers the weights before each unit's forward")


def init_checkpoint(plan: Plan):
    """The Hugging Face checkpoint a plan starts from (``init = hf("DIR")``): a folder with
    weights and a config.json, each file well-formed and inside it (E048), of this model
    (E049: the first key that differs, a tensor missing, of another shape or not floating)."""
    init = plan.train.init
    found = init and arch.hf.problem(arch.of(plan.model), plan.model, init.resolved_path)
    if found:
        kind, message = found
        yield error("E049" if kind == "model" else "E048", init.span, message, INIT_HINTS[kind])


INIT_HINTS = {  # by the kind of problem arch.hf.problem finds
    "read": "write its folder relative to the plan file",
    "file": "its files are not a Hugging Face checkpoint that can be read safely: download or export it again",
    "model": "start from a checkpoint of this model, or change the model to match it",
}
