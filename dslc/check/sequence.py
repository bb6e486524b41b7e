"""The sequence over tp and cp: sequence parallelism (E060, E061), context parallelism's
chunks, method and link (E062, E045, E065, W064, W063) and learned positions (E066)."""

from __future__ import annotations

from .. import arch
from ..diagnostics import error, warning
from ..ir import Plan
from ..unknown import unless_unknown


def sequence_context(plan: Plan):
    s, tp, cp = plan.model.seq_len, plan.tp, plan.cp
    if arch.of(plan.model).positions == "learned" and s > plan.model.max_positions:
        yield error("E066", plan.where("train.seq_len"), f"train.seq_len={s} is longer than the model's seq_len={plan.model.max_positions}: {plan.model.arch} learns a table of {plan.model.max_positions} positions",
                    f"train at most {plan.model.max_positions} tokens a sequence, or raise the model's seq_len (rotary models, such as llama, take any)")
    if plan.tensor_parallel.sequence_parallel:
        if tp == 1:
            yield error("E060", plan.where("tensor_parallel.sequence_parallel"), "sequence_parallel needs a tp axis larger than 1", "add `tp = N on <link>` to the mesh or remove sequence_parallel")
        elif (s // cp) % tp or s % cp:
            yield error("E061", plan.where("tensor_parallel.sequence_parallel"), f"sequence parallel splits the sequence over tp, but seq_len={s}" + (f" / cp={cp}" if cp > 1 else "") + f" is not divisible by tp={tp}")
    if cp > 1:
        cpo = plan.context_parallel
        chunks = 2 * cp if cpo.method == "ring" and cpo.load_balance else cp
        if s % chunks:
            why = f"2·cp={chunks} chunks (ring with load balancing)" if chunks != cp else f"cp={cp}"
            yield error("E062", plan.where("mesh.cp"), f"seq_len={s} is not divisible by {why}")
        m, method = plan.model, cpo.method
        if method not in arch.of(m).cp_methods:
            yield error("E065", plan.where("context_parallel.method", "mesh.cp"), f"context parallel ({method}) cannot run arch {m.arch}: {arch.of(m).cp_why}", "remove the cp axis")
        if method == "ulysses":
            with unless_unknown():  # the model's widths: the link below is the mesh's
                heads, kv = (w // m.head_dim for w in arch.widths(m, tp)[:2])  # on one tp rank
                if heads % cp or kv % cp:
                    per = f" per tp rank (tp={tp})" if tp > 1 else ""
                    yield error("E045", plan.where("mesh.cp"), f"Ulysses all-to-all splits heads over cp, but heads={heads}, kv_heads={kv}{per} are not both divisible by cp={cp}", "use method = ring")
            link = plan.cluster.link(plan.mesh.axis("cp").link)
            if link is not None and link.scope == "cluster":
                yield warning("W064", plan.mesh.axis("cp").span, f"Ulysses cp={cp} is placed on {link.name} (scope: cluster): it all-to-alls q, k, v and the attention output of every layer, forward and backward, across nodes, with nothing to hide them behind", "use method = ring (its K/V passes overlap the attention), or put cp on a node-scope link")
    elif "context_parallel" in plan.spans:
        yield warning("W063", plan.where("context_parallel"), "context_parallel options have no effect: the mesh has no cp axis")
