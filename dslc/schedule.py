"""Pipeline schedules as data: build each rank's action list, prove it deadlock-free, simulate it.

The model is cut into ``pp·v`` chunks in layer order (v = virtual stages per rank). Global chunk
``g`` lives on pipeline rank ``g % pp`` as its local chunk ``g // pp`` (the interleaved placement
of Narayanan et al., SC21, §2.2.2), so local chunk ``c`` of rank ``r`` is global ``c·pp + r``.

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

Ordering contract: the generated runtime executes the lists literally.

1. A rank runs its list top to bottom. F, B, W compute local chunk ``chunk`` of ``microbatch``.
2. ``chunk`` of a send/receive is the local chunk on the rank that holds the action.
   ``SEND_F(mb, c, q)`` sends the output of this rank's ``F(mb, c)`` to rank q (holder of global
   chunk c·pp+r+1); ``RECV_F(mb, c, q)`` receives the input of ``F(mb, c)``; ``SEND_B(mb, c, q)``
   sends the input gradient made by ``B(mb, c)`` to the holder of global chunk c·pp+r−1;
   ``RECV_B(mb, c, q)`` receives the output gradient that ``B(mb, c)`` needs.
3. Computes come in steps; between two steps sit the sends of the step before, then the
   receives of the step after. A step is one compute, except in the interleaved steady state,
   where it is the pair F, B followed by one batch {SEND_F, SEND_B, RECV_F, RECV_B} (Megatron's
   ``send_forward_backward_recv_forward_backward``). Sending F's output right after F instead
   deadlocks under rendezvous p2p (p = 2, v = 2, m = 4 already).
4. A maximal run of consecutive comm actions is ONE batch: one ``P2POp`` per action in list
   order, posted by a single ``torch.distributed.batch_isend_irecv``; wait for all of its
   requests before the next compute. In the 1F1B steady state, rank r's batch {SEND_F → r+1,
   RECV_B ← r+1} meets rank r+1's batch {SEND_B → r, RECV_F ← r}.
5. Between two ranks, messages match in posting order (NCCL, and gloo with one tag, do not
   match by micro-batch): the k-th send from r to q is the k-th receive on q from r. Activations
   and gradients have the same shape (micro_batch, seq, hidden), so a mix-up would not fail
   loudly; :func:`verify` checks that both sides list the same messages in the same order.

:func:`verify` proves deadlock-freedom under the strictest p2p semantics (rendezvous: a send
completes only once its receive is posted; a batch completes when all its operations have).
:func:`simulate` times the lists with eager sends: a send occupies its rank for ``t_comm``, a
receive blocks until the matching send has completed.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass
from itertools import pairwise

import networkx as nx

from .ir import SCHEDULES

COMPUTE = ("F", "B", "W")
COMM = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
KINDS = COMPUTE + COMM

__all__ = [
    "SCHEDULES", "Action", "ScheduleError", "Simulation", "build", "check", "message", "simulate",
    "verify",
]


@dataclass(frozen=True)
class Action:
    """One step of one pipeline rank; the module docstring states the contract."""

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
Steps = list[tuple[Action, ...]]  # a rank's computes, grouped; one p2p batch between steps


class ScheduleError(Exception):
    """A schedule that cannot run; ``.message`` names the cycle (ranks, actions, micro-batches)."""

    def __init__(self, message: str, problems: tuple[str, ...] = ()):
        super().__init__(message)
        self.message = message
        self.problems = problems or (message,)


# ---------------------------------------------------------------------------- build


def build(schedule: str, pp: int, microbatches: int, virtual_stages: int = 1) -> Actions:
    """One ordered action list per pipeline rank (index = pp rank).

    Raises ValueError naming the numbers: 1f1b and zb_h1 need microbatches ≥ pp,
    interleaved_1f1b needs microbatches % pp == 0; only interleaved_1f1b takes v > 1."""
    p, m, v = pp, microbatches, virtual_stages
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}")
    if p < 1 or m < 1 or v < 1:
        raise ValueError(
            f"pp, microbatches and virtual_stages must be ≥ 1 (got {p}, {m}, {v})")
    if v > 1 and schedule != "interleaved_1f1b":
        raise ValueError(f"virtual_stages={v} needs schedule interleaved_1f1b, not {schedule}")
    if schedule in ("1f1b", "zb_h1") and m < p:
        raise ValueError(f"{schedule} needs microbatches ≥ pp, got microbatches={m} < pp={p}")
    if schedule == "interleaved_1f1b" and m % p:
        raise ValueError(f"interleaved_1f1b needs microbatches divisible by pp, got "
                         f"microbatches={m}, pp={p} (remainder {m % p})")
    order = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "interleaved_1f1b": _interleaved,
             "zb_h1": _zb_h1}[schedule]
    return tuple(_with_comm(order(p, m, v, r), r, p, v) for r in range(p))


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


def _with_comm(steps: Steps, rank: int, p: int, v: int) -> tuple[Action, ...]:
    """Between two steps: the sends of the step before, then the receives of the step after."""

    def comm(prefix: str, step: tuple[Action, ...]) -> list[Action]:
        out = []
        for a in step:
            kind = prefix + a.kind
            peer = _expected_peer(kind, a.chunk, rank, p, v) if a.kind in ("F", "B") else None
            if peer is not None:
                out.append(Action(kind, a.microbatch, a.chunk, peer))
        return out

    out: list[Action] = []
    for before, step in zip([()] + steps, steps):
        out += comm("SEND_", before) + comm("RECV_", step) + list(step)
    return tuple(out + comm("SEND_", steps[-1] if steps else ()))


def _expected_peer(kind: str, chunk: int, rank: int, p: int, v: int) -> int | None:
    """Rank on the other side of a send/receive; None at either end of the model, or when the
    neighbouring chunk lives on this very rank (pp = 1)."""
    g = chunk * p + rank
    other = g + 1 if kind in ("SEND_F", "RECV_B") else g - 1
    return None if not 0 <= other < p * v or other % p == rank else other % p


def message(a: Action, rank: int, p: int) -> tuple[str, int, int]:
    """What a send/receive on ``rank`` carries: (F|B, micro-batch, producing global chunk).
    A send and a receive belong together iff their messages are equal."""
    g = a.chunk * p + rank
    return (a.kind[-1], a.microbatch, g - 1 if a.kind == "RECV_F" else
            g + 1 if a.kind == "RECV_B" else g)


# ---------------------------------------------------------------------------- verify


def check(actions: Actions) -> None:
    """:func:`verify`, raising :class:`ScheduleError` with every problem found."""
    problems = verify(actions)
    if problems:
        shown = problems[:12] + [f"… and {len(problems) - 12} more"] * (len(problems) > 12)
        raise ScheduleError("\n".join(shown), tuple(problems))


def verify(actions: Actions) -> list[str]:
    """Deadlock-freedom proof. Returns [] if fine, else human-readable problems.

    Builds a networkx DiGraph whose edges mean "must finish before": program order on each rank
    (a run of comm actions is one batch, posted together, complete when all its operations are),
    each send ↔ its receive as a rendezvous (either completes only once the other side's batch
    is posted), data dependencies F(mb, g) → F(mb, g+1), B(mb, g+1) → B(mb, g), F → B → W of a
    micro-batch and chunk, receive → its consumer and producer → its send. No deadlock iff the
    graph is acyclic; a cycle is reported with its ranks, actions and micro-batches. Also checks
    that F and B (and W, if any) run once per micro-batch and chunk on every rank, every send has
    exactly one receive of the same kind, peers hold the neighbouring chunk, and two ranks list
    their messages to each other in the same order."""
    p = len(actions)
    if p == 0:
        return ["the schedule has no pipeline ranks"]
    every = [(r, i, a) for r, acts in enumerate(actions) for i, a in enumerate(acts)]
    v = 1 + max((a.chunk for *_, a in every), default=0)
    m = 1 + max((a.microbatch for *_, a in every), default=-1)
    problems: list[str] = []
    valid = []
    for r, i, a in every:
        if problem := _malformed(a, r, p, v):
            problems.append(f"{_at(r, i, a)}: {problem}")
        if a.kind in KINDS and a.microbatch >= 0 and a.chunk >= 0:
            valid.append((r, i, a))
    first: dict[tuple[int, str, int, int], int] = {}  # (rank, kind, mb, chunk) -> first index
    problems += _coverage(valid, p, m, v, first)
    pairs, pair_problems = _pair(actions, valid, p, m, v, first)
    problems += pair_problems + _order_problems(actions, valid, p)

    graph, batch_of = _program_graph(actions)
    for s, t in pairs:
        graph.add_edge(batch_of[t], s, why="p2p")
        graph.add_edge(batch_of[s], t, why="p2p")
    _add_data_edges(graph, valid, first, p, m, v)
    if nx.is_directed_acyclic_graph(graph):
        return problems
    # find_cycle's edge DFS is slow on the whole graph: search one strongly connected component
    component = next(c for c in nx.strongly_connected_components(graph) if len(c) > 1)
    return problems + [_describe_cycle(nx.find_cycle(graph.subgraph(component)), graph, actions)]


def _at(r: int, i: int, a: Action) -> str:
    return f"rank {r} action #{i} ({a.describe()})"


def _malformed(a: Action, r: int, p: int, v: int) -> str | None:
    if a.kind not in KINDS:
        return f"unknown kind {a.kind!r}; expected one of {', '.join(KINDS)}"
    if a.microbatch < 0 or a.chunk < 0:
        return "micro-batch and chunk must be ≥ 0"
    if a.kind in COMPUTE:
        return None if a.peer is None else f"a {a.kind} computation has no peer (got {a.peer})"
    g, expected = a.chunk * p + r, _expected_peer(a.kind, a.chunk, r, p, v)
    other = g + 1 if a.kind in ("SEND_F", "RECV_B") else g - 1
    if expected is None:
        where = "outside the model" if not 0 <= other < p * v else "on the same rank"
        return f"global chunk {g}'s neighbour {other} is {where}: nothing to send or receive"
    if a.peer != expected:
        return f"wrong peer: global chunk {other} lives on rank {expected}, not rank {a.peer}"
    return None


def _ranges(xs: list[int]) -> str:
    out = []
    for k, x in enumerate(xs):
        if k == 0 or xs[k - 1] != x - 1:
            out.append([x, x])
        out[-1][1] = x
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in out)


def _coverage(valid, p: int, m: int, v: int, first: dict) -> list[str]:
    """Every rank runs F and B (and W, when the backward is split) once per micro-batch and
    local chunk, in the order F, B, W."""
    seen: dict[tuple[int, str, int, int], list[int]] = defaultdict(list)
    for r, i, a in valid:
        if a.kind in COMPUTE:
            seen[(r, a.kind, a.microbatch, a.chunk)].append(i)
    first.update((key, idx[0]) for key, idx in seen.items())
    kinds = COMPUTE if any(key[1] == "W" for key in seen) else ("F", "B")
    problems = []
    for r in range(p):
        for c in range(v):
            for kind in kinds:
                if missing := [mb for mb in range(m) if (r, kind, mb, c) not in seen]:
                    problems.append(f"rank {r} never runs {kind} for micro-batch "
                                    f"{_ranges(missing)} of chunk {c}")
            for mb in range(m):
                for kind in kinds:
                    if len(idx := seen.get((r, kind, mb, c), [])) > 1:
                        problems.append(f"rank {r} runs {kind} mb {mb} chunk {c} {len(idx)} times "
                                        f"(actions {', '.join(f'#{i}' for i in idx)})")
                for before, after in pairwise(kinds):
                    i, j = first.get((r, before, mb, c), -1), first.get((r, after, mb, c), -1)
                    if 0 <= j < i:
                        problems.append(f"rank {r} runs {after} mb {mb} chunk {c} (#{j}) "
                                        f"before its {before} (#{i})")
    return problems


def _pair(actions: Actions, valid, p: int, m: int, v: int, first: dict):
    """Match each send to its receive by message: one-to-one, same kind, nothing missing."""
    sends: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    recvs: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for r, i, a in valid:
        if a.is_comm and _expected_peer(a.kind, a.chunk, r, p, v) is not None:
            (sends if a.kind.startswith("SEND") else recvs)[message(a, r, p)].append((r, i))
    problems, pairs = [], []
    for key in sorted(set(sends) | set(recvs)):
        ss, rs = sends.get(key, []), recvs.get(key, [])
        if len(ss) == 1 and len(rs) == 1:
            pairs.append((ss[0], rs[0]))
        for group, verb in ((ss, "sent"), (rs, "received")):
            if len(group) > 1:
                where = ", ".join(f"rank {r} #{i}" for r, i in group)
                problems.append(f"message {_key_text(key)} is {verb} {len(group)} times ({where}); "
                                f"each must be {verb} exactly once")
        if ss and not rs:
            (r, i), a = ss[0], actions[ss[0][0]][ss[0][1]]
            problems.append(f"{_at(r, i, a)} has no matching RECV_{a.kind[-1]} on rank {a.peer}"
                            + _kind_hint(actions, a, r))
        if rs and not ss:
            (q, j), a = rs[0], actions[rs[0][0]][rs[0][1]]
            problems.append(f"{_at(q, j, a)} waits for a message that rank {a.peer} never sends"
                            + _kind_hint(actions, a, q))
    for mb in range(m):  # boundaries that no send and no receive carries at all
        for g in range(p * v - 1):
            if g % p == (g + 1) % p:
                continue
            for d, src, dst in (("F", g, g + 1), ("B", g + 1, g)):
                key = (d, mb, src)
                ends = [(x % p, d, mb, x // p) in first for x in (src, dst)]
                if key not in sends and key not in recvs and all(ends):
                    problems.append(f"micro-batch {mb} never crosses from rank {src % p} to rank "
                                    f"{dst % p}: no SEND_{d}/RECV_{d} carries {_key_text(key)}")
    return pairs, problems


def _key_text(key: tuple[str, int, int]) -> str:
    d, mb, g = key
    return (f"{'activation' if d == 'F' else 'gradient'} of mb {mb} from global chunk {g} "
            f"to {g + 1 if d == 'F' else g - 1}")


def _kind_hint(actions: Actions, a: Action, r: int) -> str:
    """Name a counterpart of the other kind on the peer (activations and gradients share a
    shape, so the runtime would not notice the mix-up)."""
    want = ("RECV_" if a.kind.startswith("SEND") else "SEND_") + "FB"[a.kind.endswith("F")]
    if a.peer is None or not 0 <= a.peer < len(actions):
        return ""
    for j, b in enumerate(actions[a.peer]):
        if b.kind == want and b.microbatch == a.microbatch and b.peer == r:
            return f"; kind mismatch: rank {a.peer} has {b.describe()} at #{j}"
    return ""


def _order_problems(actions: Actions, valid, p: int) -> list[str]:
    """p2p between two ranks matches in posting order: both sides must list the same messages
    in the same order."""
    sent: dict[tuple[int, int], list[tuple[tuple, int]]] = defaultdict(list)
    got: dict[tuple[int, int], list[tuple[tuple, int]]] = defaultdict(list)
    for r, i, a in valid:
        if a.is_comm and a.peer is not None:
            is_send = a.kind.startswith("SEND")
            channel = (r, a.peer) if is_send else (a.peer, r)
            (sent if is_send else got)[channel].append((message(a, r, p), i))
    problems = []
    for r, q in sorted(set(sent) & set(got)):
        out, into = sent[(r, q)], got[(r, q)]
        if sorted(k for k, _ in out) != sorted(k for k, _ in into):
            continue  # the pairing problems are reported already
        for (ks, i), (kr, j) in zip(out, into):
            if ks != kr:
                problems.append(
                    f"rank {q} receives from rank {r} in a different order than rank {r} sends: "
                    f"rank {r}'s next send is {actions[r][i].describe()} (#{i}) but rank {q} posts "
                    f"{actions[q][j].describe()} (#{j}); p2p between two ranks matches in posting "
                    f"order, not by micro-batch, so rank {q} would get the wrong tensor")
                break
    return problems


def _program_graph(actions: Actions) -> tuple[nx.DiGraph, dict]:
    """Program order; a run of comm actions is one batch: a post node, then its operations."""
    graph, batch_of = nx.DiGraph(), {}
    for r, acts in enumerate(actions):
        prev: list = []
        i = 0
        while i < len(acts):
            j = i + 1
            if acts[i].is_comm:
                while j < len(acts) and acts[j].is_comm:
                    j += 1
                post = ("post", r, i)
                graph.add_edges_from(((u, post) for u in prev), why="order")
                graph.add_edges_from(((post, (r, k)) for k in range(i, j)), why="order")
                batch_of.update(((r, k), post) for k in range(i, j))
            else:
                graph.add_node((r, i))
                graph.add_edges_from(((u, (r, i)) for u in prev), why="order")
            prev, i = [(r, k) for k in range(i, j)], j
    return graph, batch_of


def _add_data_edges(graph: nx.DiGraph, valid, first: dict, p: int, m: int, v: int) -> None:
    def edge(u, x) -> None:
        if u is not None and x is not None and not graph.has_edge(u, x):
            graph.add_edge(u, x, why="data")

    def node(g: int, kind: str, mb: int):
        i = first.get((g % p, kind, mb, g // p)) if g < p * v else None
        return None if i is None else (g % p, i)

    for mb in range(m):
        for g in range(p * v):
            f, b = node(g, "F", mb), node(g, "B", mb)
            edge(f, node(g + 1, "F", mb)), edge(node(g + 1, "B", mb), b)
            edge(f, b), edge(b, node(g, "W", mb))
    for r, i, a in valid:
        if a.is_comm and (c := first.get((r, a.kind[-1], a.microbatch, a.chunk))) is not None:
            edge(*(((r, i), (r, c)) if a.kind.startswith("RECV") else ((r, c), (r, i))))


def _describe_cycle(cycle: list, graph: nx.DiGraph, actions: Actions) -> str:
    """'deadlock: … rank 0 [a, b] → rank 1 [c, d] → back to rank 0', one run per rank, long
    runs shortened; a data dependency against program order is spelled out."""

    def text(n) -> str:
        return f"post batch at #{n[2]}" if n[0] == "post" else \
            f"{actions[n[0]][n[1]].describe()} (#{n[1]})"

    runs: list[tuple[int, list[str]]] = []
    mbs: set[int] = set()
    for u, x in cycle:
        r = u[1] if u[0] == "post" else u[0]
        item = text(u)
        if u[0] != "post":
            mbs.add(actions[r][u[1]].microbatch)
            if graph.edges[u, x]["why"] == "data" and x[0] == r and x[1] < u[1]:
                item += f" ⇠ needed by {text(x)} earlier in rank {r}'s list"
        if runs and runs[-1][0] == r:
            runs[-1][1].append(item)
        else:
            runs.append((r, [item]))
    if len(runs) > 1 and runs[0][0] == runs[-1][0]:
        r, last = runs.pop()
        runs[0] = (r, last + runs[0][1])
    short = [xs if len(xs) <= 4 else [*xs[:2], f"… {len(xs) - 3} more …", xs[-1]] for _, xs in runs]
    parts = [f"rank {r} [{', '.join(xs)}]" for (r, _), xs in zip(runs, short)]
    ranks = sorted({r for r, _ in runs})
    return (f"deadlock: cycle through rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))} "
            f"(micro-batch{'es' * (len(mbs) > 1)} {', '.join(map(str, sorted(mbs)))}); each step "
            f"must finish before the next can start: {' → '.join(parts)} "
            f"→ back to rank {runs[0][0]}")


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


def simulate(actions: Actions, t_f: float, t_b: float, t_w: float = 0.0,
             t_comm: float = 0.0) -> Simulation:
    """Event simulation of the action lists.

    t_f, t_b: forward/backward time of ONE chunk for one micro-batch (for zb_h1, t_b is
    backward-for-inputs and t_w the weight part; for the other schedules B covers both: pass t_b
    as the full backward). t_comm: p2p time per send. A rank runs its list in order; a send
    occupies it for t_comm; a receive starts when the rank reaches it and ends when the matching
    send has completed. The timeline holds every action, rank by rank in program order.

    ``peak_inflight[r]``: the most (micro-batch, local chunk) pairs whose F has run and whose
    backward has not finished on rank r; the backward finishes at W when the schedule has W
    passes (activations are kept for the weight gradient), else at B. With v = 1: micro-batches.

    Raises ScheduleError naming the stuck ranks when the lists cannot finish."""
    p, cost = len(actions), {"F": t_f, "B": t_b, "W": t_w}
    clock, pos = [0.0] * p, [0] * p
    sent: dict[tuple, float] = {}
    waiting: dict[tuple, list[int]] = defaultdict(list)
    rows: list[list[tuple[int, Action, float, float]]] = [[] for _ in range(p)]
    ready = deque(range(p))
    while ready:
        r = ready.popleft()
        while pos[r] < len(actions[r]):
            a, start = actions[r][pos[r]], clock[r]
            if a.kind in ("SEND_F", "SEND_B"):
                end = start + t_comm
                sent.setdefault(message(a, r, p), end)
                ready.extend(waiting.pop(message(a, r, p), []))
            elif a.kind in ("RECV_F", "RECV_B"):
                if (key := message(a, r, p)) not in sent:
                    waiting[key].append(r)
                    break
                end = max(start, sent[key])
            elif a.kind in cost:
                end = start + cost[a.kind]
            else:
                raise ScheduleError(f"{_at(r, pos[r], a)}: unknown kind {a.kind!r}")
            rows[r].append((r, a, start, end))
            clock[r], pos[r] = end, pos[r] + 1
    if stuck := [f"{_at(r, pos[r], actions[r][pos[r]])} waits forever"
                 for r in range(p) if pos[r] < len(actions[r])]:
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
