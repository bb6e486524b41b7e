"""The compute order of the V-shaped schedules, rank by rank, as (kind, micro-batch, local
chunk) steps; :func:`dslc.cost.messages.place` adds the sends and receives.

Both place two chunks per rank in a V (:mod:`dslc.chunks`): local chunk 0 of rank r is global
chunk r, local chunk 1 is global chunk 2p−1−r.

* ``zb_v``: ZB-V of Qi et al. 2024 ("Pipeline Parallelism with Controllable Memory", §6), in
  the order of torch.distributed.pipelining's ScheduleZBVZeroBubble: warm-up forwards of
  chunk 0, then of both chunks, then F B W of chunk 1; in the steady state F B W of chunk 0
  then of chunk 1; the cool-down runs the input gradients (B) first and the deferred weight
  gradients (W) last. The backward is split into B and W as zb_h1's is. With T_F = T_B = T_W
  the bubble is (p−1)(T_F+T_B−2T_W)/… ≈ 0 once m ≥ 2p−1; the peak is 2p chunk activations on
  every rank (p micro-batches' worth, as 1F1B's first stage, but on every rank).
* ``dualpipe_v``: DeepSeek-V3's DualPipe (DeepSeek-AI 2024, §3.2.1) in its single-direction
  "V" form, in the order of torch.distributed.pipelining's ScheduleDualPipeV: in the steady
  state one step runs a forward of one chunk together with the backward of the other chunk
  of another micro-batch (DualPipe's overlapped F&B pair, which on DeepSeek's GPUs hides the
  expert all-to-all of one under the compute of the other); the last micro-batches split
  their backward into B and W to fill the cool-down. The pair overlaps its messages with its
  computes (:func:`dslc.cost.messages.place`): a receive is posted as soon as its message is
  made (the B's before the F when it is made by then), the F's activation is sent before the
  B and the B's input gradient before the W, each waited for only where the runtime needs it
  (ordering contract 4, :mod:`dslc.cost.messages`), so one half's messages are in flight
  while the other half computes. The two computes themselves run one after the other on the
  rank, and so does an expert all-to-all inside them (a collective the compute waits for):
  :func:`dslc.cost.schedule.simulate` times the pair as the sum of its computes.
"""

from __future__ import annotations

from collections import deque

Step = tuple[tuple[str, int, int], ...]  # (kind, micro-batch, local chunk) of one step


def zb_v(p: int, m: int, r: int) -> list[Step]:
    """ScheduleZBVZeroBubble's order for rank r (micro-batches past m, which pad the
    pipeline to 2p−1 micro-batches when m is smaller, left out)."""
    n = max(2 * p - 1, m)
    out: list[tuple[str, int, int]] = []
    f, b = [0, 0], [0, 0]

    def add(kind: str, c: int) -> None:  # F or B of the chunk's next micro-batch
        count = f if kind == "F" else b
        out.append((kind, count[c], c))
        count[c] += 1

    for _ in range(2 * (p - r) - 1):
        add("F", 0)
    for _ in range(r):
        add("F", 1), add("F", 0)
    for _ in range(p - r):
        add("F", 1), add("B", 1), out.append(("W", b[1] - 1, 1))  # W of the B just run
    while f[1] < f[0] or f[0] < n:
        if f[0] < n:
            add("F", 0)
        add("B", 0), out.append(("W", b[0] - 1, 0))
        add("F", 1), add("B", 1), out.append(("W", b[1] - 1, 1))
    w = list(b)
    for _ in range(r):
        add("B", 0), add("B", 1)
    for _ in range(p - r):
        add("B", 0), out.append(("W", w[0], 0))
        w[0] += 1
    out += [("W", i, 1) for i in range(w[1], b[1])] + [("W", i, 0) for i in range(w[0], b[0])]
    return [(a,) for a in out if a[1] < m]


def dualpipe_v(p: int, m: int, r: int) -> list[Step]:
    """ScheduleDualPipeV's order for rank r (needs m ≥ 2p). A full backward is B then W in
    the same step; an overlapped pair is the step (F, B, W)."""
    count: dict[tuple[str, int], int] = {}
    queue: deque[tuple[str, int, int]] = deque()  # deferred W, oldest first
    out: list[Step] = []

    def act(kind: str, c: int, full: bool = False) -> Step:
        key = (kind, c)
        mb = count.get(key, 0)
        count[key] = mb + 1
        if kind == "F":
            return (("F", mb, c),)
        if full:
            return (("B", mb, c), ("W", mb, c))
        queue.append(("W", mb, c))
        return (("B", mb, c),)

    def weight() -> None:
        if queue:
            out.append((queue.popleft(),))

    for _ in range(2 * (p - r - 1)):
        out.append(act("F", 0))
    for _ in range(r + 1):
        out += [act("F", 0), act("F", 1)]
    for _ in range(p - r - 1):
        out.append(act("B", 1))
        weight()
        out.append(act("F", 1))
    for i in range(m - 2 * p + r + 1):
        if i == 0 and r == p - 1:  # not overlapped, to shorten the bubble (as DualPipeV)
            out += [act("F", 0), act("B", 1, full=True)]
        else:
            out.append(act("F", 0) + act("B", 1, full=True))
        out.append(act("F", 1) + act("B", 0, full=True))
    for _ in range(p - r - 1):
        out += [act("B", 1, full=True), act("F", 1) + act("B", 0, full=True)]
    split = False
    for i in range(r + 1):
        if i == (r + 1) // 2 and r % 2 == 1:
            split = True
        out.append(act("B", 1, full=not split))
        if i == (r + 1) // 2 and r % 2 == 0:
            split = True
        out.append(act("B", 0, full=not split))
    for _ in range(p - r - 1):
        weight()
        out.append(act("B", 0, full=not split))
    for _ in range(r + 1):
        weight()
    return out
