"""Where a pipeline's messages go in the action lists, and when the runtime waits for them:
the ordering contract of :mod:`dslc.cost.schedule`, continued.

3. Computes come in steps. gpipe, 1f1b, zb_h1 and interleaved_1f1b place, between two
   steps, the sends of the step before and then the receives of the step after (a step is one
   compute, but the interleaved steady state's F, B pair, followed by one batch {SEND_F,
   SEND_B, RECV_F, RECV_B}: Megatron's ``send_forward_backward_recv_forward_backward``).
   zb_v and dualpipe_v are placed by :func:`place`: a timed run of the computes pairs each
   message into the batches both ranks have open between two computes, so dualpipe_v's
   overlapped F&B pair (DeepSeek-V3's DualPipe, DeepSeek-AI 2024 §3.2.1; its B is marked
   ``overlaps``) sends F's activation before B runs and B's gradient before its W: one half's
   messages are in flight while the other half computes. Sending each result right after its
   producer and receiving right before its consumer instead deadlocks on a stream that
   completes a rank's batches in order (interleaved p = 2, v = 2, m = 4; dualpipe_v p = 2).
   Placed as the V is, interleaved's pairs measured 15–20 % slower on CPU with gloo (a batch
   between every two computes costs its posting; README, the pipeline benchmark), so they
   keep Megatron's one batch.
4. A maximal run of consecutive comm actions is ONE batch: one ``P2POp`` per action in list
   order, posted by a single ``torch.distributed.batch_isend_irecv`` without waiting. In the
   1F1B steady state, rank r's batch {SEND_F → r+1, RECV_B ← r+1} meets rank r+1's batch
   {SEND_B → r, RECV_F ← r}. The runtime waits for a receive just before the compute that
   reads it (on NCCL, whose batch is one request, for the whole batch); for an activation's
   send just before the B of its own micro-batch and chunk (the activation is kept for that B
   anyway), for an input gradient's before the rank's next B (:func:`send_waits`); for the
   rest at the end of the step. On gloo a send completes only once its receive is posted
   (measured), so a send waited for before the very next compute would hold its rank there.
5. Between two ranks, messages match in posting order (NCCL, and gloo with one tag, do not
   match by micro-batch): the k-th send from r to q is the k-th receive on q from r. Activations
   and gradients have the same shape (micro_batch, seq, hidden), so a mix-up would not fail
   loudly; :func:`dslc.cost.deadlock.verify` checks that both sides list the same messages in the
   same order.

:func:`dslc.cost.deadlock.verify` proves deadlock-freedom under the strictest p2p semantics
(rendezvous: a send completes only once its receive is posted; a batch completes when all its
operations have, and a rank's batches complete in the order posted, as on one NCCL stream)
with the runtime's waits of contract 4. :func:`dslc.cost.schedule.simulate` times the lists as
the runtime waits: a send arrives ``t_comm`` after it is posted without holding its rank, a
compute waits for the message it reads and the sends of that receive's batch, a B for the
sends :func:`send_waits` gives it.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence

from ..chunks import ONWARD, Placement

Step = tuple[tuple[str, int, int], ...]  # (kind, micro-batch, local chunk) of one step


def between(steps: list[Step], rank: int, at: Placement) -> list[tuple]:
    """Contract 3 for gpipe, 1f1b, zb_h1 and interleaved_1f1b: between two steps, the sends of the step before,
    then the receives of the step after, as (kind, micro-batch, local chunk[, peer])."""

    def comm(prefix: str, step: Step) -> list[tuple]:
        out = []
        for kind, mb, c in step:
            peer = at.peer(rank, c, step_of(prefix + kind)) if kind in ONWARD else None
            if peer is not None:
                out.append((prefix + kind, mb, c, peer))
        return out

    out: list[tuple] = []
    for before, step in zip([()] + steps, steps):
        out += comm("SEND_", before) + comm("RECV_", step) + list(step)
    return out + comm("SEND_", steps[-1] if steps else ())


def step_of(kind: str) -> int:
    """Which neighbour a send/receive talks to: +1, the next chunk (SEND_F, RECV_B), or −1;
    its peer rank is :meth:`Placement.peer` (None at either end of the model or a V's turn)."""
    return 1 if kind in ("SEND_F", "RECV_B") else -1


def place(steps: list[list[Step]], at: Placement) -> list[list[tuple]]:
    """Each rank's steps with their sends and receives placed among them, as (kind,
    micro-batch, local chunk, peer, overlaps); ``overlaps`` marks the B of an overlapped F&B
    pair (a step F, B[, W]: dualpipe_v's).

    In a V two message streams share each link (rank r sends chunk r's activations and chunk
    2p−1−r's gradients both to r+1), and p2p matches in posting order, so the placement of
    the other schedules (sends right after the step, receives right before the step that needs
    them) would post them in different orders on the two sides. Here a timed run (F, B, W one
    unit each) advances the rank whose next compute can start first; before it does, the
    messages that rank has made and those it has been sent by then are paired, each send and
    its receive into the batches the two ranks have open at that moment (so both sides list a
    link's messages in the order they were made). Each compute of a pair is its own point, so
    the F's activation is sent before its pair's B and the B's gradient before the W: one
    half's messages are in flight while the other half computes. A rank is always between two
    computes when a message is paired, so even if every batch were waited for before the next
    compute, on a stream that completes a rank's batches in order, the lists would run as
    constructed; :func:`dslc.cost.deadlock.verify` proves it, with the runtime's own waits, for
    every shape tested. ``at``: the placement, which says each chunk's rank and neighbours."""
    p = at.pp
    near = [sorted({at.rank(n) for g in at.ids(r) for n in (g - 1, g + 1) if 0 <= n < at.chunks} - {r}) for r in range(p)]
    computes = []  # per rank: (action, the message it needs from another rank, the message it makes, its receiver)
    for r, rank in enumerate(steps):
        row = []
        for step in rank:
            for k, (kind, mb, c) in enumerate(step):
                g = at.global_chunk(r, c)
                source = at.neighbour(g, -ONWARD[kind]) if kind in ONWARD else None
                want = (kind, mb, source) if source is not None and at.rank(source) != r else None
                to = at.neighbour(g, ONWARD[kind]) if kind in ONWARD else None
                makes = (kind, mb, g) if to is not None and at.rank(to) != r else None
                row.append(((kind, mb, c, None, k == 1 and step[0][0] == "F" and kind == "B"),
                            want, makes, None if makes is None else (at.local(g), at.rank(to), at.local(to))))
        computes.append(row)
    made: set[tuple[str, int, int]] = set()
    out: list[list[tuple]] = [[] for _ in range(p)]
    batch: list[list[tuple]] = [[] for _ in range(p)]
    pos, clock = [0] * p, [0.0] * p
    links: dict[tuple[int, int], deque] = defaultdict(deque)  # (from, to) -> (made when, message, chunks), unsent
    when: dict[tuple[str, int, int], float] = {}  # message -> when made
    none = (float("inf"), True, 0)

    def pair(src: int, to: int) -> None:
        _, (d, mb, _), (cs, _, cd) = links[(src, to)].popleft()
        batch[src].append(("SEND_" + d, mb, cs, to))
        batch[to].append(("RECV_" + d, mb, cd, src))

    def candidate(r: int) -> tuple[float, bool, int]:
        """(start, no message waiting for it by then, r) of r's next compute; ``none`` if it cannot start."""
        if pos[r] >= len(computes[r]):
            return none
        want = computes[r][pos[r]][1]
        if want is not None and want not in made:
            return none
        start = clock[r] if want is None else max(clock[r], when[want])
        waiting = any(links[(q, r)] and links[(q, r)][0][0] <= start for q in near[r])
        return start, not waiting, r

    cands = [candidate(r) for r in range(p)]
    while True:
        start, _, r = min(cands)
        if start == float("inf"):
            break
        # into the batches open now: what r has made, and what it has been sent by its start
        for q in near[r]:
            while links[(r, q)]:
                pair(r, q)
            while links[(q, r)] and links[(q, r)][0][0] <= start:
                pair(q, r)
        action, _, makes, chunks = computes[r][pos[r]]
        out[r] += batch[r]
        out[r].append(action)
        batch[r] = []
        clock[r] = start + 1
        if makes is not None:
            made.add(makes)
            when[makes] = clock[r]
            links[(r, chunks[1])].append((clock[r], makes, chunks))
        pos[r] += 1
        for q in (r, *near[r]):
            cands[q] = candidate(q)
    if any(pos[r] < len(computes[r]) for r in range(p)):
        raise ValueError(f"the schedule cannot place its messages for p={p}")
    for (src, to), queue in list(links.items()):
        while queue:
            pair(src, to)
    return [acts + rest for acts, rest in zip(out, batch)]


def send_waits(acts: Sequence) -> dict[int, int | None]:
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
