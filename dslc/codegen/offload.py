"""The view of ``train { offload { … } }``: with ``optimizer`` the generated
host_optimizer.py keeps the fp32 master weights, their gradients and the optimizer's
moments in host memory and steps them there; with ``activations`` activation_offload.py
moves what each block saves there until its backward (docs/language.md, Offload)."""

from __future__ import annotations

from ..cost.memory import dtype_bytes
from ..cost.offload import activations_on_host, optimizer_on_host
from ..ir import Plan

_TORCH_NAMES = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}  # torch.optim's


def offload_view(plan: Plan) -> dict:
    offload = optimizer_on_host(plan)
    return {
        "offload_optimizer": offload,
        "offload_activations": activations_on_host(plan),
        # the optimizer steps a copy of the weights: fp32 masters (16-bit weights) or the host's
        "master_copy": dtype_bytes(plan) == 2 or offload,
        "optimizer_name": _TORCH_NAMES[plan.train.optimizer.name],
    }
