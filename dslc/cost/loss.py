"""The loss in chunks: what the generated script's ``LinearCrossEntropy`` (``layers.py``)
holds, and the rows of a chunk, which codegen writes as ``LOSS_CHUNK_ROWS``.

The head and the cross-entropy run as one function over chunks of the micro-batch's rows
(this rank's T tokens; under sequence parallelism the gathered sequence): a chunk's
logits x W^T (16-bit), their fp32 copy, its loss and at once its gradient (softmax −
one-hot, 16-bit), whose products give the chunk's rows of dx and its sum into dW; only
one chunk's logits are alive at a time, never the micro-batch's (Liger-Kernel's fused
linear cross-entropy). Forward saves dx and dW; backward only scales them.

Notation as :mod:`dslc.cost.memory`: T tokens per rank per micro-batch, h hidden, V the
vocabulary rows per tp rank, e bytes of the plan's dtype, R rows per chunk.
"""

from __future__ import annotations

from math import ceil

from .. import arch
from ..front.recompute import EAGER_POLICIES
from ..ir import Plan
from .params import dtype_bytes, local_tokens
from .schedule import SPLIT_BACKWARD

# the most bytes of one chunk's fp32 logits: 512 MiB keeps a chunk's GEMM large (2,668
# rows of GPT-2's vocabulary, 1,046 of Llama 3's 128k) and its memory small beside an
# 80 GiB device's
LOSS_CHUNK_BYTES = 512 * 2**20


def _sizes(plan: Plan) -> tuple[int, int, int, int]:
    """(T, h, V, e)."""
    return local_tokens(plan), plan.model.hidden, arch.vocab_per_rank(plan.model, plan.tp), dtype_bytes(plan)


def chunk_rows(plan: Plan) -> int:
    """R: T / n for the fewest chunks n that divide T and keep a chunk's fp32 logits within
    LOSS_CHUNK_BYTES (n = T, one row a chunk, at worst): every chunk has R rows, so each
    sends and holds the same."""
    T, _, V, _ = _sizes(plan)
    need = ceil(4 * T * V / LOSS_CHUNK_BYTES)
    return T // next(n for n in range(max(1, need), T + 1) if T % n == 0)


def chunks(plan: Plan) -> int:
    return _sizes(plan)[0] // chunk_rows(plan)


def _dw_bytes(plan: Plan) -> int:
    """Bytes per element of the dW forward saves: summed over the chunks in fp32 and kept
    in bf16 (a pipeline's last stage may hold several); fp16 could not hold the unscaled
    sum, so fp16 (and fp32) keep fp32."""
    return 2 if plan.train.precision == "bf16" else 4


def saved_bytes(plan: Plan) -> int:
    """What forward saves for backward: dx, T·h·e, and dW, V·h in bf16 or fp32."""
    T, h, V, e = _sizes(plan)
    return T * h * e + _dw_bytes(plan) * V * h


def buffer_bytes(plan: Plan) -> int:
    """The most bytes the loss holds beyond what it saves: a chunk's fp32 logits 4·R·V and,
    16-bit, their 16-bit copy (and then gradient) R·V·e beside them; then the gradient
    beside the chunk's product into dx, R·h·e, or into dW, V·h·e (backward's dW cast to
    the weights' dtype is no more: V·h·e). fp32: the logits, turned into their gradient in
    place, beside the product into dx (dW sums in place). bf16: the fp32 sum of dW, 4·V·h,
    beside all of it until forward keeps it in bf16: 2·V·h more than the saved dW."""
    _, h, V, e = _sizes(plan)
    R = chunk_rows(plan)
    chunk = 4 * R * V + R * h * e if e == 4 else max((4 + e) * R * V, e * (R * V + max(R, V) * h))
    return chunk + (2 * V * h if _dw_bytes(plan) == 2 else 0)


def blocks_compiled(plan: Plan) -> bool:
    """Whether the script compiles its blocks: compile on (the default on a GPU), and a
    recompute policy that compiles (not selective_ops)."""
    t = plan.train
    on = t.compile if t.compile is not None else plan.cluster.device.name != "cpu"
    return on and t.recompute not in EAGER_POLICIES


def compiled(plan: Plan) -> bool:
    """Whether the script runs the loss compiled, its elementwise kernels fused: blocks that
    compile, and no graph break at the loss (tp's all-reduces, the split backward's
    deferred dW run it eagerly)."""
    return blocks_compiled(plan) and plan.tp == 1 and plan.pipeline.schedule not in SPLIT_BACKWARD


def elementwise_bytes(plan: Plan) -> int:
    """Bytes the loss's elementwise kernels move per logit, forward and backward together
    (both run in forward): compiled, 5·e — the GEMM writes the logits, the reductions
    (max, sum of exp) read them twice, the gradient kernel reads them and writes dz;
    eager, 3·e + 40 — the fp32 copy, max, shift, exp, sum, division, one-hot step and cast,
    each a pass over the chunk in fp32."""
    e = dtype_bytes(plan)
    return 5 * e if compiled(plan) else 3 * e + 40
