"""Offload to host memory (``train { offload }``): what leaves the device, what the host
then holds, the bytes that cross each GPU's PCIe link per step and the time that adds.

Optimizer offload (ZeRO-Offload, Ren et al. 2021) keeps the optimizer's part of a rank
— n parameters: its shard under ZeRO, all its parameters without — on the host, as the
generated script does: an fp32 master copy (4n bytes, also under fp32, where the device's
weights are the working copy), the optimizer's moments, the fp32 gradients the step reads
(4n) and, under 16-bit precision, a pinned staging buffer in the working precision (wn)
that the gradients arrive in and the updated weights leave from. Each step copies the
reduced gradients out (wn bytes) and the updated weights back (wn); the device holds no
optimizer state and no step temporaries.

Activation offload moves what each block saves for its backward to the host during the
forward and brings it back one block ahead of the block's backward: the host holds every
block's saved tensors of the forwards in flight (what the device held without offload;
under ``selective_ops`` the blocks' inputs, the outputs its policy keeps staying on the
device), the device the blocks being written or read (two at most) and the pipeline edges'. Each
forward of a chunk copies its blocks' bytes out and its backward brings them back.

Time: a GPU's copies use its own PCIe link (the cluster's ``pcie``, or the catalog's), one
direction each way (:func:`copies`). The host's optimizer step is memory-bound at the
node's host bandwidth shared by its GPUs (the cluster's ``host_bandwidth``, else
``catalog.HOST_BANDWIDTH``), every pass over its tensors counted (:func:`host_step_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import catalog
from ..ir import Link, Offload, Plan
from .params import dtype_bytes, local_tokens

PREFETCHED = 2  # blocks of saved tensors on the device at once under activation offload


@dataclass(frozen=True)
class Host:
    """One rank's offload: host bytes held and PCIe bytes per step each way."""

    master: int = 0  # the fp32 master weights
    moments: int = 0  # the optimizer's state
    grads: int = 0  # the fp32 gradients the host step reads
    staging: int = 0  # pinned buffers in the working precision (16-bit only)
    activations: int = 0  # the saved tensors of the forwards in flight, at the peak
    d2h: int = 0  # bytes copied device → host per step
    h2d: int = 0  # host → device

    @property
    def total(self) -> int:
        return self.master + self.moments + self.grads + self.staging + self.activations


NONE = Host()


def choices(plan: Plan) -> list[Offload]:
    """What E090's hint and ``dslc search`` may offload beyond what the plan does: the
    optimizer, the activations, both (each only where it adds to the plan's)."""
    now = plan.train.offload or Offload(False, False, None)
    out = [Offload(opt or now.optimizer, act or now.activations, now.span) for opt, act in ((True, False), (False, True), (True, True))]
    return [o for o in dict.fromkeys(out) if (o.optimizer, o.activations) != (now.optimizer, now.activations)]


def optimizer_on_host(plan: Plan) -> bool:
    return bool(plan.train.offload and plan.train.offload.optimizer)


def activations_on_host(plan: Plan) -> bool:
    return bool(plan.train.offload and plan.train.offload.activations)


def optimizer_host(plan: Plan, n: int, w: int, moments: int) -> Host:
    """The host side of optimizer offload for a rank whose optimizer steps ``n`` parameters,
    in the working precision of ``w`` bytes, with ``moments`` bytes of state per parameter."""
    if not optimizer_on_host(plan):
        return NONE
    return Host(master=4 * n, moments=moments * n, grads=4 * n, staging=w * n if w < 4 else 0, d2h=w * n, h2d=w * n)


def activation_host(plan: Plan, held_bytes: int, per_step: int) -> Host:
    """``held_bytes``: the blocks' saved tensors of the forwards in flight at the peak;
    ``per_step``: those of every forward the step runs (each copied out, then back)."""
    if not activations_on_host(plan):
        return NONE
    return Host(activations=held_bytes, d2h=per_step, h2d=per_step)


def moved_per_layer(plan: Plan, per_layer: float) -> float:
    """What activation offload moves of a block's ``per_layer`` saved bytes: all of what
    autograd's hooks see, which under ``selective_ops`` is the block's input alone (the
    outputs its policy keeps are held by the checkpoint, past the hooks, on the device)."""
    if plan.train.recompute != "selective_ops":
        return per_layer
    r = plan.tp if plan.tensor_parallel.sequence_parallel else 1
    return local_tokens(plan) * plan.model.hidden * dtype_bytes(plan) // r


def link(plan: Plan) -> Link:
    """The PCIe link each GPU copies over: the cluster's ``pcie``, or the catalog's."""
    own = plan.cluster.link("pcie")
    if own is not None:
        return own
    scope, bandwidth, latency = catalog.LINKS["pcie"]
    return Link("pcie", scope, bandwidth, latency, plan.cluster.span)


def host_bandwidth(plan: Plan) -> float:
    """Host memory bytes/s one GPU's process gets: the node's, shared by its GPUs."""
    c = plan.cluster
    return (c.host_bandwidth or (c.device.bandwidth if c.device.name == "cpu" else catalog.HOST_BANDWIDTH)) / c.gpus_per_node


@dataclass(frozen=True)
class Copies:
    """A stage's offload time per step, worst rank."""

    d2h: float  # seconds of device → host copies
    h2d: float
    host_step: float  # the optimizer step on the host
    exposed: float  # what compute does not hide, beyond the host step

    @property
    def added(self) -> float:
        return self.exposed + self.host_step


NO_COPIES = Copies(0.0, 0.0, 0.0, 0.0)


def host_step_bytes(plan: Plan, opt: Host) -> int:
    """Bytes the host's optimizer step reads and writes, pass by pass as the script runs
    them: 16-bit gradients widened from the staging buffer into the fp32 ones (and fp16's
    divided by the loss scale), the gradient norm read, the clip's multiply, the fused
    optimizer (master, moments and gradients read, master and moments written), and the
    updated masters rounded into the staging buffer."""
    if not opt.master:
        return 0
    widen = opt.staging + opt.grads if opt.staging else 0
    unscale = 2 * opt.grads if plan.train.precision == "fp16" and plan.train.loss_scale == "dynamic" else 0
    clip = 2 * opt.grads if plan.train.grad_clip > 0 else 0
    step = 2 * (opt.master + opt.moments) + opt.grads
    rounded = opt.master + opt.staging if opt.staging else 0
    return widen + unscale + opt.grads + clip + step + rounded


def copies(plan: Plan, opt: Host, act: Host, forward: float, backward: float, last: float, buckets: bool, blocks: float) -> Copies:
    """Seconds a stage's copies take per step and what compute leaves exposed, as the
    script orders them: the activations behind its ``forward`` and ``backward`` seconds
    (every micro-batch's) but for the last of each forward's ``blocks``, which goes out
    as its forward ends and comes back as its backward begins; the gradients behind the
    ``last`` backward where ``buckets`` copy each as its reduction ends (without data
    parallelism after the backward); the weights after the host step, before anything
    else the device runs (its stream waits for all of them)."""
    bw = link(plan).bandwidth
    last_block = 2 * act.d2h / blocks if act.d2h else 0.0
    exposed = max(0.0, act.d2h / bw - forward) + max(0.0, act.h2d / bw - backward) + last_block / bw
    exposed += max(0.0, opt.d2h / bw - last) if buckets else opt.d2h / bw
    exposed += opt.h2d / bw
    return Copies((opt.d2h + act.d2h) / bw, (opt.h2d + act.h2d) / bw, host_step_bytes(plan, opt) / host_bandwidth(plan), exposed)
