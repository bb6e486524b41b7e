"""Deadlock-freedom proof of the pipeline action lists of :func:`dslc.cost.schedule.build`.

The lists follow the ordering contract of :mod:`dslc.cost.schedule` and
:mod:`dslc.cost.messages`. :func:`verify` proves they cannot deadlock as the runtime runs them,
under the strictest p2p semantics (rendezvous: a send completes only once its receive is
posted; a batch completes when all its operations have; a rank's batches complete in the order
it posted them, as on one NCCL stream; a compute waits for the whole batch of a receive it
reads, as on NCCL, and for the sends contract 4 waits for before it), by building a networkx
"must finish before" graph and checking that it is acyclic (gloo, whose messages progress on
their own, adds fewer edges); it also checks that every rank computes each micro-batch and
chunk once, that sends and receives pair up one-to-one, and that two ranks list their
messages to each other in the same order (p2p matches in posting order).
:func:`check` raises :class:`~dslc.cost.schedule.ScheduleError` with every problem found.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise

import networkx as nx

from ..chunks import Placement
from .schedule import (
    COMPUTE,
    KINDS,
    Action,
    Schedule,
    ScheduleError,
    locate,
    message,
    placed,
    send_waits,
    step_of,
)

__all__ = ["check", "verify"]


def check(actions: Schedule, split_backward: bool | None = None) -> None:
    """:func:`verify`, raising :class:`ScheduleError` with every problem found."""
    problems = verify(actions, split_backward)
    if problems:
        shown = problems[:12] + [f"… and {len(problems) - 12} more"] * (len(problems) > 12)
        raise ScheduleError("\n".join(shown), tuple(problems))


def verify(actions: Schedule, split_backward: bool | None = None) -> list[str]:
    """Deadlock-freedom proof. Returns [] if fine, else human-readable problems.

    ``split_backward``: whether every (micro-batch, chunk) must also run W (zb_h1). The
    caller that knows the schedule should say so; None infers it from the presence of any W,
    which cannot notice a list whose only W is missing. Where the chunks live (interleaved, or
    in a V) comes with the lists: the :class:`~dslc.cost.schedule.Schedule`'s placement.

    Builds a networkx DiGraph whose edges mean "must finish before": program order on each rank
    (a run of comm actions is one batch, posted together without waiting; it starts once posted
    and once the rank's batch before it is done, and is done when all its operations are), each
    send ↔ its receive as a rendezvous (either completes only once the other side's batch has
    started), data dependencies F(mb, g) → F(mb, g+1), B(mb, g+1) → B(mb, g), F → B → W of a
    micro-batch and chunk, a receive's batch done → its consumer, a send's batch done → the
    compute that waits for it (:func:`~dslc.cost.messages.send_waits`), producer → its send.
    An overlapped F&B pair (a B marked ``overlaps``) must follow its F with only messages
    between them. No deadlock iff the graph is acyclic; a cycle is reported with its ranks,
    actions and micro-batches. Also checks that F and B (and W, if any) run once per micro-batch
    and chunk on every rank, every send has exactly one receive of the same kind, peers hold the
    neighbouring chunk, and two ranks list their messages to each other in the same order."""
    at = placed(actions).placement
    p, v = at.pp, at.v
    if p == 0:
        return ["the schedule has no pipeline ranks"]
    every = [(r, i, a) for r, acts in enumerate(actions) for i, a in enumerate(acts)]
    m = 1 + max((a.microbatch for *_, a in every), default=-1)
    problems: list[str] = []
    valid = []
    for r, i, a in every:
        if problem := _malformed(a, r, at):
            problems.append(f"{locate(r, i, a)}: {problem}")
        if a.kind in KINDS and a.microbatch >= 0 and 0 <= a.chunk < len(at.ids(r)):
            valid.append((r, i, a))
    first: dict[tuple[int, str, int, int], int] = {}  # (rank, kind, mb, chunk) -> first index
    problems += _coverage(valid, p, m, v, first, split_backward)
    pairs, pair_problems = _pair(actions, valid, m, first, at)
    problems += pair_problems + _order_problems(actions, valid, at)

    problems += _pair_problems(actions)
    graph, batch_of = _program_graph(actions)
    for s, t in pairs:
        graph.add_edge(("start", *batch_of[t][1:]), s, why="p2p")
        graph.add_edge(("start", *batch_of[s][1:]), t, why="p2p")
    _add_data_edges(graph, valid, first, m, at)
    _add_waits(graph, actions, batch_of, first)
    if nx.is_directed_acyclic_graph(graph):
        return problems
    # find_cycle's edge DFS is slow on the whole graph: search one strongly connected component
    # (the same component and start node on every run, whatever the hash seed)
    components = [c for c in nx.strongly_connected_components(graph) if len(c) > 1]
    component = min(components, key=lambda c: min(map(repr, c)))
    start = min(component, key=repr)
    return problems + [_describe_cycle(nx.find_cycle(graph.subgraph(component), source=start), graph, actions)]



def _malformed(a: Action, r: int, at: Placement) -> str | None:
    if a.kind not in KINDS:
        return f"unknown kind {a.kind!r}; expected one of {', '.join(KINDS)}"
    if a.microbatch < 0 or a.chunk < 0:
        return "micro-batch and chunk must be ≥ 0"
    if a.chunk >= len(at.ids(r)):
        return f"rank {r} holds {len(at.ids(r))} chunks, not a chunk {a.chunk}"
    if a.kind in COMPUTE:
        return None if a.peer is None else f"a {a.kind} computation has no peer (got {a.peer})"
    g, expected = at.global_chunk(r, a.chunk), at.peer(r, a.chunk, step_of(a.kind))
    other = g + step_of(a.kind)
    if expected is None:
        where = "outside the model" if at.neighbour(g, step_of(a.kind)) is None else "on the same rank"
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


def _coverage(valid, p: int, m: int, v: int, first: dict, split_backward: bool | None) -> list[str]:
    """Every rank runs F and B (and W, when the backward is split) once per micro-batch and
    local chunk, in the order F, B, W."""
    seen: dict[tuple[int, str, int, int], list[int]] = defaultdict(list)
    for r, i, a in valid:
        if a.kind in COMPUTE:
            seen[(r, a.kind, a.microbatch, a.chunk)].append(i)
    first.update((key, idx[0]) for key, idx in seen.items())
    if split_backward is None:
        split_backward = any(key[1] == "W" for key in seen)
    kinds = COMPUTE if split_backward else ("F", "B")
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


def _pair(actions: Schedule, valid, m: int, first: dict, at: Placement):
    """Match each send to its receive by message: one-to-one, same kind, nothing missing."""
    sends: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    recvs: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for r, i, a in valid:
        if a.is_comm and at.peer(r, a.chunk, step_of(a.kind)) is not None:
            (sends if a.kind.startswith("SEND") else recvs)[message(a, r, at)].append((r, i))
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
            problems.append(f"{locate(r, i, a)} has no matching RECV_{a.kind[-1]} on rank {a.peer}"
                            + _kind_hint(actions, a, r))
        if rs and not ss:
            (q, j), a = rs[0], actions[rs[0][0]][rs[0][1]]
            problems.append(f"{locate(q, j, a)} waits for a message that rank {a.peer} never sends"
                            + _kind_hint(actions, a, q))
    for mb in range(m):  # boundaries that no send and no receive carries at all
        for g in range(at.chunks - 1):
            if at.rank(g) == at.rank(g + 1):
                continue
            for d, src, dst in (("F", g, g + 1), ("B", g + 1, g)):
                key = (d, mb, src)
                ends = [(at.rank(x), d, mb, at.local(x)) in first for x in (src, dst)]
                if key not in sends and key not in recvs and all(ends):
                    problems.append(f"micro-batch {mb} never crosses from rank {at.rank(src)} to rank "
                                    f"{at.rank(dst)}: no SEND_{d}/RECV_{d} carries {_key_text(key)}")
    return pairs, problems


def _key_text(key: tuple[str, int, int]) -> str:
    d, mb, g = key
    return (f"{'activation' if d == 'F' else 'gradient'} of mb {mb} from global chunk {g} "
            f"to {g + 1 if d == 'F' else g - 1}")


def _kind_hint(actions: Schedule, a: Action, r: int) -> str:
    """Name a counterpart of the other kind on the peer (activations and gradients share a
    shape, so the runtime would not notice the mix-up)."""
    want = ("RECV_" if a.kind.startswith("SEND") else "SEND_") + "FB"[a.kind.endswith("F")]
    if a.peer is None or not 0 <= a.peer < len(actions):
        return ""
    for j, b in enumerate(actions[a.peer]):
        if b.kind == want and b.microbatch == a.microbatch and b.peer == r:
            return f"; kind mismatch: rank {a.peer} has {b.describe()} at #{j}"
    return ""


def _order_problems(actions: Schedule, valid, at: Placement) -> list[str]:
    """p2p between two ranks matches in posting order: both sides must list the same messages
    in the same order."""
    sent: dict[tuple[int, int], list[tuple[tuple, int]]] = defaultdict(list)
    got: dict[tuple[int, int], list[tuple[tuple, int]]] = defaultdict(list)
    for r, i, a in valid:
        if a.is_comm and a.peer is not None:
            is_send = a.kind.startswith("SEND")
            channel = (r, a.peer) if is_send else (a.peer, r)
            (sent if is_send else got)[channel].append((message(a, r, at), i))
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


def _pair_problems(actions: Schedule) -> list[str]:
    """An overlapped B follows the F of its pair, with only messages between them."""
    problems = []
    for r, acts in enumerate(actions):
        for i, a in enumerate(acts):
            if not a.overlaps:
                continue
            j = i - 1
            while j >= 0 and acts[j].is_comm:
                j -= 1
            if a.kind != "B" or j < 0 or acts[j].kind != "F":
                problems.append(f"{locate(r, i, a)}: an overlapped pair is an F and a B with only "
                                "messages between them")
    return problems


def _program_graph(actions: Schedule) -> tuple[nx.DiGraph, dict]:
    """Program order; a run of comm actions is one batch: a post node (the rank goes on at
    once), a start node (once posted and once the rank's batch before it is done), its
    operations, and a done node."""
    graph, batch_of = nx.DiGraph(), {}
    for r, acts in enumerate(actions):
        prev, done = None, None
        i = 0
        while i < len(acts):
            j = i + 1
            if acts[i].is_comm:
                while j < len(acts) and acts[j].is_comm:
                    j += 1
                post, start = ("post", r, i), ("start", r, i)
                if prev is not None:
                    graph.add_edge(prev, post, why="order")
                graph.add_edge(post, start, why="order")
                if done is not None:
                    graph.add_edge(done, start, why="stream")
                done = ("done", r, i)
                for k in range(i, j):
                    graph.add_edge(start, (r, k), why="order")
                    graph.add_edge((r, k), done, why="order")
                batch_of.update(((r, k), post) for k in range(i, j))
                prev = post
            else:
                graph.add_node((r, i))
                if prev is not None:
                    graph.add_edge(prev, (r, i), why="order")
                prev = (r, i)
            i = j
    return graph, batch_of


def _add_waits(graph: nx.DiGraph, actions: Schedule, batch_of: dict, first: dict) -> None:
    """The runtime's waits: a receive's whole batch before the compute that reads it (one
    request on NCCL), a send's batch before the compute that contract 4 waits for it at."""
    for r, acts in enumerate(actions):
        for i, at_compute in send_waits(acts).items():
            if at_compute is not None:
                graph.add_edge(("done", *batch_of[(r, i)][1:]), (r, at_compute), why="wait")
        for i, a in enumerate(acts):
            if a.kind.startswith("RECV") and (c := first.get((r, a.kind[-1], a.microbatch, a.chunk))) is not None:
                graph.add_edge(("done", *batch_of[(r, i)][1:]), (r, c), why="wait")


def _add_data_edges(graph: nx.DiGraph, valid, first: dict, m: int, at: Placement) -> None:
    def edge(u, x) -> None:
        if u is not None and x is not None and not graph.has_edge(u, x):
            graph.add_edge(u, x, why="data")

    def node(g: int, kind: str, mb: int):
        if g >= at.chunks:
            return None
        i = first.get((at.rank(g), kind, mb, at.local(g)))
        return None if i is None else (at.rank(g), i)

    for mb in range(m):
        for g in range(at.chunks):
            f, b = node(g, "F", mb), node(g, "B", mb)
            edge(f, node(g + 1, "F", mb)), edge(node(g + 1, "B", mb), b)
            edge(f, b), edge(b, node(g, "W", mb))
    for r, i, a in valid:
        if a.kind.startswith("SEND") and (c := first.get((r, a.kind[-1], a.microbatch, a.chunk))) is not None:
            edge((r, c), (r, i))


def _describe_cycle(cycle: list, graph: nx.DiGraph, actions: Schedule) -> str:
    """'deadlock: … rank 0 [a, b] → rank 1 [c, d] → back to rank 0', one run per rank, long
    runs shortened; a data dependency against program order is spelled out."""

    def text(n) -> str:
        if n[0] == "done":  # a batch is done when all its operations are: name them
            acts, i = actions[n[1]], n[2]
            ops = [a.describe() for a in acts[i:next((j for j in range(i, len(acts)) if not acts[j].is_comm), len(acts))]]
            return f"batch at #{i} done ({', '.join(ops)})"
        return f"{n[0]} batch at #{n[2]}" if isinstance(n[0], str) else \
            f"{actions[n[0]][n[1]].describe()} (#{n[1]})"

    runs: list[tuple[int, list[str]]] = []
    mbs: set[int] = set()
    for u, x in cycle:
        r = u[1] if isinstance(u[0], str) else u[0]
        item = text(u)
        if not isinstance(u[0], str):
            mbs.add(actions[r][u[1]].microbatch)
        index = u[2] if isinstance(u[0], str) else u[1]
        if graph.edges[u, x]["why"] in ("data", "wait") and x[0] == r and x[1] < index:
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
