"""Where the model's chunks live on the pipeline ranks: the one definition of a chunk's global
id, its rank, its local index and its neighbours, for both placements.

The model is cut into pp·v chunks in layer order. Every schedule but the V-shaped ones
places them interleaved (Narayanan et al., SC21 §2.2.2): global chunk g on pp rank g % pp as
its local chunk g // pp. ``zb_v`` and ``dualpipe_v`` (v = 2) place them in a V (Qi et al.
2024, "Pipeline Parallelism with Controllable Memory"; DeepSeek-V3's DualPipeV): rank r holds
global chunks r and 2p−1−r, so the first and the last chunk (embedding and loss) share rank
0, and the two chunks at the bottom of the V share rank p−1, whose turn needs no message.
"""

from __future__ import annotations

from dataclasses import dataclass

V_SHAPED = ("zb_v", "dualpipe_v")
# where a compute's result goes: an F's output to the next chunk, a B's input gradient to the
# one before (the step :meth:`Placement.neighbour` and :meth:`Placement.turn` take)
ONWARD = {"F": 1, "B": -1}


@dataclass(frozen=True)
class Placement:
    """The pp·v chunks of a pipeline on its pp ranks: interleaved, or in a V (``v_shape``,
    v = 2). Every consumer of a chunk's rank, local index or neighbour asks this."""

    pp: int
    v: int = 1
    v_shape: bool = False

    @classmethod
    def of(cls, schedule: str, pp: int, v: int) -> Placement:
        """The placement of a schedule's chunks (a V for :data:`V_SHAPED`)."""
        return cls(pp, v, schedule in V_SHAPED)

    @property
    def chunks(self) -> int:
        return self.pp * self.v

    def ids(self, rank: int) -> tuple[int, ...]:
        """The global chunks of pp rank ``rank``, by local chunk."""
        p = self.pp
        return (rank, 2 * p - 1 - rank) if self.v_shape else tuple(c * p + rank for c in range(self.v))

    def global_chunk(self, rank: int, local: int) -> int:
        """The global chunk of local chunk ``local`` on ``rank`` (``ids(rank)[local]``, without
        building the tuple: a rank may hold 8,192 chunks)."""
        if self.v_shape:
            return (rank, 2 * self.pp - 1 - rank)[local]
        if not 0 <= local < self.v:
            raise IndexError(local)
        return local * self.pp + rank

    def rank(self, g: int) -> int:
        """The pp rank holding global chunk ``g``."""
        p = self.pp
        return (g if g < p else 2 * p - 1 - g) if self.v_shape else g % p

    def local(self, g: int) -> int:
        """The local chunk of global chunk ``g`` on its rank."""
        return (0 if g < self.pp else 1) if self.v_shape else g // self.pp

    def neighbour(self, g: int, step: int) -> int | None:
        """Global chunk g + step (+1: the next in layer order, where the activations go; −1: the
        one before, where the gradients go), or None past either end of the model."""
        return g + step if 0 <= g + step < self.chunks else None

    def peer(self, rank: int, local: int, step: int) -> int | None:
        """The rank that local chunk ``local`` of ``rank`` exchanges with towards ``step``;
        None at either end of the model, or when the neighbour is on this very rank (pp = 1,
        the turn of a V: the tensor is handed over in memory, :meth:`turn`)."""
        other = self.neighbour(self.global_chunk(rank, local), step)
        q = rank if other is None else self.rank(other)
        return None if q == rank else q

    def turn(self, rank: int, local: int, step: int) -> int | None:
        """The local chunk of ``rank`` that receives local chunk ``local``'s output (step +1)
        or input gradient (step −1) in memory, being its neighbour on the same rank; else None."""
        other = self.neighbour(self.global_chunk(rank, local), step)
        return self.local(other) if other is not None and self.rank(other) == rank else None
