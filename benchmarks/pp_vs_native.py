"""Generated pipeline-parallel step vs torch.distributed.pipelining, CPU + gloo.

    .venv/bin/python benchmarks/pp_vs_native.py [--pp 2] [--steps 20] [--repeats 3]
        [--hidden 128 --seq-len 128 --micro-batch 2 --microbatches 8] [--schedule S]

For each schedule, both sides run under torchrun with pp processes, the same GPT-2
(untied head, so the native stages need no shared weight), the same layers per
stage, micro-batch size and number of micro-batches, and the same work per step
(the pipeline's forwards and backwards, cross-entropy on the last stage, the loss
summed to every rank, AdamW):
- generated: the script dslc emits for a `mesh { pp = N }` plan with that schedule
  (its own action list, batched isend/irecv, one interpreter loop);
- native: torch.distributed.pipelining's PipelineStage on the same stage modules,
  driven by ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B, or, for the V-shaped
  schedules, ScheduleZBVZeroBubble and ScheduleDualPipeV (where the installed torch has
  them; otherwise a line says the schedule is skipped). Both sides place the chunks as
  the schedule does: interleaved (rank r holds chunks r, r + pp, ...) or in a V (rank r
  holds chunks r and 2·pp − 1 − r, so rank 0 holds the embedding and the loss), each
  chunk with the generated plan's layers (its layers_per_stage).
A run's time is the median step after warm-up. The two sides alternate --repeats times;
the line per schedule gives each side's median ms/step over the repeats with its range
(min-max), and the median of the per-repeat ratios generated / native with its range
(target <= 0.9; <= 1.0 for interleaved_1f1b and dualpipe_v, issue 44's, whose F&B pairs
overlap their messages with their computes). On a small, shared CPU machine the per-repeat ratios spread by about
+-10 %: compare medians over several repeats.
The default size is compute-bound (the busiest rank computes almost the whole step);
a small one (--hidden 32 --seq-len 32 --micro-batch 1 --microbatches 16) weighs the
runtimes' own overhead and the latency of their messages.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from common import ENV, adamw, compared, compile_plan, generated_step_ms, reference_block, run

MODEL = {"layers": 4, "hidden": 128, "heads": 4, "vocab": 512, "seq_len": 128}
MICRO_BATCH, MICROBATCHES = 2, 8
SCHEDULES = {  # dslc schedule -> (native schedule class, virtual stages)
    "gpipe": ("ScheduleGPipe", 1),
    "1f1b": ("Schedule1F1B", 1),
    "interleaved_1f1b": ("ScheduleInterleaved1F1B", 2),
    "zb_v": ("ScheduleZBVZeroBubble", 2),  # torch >= 2.6; split backward, V placement
    "dualpipe_v": ("ScheduleDualPipeV", 2),  # torch >= 2.8; microbatches >= 2·pp
}
V_SHAPED = ("zb_v", "dualpipe_v")
PLAN = """
cluster cpus {{ nodes = 1; gpus_per_node = {pp}; device = cpu
    link shm {{ scope = node; bandwidth = 10 GB/s; latency = 10 us }} }}
plan bench_pp {{
    model gpt2 {{
        layers = {layers}; hidden = {hidden}; heads = {heads}; vocab = {vocab}; seq_len = {seq_len}
        tie_embeddings = false
    }}
    cluster = cpus
    mesh {{ pp = {pp} on shm }}
    pipeline {{ schedule = {schedule}; virtual_stages = {v}; microbatches = {m} }}
    train {{
        steps = 100; micro_batch = {mb}; global_batch = {batch}; precision = fp32
        grad_clip = 0; optimizer adamw {{ lr = 3e-4 }}; lr_schedule constant {{ warmup = 0 }}
        data = synthetic
    }}
}}
"""


def native_worker(schedule: str, steps: int, warmup: int, split: list[int]) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed import pipelining

    dist.init_process_group("gloo")
    rank, pp = dist.get_rank(), dist.get_world_size()
    cls, v = SCHEDULES[schedule]
    h, T, V = MODEL["hidden"], MODEL["seq_len"], MODEL["vocab"]
    n_stages = pp * v
    assert len(split) == n_stages and sum(split) == MODEL["layers"], split

    class Stage(nn.Module):
        def __init__(self, index):
            super().__init__()
            self.first, self.last = index == 0, index == n_stages - 1
            if self.first:
                self.wte, self.wpe = nn.Embedding(V, h), nn.Embedding(T, h)
            self.blocks = nn.ModuleList(
                reference_block(h, MODEL["heads"], T) for _ in range(split[index])
            )
            if self.last:
                self.ln_f, self.head = nn.LayerNorm(h), nn.Linear(h, V, bias=False)

        def forward(self, x):
            if self.first:
                x = self.wte(x) + self.wpe.weight[:T]
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln_f(x)) if self.last else x

    def loss_fn(logits, targets):
        return F.cross_entropy(logits.float().view(-1, V), targets.reshape(-1))

    torch.manual_seed(0)
    v_shape = schedule in V_SHAPED
    # dslc's placement (dslc/chunks.py), which torch's schedules expect too: interleaved,
    # or in a V (generate_stage_to_rank_mapping(style="v"): rank r runs r and 2p − 1 − r)
    indices = [rank, 2 * pp - 1 - rank] if v_shape else [c * pp + rank for c in range(v)]
    last_rank = 0 if v_shape else pp - 1  # the rank of the head and the loss
    modules = [Stage(i) for i in indices]
    stages = [
        pipelining.PipelineStage(mod, i, n_stages, torch.device("cpu"))
        for mod, i in zip(modules, indices)
    ]
    sched_cls = getattr(pipelining, cls)
    sched = sched_cls(stages if v > 1 else stages[0], MICROBATCHES, loss_fn=loss_fn)
    opt = adamw(p for mod in modules for p in mod.parameters())
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        g = torch.Generator().manual_seed(step)
        batch = torch.randint(V, (MICRO_BATCH * MICROBATCHES, T + 1), generator=g)
        losses = []
        if rank == 0:
            target = batch[:, 1:] if rank == last_rank else None
            sched.step(batch[:, :-1], target=target, losses=losses)
        elif rank == last_rank:
            sched.step(target=batch[:, 1:], losses=losses)
        else:
            sched.step()
        loss = torch.stack(losses).mean() if losses else torch.zeros(())
        dist.all_reduce(loss)  # the logged loss, as the generated script does
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(1000 * statistics.median(times[warmup:]))
    dist.destroy_process_group()


def plan_split(text: str) -> tuple[int, ...]:
    """The layers of each model chunk of the plan in `text`, as the generated script has them."""
    from dslc.driver import load_text  # on the path once compile_plan has run

    return load_text(text, "bench.plan").program.plans[0].stage_layers()


def main() -> None:
    global MICRO_BATCH, MICROBATCHES
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--native-worker", choices=sorted(SCHEDULES), help=argparse.SUPPRESS)
    ap.add_argument("--hidden", type=int, default=MODEL["hidden"])
    ap.add_argument("--seq-len", type=int, default=MODEL["seq_len"])
    ap.add_argument("--micro-batch", type=int, default=MICRO_BATCH)
    ap.add_argument("--microbatches", type=int, default=MICROBATCHES)
    ap.add_argument("--split", help=argparse.SUPPRESS)  # the plan's layers per chunk
    ap.add_argument("--schedule", choices=sorted(SCHEDULES), help="run only this one")
    args = ap.parse_args()
    MODEL["hidden"], MODEL["seq_len"] = args.hidden, args.seq_len
    MICRO_BATCH, MICROBATCHES = args.micro_batch, args.microbatches
    if args.native_worker:
        split = [int(n) for n in args.split.split(",")]
        native_worker(args.native_worker, args.steps, args.warmup, split)
        return
    probe = "import torch.distributed.pipelining as p; print(*dir(p))"  # torch not in this process
    native_classes = set(run(1, "-c", probe).split())

    print(f"pp = {args.pp} processes, CPU, gloo, fp32, OMP_NUM_THREADS={ENV['OMP_NUM_THREADS']}")
    print(f"gpt2 {MODEL}, {MICROBATCHES} micro-batches of {MICRO_BATCH}")
    with tempfile.TemporaryDirectory() as tmp:
        for schedule, (cls, v) in SCHEDULES.items():
            if args.schedule and schedule != args.schedule:
                continue
            if cls not in native_classes:
                print(f"{schedule:17s} skipped: this torch has no pipelining.{cls}")
                continue
            text = PLAN.format(
                pp=args.pp,
                schedule=schedule,
                v=v,
                m=MICROBATCHES,
                mb=MICRO_BATCH,
                batch=MICRO_BATCH * MICROBATCHES,
                **MODEL,
            )
            script = compile_plan(text, Path(tmp) / schedule)
            split = ",".join(map(str, plan_split(text)))
            flags = ["--native-worker", schedule, "--split", split, "--steps", str(args.steps)]
            flags += ["--warmup", str(args.warmup), "--hidden", str(args.hidden)]
            flags += ["--seq-len", str(args.seq_len), "--micro-batch", str(args.micro_batch)]
            flags += ["--microbatches", str(args.microbatches)]
            gens, natives = [], []
            for _ in range(args.repeats):
                gens.append(generated_step_ms(script, args.pp, args.steps, args.warmup))
                natives.append(float(run(args.pp, __file__, *flags).split()[-1]))
            target = "<= 1.0" if schedule in ("interleaved_1f1b", "dualpipe_v") else "<= 0.9"
            print(f"{schedule:17s}", compared("generated", gens, cls, natives, target=target))


if __name__ == "__main__":
    main()
