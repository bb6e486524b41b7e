"""The view of ``train { offload { optimizer = true } }``: the generated host_optimizer.py
keeps the fp32 master weights, their gradients and the optimizer's moments in host memory
and steps them there (docs/language.md, Offload)."""

from __future__ import annotations

from ..ir import Plan

_DTYPES_16 = ("bf16", "fp16")
_TORCH_NAMES = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}  # torch.optim's


def offload_optimizer_view(plan: Plan) -> dict:
    t = plan.train
    offload = bool(t.offload and t.offload.optimizer)
    return {
        "offload_optimizer": offload,
        # the optimizer steps a copy of the weights: fp32 masters (16-bit weights) or the host's
        "master_copy": t.precision in _DTYPES_16 or offload,
        "optimizer_name": _TORCH_NAMES[t.optimizer.name],
    }
