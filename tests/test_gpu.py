"""Golden tests on CUDA: skipped where no GPU is visible (never needed by CI).

The serial plans run on the GPU in fp32 (tf32 matmuls) and bf16 and must track
the CPU fp32 reference within the tolerance of that precision; a bf16 run of a
GPT-2 124M-sized model prints its MFU. A tensor-parallel plan needs one GPU per
NCCL rank, so it runs only where two or more GPUs are visible; with --share-gpu the
ranks of a parallel plan share one GPU (gloo, collectives staged through host memory),
so a plan per axis and a 3D one run on a single GPU against the CPU fp32 serial run.
`make gpu` (benchmarks/gpu_routine.py) runs this file first on a lent GPU."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from dslc import codegen
from dslc.driver import load_text

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

# rtol on the per-step losses: tf32 rounds matmul inputs to 10 mantissa bits, bf16 to 7,
# fp16 to 10 (and scales the loss)
TOLERANCE = {"fp32": 2e-3, "bf16": 2e-2, "fp16": 2e-2}


def run(plan, run_script, root, device, *flags):
    script = codegen.write(plan, root) / "train.py"
    losses = root / f"{plan.name}-{device}.json"
    weights = root / f"{plan.name}-{device}.pt"
    args = ["--device", device, "--dump-losses", losses, "--dump-weights", weights, *flags]
    out = run_script(script, plan.world_size, *args)
    assert out.returncode == 0, out.stderr[-4000:]
    dumped = json.loads(losses.read_text())
    run.validation = dumped.get("val_loss", [])  # with an evaluation only
    return dumped["loss"], torch.load(weights), out.stdout


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize(
    "name", ["gpt2_serial", "llama_serial", "mixtral_serial", "mixtralcap_serial", "deepseek_serial", "tokens_serial"]
)
def test_serial_plan_on_cuda_tracks_cpu_fp32(name, precision, golden_plans, run_script, tmp_path):
    ref_plan = golden_plans[name]
    plan = dataclasses.replace(
        ref_plan, train=dataclasses.replace(ref_plan.train, precision=precision)
    )
    ref_losses, ref_weights, _ = run(ref_plan, run_script, tmp_path, "cpu")
    ref_validation = run.validation
    losses, weights, _ = run(plan, run_script, tmp_path, "cuda")
    rtol = TOLERANCE[precision]
    assert len(losses) == len(ref_losses)  # zip would stop at the shorter
    for got, want in zip(losses, ref_losses):
        assert abs(got - want) <= rtol * want, (losses, ref_losses)
    # tokens_serial: uint32 token files, a blend and the validation loss on the GPU
    assert len(run.validation) == len(ref_validation)
    assert bool(ref_validation) == (ref_plan.train.eval is not None)
    for (_, got), (_, want) in zip(run.validation, ref_validation):
        assert abs(got - want) <= rtol * want, (run.validation, ref_validation)
    for key, want in ref_weights.items():  # Adam moves every weight by about lr a step
        torch.testing.assert_close(weights[key], want, rtol=0, atol=10 * plan.train.optimizer.lr)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="one GPU cannot hold two NCCL ranks")
def test_tensor_parallel_plan_on_cuda_matches_serial(golden_plans, run_script, tmp_path):
    ref_losses = run(golden_plans["llama_serial"], run_script, tmp_path, "cpu")[0]
    losses = run(golden_plans["llama_tp2_sp"], run_script, tmp_path, "cuda")[0]
    assert len(losses) == len(ref_losses)  # zip would stop at the shorter
    for got, want in zip(losses, ref_losses):
        assert abs(got - want) <= TOLERANCE["fp32"] * want


# --share-gpu: the plan's ranks on one GPU, each collective and message staged through
# host memory; (golden plan, precision, mode): a plan per axis, in bf16 (fp16 once), a 3D
# one, fp32 (tf32 matmuls) where the tolerance is tighter, eager (--no-compile: the axes'
# CUDA paths, not dynamo's) and compiled (the blocks' graphs broken at each collective)
SHARED = [
    ("llama_tp2_sp", "bf16", "eager"), ("llama_tp2_sp", "fp32", "eager"),  # tp + sp collectives in the blocks and the loss
    ("llama_tp2_sp", "bf16", "compiled"),
    ("gpt2pp_pp2_1f1b", "bf16", "eager"),  # pipeline p2p (batched isend/irecv), tied embeddings
    ("llamapp_pp2_interleaved", "bf16", "eager"),  # two chunks a rank
    ("llamapp_pp2_dualpipe_v", "bf16", "eager"),  # the V's overlapped F&B pairs
    ("llama_cp2", "bf16", "eager"), ("llama_cp2_ulysses", "bf16", "eager"),  # cp ring passes; Ulysses's all-to-alls
    ("mixtral_ep2", "bf16", "eager"),  # ep dispatch; the local experts as torch._grouped_mm
    ("mixtral_ep2", "bf16", "compiled"),  # dropless: the rows each rank receives change step to step
    ("mixtralcap_ep2", "bf16", "eager"),  # the capacity path's fixed-size dispatch
    ("deepseek_ep2", "bf16", "eager"),  # MLA, shared experts beside the routed ones
    ("gpt2_dp2_zero2", "bf16", "eager"), ("gpt2_dp2_zero3", "bf16", "eager"),  # bucket reduce-scatters; ZeRO-3 prefetch
    ("llama_dp2_zero3_full", "fp16", "eager"),  # fp16 with ZeRO-3 gathers under full recompute
    ("llamapp_dp2_pp2_tp2", "bf16", "eager"), ("llamapp_dp2_pp2_tp2", "fp32", "eager"),  # 3D: 8 ranks on one GPU
    ("llamapp_dp2_pp2_tp2", "bf16", "compiled"),
]


@pytest.mark.parametrize(("name", "precision", "mode"), SHARED)
def test_parallel_plan_sharing_one_gpu_tracks_cpu_fp32(name, precision, mode, golden_plans, run_script, tmp_path):
    """The losses of every step and the final weights as the serial plans' test above
    has them."""
    ref_plan, plan = golden_plans[name.split("_")[0] + "_serial"], golden_plans[name]
    plan = dataclasses.replace(plan, train=dataclasses.replace(plan.train, precision=precision))
    ref_losses, ref_weights, _ = run(ref_plan, run_script, tmp_path, "cpu")
    flag = "--compile" if mode == "compiled" else "--no-compile"
    losses, weights, out = run(plan, run_script, tmp_path, "cuda", "--share-gpu", flag)
    assert f"{precision}, cuda" in out  # the start-up line: the plan's precision, on the GPU
    rtol = TOLERANCE[precision]
    assert len(losses) == len(ref_losses)
    for got, want in zip(losses, ref_losses):
        assert abs(got - want) <= rtol * want, (losses, ref_losses)
    assert sorted(weights) == sorted(ref_weights)
    for key, want in ref_weights.items():  # Adam moves every weight by about lr a step
        torch.testing.assert_close(weights[key], want, rtol=0, atol=10 * plan.train.optimizer.lr)


# train { offload { activations } } on CUDA: pinned host buffers, the side stream's copies,
# the prefetch one block ahead; each plan against itself without offload (eager and
# compiled: the compiled graph's saved tensors through the same hooks), in fp32 (tf32),
# within what the kernels' own nondeterminism leaves (atomic adds in backward)
OFFLOADED = [("llamapp_pp2_offload_selective", "--no-compile"), ("llamapp_pp2_offload_selective", "--compile"),
             ("mixtral_ep2_zero3_offload", "--no-compile"), ("llama_dp2_tp2_sp_offload", "--compile")]


def assert_offload_changes_nothing(plan, run_script, tmp_path, flags, rtol=1e-5):
    """The plan's losses and weights on CUDA within rtol of the same plan's without offload."""
    kept = dataclasses.replace(plan, name=f"{plan.name}_kept", train=dataclasses.replace(plan.train, offload=None))
    want, want_weights, _ = run(kept, run_script, tmp_path, "cuda", *flags)
    losses, weights, _ = run(plan, run_script, tmp_path, "cuda", *flags)
    assert len(losses) == len(want)
    for got, ref in zip(losses, want):
        assert abs(got - ref) <= rtol * ref, (losses, want)
    for key, ref in want_weights.items():
        torch.testing.assert_close(weights[key].float(), ref.float(), rtol=rtol, atol=rtol)


def measured_on_cuda(plan, run_script, tmp_path):
    """Each rank's --measure record of one step on CUDA, the ranks sharing the GPU."""
    measure = tmp_path / f"{plan.name}-measure.json"
    out = run_script(codegen.write(plan, tmp_path) / "train.py", plan.world_size, "--device", "cuda", "--share-gpu", "--steps", "1", "--measure", measure)
    assert out.returncode == 0, out.stderr[-4000:]
    return [json.loads((tmp_path / f"{plan.name}-measure.rank{rank}.json").read_text()) for rank in range(plan.world_size)]


@pytest.mark.parametrize(("name", "flag"), OFFLOADED)
def test_activation_offload_on_cuda_computes_what_the_plan_computes_without_it(name, flag, golden_plans, run_script, tmp_path):
    plan = golden_plans[name]
    assert_offload_changes_nothing(plan, run_script, tmp_path, ("--share-gpu", flag))
    if flag == "--no-compile":  # and every byte that went to the host came back
        for record in measured_on_cuda(plan, run_script, tmp_path):
            moved = record["offload"]["activations"]
            assert moved["d2h_per_microbatch"] == moved["h2d_per_microbatch"] and min(moved["d2h_per_microbatch"]) > 0


# train { offload { optimizer } } on CUDA: pinned host masters, gradients and moments
# stepped by torch's fused CPU optimizer; the gradients copied out on the side stream behind
# each bucket's or unit's reduction, the weights back behind an event; each plan against
# itself without offload (the fused CUDA optimizer on the device); in bf16, the staging
OFFLOADED_OPTIMIZER = [("llama_dp2_tp2_sp_zero1_offload", "fp32"), ("llama_dp2_tp2_sp_zero3_offload", "fp32"),
                       ("llamapp_pp2_offload", "fp32"), ("llama_dp2_tp2_sp_zero1_offload", "bf16")]


@pytest.mark.parametrize(("name", "precision"), OFFLOADED_OPTIMIZER)
def test_optimizer_offload_on_cuda_computes_what_the_plan_computes_without_it(name, precision, golden_plans, run_script, tmp_path):
    plan = golden_plans[name]
    plan = dataclasses.replace(plan, name=f"{name}_{precision}", train=dataclasses.replace(plan.train, precision=precision))
    rtol = 1e-5 if precision == "fp32" else 1e-3  # bf16: a master 1 ulp apart may round apart
    assert_offload_changes_nothing(plan, run_script, tmp_path, ("--share-gpu", "--no-compile"), rtol)
    for record in measured_on_cuda(plan, run_script, tmp_path):
        moved = record["offload"]["optimizer"]
        assert record["state"]["optimizer"] == 0 and moved["d2h"] == moved["h2d"] > 0
        assert moved["host"]["master"] == moved["host"]["grads"] == moved["d2h"] * (2 if precision == "bf16" else 1)


# train { float8 }: torch._scaled_mm on a GPU with fp8 tensor cores (compute capability
# 8.9 on), against the CPU's fp32 run of torchao's emulation of the same plan: the same
# casts, the products accumulated differently (the forward's with cuBLAS's fast accumulation)
FLOAT8 = [("fp8_serial", ()), ("fp8row_serial", ()), ("fp8moe_serial", ()),
          ("fp8_dp2_tp2_sp", ("--share-gpu", "--no-compile")), ("fp8moe_ep2", ("--share-gpu", "--no-compile"))]
# (not fp8moe_ep2_tp2_sp: its k and v projections are 8 wide per tp rank, and
# torch._scaled_mm takes only multiples of 16)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9), reason="needs fp8 tensor cores")
@pytest.mark.parametrize(("name", "flags"), FLOAT8)
def test_float8_plan_on_cuda_tracks_its_cpu_emulation(name, flags, golden_plans, run_script, tmp_path):
    """bf16 working weights, the linears' GEMMs in fp8 (tensorwise, rowwise; the experts'
    loop of GEMMs; tp's amax reductions over NCCL or, sharing one GPU, gloo) within bf16's
    tolerance of the serial plan's fp32 emulated run, compiled (serial) and eager."""
    ref_plan, plan = golden_plans[name.split("_")[0] + "_serial"], golden_plans[name]
    plan = dataclasses.replace(plan, train=dataclasses.replace(plan.train, precision="bf16"))
    ref_losses = run(ref_plan, run_script, tmp_path, "cpu")[0]
    losses, _, out = run(plan, run_script, tmp_path, "cuda", *flags)
    assert f"bf16, float8 {plan.train.float8}, cuda" in out
    assert len(losses) == len(ref_losses)  # zip would stop at the shorter
    for got, want in zip(losses, ref_losses):
        assert abs(got - want) <= TOLERANCE["bf16"] * want, (losses, ref_losses)


GPT2_124M = """
cluster gpu {{ nodes = 1; gpus_per_node = 1; device = {device}
    link nvlink {{ scope = node }} }}
plan gpt2_124m_bf16 {{
    model gpt2 {{ layers = 12; hidden = 768; heads = 12; vocab = 50304; seq_len = 1024 }}
    cluster = gpu
    train {{ steps = 30; micro_batch = 8; global_batch = 8; precision = bf16; data = synthetic }}
}}
"""


def _catalog_device():
    """The catalog's name for this GPU (its peak FLOP/s gives the MFU); skips if none."""
    from dslc.catalog import device_of_cuda_name

    device = device_of_cuda_name(torch.cuda.get_device_name())
    if device is None:
        pytest.skip(f"no catalog peak for {torch.cuda.get_device_name()}")
    return device


def test_bf16_mfu_is_reported(run_script, tmp_path):
    device = _catalog_device()
    plan = load_text(GPT2_124M.format(device=device), "gpt2_124m_bf16.plan").program.plans[0]
    out = run(plan, run_script, tmp_path, "cuda")[2]
    last = out.strip().splitlines()[-1]
    mfu = float(re.search(r"mfu ([\d.]+)%", last).group(1))
    print(f"\n{torch.cuda.get_device_name()}: {last}")
    assert 0 < mfu < 100 and "peak mem" in last


def test_a_megatron_dataset_feeds_the_gpu_as_synthetic_data_does(run_script, tmp_path):
    """GPT-2 124M in bf16 on a Megatron indexed dataset (2M uint16 ids in documents of
    1-3k ids) and on synthetic tokens: both train; the two log lines show what reading,
    cutting and checking every global batch costs (printed, not asserted: timings)."""
    import struct

    device = _catalog_device()
    rng = torch.Generator().manual_seed(0)
    lengths = torch.randint(1000, 3000, (1000,), generator=rng)
    ids = torch.randint(50257, (int(lengths.sum()),), generator=rng)
    (tmp_path / "web.bin").write_bytes(ids.to(torch.int32).numpy().astype("<u2").tobytes())
    pointers = torch.cumsum(lengths, 0) * 2 - lengths * 2
    index = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(lengths), len(lengths) + 1)
    index += lengths.to(torch.int32).numpy().astype("<i4").tobytes()
    index += pointers.numpy().astype("<i8").tobytes() + torch.arange(len(lengths) + 1).numpy().astype("<i8").tobytes()
    (tmp_path / "web.idx").write_bytes(index)
    lines = {}
    for data in ("synthetic", f'tokens("{tmp_path / "web"}")'):
        text = GPT2_124M.format(device=device).replace("data = synthetic", f"data = {data}")
        plan = load_text(text, str(tmp_path / "gpt2.plan")).program.plans[0]
        losses, _, out = run(plan, run_script, tmp_path / data[:6], "cuda")
        times = [float(t) for t in re.findall(r"\| ([\d.]+) ms \|", out)][10:]  # past the warm-up
        lines[data] = f"mean {sum(times) / len(times):.1f} ms/step over steps 11-30; last: {out.strip().splitlines()[-1]}"
        assert len(losses) == plan.train.steps and "mfu" in lines[data]
    print(f"\n{torch.cuda.get_device_name()}:\n" + "\n".join(f"  {k}: {v}" for k, v in lines.items()))


MOE = """
cluster gpu {{ nodes = 1; gpus_per_node = 1; device = {device}
    link nvlink {{ scope = node }} }}
plan moe_bf16 {{
    model mixtral {{ layers = 8; hidden = 1024; heads = 16; kv_heads = 8; ffn = 2048
                    vocab = 32000; seq_len = 1024; experts = 8; top_k = 2 }}
    experts {{ {experts} }}
    cluster = gpu
    train {{ steps = 20; micro_batch = 8; global_batch = 8; precision = bf16; data = synthetic }}
}}
"""


@pytest.mark.parametrize("experts", ["aux_loss_weight = 0.01", "capacity_factor = 1.25; aux_loss_weight = 0.01"])
def test_moe_bf16_on_cuda(experts, run_script, tmp_path):
    """A 8-expert top-2 MoE in bf16 on one GPU, dropless and with a capacity: it trains,
    logs the router (aux loss near 1, imbalance) and its MFU and peak memory."""
    device = _catalog_device()
    plan = load_text(MOE.format(device=device, experts=experts), "moe_bf16.plan").program.plans[0]
    losses, _, out = run(plan, run_script, tmp_path, "cuda")
    last = out.strip().splitlines()[-1]
    print(f"\n{torch.cuda.get_device_name()} ({experts}): {last}")
    assert losses[-1] < losses[0] and "imbalance" in last
    assert 0 < float(re.search(r"mfu ([\d.]+)%", last).group(1)) < 100


# Runs train.py as python would, with the host's synchronisations with the GPU turned
# into errors from the optimizer step of step 2 to that of step 5: steps 3 and 4, which
# do not log, whole (torch.cuda.set_sync_debug_mode).
NO_SYNC = r"""
import os, runpy, sys, torch
from torch.optim.optimizer import register_optimizer_step_post_hook
script = sys.argv[1]
sys.path.insert(0, os.path.dirname(script))
sys.argv = [script, *sys.argv[2:]]
steps = []
def after_update(*_):
    steps.append(1)
    if len(steps) in (2, 5):
        torch.cuda.set_sync_debug_mode("error" if len(steps) == 2 else "default")
register_optimizer_step_post_hook(after_update)
runpy.run_path(script, run_name="__main__")
"""


# the MoE plans (serial, bf16: grouped matmuls) too: dropless routing, whose counts a
# loop of matmuls or ep's all-to-all would read once per layer (counted on a CPU in
# tests/test_golden.py), and a capacity; no validation pass inside the steps checked
NEVER_WAITS = [("gpt2_serial", "--compile"), ("gpt2_serial", "--no-compile"), ("mixtral_serial", "--compile"),
               ("mixtral_serial", "--no-compile"), ("mixtralcap_serial", "--compile")]


@pytest.mark.parametrize(("name", "compiled"), NEVER_WAITS)
def test_a_step_that_does_not_log_never_waits_for_the_gpu(name, compiled, golden_plans, tmp_path):
    import subprocess
    import sys

    ref = golden_plans[name]
    plan = dataclasses.replace(ref, train=dataclasses.replace(ref.train, precision="bf16", eval=None))
    script = codegen.write(plan, tmp_path) / "train.py"
    args = ["--steps", "6", "--log-every", "100", "--device", "cuda", compiled]
    out = subprocess.run([sys.executable, "-c", NO_SYNC, str(script), *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]


RING = """
cluster c { nodes = 1; gpus_per_node = 2; device = cpu
            link shm { scope = node; bandwidth = 10 GB/s; latency = 10 us } }
plan p {
    model llama { layers = 1; hidden = 256; heads = 4; kv_heads = 2; vocab = 64; seq_len = 512 }
    cluster = c
    mesh { cp = 2 on shm }
    context_parallel { method = ring }
    train { micro_batch = 1; global_batch = 1; data = synthetic }
}
"""


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])  # flash attention, the memory-efficient kernel
def test_ring_blocks_on_cuda_merge_to_attention_over_the_whole_sequence(dtype, tmp_path):
    """The ring's per-block CUDA calls (context_parallel.attend and attend_backward, GQA:
    4 query heads on 2 kv heads), in one process over a sequence cut into 4 chunks: each
    query chunk's diagonal block (causal) and the block of every chunk before it (unmasked),
    merged by log-sum-exp as the ring merges them, and each block's backward from the
    merged output and log-sum-exp, summed; against F.scaled_dot_product_attention over the
    whole sequence, forward and gradients."""
    import sys

    import torch.nn.functional as F

    folder = codegen.write(load_text(RING).program.plans[0], tmp_path)
    for name in ("mesh", "context_parallel", "plan", "meter", "utils"):
        sys.modules.pop(name, None)
    sys.path.insert(0, str(folder))
    try:
        import context_parallel as cp
    finally:
        sys.path.remove(str(folder))
    B, nh, nkv, hs, C, n = 2, 4, 2, 64, 128, 4
    g = torch.Generator().manual_seed(0)
    full = [torch.randn(B, n * C, h, hs, generator=g).transpose(1, 2) for h in (nh, nkv, nkv)]
    q, k, v = (t.to("cuda", getattr(torch, dtype)).requires_grad_() for t in full)
    w = torch.randn(B, nh, n * C, hs, generator=g).to("cuda", q.dtype)
    (F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True) * w).sum().backward()
    tol = {"atol": 3e-2, "rtol": 3e-2} if dtype == "bfloat16" else {"atol": 5e-4, "rtol": 5e-4}
    dq, dk, dv = (torch.zeros_like(t, dtype=torch.float32) for t in (q, k, v))
    with torch.no_grad():
        for i in range(n):
            rows, diagonal, before = (slice(i * C, (i + 1) * C), slice(i * C, (i + 1) * C), slice(0, i * C))
            blocks = [(diagonal, True)] + [(before, False)] * (i > 0)
            parts = [cp.attend(q[:, :, rows], k[:, :, keys], v[:, :, keys], causal) for keys, causal in blocks]
            y, lse = parts[0][0].float(), parts[0][1].float()
            for block_y, block_lse, _ in parts[1:]:
                merged = torch.logaddexp(lse, block_lse)
                y = y * (lse - merged).exp()[..., None] + block_y.float() * (block_lse - merged).exp()[..., None]
                lse = merged
            torch.testing.assert_close(y.to(q.dtype), F.scaled_dot_product_attention(
                q[:, :, : (i + 1) * C], k[:, :, : (i + 1) * C], v[:, :, : (i + 1) * C], is_causal=True, enable_gqa=True
            )[:, :, rows], **tol)
            y = y.to(q.dtype)
            for (keys, causal), (_, _, kernel) in zip(blocks, parts):
                grads = cp.attend_backward(w[:, :, rows], q[:, :, rows], k[:, :, keys], v[:, :, keys], y, lse.contiguous(),
                                           causal, kernel)
                dq[:, :, rows] += grads[0]
                dk[:, :, keys] += grads[1]
                dv[:, :, keys] += grads[2]
    for name, got, want in zip("qkv", (dq, dk, dv), (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(got, want.float(), **tol, msg=lambda m: f"d{name}: {m}")
