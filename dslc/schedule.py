"""Pipeline schedules as data: build each rank's action list, prove it cannot deadlock, simulate it.

The model is cut into ``pp·v`` chunks in layer order (``v`` = virtual stages per rank). Global
chunk ``g`` lives on pipeline rank ``g % pp`` as that rank's local chunk ``g // pp`` — the
interleaved assignment of Narayanan et al., SC21, §2.2.2 — so local chunk ``c`` of rank ``r``
is global chunk ``c·pp + r``. With ``v = 1`` this is the usual one-stage-per-rank split.

Schedules (:func:`build`):

* ``gpipe`` — every forward, then every backward (Huang et al. 2019). Bubble (p−1)/m; every
  rank holds the activations of all m micro-batches.
* ``1f1b`` — PipeDream-Flush (Narayanan et al., SC21, §2.2.1): rank r runs min(p−r−1, m)
  warm-up forwards, then alternates one forward and one backward, then drains the backwards.
  Same bubble (p−1)/m, but rank 0 holds at most p micro-batches.
* ``interleaved_1f1b`` — SC21 §2.2.2, in Megatron-LM's order: the forward sequence walks the
  chunks in groups of p micro-batches, warm-up is 2(p−r−1) + (v−1)·p chunk-forwards (all of
  them when m = p). Bubble (p−1)/(v·m); rank 0 holds p·v + p − 1 chunk activations, i.e.
  p·(1 + (p−1)/(p·v)) micro-batches' worth (Korthikanti et al. 2022).
* ``zb_h1`` — ZB-H1 of Qi et al. 2023 ("Zero Bubble Pipeline Parallelism", §2.1): the backward
  is split into B (gradient w.r.t. the input, on the critical path) and W (gradient w.r.t. the
  weights, deferred). Rank r runs p−r warm-up forwards, then B·W·F repeatedly with its first r
  W passes postponed into the cool-down. Bubble (p−1)(T_F + T_B − T_W) with the peak memory
  of 1F1B.

Ordering contract — what the generated runtime executes, literally:

1. A rank executes its list top to bottom. ``F``/``B``/``W`` run forward, backward (for zb_h1:
   backward-for-inputs) and weight-gradient of local chunk ``chunk`` for ``microbatch``.
2. ``chunk`` of a send/receive is the local chunk *on the rank holding the action*:
   ``SEND_F(mb, c, q)`` sends the output of this rank's ``F(mb, c)`` to rank q (which holds
   global chunk c·pp+r+1); ``RECV_F(mb, c, q)`` receives the input of this rank's ``F(mb, c)``;
   ``SEND_B(mb, c, q)`` sends the input-gradient computed by ``B(mb, c)`` to the rank of
   global chunk c·pp+r−1; ``RECV_B(mb, c, q)`` receives the output-gradient ``B(mb, c)`` needs.
3. A receive sits right before the compute that consumes it; a send right after the compute
   that produces it. Between two computes there is therefore at most one run of comm actions:
   the sends of the compute before, then the receives of the compute after.
4. A maximal run of consecutive comm actions is ONE batch: build one ``P2POp`` per action in
   list order, post them with a single ``torch.distributed.batch_isend_irecv`` and wait for all
   of its requests before the next compute. In the 1F1B steady state rank r's batch
   {SEND_F → r+1, RECV_B ← r+1} meets rank r+1's batch {SEND_B → r, RECV_F ← r} (Megatron's
   ``send_forward_recv_backward`` / ``send_backward_recv_forward``).
5. Between two ranks, messages are matched in posting order (NCCL, and gloo with one tag, do
   not match by micro-batch): the k-th send from r to q is the k-th receive on q from r.
   Activations and gradients have the same shape (micro_batch, seq, hidden), so a mix-up would
   not fail loudly — :func:`verify` checks that both sides list the same messages in the
   same order.

:func:`verify` proves deadlock-freedom under the strictest p2p semantics (rendezvous: a send
completes only once its receive is posted; a batch completes once all its operations have).
:func:`simulate` times the lists with eager sends: a send occupies its rank for ``t_comm``; a
receive blocks until the matching send has completed.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

import networkx as nx

from .ir import SCHEDULES

COMPUTE = ("F", "B", "W")
COMM = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
KINDS = COMPUTE + COMM

__all__ = ["Action", "SCHEDULES", "ScheduleError", "Simulation", "build", "check", "simulate", "verify"]


@dataclass(frozen=True)
class Action:
    """One step of one pipeline rank; see the module docstring for the exact contract."""

    kind: str  # one of KINDS
    microbatch: int
    chunk: int  # local chunk (virtual stage) 0..v-1; global chunk = chunk * pp + rank
    peer: int | None = None  # the other pipeline rank of a send/receive

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


Actions = tuple[tuple[Action, ...], ...]


class ScheduleError(Exception):
    """A schedule that cannot run; ``.message`` names the cycle (ranks, actions, micro-batches)."""

    def __init__(self, message: str, problems: tuple[str, ...] = ()):
        super().__init__(message)
        self.message = message
        self.problems = problems or (message,)


# ---------------------------------------------------------------------------- build


def build(schedule: str, pp: int, microbatches: int, virtual_stages: int = 1) -> Actions:
    """One ordered action list per pipeline rank (index = pp rank).

    Raises ValueError, naming the numbers, when the schedule cannot be built: 1f1b and zb_h1
    need microbatches ≥ pp, interleaved_1f1b needs microbatches % pp == 0, and only
    interleaved_1f1b takes virtual_stages > 1."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}")
    p, m, v = pp, microbatches, virtual_stages
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"pp, microbatches and virtual_stages must be ≥ 1 (got pp={p}, microbatches={m}, virtual_stages={v})")
    if v > 1 and schedule != "interleaved_1f1b":
        raise ValueError(f"virtual_stages={v} needs schedule interleaved_1f1b; {schedule} runs one stage per rank")
    if schedule in ("1f1b", "zb_h1") and m < p:
        raise ValueError(f"{schedule} needs microbatches ≥ pp, got microbatches={m} < pp={p}")
    if schedule == "interleaved_1f1b" and m % p:
        raise ValueError(f"interleaved_1f1b needs microbatches divisible by pp, got microbatches={m}, pp={p} (remainder {m % p})")
    order = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "interleaved_1f1b": _interleaved, "zb_h1": _zb_h1}[schedule]
    return tuple(_with_comm(order(p, m, v, r), r, p, v) for r in range(p))


# Each order function returns the rank's computations grouped into steps; one batch of p2p
# runs between two steps (see _with_comm).
Steps = list[tuple[Action, ...]]


def _gpipe(p: int, m: int, v: int, r: int) -> Steps:
    return [(Action("F", i, 0),) for i in range(m)] + [(Action("B", i, 0),) for i in range(m)]


def _one_f_one_b(p: int, m: int, v: int, r: int) -> Steps:
    warm = min(p - r - 1, m)
    out = [(Action("F", i, 0),) for i in range(warm)]
    for i in range(m - warm):
        out += [(Action("F", warm + i, 0),), (Action("B", i, 0),)]
    return out + [(Action("B", i, 0),) for i in range(m - warm, m)]


def _interleaved(p: int, m: int, v: int, r: int) -> Steps:
    """Megatron-LM's forward_backward_pipelining_with_interleaving: chunk-step k runs
    micro-batch (k // pv)·p + k % p on chunk (k % pv) // p (reversed for the backward).

    A steady-state step is the pair F(k), B(k') followed by ONE batch {SEND_F, SEND_B,
    RECV_F, RECV_B} (Megatron's send_forward_backward_recv_forward_backward). Sending F's
    output right after F instead deadlocks under rendezvous p2p from p = 2, v = 2 on."""
    total, group = m * v, p * v

    def fwd(k: int) -> Action:
        return Action("F", (k // group) * p + k % p, (k % group) // p)

    def bwd(k: int) -> Action:
        return Action("B", (k // group) * p + k % p, v - 1 - (k % group) // p)

    warm = total if m == p else min(2 * (p - r - 1) + (v - 1) * p, total)
    out = [(fwd(k),) for k in range(warm)]
    out += [(fwd(warm + i), bwd(i)) for i in range(total - warm)]
    return out + [(bwd(k),) for k in range(total - warm, total)]


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


def _with_comm(steps: Steps, rank: int, p: int, v: int) -> tuple[Action, ...]:
    """Between two steps: the sends of the step before, then the receives of the step after."""
    out: list[Action] = []
    sends: list[Action] = []
    for step in steps:
        out += sends
        for a in step:
            recv = {"F": "RECV_F", "B": "RECV_B"}.get(a.kind)
            if recv and (peer := _expected_peer(recv, a.chunk, rank, p, v)) is not None:
                out.append(Action(recv, a.microbatch, a.chunk, peer))
        out += step
        sends = []
        for a in step:
            send = {"F": "SEND_F", "B": "SEND_B"}.get(a.kind)
            if send and (peer := _expected_peer(send, a.chunk, rank, p, v)) is not None:
                sends.append(Action(send, a.microbatch, a.chunk, peer))
    return tuple(out + sends)


def _expected_peer(kind: str, chunk: int, rank: int, p: int, v: int) -> int | None:
    """Rank on the other side of a send/receive, or None when there is none (end of the
    model, or the neighbouring chunk lives on this very rank)."""
    g = chunk * p + rank
    other = g + 1 if kind in ("SEND_F", "RECV_B") else g - 1
    if not 0 <= other < p * v or other % p == rank:
        return None
    return other % p


def _message(a: Action, rank: int, p: int) -> tuple[str, int, int]:
    """Key of the message a send/receive carries: (direction, micro-batch, producing global chunk)."""
    g = a.chunk * p + rank
    src = {"SEND_F": g, "RECV_F": g - 1, "SEND_B": g, "RECV_B": g + 1}[a.kind]
    return (a.kind[-1], a.microbatch, src)


# ---------------------------------------------------------------------------- verify


def check(actions: Actions) -> None:
    """:func:`verify`, raising :class:`ScheduleError` with every problem when there are any."""
    problems = verify(actions)
    if problems:
        shown = problems[:12] + ([f"… and {len(problems) - 12} more"] if len(problems) > 12 else [])
        raise ScheduleError("\n".join(shown), tuple(problems))


def verify(actions: Actions) -> list[str]:
    """Deadlock-freedom proof. Returns [] if fine, else human-readable problems.

    Builds a networkx DiGraph whose edges mean "must finish before": program order on each
    rank (a batch of consecutive comm actions is posted together and completes together),
    each send ↔ its receive as a rendezvous (each completes only once the other side's batch
    is posted), data dependencies F(mb, g) → F(mb, g+1), B(mb, g+1) → B(mb, g), F → B → W of
    one micro-batch and chunk, receive → consumer and producer → send. The schedule cannot
    deadlock iff the graph is acyclic; a cycle is reported with its ranks, actions and
    micro-batches. Also checked: every F/B (and W, if any) runs exactly once per micro-batch
    and chunk on every rank, every send has exactly one receive of the same kind, peers are the
    ranks that hold the neighbouring chunk, and two ranks post their messages in the same order."""
    p = len(actions)
    if p == 0:
        return ["the schedule has no pipeline ranks"]
    every = [(r, i, a) for r, acts in enumerate(actions) for i, a in enumerate(acts)]
    v = 1 + max((a.chunk for _, _, a in every), default=0)
    m = 1 + max((a.microbatch for _, _, a in every), default=-1)
    problems: list[str] = []
    valid: list[tuple[int, int, Action]] = []
    for r, i, a in every:
        problem = _malformed(a, r, p, v)
        if problem:
            problems.append(f"{_at(r, i, a)}: {problem}")
        if a.kind in KINDS and a.microbatch >= 0 and a.chunk >= 0:
            valid.append((r, i, a))

    first: dict[tuple[int, str, int, int], int] = {}  # (rank, kind, mb, chunk) -> first index
    problems += _coverage(actions, valid, p, m, v, first)
    pairs, channel_problems = _pair(actions, valid, p, m, v, first)
    problems += channel_problems

    graph, batch_of = _program_graph(actions)
    for (r, i), (q, j) in pairs:
        graph.add_edge(batch_of[(q, j)], (r, i))
        graph.add_edge(batch_of[(r, i)], (q, j))
    _add_data_edges(graph, valid, first, p, m, v)
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        return problems
    return problems + [_describe_cycle([u for u, _ in cycle], actions)]


def _at(r: int, i: int, a: Action) -> str:
    return f"rank {r} action #{i} ({a.describe()})"


def _malformed(a: Action, r: int, p: int, v: int) -> str | None:
    if a.kind not in KINDS:
        return f"unknown kind {a.kind!r}; expected one of {', '.join(KINDS)}"
    if a.microbatch < 0 or a.chunk < 0:
        return "micro-batch and chunk must be ≥ 0"
    if a.kind in COMPUTE:
        return None if a.peer is None else f"a {a.kind} computation has no peer (got {a.peer})"
    g = a.chunk * p + r
    expected = _expected_peer(a.kind, a.chunk, r, p, v)
    if expected is None:
        where = "the last" if a.kind in ("SEND_F", "RECV_B") else "the first"
        if 0 < g < p * v - 1:
            where = "next to a chunk on the same rank"
        return f"global chunk {g} is {where} chunk of {p * v}: there is nothing to {a.kind.split('_')[0].lower()}"
    if a.peer != expected:
        other = g + 1 if a.kind in ("SEND_F", "RECV_B") else g - 1
        return f"wrong peer: global chunk {other} lives on rank {expected}, not rank {a.peer}"
    return None


def _ranges(xs: list[int]) -> str:
    out, start = [], None
    for k, x in enumerate(xs):
        if start is None:
            start = x
        if k + 1 == len(xs) or xs[k + 1] != x + 1:
            out.append(str(start) if start == x else f"{start}–{x}")
            start = None
    return ", ".join(out)


def _coverage(actions, valid, p, m, v, first) -> list[str]:
    """Every rank runs F and B (and W, when the schedule splits the backward) exactly once
    per micro-batch and local chunk, in the order F, B, W."""
    seen: dict[tuple[int, str, int, int], list[int]] = defaultdict(list)
    for r, i, a in valid:
        if a.kind in COMPUTE:
            seen[(r, a.kind, a.microbatch, a.chunk)].append(i)
    for key, idx in seen.items():
        first[key] = idx[0]
    kinds = COMPUTE if any(k[1] == "W" for k in seen) else ("F", "B")
    problems = []
    for r in range(p):
        for c in range(v):
            for kind in kinds:
                missing = [mb for mb in range(m) if (r, kind, mb, c) not in seen]
                if missing:
                    problems.append(f"rank {r} never runs {kind} for micro-batch {_ranges(missing)} of chunk {c}")
            for mb in range(m):
                for kind in kinds:
                    idx = seen.get((r, kind, mb, c), [])
                    if len(idx) > 1:
                        problems.append(f"rank {r} runs {kind} mb {mb} chunk {c} {len(idx)} times (actions {', '.join(f'#{i}' for i in idx)})")
                for before, after in zip(kinds, kinds[1:]):
                    i, j = first.get((r, before, mb, c)), first.get((r, after, mb, c))
                    if i is not None and j is not None and j < i:
                        problems.append(f"rank {r} runs {after} mb {mb} chunk {c} (#{j}) before its {before} (#{i})")
    return problems


def _pair(actions, valid, p, m, v, first):
    """Match sends to receives by message; check one-to-one, kinds, and posting order."""
    sends: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    recvs: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for r, i, a in valid:
        if a.is_comm and _expected_peer(a.kind, a.chunk, r, p, v) is not None:
            (sends if a.kind.startswith("SEND") else recvs)[_message(a, r, p)].append((r, i))
    problems, pairs = [], []
    for key in sorted(set(sends) | set(recvs)):
        ss, rs = sends.get(key, []), recvs.get(key, [])
        if len(ss) == 1 and len(rs) == 1:
            pairs.append((ss[0], rs[0]))
        for group, verb in ((ss, "sent"), (rs, "received")):
            if len(group) > 1:
                where = ", ".join(f"rank {r} #{i}" for r, i in group)
                problems.append(f"message {_key_text(key)} is {verb} {len(group)} times ({where}); each must be {verb} exactly once")
        if ss and not rs:
            r, i = ss[0]
            a = actions[r][i]
            problems.append(f"{_at(r, i, a)} has no matching RECV_{a.kind[-1]} on rank {a.peer}" + _kind_hint(actions, a, r))
        if rs and not ss:
            q, j = rs[0]
            a = actions[q][j]
            problems.append(f"{_at(q, j, a)} waits for a message that rank {a.peer} never sends" + _kind_hint(actions, a, q))
    for mb in range(m):  # boundaries that no send and no receive carries at all
        for g in range(p * v - 1):
            a, b = (g % p, g // p), ((g + 1) % p, (g + 1) // p)
            if a[0] == b[0]:
                continue
            for d, src, dst, kind in (("F", a, b, "F"), ("B", b, a, "B")):
                key = (d, mb, src[1] * p + src[0])
                if key not in sends and key not in recvs and (src[0], kind, mb, src[1]) in first and (dst[0], kind, mb, dst[1]) in first:
                    problems.append(f"micro-batch {mb} never crosses from rank {src[0]} to rank {dst[0]}: no SEND_{d}/RECV_{d} carries {_key_text(key)}")
    return pairs, problems + _order_problems(actions, valid, p, sends, recvs)


def _key_text(key: tuple[str, int, int]) -> str:
    d, mb, g = key
    what = "activation" if d == "F" else "gradient"
    return f"{what} of mb {mb} from global chunk {g} to {g + 1 if d == 'F' else g - 1}"


def _kind_hint(actions: Actions, a: Action, r: int) -> str:
    """Name a counterpart of the wrong kind on the peer (activations and gradients share a shape)."""
    want = ("RECV_" if a.kind.startswith("SEND") else "SEND_") + ("B" if a.kind.endswith("F") else "F")
    if a.peer is None or not 0 <= a.peer < len(actions):
        return ""
    for j, b in enumerate(actions[a.peer]):
        if b.kind == want and b.microbatch == a.microbatch and b.peer == r:
            return f" — kind mismatch: rank {a.peer} has {b.describe()} at #{j}"
    return ""


def _order_problems(actions, valid, p, sends, recvs) -> list[str]:
    """p2p between two ranks matches in posting order: both sides must list the same messages in the same order."""
    out_of: dict[tuple[int, int], list[tuple[tuple, int]]] = defaultdict(list)
    into: dict[tuple[int, int], list[tuple[tuple, int]]] = defaultdict(list)
    for r, i, a in valid:
        if a.is_comm and a.peer is not None:
            if a.kind.startswith("SEND"):
                out_of[(r, a.peer)].append((_message(a, r, p), i))
            else:
                into[(a.peer, r)].append((_message(a, r, p), i))
    problems = []
    for (r, q) in sorted(set(out_of) | set(into)):
        sent, got = out_of.get((r, q), []), into.get((r, q), [])
        if sorted(k for k, _ in sent) != sorted(k for k, _ in got):
            continue  # pairing problems are reported already
        for (ks, i), (kr, j) in zip(sent, got):
            if ks != kr:
                problems.append(
                    f"rank {q} receives from rank {r} in a different order than rank {r} sends: rank {r}'s next send is "
                    f"{actions[r][i].describe()} (#{i}) but rank {q} posts {actions[q][j].describe()} (#{j}); p2p between "
                    f"two ranks matches in posting order, not by micro-batch, so rank {q} would get the wrong tensor")
                break
    return problems


def _program_graph(actions: Actions):
    """Program order; a run of comm actions is one batch: a post node, then its ops."""
    graph = nx.DiGraph()
    batch_of: dict[tuple[int, int], tuple] = {}
    for r, acts in enumerate(actions):
        prev: list = []
        i = 0
        while i < len(acts):
            if acts[i].is_comm:
                j = i
                while j < len(acts) and acts[j].is_comm:
                    j += 1
                post = ("post", r, i)
                graph.add_edges_from((u, post) for u in prev)
                for k in range(i, j):
                    graph.add_edge(post, (r, k))
                    batch_of[(r, k)] = post
                prev, i = [(r, k) for k in range(i, j)], j
            else:
                graph.add_node((r, i))
                graph.add_edges_from((u, (r, i)) for u in prev)
                prev, i = [(r, i)], i + 1
    return graph, batch_of


def _add_data_edges(graph, valid, first, p, m, v) -> None:
    def node(g: int, kind: str, mb: int):
        i = first.get((g % p, kind, mb, g // p))
        return None if i is None else (g % p, i)

    for mb in range(m):
        for g in range(p * v):
            f, b, w = node(g, "F", mb), node(g, "B", mb), node(g, "W", mb)
            nf, nb = (node(g + 1, "F", mb), node(g + 1, "B", mb)) if g + 1 < p * v else (None, None)
            for u, x in ((f, nf), (nb, b), (f, b), (b, w)):
                if u is not None and x is not None:
                    graph.add_edge(u, x)
    for r, i, a in valid:
        if a.is_comm:
            compute = first.get((r, a.kind[-1], a.microbatch, a.chunk))
            if compute is not None:
                graph.add_edge(*(((r, i), (r, compute)) if a.kind.startswith("RECV") else ((r, compute), (r, i))))


def _describe_cycle(nodes: list, actions: Actions) -> str:
    """'deadlock: ... rank 0 [..] → rank 1 [..] → back to rank 0', each run of one rank compressed."""
    runs: list[tuple[int, list[str]]] = []
    mbs: set[int] = set()
    for n in nodes:
        r = n[1] if n[0] == "post" else n[0]
        if n[0] == "post":
            text = f"post batch at #{n[2]}"
        else:
            a = actions[r][n[1]]
            mbs.add(a.microbatch)
            text = f"{a.describe()} (#{n[1]})"
        if runs and runs[-1][0] == r:
            runs[-1][1].append(text)
        else:
            runs.append((r, [text]))
    if len(runs) > 1 and runs[0][0] == runs[-1][0]:
        r, last = runs.pop()
        runs[0] = (r, last + runs[0][1])
    parts = []
    for r, texts in runs:
        shown = texts if len(texts) <= 4 else texts[:2] + [f"… {len(texts) - 3} more …", texts[-1]]
        parts.append(f"rank {r} [{', '.join(shown)}]")
    ranks = sorted({r for r, _ in runs})
    return (f"deadlock: cycle through rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} "
            f"(micro-batches {', '.join(map(str, sorted(mbs)))}); each step must finish before the next can start: "
            + " → ".join(parts) + f" → back to rank {runs[0][0]}")


# ---------------------------------------------------------------------------- simulate


@dataclass(frozen=True)
class Simulation:
    """Timed run of a schedule.

    ``bubble_fraction`` follows Narayanan et al. (SC21 §2.2): bubble time over ideal time,
    Σ_r (makespan − compute_r) / Σ_r compute_r, where compute_r is the time rank r spends in
    F/B/W (communication counts as bubble). With equal work per rank this is
    (makespan − ideal) / ideal: (p−1)/m for gpipe and 1f1b, (p−1)/(v·m) interleaved. Note this
    is not the idle share of the makespan; that is :attr:`idle_fraction`."""

    bubble_fraction: float
    makespan: float  # seconds, or whatever unit the costs were given in
    peak_inflight: tuple[int, ...]  # per rank: max (micro-batch, chunk) activations held — see simulate
    timeline: tuple[tuple[int, Action, float, float], ...]  # (rank, action, start, end), rank-major, program order

    @property
    def idle_fraction(self) -> float:
        """Idle compute time / (pp · makespan) = b / (1 + b); (p−1)/(m+p−1) for 1f1b."""
        return self.bubble_fraction / (1 + self.bubble_fraction)


def simulate(actions: Actions, t_f: float, t_b: float, t_w: float = 0.0, t_comm: float = 0.0) -> Simulation:
    """Event simulation of the action lists.

    t_f, t_b: forward/backward time of ONE chunk for one micro-batch (for zb_h1, t_b is
    backward-for-inputs and t_w the weight part; for the other schedules B covers both: pass
    t_b as the full backward). t_comm: p2p time per send. A rank runs its list in order; a
    send occupies its rank for t_comm; a receive starts when the rank reaches it and ends
    when the matching send has completed (at once if it already has).

    ``peak_inflight[r]`` counts (micro-batch, local chunk) pairs whose F has run and whose
    backward has not — the backward ends at W when the schedule has W passes (activations are
    needed until the weight gradient), at B otherwise. With v = 1 that is micro-batches.

    Raises ScheduleError naming the stuck ranks when the lists cannot finish."""
    p = len(actions)
    cost = {"F": t_f, "B": t_b, "W": t_w}
    clock, pos = [0.0] * p, [0] * p
    done: dict[tuple, float] = {}
    waiting: dict[tuple, list[int]] = defaultdict(list)
    rows: list[list[tuple[int, Action, float, float]]] = [[] for _ in range(p)]
    ready = deque(range(p))
    while ready:
        r = ready.popleft()
        acts = actions[r]
        while pos[r] < len(acts):
            a, start = acts[pos[r]], clock[r]
            if a.kind in ("SEND_F", "SEND_B"):
                end = start + t_comm
                key = _message(a, r, p)
                done.setdefault(key, end)
                ready.extend(waiting.pop(key, []))
            elif a.kind in ("RECV_F", "RECV_B"):
                key = _message(a, r, p)
                if key not in done:
                    waiting[key].append(r)
                    break
                end = max(start, done[key])
            elif a.kind in cost:
                end = start + cost[a.kind]
            else:
                raise ScheduleError(f"{_at(r, pos[r], a)}: unknown kind {a.kind!r}")
            rows[r].append((r, a, start, end))
            clock[r], pos[r] = end, pos[r] + 1
    stuck = [f"{_at(r, pos[r], actions[r][pos[r]])} waits forever" for r in range(p) if pos[r] < len(actions[r])]
    if stuck:
        raise ScheduleError("deadlock in simulation: " + "; ".join(stuck), tuple(stuck))
    timeline = tuple(row for rank_rows in rows for row in rank_rows)
    makespan = max((end for *_, end in timeline), default=0.0)
    busy = sum(end - start for _, a, start, end in timeline if a.kind in COMPUTE)
    bubble = (p * makespan - busy) / busy if busy > 0 else 0.0
    return Simulation(bubble, makespan, _peak_inflight(actions), timeline)


def _peak_inflight(actions: Actions) -> tuple[int, ...]:
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
