"""The peer of benchmarks/moe_vs_peer.py: torchtitan's MoE decoder trained with expert
parallelism, CPU + gloo, fp32. Prints one line: the median ms per step after warm-up.

    # a venv beside .venv that sees its packages; nothing is installed into .venv
    .venv/bin/python -m venv --system-site-packages /tmp/moe-peer
    /tmp/moe-peer/bin/pip install -c benchmarks/moe_constraints.txt torchtitan triton
    /tmp/moe-peer/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        benchmarks/moe_peer_torchtitan.py --ep 2 --steps 20      # MOE_PEER_VERBOSE=1: per step

The model is torchtitan's own Qwen3 decoder (torchtitan.models.qwen3) configured as
Mixtral: GQA attention with RoPE and no q/k norm, RMSNorm, untied embeddings, and in
every layer torchtitan's MoE (softmax top-k router with the top-k weights renormalised,
SwiGLU experts in torch._grouped_mm, AllToAllTokenDispatcher when ep > 1), no shared
expert. It is built and parallelized the way torchtitan's Trainer does it: meta-device
build, `parallelize_qwen3` (expert parallel over `ep`, FSDP2 over the data-parallel
ranks, which is the only dense layout torchtitan allows with EP: ep borrows its ranks
from dp_shard), `to_empty` + `init_weights`, torchtitan's AdamW container with its
expert-bias load-balancing hook. The step is forward, cross-entropy over the vocabulary,
backward, global-norm clipping when --clip > 0, AdamW.

What it takes to run torchtitan 0.3.0 on CPU with gloo (all of it done below; none of
it touches the MoE's routing, dispatch or collectives):
- torchtitan/models/common/token_dispatcher.py imports
  torchtitan.distributed.minimal_async_ep, whose kernels.py starts with `import
  triton`: every MoE model needs triton installed, though the all-to-all dispatcher
  used here runs no triton kernel (triton installs and imports on a CPU-only machine).
- torchtitan/tools/utils.py sets `device_type = _get_available_device_type() or "cuda"`,
  so on a machine without an accelerator ParallelDims.build_mesh
  (torchtitan/distributed/parallel_dims.py, `init_device_mesh(device_type, ...)`) asks
  for a CUDA mesh; we point that module's `device_type` at "cpu".
- GroupedExperts.forward (torchtitan/models/common/moe.py) casts the tokens and the
  expert weights to bfloat16 before torch._grouped_mm whatever the model's dtype; to
  compare at fp32 the experts here run the same three grouped matmuls without the cast.
  torch._grouped_mm itself runs on CPU (torch 2.13), fp32 and bf16; bf16 is about 3x
  slower there (--bf16-experts keeps the cast).
- torchtitan sets every FSDP module's gradient divide factor to 1.0 (it divides the
  loss by the global token count itself), and FSDP2 then reduce-scatters with
  ReduceOp.PREMUL_SUM(1.0), which gloo refuses ("Cannot use ReduceOp.PREMUL_SUM with
  Gloo"); we set `set_force_sum_reduction_for_comms(True)` on those modules, which
  reduce-scatters with SUM and divides by the same factor (1.0) afterwards.

Megatron-Core, the other candidate (pip megatron-core 0.16.1, no extras: its MoELayer
with moe_token_dispatcher_type="alltoall", local SequentialMLP experts,
use_cpu_initialization=True), does not run on CPU: MoEAlltoAllTokenDispatcher.__init__
(megatron/core/transformer/moe/token_dispatcher.py:445 in 0.16.1) creates
`torch.cuda.Stream()` ("torch.cuda.Stream requires CUDA support"), and its dispatch
copies the split sizes to the host under `torch.cuda.stream(...)` (_maybe_dtoh_and_synchronize,
lines 871-874); model_parallel_cuda_manual_seed (megatron/core/tensor_parallel/random.py)
asserts CUDA as well. It stays a candidate peer for a GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def build_config(a):
    from functools import partial

    from torch import nn
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import (
        make_gqa_config,
        make_moe_config,
        make_routed_experts_config,
        make_router_config,
    )
    from torchtitan.models.common.nn_modules import RMSNorm
    from torchtitan.models.qwen3.model import Qwen3Model, Qwen3TransformerBlock

    init = {"weight": partial(nn.init.normal_, std=0.02), "bias": nn.init.zeros_}
    experts_init = {k: init["weight"] for k in ("w1_EFD", "w2_EDF", "w3_EFD")}
    head_dim = a.hidden // a.heads

    def norm(dim):
        return RMSNorm.Config(normalized_shape=dim, eps=1e-5, param_init={"weight": nn.init.ones_})

    def layer():
        return Qwen3TransformerBlock.Config(
            attention_norm=norm(a.hidden),
            ffn_norm=norm(a.hidden),
            attention=make_gqa_config(
                dim=a.hidden,
                n_heads=a.heads,
                n_kv_heads=a.kv_heads,
                head_dim=head_dim,
                wqkv_param_init=init,
                wo_param_init=init,
                # the language-model backends are flex (compiled) and varlen (CUDA);
                # plain causal SDPA is what our generated script computes
                inner_attention=ScaledDotProductAttention.Config(),
                fuse_qkv=True,
                rope=CosSinRoPE.Config(dim=head_dim, max_seq_len=a.seq_len, theta=1e4),
            ),
            moe=make_moe_config(
                num_experts=a.experts,
                router=make_router_config(
                    dim=a.hidden,
                    num_experts=a.experts,
                    gate_param_init=init,
                    top_k=a.top_k,
                    score_func="softmax",
                    route_norm=True,  # softmax then renormalise the top k: Mixtral
                ),
                routed_experts=make_routed_experts_config(
                    dim=a.hidden,
                    hidden_dim=a.ffn,
                    num_experts=a.experts,
                    top_k=a.top_k,
                    param_init=experts_init,
                    comm_backend="standard",
                ),
            ),
        )

    return Qwen3Model.Config(
        vocab_size=a.vocab,
        dim=a.hidden,
        norm=norm(a.hidden),
        tok_embeddings=Embedding.Config(
            num_embeddings=a.vocab, embedding_dim=a.hidden, param_init=init
        ),
        lm_head=Linear.Config(in_features=a.hidden, out_features=a.vocab, param_init=init),
        layers=[layer() for _ in range(a.layers)],
    )


def fp32_experts_forward(self, x_RD, num_tokens_per_expert_E):
    """GroupedExperts.forward without its cast to bfloat16 (see the module docstring)."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor

    w1, w2, w3 = (
        w.to_local() if isinstance(w, DTensor) else w
        for w in (self.w1_EFD, self.w2_EDF, self.w3_EFD)
    )
    offs = num_tokens_per_expert_E.cumsum(0, dtype=torch.int32)
    h = F.silu(self._grouped_mm(A=x_RD, B_t=w1.transpose(-2, -1), offs=offs))
    h = h * self._grouped_mm(A=x_RD, B_t=w3.transpose(-2, -1), offs=offs)
    return self._grouped_mm(A=h, B_t=w2.transpose(-2, -1), offs=offs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ep", type=int, default=2)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=128)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=4, help="sequences per rank per step")
    ap.add_argument("--clip", type=float, default=0.0)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--bf16-experts", action="store_true", help="keep torchtitan's cast")
    a = ap.parse_args()

    try:
        import torchtitan  # noqa: F401
    except ImportError:  # `make bench` runs every file here with .venv's python
        print(f"skipped: no torchtitan for {sys.executable} (setup: benchmarks/moe_vs_peer.py)")
        return

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import torchtitan.distributed.parallel_dims as parallel_dims_module
    from torch.distributed.fsdp import FSDPModule

    parallel_dims_module.device_type = "cpu"  # not "cuda" (see the module docstring)

    from torchtitan.components.optimizer import default_adamw, register_moe_load_balancing_hook
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.models.common.moe import GroupedExperts
    from torchtitan.models.qwen3.parallelize import parallelize_qwen3

    if not a.bf16_experts:
        GroupedExperts.forward = fp32_experts_forward

    for k, v in dict(
        RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511"
    ).items():
        os.environ.setdefault(k, v)  # one process without torchrun: the serial model
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    parallelism = ParallelismConfig(expert_parallel_degree=a.ep, spmd_backend="partial_dtensor")
    training = TrainingConfig(
        local_batch_size=a.micro_batch,
        seq_len=a.seq_len,
        steps=a.steps,
        dtype="float32",
        mixed_precision_param="float32",
    )
    dist_utils.set_spmd_backend(parallelism.spmd_backend)
    dims = ParallelDims.from_config(parallelism, world)
    dims.build_mesh()
    dp = dims.get_mesh("batch").size() if dims.dp_enabled else 1

    class RuntimeConfig:  # what update_from_config reads off a Trainer.Config
        pass

    runtime = RuntimeConfig()
    runtime.parallelism, runtime.training = parallelism, training
    model_config = build_config(a)
    model_config.update_from_config(config=runtime)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = model_config.build()
    model = parallelize_qwen3(
        model,
        parallel_dims=dims,
        training=training,
        parallelism=parallelism,
        compile_config=CompileConfig(),
        ac_config=None,
        dump_folder="/tmp",
    )
    for module in model.modules():  # gloo has no PREMUL_SUM (see the module docstring)
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    optimizers = default_adamw(lr=3e-4).build(model_parts=[model])
    register_moe_load_balancing_hook(optimizers, [model], dims)

    if os.environ.get("MOE_PEER_VERBOSE"):
        block = model.layers["0"].moe.routed_experts
        print(
            f"rank {rank}: experts w1 local {tuple(block.inner_experts.w1_EFD.to_local().shape)}"
            f" dispatcher {type(block.token_dispatcher).__name__} ep_mesh {block.token_dispatcher.ep_mesh}"
        )
    times = []
    for step in range(a.steps):
        t0 = time.perf_counter()
        g = torch.Generator().manual_seed(step * world + rank)
        batch = torch.randint(a.vocab, (a.micro_batch, a.seq_len + 1), generator=g)
        logits = model(batch[:, :-1])
        # torchtitan turns off FSDP's gradient averaging and divides the summed loss by
        # the tokens of the global batch instead
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum")
        loss = loss / (a.micro_batch * a.seq_len * dp)
        loss.backward()
        if a.clip:
            dist_utils.clip_grad_norm_(list(model.parameters()), a.clip, ep_enabled=dims.ep_enabled)
        optimizers.step()
        optimizers.zero_grad()
        loss.item()
        times.append(time.perf_counter() - t0)
        if os.environ.get("MOE_PEER_VERBOSE") and rank == 0:
            print(
                f"step {step + 1}/{a.steps} | loss {dp * loss.item():.4f} | {1000 * times[-1]:.1f} ms"
            )
    if rank == 0:
        print(f"{1000 * statistics.median(times[a.warmup :]):.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
