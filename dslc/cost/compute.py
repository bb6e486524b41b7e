"""Compute time of the kernels one rank runs, by class of operation.

Each class runs at its own rate (:class:`Rates`, from the catalog's calibration table
:data:`dslc.catalog.CALIBRATION` or the cluster's ``efficiency``):

* GEMMs (every linear layer, the router, the experts, the head): 2·m·n·k FLOPs at
  ``gemm · d/(d + gemm_half)`` of the peak, d the GEMM's smallest dimension — its
  backward is two GEMMs of the same shape (input and weight gradients). With
  ``train { float8 }`` the blocks' linears and experts run at the device's fp8 peak
  instead (not the router or the head), and each such GEMM first casts its two inputs
  to fp8: an elementwise pass (:func:`cast_bytes`);
* the attention core (a fused causal kernel): its 2·s·q FLOPs per token (the causal
  half of the square, the same count MFU uses: :func:`dslc.arch.layer_flops`) at
  ``attention`` of the peak, its backward 2.5× the forward's FLOPs (FlashAttention
  recomputes QKᵀ);
* elementwise kernels (norms, residual adds, rope, the MLP's activation, dropout, the
  MoE's permutations, the loss's softmax in fp32): the bytes they read and write at
  ``bandwidth`` of the HBM bandwidth, their backward twice the forward's bytes.

Notation as in :mod:`dslc.cost.memory`; times are per rank per micro-batch, forward.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import arch, catalog
from ..ir import Plan
from . import loss as ls
from .flops import peak_flops
from .memory import DEFAULT, Settings, dtype_bytes, local_tokens, routed_slots, routed_tokens


@dataclass(frozen=True)
class Rates:
    """The rates compute is charged at on the plan's device."""

    peak: float  # FLOP/s in the plan's precision
    gemm: float  # fraction of peak of a large GEMM
    gemm_half: int  # smallest GEMM dimension at which a GEMM runs at half of ``gemm``
    attention: float  # fraction of peak of the fused attention kernel
    bandwidth: float  # bytes/s elementwise kernels move (HBM × the calibrated fraction)
    row: str  # the calibration row ("cluster" when the plan sets efficiency)
    source: str
    fp8: float = 0.0  # FLOP/s of the plan's fp8 GEMMs (train { float8 }); 0: none, or emulated (cpu)

    def gemm_seconds(self, flops: float, *dims: int, fp8: bool = False) -> float:
        d = min(dims)
        eff = self.gemm * d / (d + self.gemm_half)
        peak = self.fp8 if fp8 and self.fp8 else self.peak
        return flops / (peak * eff) if peak and eff else float("inf") if flops else 0.0

    def bytes_seconds(self, nbytes: float) -> float:
        return nbytes / self.bandwidth if self.bandwidth else 0.0

    @property
    def summary(self) -> str:
        """One line for the report: the assumption, and where it comes from."""
        if self.row == "cluster":
            return (f"GEMMs and attention at {self.gemm:.0%} of peak (the cluster's efficiency), elementwise kernels at "
                    f"{self.bandwidth / 1e9:.0f} GB/s")
        fp8 = f"; fp8 GEMMs at the same fractions of the fp8 peak, {self.fp8 / 1e12:g} TFLOP/s (uncalibrated)" if self.fp8 else ""
        return (f"GEMMs at {self.gemm:.0%}·d/(d+{self.gemm_half}) of peak (d: a GEMM's smallest dimension), attention at "
                f"{self.attention:.0%}, elementwise kernels at {self.bandwidth / 1e9:.0f} GB/s (calibration '{self.row}': {self.source}){fp8}")


def rates(plan: Plan) -> Rates:
    dev, eff = plan.cluster.device, plan.cluster.efficiency
    row, cal = catalog.calibration(dev.name)
    bandwidth = dev.bandwidth * cal.bandwidth
    fp8 = dev.fp8_flops if plan.train.float8 else 0.0
    if eff is not None:
        return Rates(peak_flops(plan), eff, 0, eff, bandwidth, "cluster", "set in the plan", fp8)
    return Rates(peak_flops(plan), cal.gemm, cal.gemm_half, cal.attention, bandwidth, row, cal.source, fp8)


def cast_bytes(plan: Plan, rows: int, w) -> float:
    """Bytes the forward's fp8 casts of one linear move (``train { float8 }``; 0 without):
    its input (rows × the weight's inputs) and its weight, each read for the amax that sets
    the scale and read again to write one byte per element: 2·e + 1 bytes an element
    eagerly, e + 1 in a compiled block (the amax fused into the kernel that wrote the
    tensor). Backward casts the output's gradient twice and the weight and input again:
    the 2× every elementwise pass is charged in backward. Eager with tp or cp too: the
    script runs the linears whose amax it reduces outside the compiled graph (float8.py's
    float8_linear). Checked once (an H200, tensorwise, compiled serial Llamas: the step
    within 11-14 %); rowwise is charged alike and ran 43 % slower than that."""
    if not plan.train.float8:
        return 0.0
    # no amax to reduce (tp and cp of one: codegen.float8's float8_reduces) and compiled blocks
    fused = ls.blocks_compiled(plan) and plan.tp == 1 and plan.cp == 1
    e = dtype_bytes(plan)
    return (e + 1 + (0 if fused else e)) * (rows * w.shape[-1] + w.numel)


@dataclass(frozen=True)
class Kernels:
    """Forward seconds of one piece of the model (a layer, or a chunk's edges) by class."""

    gemm: float = 0.0
    attention: float = 0.0  # the attention core, fused or not
    elementwise: float = 0.0
    attention_backward: float = 2.5  # its backward over its forward: 2.5 fused (QKᵀ again), 2 unfused
    loss: float = 0.0  # the head and loss, whose gradients forward takes: no backward
    # backward's GEMMs beyond 2× gemm: float8's routed experts compute grad_weight in high
    # precision (rowwise_with_gw_hp), its time at the plan's peak less that at the fp8 peak
    hp_grad_weight: float = 0.0

    @property
    def forward(self) -> float:
        return self.gemm + self.attention + self.elementwise + self.loss

    @property
    def backward(self) -> float:
        """Input and weight gradients: 2× the GEMMs and elementwise, 2.5× a fused attention."""
        return 2 * self.gemm + self.hp_grad_weight + self.attention_backward * self.attention + 2 * self.elementwise

    def __add__(self, other: Kernels) -> Kernels:
        return Kernels(self.gemm + other.gemm, self.attention + other.attention, self.elementwise + other.elementwise,
                       self.attention_backward if self.attention else other.attention_backward, self.loss + other.loss,
                       self.hp_grad_weight + other.hp_grad_weight)

    def __mul__(self, n: float) -> Kernels:
        return Kernels(self.gemm * n, self.attention * n, self.elementwise * n, self.attention_backward, self.loss * n,
                       self.hp_grad_weight * n)


def layer_kernels(plan: Plan, r: Rates, settings: Settings = DEFAULT) -> Kernels:
    """One transformer layer on one rank for one micro-batch of T tokens (T/t of them
    under sequence parallelism for the norms, residuals and dropout). Elements read and
    written forward: 2 norms 4·h and 2 residual adds 6·h per token (+ 2·h per dropout,
    3 of them when dropout is on), rope 2·(q + kv) on q and k, the MLP's activation
    (SwiGLU reads gate and up and writes their product: 3·f; GELU 2·f); an MoE layer's
    experts run on :func:`~dslc.cost.memory.routed_slots` rows (at a load imbalance r,
    r× on the busiest rank) and permute them twice (2·2·h per slot). The attention core
    is one fused kernel, or, with ``settings.attention == "paper"`` (Megatron before flash
    attention), two batched GEMMs over the whole square, masked half included (twice the
    causal count; d = head_dim), with the scores between them written, softmaxed, masked
    and dropped out (4·e + 1 bytes per score)."""
    imbalance = settings.imbalance
    m, T, e = plan.model, local_tokens(plan), dtype_bytes(plan)
    a, h = arch.of(m), m.hidden
    q, kv, f = arch.widths(m, plan.tp)
    sp = plan.tp if plan.tensor_parallel.sequence_parallel else 1
    gemm = casts = hp = 0.0
    for w in arch.weights(m, plan.tp):
        if len(w.shape) != 2 or w.part != "layer":
            continue
        router = w.name.endswith("router")
        rows = routed_tokens(plan) if router else T
        gemm += r.gemm_seconds(2 * rows * w.numel, rows, *w.shape, fp8=not router)
        casts += 0.0 if router else cast_bytes(plan, rows, w)
    elems = T // sp * (10 + (6 if m.dropout > 0 else 0)) * h
    elems += T * 2 * (q + kv) if a.positions == "rope" else 0
    if m.is_moe:
        slots = routed_slots(plan, imbalance)
        per_expert = max(1, slots * plan.ep // m.experts)  # the rows one local expert's GEMMs run on
        for w in arch.weights(m, plan.tp):
            if w.part == "expert":
                fp8 = r.gemm_seconds(2 * slots * w.numel, per_expert, *w.shape, fp8=True)
                gemm += fp8  # grad_weight's GEMM in high precision (float8.py's EXPERT_RECIPE)
                hp += r.gemm_seconds(2 * slots * w.numel, per_expert, *w.shape) - fp8
                casts += cast_bytes(plan, slots, w) + (m.experts // plan.ep - 1) * cast_bytes(plan, 0, w)  # every local expert's weight
        elems += slots * (3 * m.ffn + 4 * h)
    else:
        elems += T * f * (3 if a.mlp == "swiglu" else 2)
    _, core = arch.layer_flops(m, m.seq_len, plan.tp)
    if settings.attention == "paper":
        scores = q // m.head_dim * m.seq_len * T
        attention = r.gemm_seconds(2 * T * core, m.head_dim, m.seq_len) + r.bytes_seconds(scores * (4 * e + 1))
        return Kernels(gemm, attention, r.bytes_seconds(elems * e + casts), 2.0, hp_grad_weight=hp)
    attention = T * core / (r.peak * r.attention) if r.peak and r.attention else 0.0
    return Kernels(gemm, attention, r.bytes_seconds(elems * e + casts), hp_grad_weight=hp)


def shared_experts_seconds(plan: Plan, r: Rates) -> float:
    """Forward seconds of a MoE layer's shared experts on one rank (their GEMMs on its
    tokens, its slice of them under sequence parallelism), which ep's dispatch overlaps."""
    m = plan.model
    if not (m.is_moe and m.shared_experts):
        return 0.0
    rows = local_tokens(plan) // (plan.tp if plan.tensor_parallel.sequence_parallel else 1)
    return sum(r.gemm_seconds(2 * rows * w.numel, rows, *w.shape, fp8=True)
               for w in arch.weights(m, plan.tp) if ".shared_experts." in w.name and len(w.shape) == 2)


def edge_kernels(plan: Plan, r: Rates, first: bool, last: bool) -> Kernels:
    """The first chunk's embedding (a gather writing T·h) and the last chunk's final
    norm (2·h per token) and the loss in chunks of R rows (:mod:`dslc.cost.loss`), all
    in forward: the logits, dx and dW GEMMs (R × h × V/t each) and the elementwise passes
    over the logits (:func:`dslc.cost.loss.elementwise_bytes` per logit)."""
    m, T, e = plan.model, local_tokens(plan), dtype_bytes(plan)
    sp = plan.tp if plan.tensor_parallel.sequence_parallel else 1
    V, R = arch.vocab_per_rank(m, plan.tp), ls.chunk_rows(plan)
    out = Kernels(elementwise=r.bytes_seconds(T // sp * m.hidden * e)) if first else Kernels()
    if last:
        head = 3 * (T // R) * r.gemm_seconds(2 * R * m.hidden * V, R, m.hidden, V)
        out += Kernels(elementwise=r.bytes_seconds(T // sp * 2 * m.hidden * e),
                       loss=head + r.bytes_seconds(T * V * ls.elementwise_bytes(plan)))
    return out
