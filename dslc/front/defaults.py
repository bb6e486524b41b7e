"""Every default of the plan language, in one table: what lowering fills in when a key is
not written. docs/language.md lists each of them (tests/test_docs.py keeps it honest).

Defaults that depend on other values (``model.ffn``, ``model.tie_embeddings`` from the
architecture, ``train.precision`` from the device, batch sizes from each other, and
``lr_schedule.min_lr`` = lr / 10) are computed where they are lowered and described in
the docs; they are not in this table.
"""

from __future__ import annotations

DEFAULTS: dict[str, object] = {
    "link.latency": 0.0,  # a link the catalog does not know
    "model.norm_eps": 1e-5,
    "model.rope_theta": 10000.0,
    "model.dropout": 0.0,
    "model.top_k": 2,
    "model.capacity_factor": 0.0,  # dropless
    "model.aux_loss_weight": 0.01,
    "tensor_parallel.sequence_parallel": False,
    "data_parallel.zero": 0,
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
    "optimizer.lr": 3e-4,
    "optimizer.betas": (0.9, 0.95),
    "optimizer.eps": 1e-8,
    "optimizer.weight_decay": 0.1,
    "optimizer.momentum": 0.9,
    "lr_schedule.warmup": 0,
}
