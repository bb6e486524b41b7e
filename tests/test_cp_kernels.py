"""The context-parallel kernels of a generated script against PyTorch's attention.

The generated package's context_parallel.py (ring attention or Ulysses) is imported as
it is, with the process groups its mesh.py builds, run under torchrun (CPU, gloo) on
random q, k, v, and each rank's output and gradients compared with
``scaled_dot_product_attention`` over the whole sequence at that rank's positions: forward
and backward, grouped-query attention, the load-balanced and the contiguous layout (where
rank 0 attends only to its own diagonal block and the last rank to every block). A larger
ring measures, with torch.profiler, the most bytes its backward holds at once beyond its
inputs and saved tensors: what ``dslc explain`` counts as ``ring`` (dslc/cost/ring.py).
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from dslc import codegen
from dslc.driver import load_text

pytestmark = pytest.mark.slow

PLAN = """
cluster c {{ nodes = 1; gpus_per_node = {cp}; device = cpu
            link shm {{ scope = node; bandwidth = 10 GB/s; latency = 10 us }} }}
plan p {{
    model llama {{ layers = 1; hidden = {hidden}; heads = {heads}; kv_heads = {kv}; vocab = 64; seq_len = {seq} }}
    cluster = c
    mesh {{ cp = {cp} on shm }}
    context_parallel {{ method = {method}; load_balance = {balance} }}
    train {{ micro_batch = 2; global_batch = 2; data = synthetic }}
}}
"""

# Runs on every rank: for each case, the generated modules, then the comparison. The cases
# of one world size share a torchrun job; each imports its own package afresh.
DRIVER = textwrap.dedent(
    """
    import datetime, json, sys, traceback
    import torch, torch.distributed as dist, torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    dist.init_process_group("gloo")
    CP, CP_RANK = dist.get_world_size(), dist.get_rank()
    for case, (folder, heads, kv, seq) in enumerate(json.loads(sys.argv[1])):
        for name in ("mesh", "context_parallel", "plan", "meter", "utils"):
            sys.modules.pop(name, None)
        sys.path.insert(0, folder)
        import mesh, context_parallel
        sys.path.remove(folder)
        mesh.build_process_groups(CP_RANK, (("cp", CP),), (("cp",),), datetime.timedelta(seconds=60))

        B, hs = 2, 16
        g = torch.Generator().manual_seed(0)  # the same global tensors on every rank
        q, k, v, w = (torch.randn(B, n, seq, hs, generator=g) for n in (heads, kv, kv, heads))
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        want = F.scaled_dot_product_attention(*full, is_causal=True, enable_gqa=heads != kv)
        (want * w).sum().backward()

        at = context_parallel.positions()
        # this rank's tokens, laid out (B, T, n, hs) as the model's projections leave them
        mine = [t[:, :, at].transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in (q, k, v)]
        got = context_parallel.context_attention(*mine)
        (got * w[:, :, at]).sum().backward()
        try:
            torch.testing.assert_close(got, want[:, :, at])
            for name, mine_t, full_t in zip("qkv", mine, full):
                torch.testing.assert_close(mine_t.grad, full_t.grad[:, :, at], msg=lambda m: f"d{name}: {m}")
            print(f"case {case} rank {CP_RANK} ok: positions {at.tolist()}", flush=True)
        except AssertionError:
            print(f"case {case} rank {CP_RANK} differs:", traceback.format_exc(), flush=True)
        if seq >= 1024:  # the ring's backward working set: the peak of its allocations
            got = context_parallel.context_attention(*mine)
            dy = w[:, :, at].transpose(1, 2).contiguous().transpose(1, 2)  # laid out as the model's
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                got.backward(dy)
            events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
            held = [0]
            for _, nbytes in events:
                held.append(held[-1] + nbytes)
            print(f"case {case} rank {CP_RANK} ring bytes {max(held)}", flush=True)
        mesh.GROUPS.clear()
    dist.destroy_process_group()
    """
)

CASES = [  # method, load_balance, cp, heads, kv heads, sequence
    ("ring", "true", 4, 4, 2, 32),  # 8 chunks: full, diagonal and skipped blocks; GQA
    ("ring", "false", 4, 4, 4, 24),  # contiguous: rank 0 one block, rank 3 four
    ("ring", "true", 2, 2, 1, 16),  # one kv head shared by both query heads
    ("ulysses", "false", 2, 4, 2, 24),  # heads and kv heads split over cp; GQA
    ("ring", "true", 2, 8, 2, 2048),  # large enough to measure the ring's working set
]


@pytest.fixture(scope="module")
def runs(run_script, tmp_path_factory):
    """The driver's output for every case, one torchrun job per cp size."""
    tmp = tmp_path_factory.mktemp("cp_kernels")
    (tmp / "driver.py").write_text(DRIVER)
    out, plans = {}, {}
    for cp in sorted({c[2] for c in CASES}):
        cases = [c for c in CASES if c[2] == cp]
        jobs = []
        for method, balance, _, heads, kv, seq in cases:
            text = PLAN.format(cp=cp, heads=heads, kv=kv, seq=seq, method=method, balance=balance, hidden=16 * heads)
            plan = load_text(text).program.plans[0]
            folder = codegen.write(plan, tmp / f"{method}_{balance}_{cp}_{heads}_{kv}_{seq}")
            jobs.append([str(folder), heads, kv, seq])
            plans[cases[len(jobs) - 1]] = plan
        run = run_script(tmp / "driver.py", cp, json.dumps(jobs))
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
        for k, case in enumerate(cases):  # (the ranks' lines may interleave)
            ranks = {int(r) for r in re.findall(rf"case {k} rank (\d+) ok: positions ", run.stdout)}
            held = [int(b) for b in re.findall(rf"case {k} rank \d+ ring bytes (\d+)", run.stdout)]
            out[case] = (ranks, run.stdout, held, plans[case])
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_context_attention_equals_sdpa_on_the_whole_sequence(case, runs):
    ranks, stdout, _, _ = runs[case]
    assert ranks == set(range(case[2])), stdout[-4000:]


def test_the_rings_working_set_is_what_explain_counts(runs):
    """Each rank's backward peak (fp32; the driver's head size, 16, is the plan's) within
    10 % of memory's ring term: no score tile, only accumulators and blocks in flight."""
    from dslc.cost import ring

    _, stdout, held, plan = runs[CASES[-1]]
    want = ring.working_bytes(plan)
    assert len(held) == plan.cp, stdout[-4000:]
    print(f"ring working set: measured {held}, explain {want}")
    assert all(abs(got - want) <= 0.1 * want for got in held), (held, want)
