"""How the generated MoE layer should run its local experts: a loop over the experts on
rows sorted by expert (what the dropless script does), one batched matmul over a buffer
padded to the largest expert's rows (what the capacity script does, where the padding
is the capacity), or torch's grouped matmul (torch._grouped_mm: CUDA, bf16, private).

    .venv/bin/python benchmarks/moe_experts.py            # CPU, fp32
    python3 benchmarks/moe_experts.py --device cuda      # GPU, bf16

Forward and backward of the SwiGLU experts, milliseconds per call over `--reps` calls
after two of warm-up: the median with its range (min-max), uniform routing and a skewed
one (the busiest expert gets `skew` times the mean)."""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def experts_loop(x, counts, w1, w3, w2):
    out = []
    for e, rows in enumerate(x.split(counts)):
        h = F.silu(rows @ w1[e].t()) * (rows @ w3[e].t())
        out.append(h @ w2[e].t())
    return torch.cat(out)


def experts_padded(x, counts, w1, w3, w2):
    E, n = len(counts), max(counts)
    buf = x.new_zeros(E, n, x.size(1))
    starts = [0]
    for c in counts[:-1]:
        starts.append(starts[-1] + c)
    index = torch.cat([torch.arange(c, device=x.device) + e * n for e, c in enumerate(counts)])
    buf = buf.view(E * n, -1).index_copy(0, index, x).view(E, n, -1)
    h = F.silu(buf @ w1.transpose(1, 2)) * (buf @ w3.transpose(1, 2))
    return (h @ w2.transpose(1, 2)).view(E * n, -1)[index]


def experts_grouped(x, counts, w1, w3, w2):
    offs = torch.tensor(counts, device=x.device).cumsum(0).to(torch.int32)
    h = F.silu(torch._grouped_mm(x, w1.transpose(1, 2), offs=offs))
    h = h * torch._grouped_mm(x, w3.transpose(1, 2), offs=offs)
    return torch._grouped_mm(h, w2.transpose(1, 2), offs=offs)


def step(fn, args):
    out = fn(*args)
    out.backward(torch.ones_like(out))  # a contiguous gradient (grouped_mm needs one)


def timed(fn, args, device, reps) -> str:
    """'median (min-max)' ms of `reps` calls after two of warm-up."""
    for _ in range(2):
        step(fn, args)
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step(fn, args)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    return f"{statistics.median(times):8.2f} ({min(times):.2f}-{max(times):.2f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=None, help="choices routed (tokens x top_k)")
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--ffn", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None)
    a = ap.parse_args()
    gpu = a.device == "cuda"
    dtype = torch.bfloat16 if gpu else torch.float32
    N = a.tokens or (32768 if gpu else 2048)
    h, f = a.hidden or (4096 if gpu else 256), a.ffn or (14336 if gpu else 512)
    reps, E = a.reps or (20 if gpu else 5), a.experts
    torch.manual_seed(0)
    w = [
        (torch.randn(E, f, h, device=a.device, dtype=dtype) * 0.02).requires_grad_()
        for _ in range(2)
    ]
    w2 = (torch.randn(E, h, f, device=a.device, dtype=dtype) * 0.02).requires_grad_()
    kernels = {"loop": experts_loop, "padded bmm": experts_padded}
    if gpu and hasattr(torch, "_grouped_mm"):
        kernels["torch._grouped_mm"] = experts_grouped
    if "torch._grouped_mm" in kernels:  # the same rows out, an expert without rows too
        counts = [0] + [N // (E - 1)] * (E - 2) + [N - N // (E - 1) * (E - 2)]
        x = torch.randn(N, h, device=a.device, dtype=dtype)
        got, want = experts_grouped(x, counts, *w, w2), experts_loop(x, counts, *w, w2)
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    print(
        f"{a.device} {dtype}: {E} experts, {N} routed rows, hidden {h}, ffn {f};"
        f" ms per forward+backward, median (min-max) over {reps} calls"
    )
    for skew in (1.0, 2.0):
        base = N / E
        counts = [int(base * skew)] + [int((N - base * skew) / (E - 1))] * (E - 1)
        counts[-1] += N - sum(counts)
        x = (torch.randn(N, h, device=a.device, dtype=dtype)).requires_grad_()
        row = [
            f"{name} {timed(fn, (x, counts, w[0], w[1], w2), a.device, reps)}"
            for name, fn in kernels.items()
        ]
        print(f"  busiest expert {skew:.0f}x the mean: " + " | ".join(row))


if __name__ == "__main__":
    main()
