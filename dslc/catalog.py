"""Built-in numbers: accelerators and links. A cluster block may override any
of them; a missing number falls back to this catalog with a note (N021).

Peak FLOP/s are dense bf16 tensor-core figures from the vendors' datasheets.
"""

from __future__ import annotations

from .ir import Device
from .units import GB, GiB

DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        Device("h100_sxm", 989e12, 80 * GiB),
        Device("h100_pcie", 756e12, 80 * GiB),
        Device("h200", 989e12, 141 * GB),
        Device("b200", 2250e12, 192 * GB),
        Device("a100_40g", 312e12, 40 * GiB),
        Device("a100_80g", 312e12, 80 * GiB),
        Device("l40s", 362e12, 48 * GB),
        Device("mi300x", 1307e12, 192 * GB),
        # A CPU "device" for the gloo demos: numbers are nominal.
        Device("cpu", 1e12, 16 * GiB),
    )
}

# name → (scope, bandwidth bytes/s per direction per GPU, latency s)
LINKS: dict[str, tuple[str, float, float]] = {
    "nvlink": ("node", 450e9, 2e-6),  # NVLink 4 (H100): 900 GB/s bidirectional
    "nvswitch": ("node", 450e9, 2e-6),
    "xgmi": ("node", 64e9, 2e-6),  # AMD Infinity Fabric, per peer link
    "pcie": ("node", 32e9, 5e-6),  # PCIe 4.0 x16
    "shm": ("node", 20e9, 5e-6),  # shared memory between CPU processes
    "ib": ("cluster", 50e9, 8e-6),  # 400 Gb/s NDR InfiniBand per GPU
    "roce": ("cluster", 50e9, 10e-6),
    "efa": ("cluster", 50e9, 15e-6),
    "ethernet": ("cluster", 12.5e9, 20e-6),  # 100 Gb/s
}
