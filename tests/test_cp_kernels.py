"""The context-parallel kernels of a generated script against PyTorch's attention.

The script's context-parallel section (ring attention or Ulysses) is cut out of the
generated train.py as it is, run under torchrun (CPU, gloo) on random q, k, v, and each
rank's output and gradients compared with ``scaled_dot_product_attention`` over the whole
sequence at that rank's positions: forward and backward, grouped-query attention, the
load-balanced and the contiguous layout (where rank 0 attends only to its own diagonal
block and the last rank to every block).
"""

from __future__ import annotations

import ast
import textwrap

import pytest

from dslc import codegen
from dslc.driver import load_text

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("golden")]

PLAN = """
cluster c {{ nodes = 1; gpus_per_node = {cp}; device = cpu
            link shm {{ scope = node; bandwidth = 10 GB/s; latency = 10 us }} }}
plan p {{
    model llama {{ layers = 1; hidden = 64; heads = {heads}; kv_heads = {kv}; vocab = 64; seq_len = {seq} }}
    cluster = c
    mesh {{ cp = {cp} on shm }}
    context_parallel {{ method = {method}; load_balance = {balance} }}
    train {{ micro_batch = 1; global_batch = 1; data = synthetic }}
}}
"""

# Runs on every rank: the kernels from the script, then the comparison.
DRIVER = textwrap.dedent(
    """
    import math, sys
    import torch, torch.distributed as dist, torch.nn.functional as F

    source, heads, kv, seq = sys.argv[1], *map(int, sys.argv[2:])
    dist.init_process_group("gloo")
    CP, CP_RANK = dist.get_world_size(), dist.get_rank()
    ns = dict(torch=torch, dist=dist, math=math, F=F, METER=None, CALLING=[""], device=torch.device("cpu"),
              SEQ_LEN=seq, CP=CP, CP_RANK=CP_RANK, GROUPS={"cp": dist.group.WORLD})
    exec(compile(open(source).read(), source, "exec"), ns)

    B, hs = 2, 16
    g = torch.Generator().manual_seed(0)  # the same global tensors on every rank
    q, k, v, w = (torch.randn(B, n, seq, hs, generator=g) for n in (heads, kv, kv, heads))
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*full, is_causal=True, enable_gqa=heads != kv)
    (want * w).sum().backward()

    at = ns["POSITIONS"]
    # this rank's tokens, laid out (B, T, n, hs) as the model's projections leave them
    mine = [t[:, :, at].transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in (q, k, v)]
    got = ns["context_attention"](*mine)
    (got * w[:, :, at]).sum().backward()
    torch.testing.assert_close(got, want[:, :, at])
    for name, mine_t, full_t in zip("qkv", mine, full):
        torch.testing.assert_close(mine_t.grad, full_t.grad[:, :, at], msg=lambda m: f"d{name}: {m}")
    print(f"rank {CP_RANK} ok: positions {at.tolist()}")
    dist.destroy_process_group()
    """
)


def kernel_source(script: str) -> str:
    """The top-level statements of the script's context-parallel section, and the mesh's
    all_to_all (Ulysses)."""
    lines = script.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("# Context parallel:"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("# ----"))
    tree = ast.parse(script)
    keep = [n for n in tree.body if start < n.lineno <= end or getattr(n, "name", "") == "all_to_all"]
    return "\n\n".join(ast.get_source_segment(script, n) for n in keep) + "\n"


@pytest.mark.parametrize(
    "method, balance, cp, heads, kv, seq",
    [
        ("ring", "true", 4, 4, 2, 32),  # 8 chunks: full, diagonal and skipped blocks; GQA
        ("ring", "false", 4, 4, 4, 24),  # contiguous: rank 0 one block, rank 3 four
        ("ring", "true", 2, 2, 1, 16),  # one kv head shared by both query heads
        ("ulysses", "false", 2, 4, 2, 24),  # heads and kv heads split over cp; GQA
    ],
)
def test_context_attention_equals_sdpa_on_the_whole_sequence(method, balance, cp, heads, kv, seq, run_script, tmp_path):
    plan = load_text(PLAN.format(cp=cp, heads=heads, kv=kv, seq=seq, method=method, balance=balance)).program.plans[0]
    (tmp_path / "kernels.py").write_text(kernel_source(codegen.render(plan)["train.py"]))
    (tmp_path / "driver.py").write_text(DRIVER)
    out = run_script(tmp_path / "driver.py", cp, tmp_path / "kernels.py", heads, kv, seq)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert out.stdout.count(" ok: positions ") == cp
