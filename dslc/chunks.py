"""Where the model's chunks live on the pipeline ranks.

The model is cut into pp·v chunks in layer order. Every schedule but the V-shaped ones
places them interleaved (Narayanan et al., SC21 §2.2.2): global chunk g on pp rank g % pp as
its local chunk g // pp. ``zb_v`` and ``dualpipe_v`` (v = 2) place them in a V (Qi et al.
2024, "Pipeline Parallelism with Controllable Memory"; DeepSeek-V3's DualPipeV): rank r holds
global chunks r and 2p−1−r, so the first and the last chunk (embedding and loss) share rank
0, and the two chunks at the bottom of the V share rank p−1, whose turn needs no message.
"""

from __future__ import annotations

V_SHAPED = ("zb_v", "dualpipe_v")


def chunk_ids(p: int, v: int, rank: int, v_shape: bool = False) -> tuple[int, ...]:
    """The global chunks of pp rank ``rank``, by local chunk."""
    return (rank, 2 * p - 1 - rank) if v_shape else tuple(c * p + rank for c in range(v))


def chunk_rank(p: int, g: int, v_shape: bool = False) -> int:
    """The pp rank holding global chunk ``g``."""
    return (g if g < p else 2 * p - 1 - g) if v_shape else g % p


def chunk_local(p: int, g: int, v_shape: bool = False) -> int:
    """The local chunk of global chunk ``g`` on its rank."""
    return (0 if g < p else 1) if v_shape else g // p
