"""The typed intermediate representation.

Everything after ``lower`` consumes these frozen dataclasses and nothing else: units are
resolved to SI (bytes, bytes/s, seconds, FLOP/s), every default is explicit, and every
node keeps the span of the source it came from so later stages can still point at a line.

Vocabulary (after torchtitan): an *axis* is a mesh axis (dp, tp, pp, cp, ep);
a *dim* is a tensor dimension.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from math import prod

from .chunks import V_SHAPED, Placement  # noqa: F401 (V_SHAPED: ir.V_SHAPED, with SCHEDULES)
from .source import Span

AXES = ("dp", "tp", "pp", "cp", "ep")
ARCHS = ("gpt2", "llama", "mixtral")
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_v", "dualpipe_v")
PRECISIONS = ("fp32", "bf16", "fp16")
FLOAT8 = ("tensorwise", "rowwise")  # torchao's float8 training recipes (`train { float8 }`)
RECOMPUTE = ("none", "selective", "selective_ops", "full")  # `full every N`: Train.recompute_every
CP_METHODS = ("ring", "ulysses")
LINK_SCOPES = ("node", "cluster")
LOSS_SCALES = ("dynamic", "none")  # fp16: a dynamic loss scale, or none
OPTIMIZERS = ("adamw", "adam", "sgd")
LR_SCHEDULES = ("constant", "cosine", "linear")
DATA_KINDS = ("synthetic", "text", "tokens", "blend")
TOKEN_DTYPES = ("uint16", "uint32", "int32")  # of a raw tokens file (`dtype = …`)


@dataclass(frozen=True)
class Device:
    """An accelerator from the catalog (or overridden in the cluster block)."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s
    memory: int  # bytes
    bandwidth: float = 0.0  # memory (HBM) bytes/s; 0: unknown, elementwise work is not timed
    fp8_flops: float = 0.0  # dense fp8 FLOP/s; 0: no fp8 tensor cores (catalog.FP8)


@dataclass(frozen=True)
class Link:
    name: str
    scope: str  # "node": inside one node only; "cluster": between nodes
    bandwidth: float  # bytes/s, per direction per GPU
    latency: float  # seconds
    span: Span


@dataclass(frozen=True)
class Cluster:
    name: str
    nodes: int
    gpus_per_node: int
    device: Device
    links: tuple[Link, ...]
    span: Span
    efficiency: float | None = None  # `cluster { efficiency }`: GEMM and attention at this fraction of peak
    host_memory: int | None = None  # bytes of host memory a node has; None: not said (offload's hint)
    host_bandwidth: float = 0.0  # bytes/s of a node's host memory; 0: the catalog's HOST_BANDWIDTH

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def link(self, name: str) -> Link | None:
        return next((lk for lk in self.links if lk.name == name), None)


@dataclass(frozen=True)
class Model:
    """A transformer. ``experts == 0`` means a dense model."""

    name: str
    arch: str  # gpt2 | llama | mixtral
    layers: int
    hidden: int
    heads: int
    kv_heads: int  # == heads unless grouped-query attention
    ffn: int  # intermediate size of the MLP (per expert for MoE)
    vocab: int
    seq_len: int
    norm_eps: float
    rope_theta: float  # unused by gpt2 (learned positions)
    tie_embeddings: bool
    dropout: float
    experts: int  # 0 for dense
    top_k: int  # 0 for dense
    capacity_factor: float  # 0.0 means no capacity limit (dropless)
    aux_loss_weight: float
    router: str  # MoE: "topk_softmax" | "softmax_topk" (front.defaults.ROUTERS); "" for dense
    z_loss_weight: float  # router z-loss (Zoph et al. 2022); 0.0 off, and for dense
    span: Span
    # q is heads·head_dim wide, k and v kv_heads·head_dim (Gemma, Qwen3: ≠ hidden); 0: hidden // heads
    head_dim: int = 0
    # the model block's seq_len, gpt2's position rows; seq_len is train.seq_len's (≤ it, E066); 0: seq_len
    max_positions: int = 0
    # DeepSeek-style MoE (Dai et al. 2024; DeepSeek-V3): the first `dense_layers` blocks have
    # a dense MLP `dense_ffn` wide (0: ffn) in place of the MoE, and every MoE block adds
    # `shared_experts` always-on experts (one MLP of shared_experts · ffn) to the routed ones
    dense_layers: int = 0
    dense_ffn: int = 0
    shared_experts: int = 0

    def __post_init__(self) -> None:  # 0: derived (isinstance: a value an error left unknown stays so, dslc.unknown)
        if isinstance(self.head_dim, int) and not self.head_dim:
            object.__setattr__(self, "head_dim", max(1, self.hidden // self.heads))
        if isinstance(self.max_positions, int) and not self.max_positions:
            object.__setattr__(self, "max_positions", self.seq_len)
        if isinstance(self.dense_ffn, int) and not self.dense_ffn:
            object.__setattr__(self, "dense_ffn", self.ffn)

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    def moe_layer(self, i: int) -> bool:
        """Whether block ``i`` is a mixture of experts (not one of the dense prefix)."""
        return self.is_moe and i >= self.dense_layers


@dataclass(frozen=True)
class MeshAxis:
    name: str  # one of AXES
    size: int
    link: str  # name of a Link of the cluster
    span: Span


@dataclass(frozen=True)
class Mesh:
    """Ordered axes, outermost first; the last axis has stride 1.

    rank = Σ coordinate(axis) × stride(axis).
    """

    axes: tuple[MeshAxis, ...]
    span: Span

    def size(self, name: str) -> int:
        ax = self._by_name.get(name)
        return ax.size if ax else 1

    def axis(self, name: str) -> MeshAxis | None:
        return self._by_name.get(name)

    @cached_property
    def _by_name(self) -> dict[str, MeshAxis]:  # the first axis of each name, worked out once
        return {a.name: a for a in reversed(self.axes)}

    def stride(self, name: str) -> int:
        names = [a.name for a in self.axes]
        if name not in names:
            return 0
        return prod(a.size for a in self.axes[names.index(name) + 1 :])

    @property
    def world_size(self) -> int:
        return prod(a.size for a in self.axes)

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinate of ``rank`` on every axis (absent axes are 0)."""
        out = {n: 0 for n in AXES}
        for a in self.axes:
            out[a.name] = (rank // self.stride(a.name)) % a.size
        return out


@dataclass(frozen=True)
class TensorParallel:
    sequence_parallel: bool
    span: Span | None


@dataclass(frozen=True)
class DataParallel:
    zero: int  # 0 replicated | 1 optimizer | 2 + gradients | 3 + parameters
    span: Span | None
    # zero = 3: free a unit's gathered weights after its forward (FSDP's default) or keep
    # them until its backward
    reshard_after_forward: bool = True
    # HSDP: ZeRO shards over groups of `shard` consecutive dp ranks and the shards are
    # all-reduced over the dp / shard replicas; 0: over every dp rank (plain ZeRO / FSDP)
    shard: int = 0

    def hsdp(self, dp: int) -> bool:
        """Whether the dp ranks split into shard groups and replicas (shard < dp)."""
        return 0 < self.shard < dp


@dataclass(frozen=True)
class Pipeline:
    schedule: str  # one of SCHEDULES
    virtual_stages: int  # per rank; > 1 for interleaved_1f1b, 2 for the V schedules
    microbatches: int
    layers_per_stage: tuple[int, ...] | None  # explicit split, one per (virtual) stage
    span: Span | None


@dataclass(frozen=True)
class ContextParallel:
    method: str  # ring | ulysses
    load_balance: bool  # ring: split the sequence into 2·cp chunks (zig-zag)
    span: Span | None


@dataclass(frozen=True)
class Optimizer:
    name: str  # adamw | adam | sgd
    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    momentum: float  # sgd only
    span: Span | None


@dataclass(frozen=True)
class LRSchedule:
    name: str  # constant | cosine | linear
    warmup: int  # steps
    min_lr: float  # absolute, reached at decay_steps
    decay_steps: int  # defaults to train.steps
    span: Span | None


@dataclass(frozen=True)
class Data:
    """Where a plan's sequences come from: random tokens, one file, or a blend of files."""

    kind: str  # synthetic | text | tokens | blend
    path: str | None  # as written in the plan (text/tokens only)
    resolved_path: str | None  # relative to the plan file's directory
    span: Span | None
    dtype: str | None = None  # tokens: the ids of a raw file as the plan says; None: from the vocab
    parts: tuple[tuple[float, Data], ...] = ()  # blend: (weight, summing to 1, file source)

    @property
    def files(self) -> tuple[Data, ...]:
        """The text and tokens sources it reads, in the plan's order."""
        if self.kind == "blend":
            return tuple(d for _, d in self.parts)
        return (self,) if self.kind in ("text", "tokens") else ()

    def raw_dtype(self, vocab: int) -> str:
        """The id type of a raw tokens file: the plan's, else the narrowest that holds the
        vocab (nanoGPT's uint16 up to 65,536 ids). Headers of llm.c files and Megatron's
        indexed datasets say their own."""
        return self.dtype or ("uint16" if vocab <= 2**16 else "uint32")


@dataclass(frozen=True)
class Eval:
    """The validation loss: `batches` global batches of `data`, without gradients, after
    every `every` steps and after the last."""

    every: int  # steps; 0: after the last step only
    batches: int
    data: Data
    span: Span | None


@dataclass(frozen=True)
class Checkpoint:
    every: int  # steps
    dir: str
    span: Span | None
    keep: int = 0  # the newest checkpoints kept; 0: all
    async_save: bool = False  # written in the background while training goes on
    max_restarts: int = 0  # torchrun restarts the job this often; it resumes by itself


@dataclass(frozen=True)
class Offload:
    """``offload { … }``: what lives in host memory instead of the device's."""
    optimizer: bool  # the fp32 master weights and moments of the rank's shard, stepped on the host
    activations: bool  # what each block saves for its backward, between its forward and backward
    span: Span | None


@dataclass(frozen=True)
class Init:
    """``init = hf("DIR")``: the weights start from a Hugging Face checkpoint."""

    kind: str  # hf
    path: str  # as written in the plan
    resolved_path: str  # relative to the plan file's directory
    span: Span | None


@dataclass(frozen=True)
class Train:
    steps: int
    micro_batch: int
    global_batch: int
    precision: str  # fp32 | bf16 | fp16
    recompute: str  # one of RECOMPUTE
    grad_clip: float  # 0.0 disables clipping
    seed: int
    loss_scale: str  # "dynamic" | "none" (fp16 only matters)
    optimizer: Optimizer
    lr_schedule: LRSchedule
    data: Data
    checkpoint: Checkpoint | None
    span: Span | None
    eval: Eval | None = None
    timeout: float = 600.0  # seconds a collective waits for its peers
    init: Init | None = None  # where the weights start: None draws them from the seed
    recompute_every: int = 1  # `full every N`: blocks N-1, 2N-1, … (0-based) are recomputed
    compile: bool | None = None  # torch.compile each block; None: on CUDA, not on CPU
    float8: str | None = None  # one of FLOAT8: the blocks' linears multiply in fp8; None: off
    offload: Offload | None = None  # None: everything on the device

    @property
    def recompute_label(self) -> str:
        """The policy as a plan writes it: ``full every 2``, ``selective_ops``."""
        return self.recompute + (f" every {self.recompute_every}" if self.recompute_every > 1 else "")


@dataclass(frozen=True)
class Plan:
    name: str
    file: str  # the .plan file that defines it
    model: Model
    cluster: Cluster
    mesh: Mesh
    tensor_parallel: TensorParallel
    data_parallel: DataParallel
    pipeline: Pipeline
    context_parallel: ContextParallel
    train: Train
    span: Span
    # Where each setting was written, by dotted key ("model.heads", "mesh.tp",
    # "train.global_batch"), so a check can point at the line it is about.
    spans: Mapping[str, Span] = field(default_factory=dict, compare=False, repr=False)

    def where(self, *keys: str) -> Span:
        """The span of the first of ``keys`` written in the plan, else the enclosing block's (``model.heads`` falls back to ``model``), else the plan's."""
        for key in keys:
            while key:
                if key in self.spans:
                    return self.spans[key]
                key = key.rpartition(".")[0]
        return self.span

    # -- derived sizes, used by every later stage ---------------------------
    # the size of each axis (1 where the mesh has none)
    dp = property(lambda self: self.mesh.size("dp"))
    tp = property(lambda self: self.mesh.size("tp"))
    pp = property(lambda self: self.mesh.size("pp"))
    cp = property(lambda self: self.mesh.size("cp"))
    ep = property(lambda self: self.mesh.size("ep"))

    @property
    def world_size(self) -> int:
        return self.mesh.world_size

    @property
    def data_parallel_size(self) -> int:
        """Ranks that see different data: dp × ep (ep ranks act as dp for dense weights)."""
        return self.dp * self.ep

    @property
    def microbatches(self) -> int:
        return self.pipeline.microbatches

    def stage_layers(self) -> tuple[int, ...]:
        """Layers of each model chunk in layer order (pp × v chunks; ranks: dslc.chunks)."""
        return self._stage_layers

    @cached_property
    def placement(self) -> Placement:  # where the chunks live: interleaved, or in a V (zb_v, dualpipe_v)
        return Placement.of(self.pipeline.schedule, self.pp, self.pipeline.virtual_stages)
    @property
    def v_shape(self) -> bool:  # the chunks sit in a V, not interleaved
        return self.placement.v_shape
    @property
    def last_stage(self) -> int:  # the pp rank of the last chunk (norm, head, loss): p − 1, or 0 in a V
        return self.placement.rank(self.placement.chunks - 1)

    @cached_property
    def _stage_layers(self) -> tuple[int, ...]:  # worked out once: the cost model asks often
        if self.pipeline.layers_per_stage:
            return self.pipeline.layers_per_stage
        q, r = divmod(self.model.layers, n := self.placement.chunks)
        return tuple(q + (1 if i < r else 0) for i in range(n))  # earlier chunks get the remainder; the last also has the head


@dataclass(frozen=True)
class Program:
    """Everything one lint/compile run read: plans and the definitions in scope."""

    plans: tuple[Plan, ...]
    files: tuple[str, ...] = field(default=())
