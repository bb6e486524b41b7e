"""Pipeline schedules as data: build each rank's action list and simulate it.

The proof that the lists cannot deadlock is :mod:`dslc.cost.deadlock`.

The model is cut into ``pp·v`` chunks in layer order (v = virtual stages per rank). Global chunk
``g`` lives on pipeline rank ``g % pp`` as its local chunk ``g // pp`` (the interleaved placement
of Narayanan et al., SC21, §2.2.2), so local chunk ``c`` of rank ``r`` is global ``c·pp + r``;
the V-shaped schedules put global chunks r and 2p−1−r on rank r. :func:`build` returns a
:class:`Schedule`, one frozen value: the lists and that placement (:class:`dslc.chunks.Placement`),
which every consumer reads from it.

Schedules (:func:`build`):

* ``gpipe``: every forward, then every backward. Bubble (p−1)/m; each rank holds m micro-batches.
* ``1f1b``: PipeDream-Flush (Narayanan et al., SC21, §2.2.1): rank r runs min(p−r−1, m) warm-up
  forwards, then alternates forward and backward. Bubble (p−1)/m; rank 0 holds p micro-batches.
* ``interleaved_1f1b``: SC21 §2.2.2 in Megatron-LM's order: chunk-step k runs micro-batch
  (k // pv)·p + k % p on chunk (k % pv) // p; warm-up 2(p−r−1) + (v−1)·p chunk-forwards (all
  when m = p). Bubble (p−1)/(v·m); rank 0 holds p·v + p − 1 chunk activations, i.e.
  p·(1 + (p−1)/(p·v)) micro-batches' worth (Korthikanti et al. 2022).
* ``zb_h1``: ZB-H1 of Qi et al. 2023 (Zero Bubble Pipeline Parallelism, §2.1): the backward is
  split into B (input gradient, on the critical path) and W (weight gradient, deferred). Rank r
  runs p−r warm-up forwards, then B, W, F repeatedly with its first r W passes postponed to the
  end. Bubble (p−1)(T_F + T_B − T_W) at the peak memory of 1F1B.
* ``zb_v`` and ``dualpipe_v``: two chunks per rank in a V, :mod:`dslc.cost.vschedule`.

Ordering contract: the generated runtime executes the lists literally.

1. A rank runs its list top to bottom. F, B, W compute local chunk ``chunk`` of ``microbatch``.
2. ``chunk`` of a send/receive is the local chunk on the rank that holds the action.
   ``SEND_F(mb, c, q)`` sends the output of this rank's ``F(mb, c)`` to rank q (holder of global
   chunk g+1, g = c·pp+r interleaved: :meth:`Placement.peer <dslc.chunks.Placement.peer>`); ``RECV_F(mb, c, q)`` receives the input of ``F(mb, c)``;
   ``SEND_B(mb, c, q)`` sends the input gradient made by ``B(mb, c)`` to the holder of global
   chunk g−1; ``RECV_B(mb, c, q)`` receives the output gradient that ``B(mb, c)`` needs. When
   chunk g±1 is on the same rank (the turn of a V) there is no message: the runtime hands the
   tensor over in memory.
3.–5. Where the sends and receives go, how a batch is posted, when the runtime waits for each
   message and how two ranks' messages pair up: :mod:`dslc.cost.messages`.

:func:`dslc.cost.deadlock.verify` proves the lists free of deadlock as the runtime waits
(contract 4) under the strictest p2p semantics; :func:`simulate` times them as it waits.
"""

from __future__ import annotations

import functools
from collections import defaultdict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..chunks import Placement
from ..ir import SCHEDULES
from ..pipeline_shapes import SPLIT_BACKWARD, shape_problems
from . import vschedule
from .messages import between, place, send_waits, step_of

COMPUTE = ("F", "B", "W")
COMM = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
KINDS = COMPUTE + COMM

__all__ = [
    "SCHEDULES", "SPLIT_BACKWARD", "Action", "Schedule", "ScheduleError", "Simulation", "build", "locate",
    "message", "peak_inflight", "placed", "send_waits", "simulate", "step_of",
]


@dataclass(frozen=True)
class Action:
    """One step of one pipeline rank; the module docstring states the contract."""

    kind: str  # one of KINDS
    microbatch: int
    chunk: int  # local chunk (virtual stage) 0..v-1; global chunk: Placement.global_chunk
    peer: int | None = None  # the other pipeline rank of a send/receive
    overlaps: bool = False  # a B run as DualPipe's F&B pair with the F before it (contract 3)

    @property
    def is_comm(self) -> bool:
        return self.kind in COMM

    def label(self, chunks: bool = False) -> str:
        """Short label: ``F3``, ``B3·1`` (with chunks), ``SEND_F3→2``, ``RECV_B3←2``."""
        text = f"{self.kind}{self.microbatch}" + (f"·{self.chunk}" if chunks else "")
        if self.peer is not None:
            text += ("→" if self.kind.startswith("SEND") else "←") + str(self.peer)
        return text

    def describe(self) -> str:
        """Long form for diagnostics: ``RECV_F mb 3 chunk 0 from rank 1``."""
        text = f"{self.kind} mb {self.microbatch} chunk {self.chunk}"
        if self.peer is not None:
            text += (" to" if self.kind.startswith("SEND") else " from") + f" rank {self.peer}"
        return text


@dataclass(frozen=True, eq=True)
class Schedule:
    """A pipeline schedule as one value: ``lists[r]``, the actions of pp rank r, and the
    ``placement`` of the chunks they name. It reads as its lists (``len``, ``[r]``, ``for``);
    a copy keeps the placement (``Schedule(lists, s.placement)``), while every consumer refuses
    a bare tuple of lists (:func:`placed`) rather than take it for the interleaved placement."""

    lists: tuple[tuple[Action, ...], ...]
    placement: Placement

    def __post_init__(self) -> None:
        object.__setattr__(self, "lists", tuple(tuple(acts) for acts in self.lists))
        if len(self.lists) != self.placement.pp:
            raise ValueError(f"a schedule of {len(self.lists)} action lists for pp={self.placement.pp}")

    def __len__(self) -> int:
        return len(self.lists)

    def __getitem__(self, rank: int) -> tuple[Action, ...]:
        return self.lists[rank]

    def __iter__(self) -> Iterator[tuple[Action, ...]]:
        return iter(self.lists)

    @functools.cached_property
    def compiled(self) -> tuple[list[list[tuple[int, object]]], tuple[int, ...]]:
        """What :func:`simulate` runs, worked out once per schedule: :func:`_compile`."""
        return _compile(self)


def placed(actions: Schedule) -> Schedule:
    """``actions``, which must be a :class:`Schedule`: a bare tuple of lists has lost its
    placement, and taking it for the interleaved one would misplace a V's chunks."""
    if not isinstance(actions, Schedule):
        raise TypeError(f"expected a Schedule (action lists with their placement), got {type(actions).__name__}: "
                        "a bare copy of the lists has lost where the chunks live; use Schedule(lists, placement)")
    return actions

Steps = list[tuple[Action, ...]]  # a rank's computes, grouped; one p2p batch between steps


class ScheduleError(Exception):
    """A schedule that cannot run; ``.message`` names the cycle (ranks, actions, micro-batches)."""

    def __init__(self, message: str, problems: tuple[str, ...] = ()):
        super().__init__(message)
        self.message = message
        self.problems = problems or (message,)


# ---------------------------------------------------------------------------- build


@functools.lru_cache(maxsize=256)
def build(schedule: str, pp: int, microbatches: int, virtual_stages: int = 1) -> Schedule:
    """The :class:`Schedule`: one ordered action list per pipeline rank (index = pp rank) and
    its placement; kept for the next plan of the same shape (the search costs many; it is immutable).

    Raises ValueError with the message of the first of :func:`dslc.pipeline_shapes.shape_problems`."""
    if problems := shape_problems(schedule, pp, microbatches, virtual_stages):
        raise ValueError(problems[0].message)
    p, m, v = pp, microbatches, virtual_stages
    at = Placement.of(schedule, p, v)
    if at.v_shape:
        make = vschedule.zb_v if schedule == "zb_v" else vschedule.dualpipe_v
        lists = place([make(p, m, r) for r in range(p)], at)
    else:
        order = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "interleaved_1f1b": _interleaved, "zb_h1": _zb_h1}[schedule]
        steps = [[tuple((a.kind, a.microbatch, a.chunk) for a in step) for step in order(p, m, v, r)] for r in range(p)]
        lists = [between(rank, r, at) for r, rank in enumerate(steps)]
    return Schedule(tuple(tuple(Action(*a) for a in acts) for acts in lists), at)


def _gpipe(p: int, m: int, v: int, r: int) -> Steps:
    return [(Action("F", i, 0),) for i in range(m)] + [(Action("B", i, 0),) for i in range(m)]


def _one_f_one_b(p: int, m: int, v: int, r: int) -> Steps:
    warm = min(p - r - 1, m)
    out = [(Action("F", i, 0),) for i in range(warm)]
    for i in range(m - warm):
        out += [(Action("F", warm + i, 0),), (Action("B", i, 0),)]
    return out + [(Action("B", i, 0),) for i in range(m - warm, m)]


def _interleaved(p: int, m: int, v: int, r: int) -> Steps:
    """Megatron-LM's forward_backward_pipelining_with_interleaving, step for step."""
    total, group = m * v, p * v

    def step(kind: str, k: int) -> Action:
        chunk = (k % group) // p
        return Action(kind, (k // group) * p + k % p, chunk if kind == "F" else v - 1 - chunk)

    warm = total if m == p else min(2 * (p - r - 1) + (v - 1) * p, total)
    out = [(step("F", k),) for k in range(warm)]
    out += [(step("F", warm + i), step("B", i)) for i in range(total - warm)]
    return out + [(step("B", k),) for k in range(total - warm, total)]


def _zb_h1(p: int, m: int, v: int, r: int) -> Steps:
    warm = p - r
    out = [(Action("F", i, 0),) for i in range(warm)]
    for k in range(m):
        out.append((Action("B", k, 0),))
        if k >= r:  # rank r postpones its first r weight-gradient passes
            out.append((Action("W", k - r, 0),))
        if warm + k < m:
            out.append((Action("F", warm + k, 0),))
    return out + [(Action("W", i, 0),) for i in range(m - r, m)]


def message(a: Action, rank: int, at: Placement) -> tuple[str, int, int]:
    """What a send/receive on ``rank`` carries: (F|B, micro-batch, producing global chunk).
    A send and a receive belong together iff their messages are equal."""
    g = at.global_chunk(rank, a.chunk)
    return (a.kind[-1], a.microbatch, g + step_of(a.kind) if a.kind.startswith("RECV") else g)


def locate(r: int, i: int, a: Action) -> str:
    """``rank 1 action #4 (RECV_F mb 3 chunk 0 from rank 0)``: an action located, for messages."""
    return f"rank {r} action #{i} ({a.describe()})"


# ---------------------------------------------------------------------------- simulate


@dataclass(frozen=True)
class Simulation:
    """A timed run of a schedule.

    ``bubble_fraction`` is bubble time over ideal time, as in Narayanan et al. (SC21 §2.2):
    Σ_r (makespan − compute_r) / Σ_r compute_r, where compute_r is rank r's time in F/B/W
    (communication counts as bubble). With equal work per rank this is (makespan − ideal) /
    ideal: (p−1)/m for gpipe and 1f1b, (p−1)/(v·m) interleaved, (p−1)(T_F+T_B−T_W) /
    (m(T_F+T_B+T_W)) for zb_h1. The idle share of the makespan is :attr:`idle_fraction`."""

    bubble_fraction: float
    makespan: float  # in the unit of the costs (seconds, or cost units)
    peak_inflight: tuple[int, ...]  # per rank; see simulate
    timeline: tuple[tuple[int, Action, float, float], ...]  # (rank, action, start, end), by rank

    @property
    def idle_fraction(self) -> float:
        """Idle compute time / (pp · makespan) = b / (1 + b): (p−1)/(m+p−1) for 1f1b."""
        return self.bubble_fraction / (1 + self.bubble_fraction)


Cost = float | Sequence[float]


def simulate(actions: Schedule, t_f: Cost, t_b: Cost, t_w: Cost = 0.0,
             t_comm: float = 0.0, timeline: bool = True) -> Simulation:
    """Event simulation of the action lists.

    t_f, t_b: forward/backward time of one chunk for one micro-batch, the same for every
    chunk or one per global chunk (:meth:`Placement.global_chunk`) (for zb_h1, t_b is
    backward-for-inputs and t_w the weight part; for the other schedules B covers both: pass t_b
    as the full backward). t_comm: p2p time per send. A rank runs its list in order; a send
    is posted and arrives t_comm later, the rank going on; a receive is posted too, and the
    compute that reads it waits until its message has arrived and its batch's sends have
    completed (a batch is one request on NCCL): the receive's row ends then; a B starts once
    the input gradients sent since the last B
    and its own micro-batch's activation have arrived (contract 4, :func:`~dslc.cost.messages.send_waits`).
    The timeline holds every action, rank by rank in program order.

    ``peak_inflight[r]``: the most (micro-batch, local chunk) pairs whose F has run and whose
    backward has not finished on rank r; the backward finishes at W when the schedule has W
    passes (activations are kept for the weight gradient), else at B. With v = 1: micro-batches.

    ``timeline`` False leaves the timeline empty (the estimate needs only the makespan, the
    bubble and the peaks: the search simulates thousands of schedules).

    Raises ScheduleError naming the stuck ranks when the lists cannot finish."""
    actions = placed(actions)
    p, chunks = len(actions), actions.placement.chunks
    steps, peaks_of = actions.compiled
    tables = tuple([t] * chunks if isinstance(t, (int, float)) else list(t) for t in (t_f, t_b, t_w))
    busy = 0.0
    clock, pos = [0.0] * p, [0] * p
    batch_done, sends_done = [0.0] * p, [0.0] * p  # when the sends of this batch, and the gradients' since the last B, complete
    activation_done: list[dict[tuple, float]] = [{} for _ in range(p)]  # an activation's send, until its B
    posted: list[list[tuple]] = [[] for _ in range(p)]  # the receives of the open batch: (message, row)
    inbound: list[dict[tuple, tuple]] = [{} for _ in range(p)]  # message -> (its batch's sends done, row)
    sent: dict[tuple, float] = {}
    waiting: dict[tuple, list[int]] = defaultdict(list)
    rows: list[list[tuple[int, Action, float, float]]] | None = [[] for _ in range(p)] if timeline else None
    ready = deque(range(p))
    while ready:
        r = ready.popleft()
        acts, todo, row = actions[r], steps[r], rows[r] if rows is not None else None
        i, start, n = pos[r], clock[r], len(todo)
        while i < n:
            what, key = todo[i]
            if what < _SEND:  # F, B or W: key is (global chunk, micro-batch, the message it reads)
                if posted[r]:  # the batch before this compute is complete: its sends are known
                    inbound[r].update((k, (batch_done[r], at_row)) for k, at_row in posted[r])
                    posted[r] = []
                if key[2] is not None:  # it waits for the message it reads (and its batch, on NCCL)
                    arrived = sent.get(key[2])
                    if arrived is None:
                        waiting[key[2]].append(r)
                        break
                    sends, at_row = inbound[r].pop(key[2], (0.0, -1))
                    if row is not None and at_row >= 0:
                        _, recv, post, _ = row[at_row]
                        row[at_row] = (r, recv, post, max(post, arrived, sends))
                    start = max(start, arrived, sends)
                if what == 1:  # B waits for the gradients sent before it and its activation's send
                    start = max(start, sends_done[r], activation_done[r].pop(("F", key[1], key[0]), 0.0))
                end = start + tables[what][key[0]]
                busy += end - start
                batch_done[r] = 0.0
                if what == 1:
                    sends_done[r] = 0.0
            elif what == _SEND:
                end, done = start, start + t_comm
                if key not in sent:
                    sent[key] = done
                batch_done[r] = max(batch_done[r], done)
                if key[0] == "F":
                    activation_done[r][key] = done
                else:
                    sends_done[r] = max(sends_done[r], done)
                woken = waiting.pop(key, None)
                if woken:
                    ready.extend(woken)
            elif what == _RECV:  # posted; its consumer waits for it
                end = start
                posted[r].append((key, len(row) if row is not None else -1))
            else:
                raise ScheduleError(f"{locate(r, i, acts[i])}: unknown kind {key!r}")
            if row is not None:
                row.append((r, acts[i], start, end))
            start, i = end, i + 1
        clock[r], pos[r] = start, i
    if stuck := [f"{locate(r, pos[r], actions[r][pos[r]])} waits forever"
                 for r in range(p) if pos[r] < len(actions[r])]:
        raise ScheduleError("deadlock in simulation: " + "; ".join(stuck), tuple(stuck))
    timeline = tuple(row for rank_rows in rows for row in rank_rows) if rows is not None else ()
    last_send = max([*sends_done, *(t for done in activation_done for t in done.values())], default=0.0)
    makespan = max(max(clock, default=0.0), last_send)  # the last action's end, or the last send's
    bubble = (p * makespan - busy) / busy if busy > 0 else 0.0
    return Simulation(bubble, makespan, peaks_of, timeline)


@functools.lru_cache(maxsize=256)
def peaks(schedule: str, pp: int, microbatches: int, virtual_stages: int = 1) -> tuple[int, ...]:
    """:func:`peak_inflight` of :func:`build`'s lists, kept for the next plan of this shape."""
    return build(schedule, pp, microbatches, virtual_stages).compiled[1]


_COMPUTE = {"F": 0, "B": 1, "W": 2}  # an action as simulate runs it: the index of its time table,
_SEND, _RECV, _OTHER = 3, 4, 5  # or a message sent or received, or a kind it does not know


def _compile(actions: Schedule) -> tuple[list[list[tuple[int, object]]], tuple[int, ...]]:
    """Each rank's actions as (what, key): F, B or W (:data:`_COMPUTE`) and (global chunk, micro-batch,
    the message it reads from a receive of the list or None),
    a send or a receive and its message, or another kind and its name; and
    :func:`peak_inflight`. :attr:`Schedule.compiled` keeps them (:func:`build` hands out the
    same schedule again), so the simulation of a large pipeline runs its loop without working
    out a message again."""
    steps, at = [], actions.placement
    for r, acts in enumerate(actions):
        reads, received = {}, {}  # compute index -> the message it reads; (kind, mb, chunk) -> message
        for i, a in enumerate(acts):
            if a.kind in ("RECV_F", "RECV_B"):
                received.setdefault((a.kind[-1], a.microbatch, a.chunk), message(a, r, at))
            elif a.kind in _COMPUTE and (a.kind, a.microbatch, a.chunk) in received:
                reads[i] = received.pop((a.kind, a.microbatch, a.chunk))
        steps.append([(_SEND, message(a, r, at)) if a.kind in ("SEND_F", "SEND_B") else
                      (_RECV, message(a, r, at)) if a.kind in ("RECV_F", "RECV_B") else
                      (_COMPUTE[a.kind], (at.global_chunk(r, a.chunk), a.microbatch, reads.get(i))) if a.kind in _COMPUTE
                      else (_OTHER, a.kind) for i, a in enumerate(acts)])
    return steps, peak_inflight(actions)


def peak_inflight(actions: Schedule) -> tuple[int, ...]:
    """Per rank, the most chunk activations held at once (see :func:`simulate`); no timing needed."""
    release = "W" if any(a.kind == "W" for acts in actions for a in acts) else "B"
    peaks = []
    for acts in actions:
        held: set[tuple[int, int]] = set()
        peak = 0
        for a in acts:
            if a.kind == "F":
                held.add((a.microbatch, a.chunk))
                peak = max(peak, len(held))
            elif a.kind == release:
                held.discard((a.microbatch, a.chunk))
        peaks.append(peak)
    return tuple(peaks)
