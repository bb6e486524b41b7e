"""What ring attention holds while it runs, beyond the activations it saves.

Each (query chunks, key chunks) block is one fused attention call that returns its
log-sum-exp (the generated context_parallel.py's ``attend``), as torch's own
context_parallel does: no block holds a score tile. What the ring holds at once is its
accumulators and the blocks in flight, all of one layer: the layers run one after the
other, so this is counted once per rank, beside the activations (memory.StageMemory).

Notation as :mod:`dslc.cost.memory`: T = b·s/cp tokens of the rank, q and kv the query
and key/value widths on one tp rank, e bytes of the plan's precision.
"""

from __future__ import annotations

from .. import arch
from ..ir import Plan
from .params import dtype_bytes, local_tokens


def working_bytes(plan: Plan) -> int:
    """The larger of the ring's forward and backward working sets, per rank; 0 without a ring.

    Forward: the fp32 output accumulator 4·T·q (in fp32 the output itself, an activation),
    this rank's K, V made contiguous and the next block arriving 4·T·kv·e, and one call's
    output with its fp32 reweighting (e + 4)·T·q. Backward: the fp32 dQ 4·T·q, the K, V
    blocks 4·T·kv·e, three fp32 dK, dV pairs 24·T·kv (the block's, the one sent on, the one
    arriving), one call's gradients e·T·(q + 2kv), and the kernel's own buffers (4 + e)·T·q
    (its fp32 dQ accumulator, a contiguous copy of a sliced output). The log-sum-exp
    temporaries (per head, not per width) are left out. Measured on CPU (torch.profiler,
    cp = 2, GQA): the backward within 4 % in fp32 and bf16. On CUDA with GQA the kernels
    widen the kv heads to the query heads: flash attention (16-bit) its dK, dV inside the
    backward, 2·T·(q − kv)·e; the memory-efficient kernel (fp32) K, V and their gradients,
    4·T·(q − kv)·e (not measured here: no GPU).
    """
    if plan.cp == 1 or plan.context_parallel.method != "ring":
        return 0
    e, T = dtype_bytes(plan), local_tokens(plan)
    q, kv, _ = arch.widths(plan.model, plan.tp)
    forward = 4 * T * q * (e < 4) + 4 * T * kv * e + (e + 4) * T * q
    backward = 4 * T * q + 4 * T * kv * e + 24 * T * kv + e * T * (q + 2 * kv) + (4 + e) * T * q
    widened = 0 if plan.cluster.device.name == "cpu" else (4 if e == 4 else 2) * T * (q - kv) * e
    return max(forward, backward) + widened
