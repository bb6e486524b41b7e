"""What each block of the language holds: its keys and the blocks nested in it. Lowering
reads these keys and no others (an unknown one is E010, a block E016), the language server
completes them, and docs/language.md has a row for each (tests/test_docs.py).

A block is named by its kind, the first word of its head: ``link`` in ``link ib { … }``,
``optimizer`` in ``optimizer adamw { … }``; ``""`` is the top level of a file.
"""

from __future__ import annotations

from ..ir import AXES

TOP_BLOCKS = ("cluster", "model", "plan")

# the expert options as a model writes them; a plan's experts block writes them as
# EXPERT_KEYS, with the model's name of each in MODEL_KEY (the others are the same)
MODEL_EXPERT_KEYS = ("experts", "top_k", "capacity_factor", "aux_loss_weight", "router", "z_loss_weight", "dense_layers", "dense_ffn", "shared_experts")
EXPERT_KEYS = ("count", "top_k", "capacity_factor", "aux_loss_weight", "router", "z_loss_weight", "dense_layers", "dense_ffn", "shared")
MODEL_KEY = {"count": "experts", "shared": "shared_experts"}

KEYS: dict[str, tuple[str, ...]] = {
    "cluster": ("nodes", "gpus_per_node", "device", "peak_flops", "fp8_flops", "device_memory", "efficiency", "host_memory", "host_bandwidth"),
    "link": ("scope", "bandwidth", "latency"),
    "model": ("arch", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "head_dim", "norm_eps",
              "rope_theta", "tie_embeddings", "dropout") + MODEL_EXPERT_KEYS,
    "plan": ("model", "cluster"),  # by name: `cluster = h100_8x8`
    "mesh": AXES,  # `tp = 8 on nvlink`
    "tensor_parallel": ("sequence_parallel",),
    "data_parallel": ("zero", "reshard_after_forward", "shard"),
    "pipeline": ("schedule", "virtual_stages", "microbatches", "layers_per_stage"),
    "context_parallel": ("method", "load_balance"),
    "experts": EXPERT_KEYS,
    "train": ("steps", "micro_batch", "global_batch", "precision", "recompute", "grad_clip", "seed", "loss_scale", "data",
              "timeout", "init", "seq_len", "compile", "float8"),
    "optimizer": ("lr", "betas", "eps", "weight_decay", "momentum"),
    "lr_schedule": ("warmup", "min_lr", "decay_steps"),
    "checkpoint": ("every", "dir", "keep", "async", "max_restarts"),
    "eval": ("every", "batches", "data"),
    "offload": ("optimizer", "activations"),
}

BLOCKS: dict[str, tuple[str, ...]] = {
    "": TOP_BLOCKS,
    "cluster": ("link",),
    "plan": ("model", "cluster", "mesh", "tensor_parallel", "data_parallel", "pipeline", "context_parallel", "experts", "train"),
    "train": ("optimizer", "lr_schedule", "checkpoint", "eval", "offload"),
}

