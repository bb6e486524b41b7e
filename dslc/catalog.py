"""Built-in numbers: accelerators, what kernels achieve on them, and links. A cluster
block may override any of them; a missing number falls back to this catalog with a note
(N021).

Peak FLOP/s are dense bf16 tensor-core figures, then HBM bandwidths, then dense fp8
tensor-core figures (e4m3; 0: no fp8 tensor cores, as on the A100), from the vendors'
datasheets: the fp8 peak is twice the bf16 one on Hopper, Ada, Blackwell and the MI300X
(each datasheet quotes 2× with sparsity; dense is half of that). :data:`CALIBRATION` holds the fractions of those peaks that the
step-time model (:mod:`dslc.cost.time`) charges each class of operation at, each with
where it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ir import Device
from .units import GB, GiB

DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        Device("h100_sxm", 989e12, 80 * GiB, 3.35e12, 1979e12),
        Device("h100_pcie", 756e12, 80 * GiB, 2.0e12, 1513e12),
        Device("h200", 989e12, 141 * GB, 4.8e12, 1979e12),
        Device("b200", 2250e12, 192 * GB, 8.0e12, 4500e12),
        Device("a100_40g", 312e12, 40 * GiB, 1.555e12),
        Device("a100_80g", 312e12, 80 * GiB, 2.039e12),
        Device("l40s", 362e12, 48 * GB, 0.864e12, 733e12),
        Device("mi300x", 1307e12, 192 * GB, 5.3e12, 2615e12),
        # H800 SXM: the export H100 SXM, the same dense bf16 peak and 80 GB HBM3 (3.35 TB/s);
        # its NVLink is 400 GB/s bidirectional (200 GB/s per direction, not H100's 450): a
        # cluster of them sets `link nvlink { bandwidth = 200 GB/s }` (DeepSeek-V3 trained on them)
        Device("h800", 989e12, 80 * GiB, 3.35e12, 1979e12),
        # One Blackwell GPU of a GB200 NVL72 (NVIDIA's GB200 NVL72 datasheet, per rack of 72
        # GPUs: FP16/BF16 tensor core 360 PFLOPS with sparsity, 180 dense, so 2.5 PFLOPS dense
        # per GPU; HBM3e up to 13.4 TB and 576 TB/s, so 186 GB and 8 TB/s per GPU; the
        # superchip, 2 GPUs: 372 GB). The first datasheets said 384 GB (192 GB a GPU); the
        # systems shipped, as MLPerf lists them (GB200-186GB), hold 186 GB.
        Device("gb200", 2500e12, 186 * GB, 8.0e12, 5000e12),
        # A CPU "device" for the gloo demos: numbers are nominal.
        Device("cpu", 1e12, 16 * GiB, 50e9),
    )
}

@dataclass(frozen=True)
class Calibration:
    """What kernels achieve on a device, as fractions of its datasheet peaks.

    A GEMM whose smallest dimension is d runs at ``gemm · d / (d + gemm_half)`` of the dense
    peak (small GEMMs fill fewer tensor-core tiles and waves); a fused causal attention
    kernel runs the FLOPs it does (half the counted QKᵀ and AV: the masked half is
    skipped) at ``attention`` of the peak, its backward 2.5× the forward's FLOPs (it
    recomputes QKᵀ); elementwise kernels (norms, activations, rope, residuals, the loss's
    softmax, the optimizer) move their bytes at ``bandwidth`` of the HBM bandwidth."""

    gemm: float
    gemm_half: int
    attention: float
    bandwidth: float
    source: str


CALIBRATION: dict[str, Calibration] = {
    "a100": Calibration(0.80, 192, 0.55, 0.75, "checked against Korthikanti et al. 2022 Table 5, SC21 Table 1, torchtitan and llm.c "
                        "A100 runs (benchmarks/published.py: within 15 %); attention near FlashAttention-2's A100 figures (Dao 2023)"),
    "h100": Calibration(0.66, 192, 0.40, 0.75, "checked against llm.c's GPT-2 1558M and Megatron-Core's Mixtral runs on 700 W "
                        "H100 SXM (benchmarks/published.py: within 10 %); attention near FlashAttention-2 on H100 (Shah et al. 2024)"),
    "default": Calibration(0.60, 192, 0.40, 0.70, "no published run on this device: the H100 fit, rounded down"),
}

# the devices each calibration row covers; any other device uses "default"
CALIBRATED = {"a100_40g": "a100", "a100_80g": "a100", "h100_sxm": "h100", "h100_pcie": "h100", "h200": "h100", "h800": "h100"}


# what CUDA calls a device (torch.cuda.get_device_name, lower case) -> its entry in DEVICES:
# the first whose words all appear in the name
CUDA_NAMES = ((("h200",), "h200"), (("h800",), "h800"), (("h100", "pcie"), "h100_pcie"), (("h100",), "h100_sxm"),
              (("a100", "40gb"), "a100_40g"), (("a100",), "a100_80g"), (("l40s",), "l40s"), (("gb200",), "gb200"),
              (("b200",), "b200"), (("mi300x",), "mi300x"))


def device_of_cuda_name(name: str) -> str | None:
    """The catalog's device for a GPU as CUDA names it ("NVIDIA H100 80GB HBM3" ->
    "h100_sxm"), or None where the catalog has no entry for it."""
    name = name.lower()
    return next((device for words, device in CUDA_NAMES if all(w in name for w in words)), None)


def calibration(device: str) -> tuple[str, Calibration]:
    """(row name, row) of :data:`CALIBRATION` that ``device`` is charged at."""
    row = CALIBRATED.get(device, "default")
    return row, CALIBRATION[row]


@dataclass(frozen=True)
class Allowance:
    """What a training process holds beyond the tensors the memory model counts."""

    context: int  # bytes outside PyTorch's allocator: CUDA context, cuBLAS workspaces, NCCL's buffers
    allocator: float  # reserved/allocated − 1 of PyTorch's caching allocator at the peak (blocks cached, fragmentation)
    source: str


ALLOWANCES: dict[str, Allowance] = {
    "gpu": Allowance(int(1.5 * GiB), 0.06, "context: a CUDA context with cuBLAS and NCCL loaded holds 0.5-1 GiB "
                     "(PyTorch's CUDA semantics notes), NCCL's channels about 0.5 GiB more; allocator: assumed, and "
                     "torchtitan's max-reserved rows come within 10 % with it (benchmarks/published.py)"),
    "cpu": Allowance(0, 0.0, "gloo on CPU: no device context, no caching allocator"),
}


def allowance(device: str) -> Allowance:
    return ALLOWANCES["cpu" if device == "cpu" else "gpu"]


# Host (CPU) memory bandwidth of one node, shared by its GPUs' processes: what the host's
# optimizer step under `train { offload }` runs at. A two-socket node with eight DDR5-4800
# channels a socket (a DGX H100's two Xeon 8480C) peaks at 614 GB/s; STREAM reaches about
# half of it with every core, and the host step gets fewer of them.
HOST_BANDWIDTH = 300e9

# name → (scope, bandwidth bytes/s per direction per GPU, latency s)
LINKS: dict[str, tuple[str, float, float]] = {
    "nvlink": ("node", 450e9, 2e-6),  # NVLink 4 (H100): 900 GB/s bidirectional
    "nvswitch": ("node", 450e9, 2e-6),
    # NVLink 5 (Blackwell: B200, GB200): 1.8 TB/s bidirectional per GPU (NVIDIA's GB200 NVL72
    # datasheet: 130 TB/s for 72 GPUs). A GB200 NVL72 rack is one NVLink domain: a cluster
    # writes it as one node of 72 GPUs for this link to span it.
    "nvlink5": ("node", 900e9, 2e-6),
    "xgmi": ("node", 64e9, 2e-6),  # AMD Infinity Fabric, per peer link
    "pcie": ("node", 32e9, 5e-6),  # PCIe 4.0 x16; the host ↔ GPU link of `train { offload }`
    "shm": ("node", 20e9, 5e-6),  # shared memory between CPU processes
    "ib": ("cluster", 50e9, 8e-6),  # 400 Gb/s NDR InfiniBand per GPU
    "roce": ("cluster", 50e9, 10e-6),
    "efa": ("cluster", 50e9, 15e-6),
    "ethernet": ("cluster", 12.5e9, 20e-6),  # 100 Gb/s
}
