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
3. Computes come in steps; before a step sit the receives it needs, and each compute's sends
   follow it at once. A step is one compute, except in the interleaved steady state, where it
   is the pair F, B (Megatron's ``send_forward_backward_recv_forward_backward``), and
   dualpipe_v's overlapped F&B pair (F of one micro-batch and chunk, B and W of another; its B
   is marked ``overlaps``): both receives are posted before the F, so the B's gradient is in
   flight while the F computes, and the F's activation is sent before the B, so it is in
   flight while the B computes (DeepSeek's DualPipe; Megatron-Core's overlap_p2p_comm).
   Waiting for every batch before the next compute would deadlock such a list (p = 2, v = 2,
   m = 4 already): the runtime waits as contract 4 says, and the proof models those waits.
4. A maximal run of consecutive comm actions is ONE batch: one ``P2POp`` per action in list
   order, posted by a single ``torch.distributed.batch_isend_irecv`` without waiting. In the
   1F1B steady state, rank r's batch {SEND_F → r+1, RECV_B ← r+1} meets rank r+1's batch
   {SEND_B → r, RECV_F ← r}. The runtime waits for a receive just before the compute that
   reads it (on NCCL, whose batch is one request, for the whole batch); for an activation's
   send just before the B of its own micro-batch and chunk (the activation is kept for that B
   anyway), for an input gradient's before the rank's next B (:func:`send_waits`), and for
   the rest at the end of the step. On gloo a send completes only once its receive is posted
   (measured), so a send waited before the very next compute would hold its rank until the
   peer got there.
5. Between two ranks, messages match in posting order (NCCL, and gloo with one tag, do not
   match by micro-batch): the k-th send from r to q is the k-th receive on q from r. Activations
   and gradients have the same shape (micro_batch, seq, hidden), so a mix-up would not fail
   loudly; :func:`dslc.cost.deadlock.verify` checks that both sides list the same messages in the
   same order.

:func:`dslc.cost.deadlock.verify` proves deadlock-freedom under the strictest p2p semantics
(rendezvous: a send completes only once its receive is posted; a batch completes when all its
operations have, and a rank's batches complete in the order posted, as on one NCCL stream)
with the runtime's waits of contract 4. :func:`simulate` times the lists as the runtime waits:
a send arrives ``t_comm`` after it is posted without holding its rank, a receive waits for its
message and for the sends of its own batch (one request on NCCL), a B for the sends
:func:`send_waits` gives it.
"""

from __future__ import annotations

import functools
from collections import defaultdict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..chunks import V_SHAPED, Placement
from ..ir import SCHEDULES
from ..pipeline_shapes import shape_problems
from . import vschedule

COMPUTE = ("F", "B", "W")
COMM = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
KINDS = COMPUTE + COMM
SPLIT_BACKWARD = ("zb_h1", *V_SHAPED)  # the schedules whose backward is B, then W apart

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
        lists = vschedule.with_comm([make(p, m, r) for r in range(p)], at)
        return Schedule(tuple(tuple(Action(*a) for a in acts) for acts in lists), at)
    order = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "interleaved_1f1b": _interleaved, "zb_h1": _zb_h1}[schedule]
    return Schedule(tuple(_with_comm(order(p, m, v, r), r, at) for r in range(p)), at)


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


def _with_comm(steps: Steps, rank: int, at: Placement) -> tuple[Action, ...]:
    """Between two steps: the sends of the step before, then the receives of the step after."""

    def comm(prefix: str, step: tuple[Action, ...]) -> list[Action]:
        out = []
        for a in step:
            kind = prefix + a.kind
            peer = at.peer(rank, a.chunk, step_of(kind)) if a.kind in ("F", "B") else None
            if peer is not None:
                out.append(Action(kind, a.microbatch, a.chunk, peer))
        return out

    out: list[Action] = []
    for before, step in zip([()] + steps, steps):
        out += comm("SEND_", before) + comm("RECV_", step) + list(step)
    return tuple(out + comm("SEND_", steps[-1] if steps else ()))


def send_waits(acts: Sequence[Action]) -> dict[int, int | None]:
    """Contract 4: for each send of a rank's list (by index), the index of the compute the
    runtime waits for it before: an activation's (SEND_F) its own micro-batch and chunk's B, an
    input gradient's (SEND_B) the next B; None: the end of the step."""
    out: dict[int, int | None] = {}
    grads: list[int] = []
    activations: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, a in enumerate(acts):
        if a.kind == "SEND_F":
            activations[(a.microbatch, a.chunk)].append(i)
        elif a.kind == "SEND_B":
            grads.append(i)
        elif a.kind == "B":
            out.update((j, i) for j in grads + activations.pop((a.microbatch, a.chunk), []))
            grads = []
    out.update((j, None) for j in grads + [j for js in activations.values() for j in js])
    return out


def step_of(kind: str) -> int:
    """Which neighbour a send/receive talks to: +1, the next chunk (SEND_F, RECV_B), or −1;
    its peer rank is :meth:`Placement.peer` (None at either end of the model or a V's turn)."""
    return 1 if kind in ("SEND_F", "RECV_B") else -1


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
    is posted and arrives t_comm later, the rank going on; a receive starts when the rank
    reaches it and ends when its message has arrived and its batch's sends have completed (a
    batch is one request on NCCL); a B starts once the input gradients sent since the last B
    and its own micro-batch's activation have arrived (ordering contract 4, :func:`send_waits`).
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
            if what < _SEND:  # F, B or W: key is (global chunk, micro-batch)
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
            elif what == _RECV:
                done = sent.get(key)
                if done is None:
                    waiting[key].append(r)
                    break
                end = max(start, done, batch_done[r])
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
    """Each rank's actions as (what, key): F, B or W (:data:`_COMPUTE`) and (global chunk, micro-batch),
    a send or a receive and its message, or another kind and its name; and
    :func:`peak_inflight`. :attr:`Schedule.compiled` keeps them (:func:`build` hands out the
    same schedule again), so the simulation of a large pipeline runs its loop without working
    out a message again."""
    steps, at = [], actions.placement
    for r, acts in enumerate(actions):
        steps.append([(_SEND, message(a, r, at)) if a.kind in ("SEND_F", "SEND_B") else
                      (_RECV, message(a, r, at)) if a.kind in ("RECV_F", "RECV_B") else
                      (_COMPUTE[a.kind], (at.global_chunk(r, a.chunk), a.microbatch)) if a.kind in _COMPUTE else
                      (_OTHER, a.kind) for a in acts])
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
