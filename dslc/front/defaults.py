"""Every default of the plan language, in one table: what lowering fills in when a key is
not written. docs/language.md lists each of them (tests/test_docs.py keeps it honest).

Defaults that depend on other values (``model.ffn``, ``model.tie_embeddings`` from the
architecture, ``model.head_dim`` = hidden / heads, ``train.seq_len`` = the model's,
``train.precision`` from the device, batch sizes from each other, and
``lr_schedule.min_lr`` = lr / 10) are computed where they are lowered and described in
the docs; they are not in this table. Below the defaults, :data:`BOUNDS`: the range every
number of a plan may take, so that every value lint accepts is one the cost model, the
schedule and the generated script can compute with.
"""

from __future__ import annotations

from ..pipeline_shapes import MAX_SCHEDULE

DEFAULTS: dict[str, object] = {
    "link.latency": 0.0,  # a link the catalog does not know
    "model.norm_eps": 1e-5,
    "model.rope_theta": 10000.0,
    "model.dropout": 0.0,
    "model.top_k": 2,
    "model.capacity_factor": 0.0,  # dropless
    "model.aux_loss_weight": 0.01,
    "model.router": "topk_softmax",
    "model.z_loss_weight": 0.0,
    "model.dense_layers": 0,
    "model.shared_experts": 0,
    "tensor_parallel.sequence_parallel": False,
    "data_parallel.zero": 0,
    "data_parallel.reshard_after_forward": True,
    "pipeline.schedule": "1f1b",
    "pipeline.virtual_stages": 1,
    "context_parallel.method": "ring",
    "context_parallel.load_balance": True,
    "train.steps": 100,
    "train.micro_batch": 1,
    "train.recompute": "none",
    "train.grad_clip": 1.0,
    "train.seed": 1234,
    "train.loss_scale": "dynamic",
    "train.data": "synthetic",
    "train.optimizer": "adamw",
    "train.lr_schedule": "cosine",
    "train.timeout": 600.0,  # seconds, as NCCL's default: a collective waits this long for its peers
    "optimizer.lr": 3e-4,
    "optimizer.betas": (0.9, 0.95),
    "optimizer.eps": 1e-8,
    "optimizer.weight_decay": 0.1,
    "optimizer.momentum": 0.9,
    "lr_schedule.warmup": 0,
    "eval.every": 0,  # after the last step only
    "eval.batches": 10,
}

# How a mixture-of-experts layer weighs the experts a token is sent to (model.router):
# topk_softmax (Mixtral, Jiang et al. 2024): the top-k logits, then a softmax over those k,
# so the weights sum to 1; softmax_topk (Switch, Fedus et al. 2021; GShard): a softmax over
# all experts, then the top-k probabilities as the weights, not renormalised.
ROUTERS = ("topk_softmax", "softmax_topk")

# -- bounds ---------------------------------------------------------------------------------
# The most a plan may ask of dslc: explain, schedule and compile stay within a few seconds
# at these sizes (tests/test_bounds.py times them), far above any real training run.
MAX_RANKS = 2**18  # GPUs in a cluster and ranks in a mesh (the largest runs use ~10⁵)
# MAX_SCHEDULE, chunk forwards per step (pp × virtual_stages × microbatches), is
# dslc/pipeline_shapes.py's, beside the rest of which pipeline shapes can be built.

STEPS = 10**9  # 30 years at one step a second; any integer type holds it
MAX_BLEND = 1024  # sources of a blend (lint reads each one's header)

# The range (inclusive) of every number a plan may write, by block and key: integers that
# fit in int64, floats that are finite, and quantities (written as a plan writes them) whose
# SI value is finite and far from zero where the cost model divides by it. The Reader
# checks each value against its row (E015); docs/language.md states every row.
BOUNDS: dict[str, tuple[object, object]] = {
    "cluster.nodes": (1, MAX_RANKS),
    "cluster.gpus_per_node": (1, MAX_RANKS),
    "cluster.peak_flops": ("1 GFLOP/s", "1000000 PFLOP/s"),
    "cluster.fp8_flops": ("1 GFLOP/s", "1000000 PFLOP/s"),
    "cluster.device_memory": ("1 MiB", "1024 TiB"),
    "cluster.efficiency": (0.01, 1.0),
    "cluster.host_memory": ("1 MiB", "1024 TiB"),
    "cluster.host_bandwidth": ("1 MB/s", "1000 TB/s"),
    "link.bandwidth": ("1 MB/s", "1000 TB/s"),
    "link.latency": ("0 s", "10 s"),
    "mesh.size": (1, MAX_RANKS),  # of each axis
    "model.layers": (1, 2**16),
    "model.hidden": (1, 2**20),
    "model.heads": (1, 2**20),
    "model.kv_heads": (1, 2**20),
    "model.head_dim": (1, 2**16),
    "model.ffn": (1, 2**22),
    "model.vocab": (1, 2**24),
    "model.seq_len": (1, 2**24),
    "model.norm_eps": (1e-30, 1.0),
    "model.rope_theta": (1.0, 1e12),
    "model.dropout": (0.0, 1.0),
    "model.experts": (1, 2**20),
    "model.top_k": (1, 2**20),
    "model.capacity_factor": (0.0, 1000.0),
    "model.aux_loss_weight": (0.0, 1000.0),
    "model.z_loss_weight": (0.0, 1000.0),
    "experts.count": (1, 2**20),
    "experts.top_k": (1, 2**20),
    "experts.capacity_factor": (0.0, 1000.0),
    "experts.aux_loss_weight": (0.0, 1000.0),
    "experts.z_loss_weight": (0.0, 1000.0),
    "model.dense_layers": (0, 2**16),
    "model.dense_ffn": (1, 2**22),
    "model.shared_experts": (0, 2**10),
    "experts.dense_layers": (0, 2**16),
    "experts.dense_ffn": (1, 2**22),
    "experts.shared": (0, 2**10),
    "data_parallel.shard": (2, MAX_RANKS),
    "pipeline.virtual_stages": (1, MAX_SCHEDULE),
    "pipeline.microbatches": (1, MAX_SCHEDULE),
    "train.steps": (1, STEPS),
    "train.micro_batch": (1, 2**16),
    "train.seq_len": (1, 2**24),
    "train.global_batch": (1, 2**40),
    "train.grad_clip": (0.0, 1e30),
    "train.seed": (0, 2**63 - 1),
    "optimizer.lr": (1e-30, 1e30),  # a huge lr is a way to make a run diverge on purpose
    "optimizer.eps": (1e-30, 1.0),
    "optimizer.weight_decay": (0.0, 1e30),
    "optimizer.momentum": (0.0, 1.0),
    "lr_schedule.warmup": (0, STEPS),
    "lr_schedule.min_lr": (0.0, 1e30),
    "lr_schedule.decay_steps": (1, STEPS),
    "checkpoint.every": (1, STEPS),
    "checkpoint.keep": (0, 2**20),
    "checkpoint.max_restarts": (0, 1000),
    "train.timeout": ("1 s", "168 h"),
    "eval.every": (0, STEPS),
    "eval.batches": (1, 2**20),
}
