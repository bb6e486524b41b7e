"""Published training runs against ``dslc explain``: step time and memory (issue 13).

Each row is a configuration its source ran, written as a plan in ``benchmarks/published/``,
with what the source measured. Step times the source gives as throughput are converted:
tokens/s per GPU → step = tokens per GPU per step / tokens/s; TFLOP/s per GPU → step =
the step's FLOPs in the source's own count / (TFLOP/s × GPUs). Memory is PyTorch's
max_memory_reserved where the source reports it (torchtitan), compared with the
estimate's ``reserved`` of the worst rank.

Stated values are the source's; what was inferred is in ``inferred``. Run
``python benchmarks/published.py`` for the table (``--markdown`` for the README's);
tests/test_published.py holds every row within 15 %.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from dslc.cost import memory as mem
from dslc.cost.flops import flops
from dslc.driver import load_paths
from dslc.report.explain import Explanation, explain

HERE = Path(__file__).parent / "published"
GiB = 2**30

# Megatron keeps only its 1/t shard of the inputs of the column-parallel linears under
# sequence parallelism and all-gathers them again in backward (Korthikanti et al. §4.2.2);
# the script dslc generates keeps the gathered input. Rows run by Megatron are estimated
# with Megatron's choice; the 2021-2022 runs also with its attention then (no flash
# attention: the scores are written, softmaxed and dropped out; Korthikanti's setting).
MEGATRON = mem.Settings(sp_inputs="shard")
MEGATRON_2022 = mem.PAPER
# torchtitan's loss is a cross-entropy over the whole fp32 logits (dslc's script runs it in
# chunks): its rows are estimated holding them whole
TITAN_LOSS = mem.Settings(loss="whole")


@dataclass(frozen=True)
class Run:
    plan: str  # the plan's name in benchmarks/published/<file>.plan
    file: str
    source: str  # paper and table, or repository, file and commit
    step: float  # seconds per step, as measured (or converted from what was measured: see how)
    how: str  # what the source states, and how ``step`` follows from it
    memory: float | None = None  # GiB per GPU, PyTorch's max reserved, worst rank
    inferred: str = ""  # what the source does not state and the plan assumes
    settings: mem.Settings = mem.DEFAULT
    not_held: str = ""  # why the row's time is shown but not held to 15 % (empty: it is; memory always is)
    fits: bool = True  # whether dslc's script would fit it too (the test holds the estimate to it)


KO = "Korthikanti et al. 2022, Reducing Activation Recomputation in Large Transformer Models, Tables 3 and 5"
KO_INF = "bf16 (the paper: mixed precision); dropout 0.1 (GPT-3 style); adam"
SC21 = "Narayanan et al. SC21, Table 1 (also the Megatron-LM README, images/cases_april2021.png)"
TITAN = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (torchtitan 9dec370), Tables 1 and 3"
TITAN_A100 = "pytorch/torchtitan docs/performance.md (parent of 877991a), 64 A100 80GB, FSDP2"
LLMC = "karpathy/llm.c scripts/run_gpt2_{124M,350M,774M,1558M}.sh (f1e2ace), the scripts' header comments"
TITAN_POWER = ("the source's H100s are 96 GB HBM2e parts capped at 500 W, whose peak it does not know ('between SXM and "
               "NVL'); it reports 33-39 % MFU against the SXM peak, where the 700 W SXM rows (llm.c, Megatron) run at 44-48 %")
MCORE = "NVIDIA/Megatron-LM megatron/core/transformer/moe/README.md (0b981f9): 438 TFLOP/s, Mixtral 8x7B reference mapping"


_PLANS: dict[str, object] = {}


def _plan(file: str, name: str):
    if file not in _PLANS:
        result = load_paths([HERE / f"{file}.plan"], check=False)
        _PLANS[file] = {p.name: p for p in result.plans}
    return _PLANS[file][name]


def tflops_step(plan_name: str, file: str, tflops: float, hardware: bool = False) -> float:
    """Seconds per step of a run reported as TFLOP/s per GPU, its FLOPs counted as the
    sources count them, the attention square whole (72·B·s·l·h²(1 + s/(6h) + V/(12lh)) for
    model FLOPs, 96·… with full recompute for SC21's hardware count), not causal as dslc's
    MFU counts them."""
    plan = _plan(file, plan_name)
    f = flops(plan, causal=False)
    return (f.hardware if hardware else f.model) / (tflops * 1e12 * plan.world_size)


RUNS: tuple[Run, ...] = (
    Run("ko_22b_selective_sp", "megatron_a100", KO, 1.10, "Table 5: 1.10 s per iteration (sequence parallel + selective recompute)",
        inferred=KO_INF, settings=MEGATRON_2022),
    Run("ko_22b_full", "megatron_a100", KO, 1.42, "Table 5: 1.42 s per iteration (full recompute, tensor parallel only)",
        inferred=KO_INF, settings=MEGATRON_2022),
    Run("ko_175b_selective_sp", "megatron_a100", KO, 13.75, "Table 5: 13.75 s; 3 interleaved stages (Table 3's note)",
        inferred=KO_INF + "; pp over InfiniBand, tp inside a node", settings=MEGATRON_2022),
    Run("ko_175b_full", "megatron_a100", KO, 18.13, "Table 5: 18.13 s (full recompute)",
        inferred=KO_INF + "; the full-recompute baseline without sequence parallelism", settings=MEGATRON_2022),
    Run("ko_530b_selective_sp", "megatron_a100", KO, 37.83, "Table 5: 37.83 s; 3 interleaved stages",
        inferred=KO_INF, settings=MEGATRON_2022),
    Run("ko_1t_selective_sp", "megatron_a100", KO, 71.49, "Table 5: 71.49 s",
        inferred=KO_INF + "; 1F1B (interleaving is stated for 175B and 530B only)", settings=MEGATRON_2022),
    Run("sc21_1_7b", "megatron_a100", SC21, tflops_step("sc21_1_7b", "megatron_a100", 137, hardware=True),
        "137 TFLOP/s per GPU counting the recompute forward (96·B·s·l·h²(…)): step = FLOPs / (137e12 × 32)",
        inferred="full recompute (the paper's FLOP count); micro-batch 16 (not stated); no ZeRO", settings=MEGATRON_2022),
    Run("sc21_18b", "megatron_a100", SC21, tflops_step("sc21_18b", "megatron_a100", 135, hardware=True),
        "135 TFLOP/s per GPU with recompute FLOPs: step = FLOPs / (135e12 × 256)",
        inferred="full recompute; micro-batch 1 (not stated); tp 8, dp 32 (secondary transcriptions)", settings=MEGATRON_2022),
    Run("titan_8b_fsdp8", "torchtitan", TITAN, 2 * 8192 / 5762, "Table 1: FSDP 5,762 tokens/s per GPU, 82.4 GiB; local batch 2",
        memory=82.4, inferred="sequence 8192 (the config's default); selective AC is per-op (the config's default); "
        "the GPUs are 96 GB HBM2e at 500 W: peak left at the SXM figure, as torchtitan's MFU does",
        not_held=TITAN_POWER, settings=TITAN_LOSS),
    Run("titan_8b_fsdp128", "torchtitan", TITAN, 2 * 8192 / 5605, "Table 3: FSDP 5,605 tokens/s per GPU, 67.0 GiB",
        memory=67.0, inferred="as titan_8b_fsdp8; 16 nodes, 400 Gb/s per GPU between them", not_held=TITAN_POWER,
        settings=TITAN_LOSS),
    Run("titan_a100_8b_ops", "torchtitan", TITAN_A100, 8192 / 2973, "8B, batch 1, selective op: 2,973 words/s per GPU (58.2 % MFU)",
        inferred="sequence 8192 (Llama 3's default then); bf16"),
    Run("titan_a100_70b_full", "torchtitan", TITAN_A100, 8192 / 331, "70B, batch 1, full: 331 words/s per GPU (51.7 % MFU)",
        inferred="sequence 8192; bf16"),
    Run("titan_a100_13b_none", "torchtitan", TITAN_A100, 2 * 4096 / 2162, "Llama 2 13B, batch 2, no AC: 2,162 words/s per GPU (61.1 % MFU)",
        inferred="sequence 4096 (stated: Llama 2's default); bf16; 200 Gb/s per GPU between nodes",
        not_held="communication-bound (26 GB of ZeRO-3 gathers and reduce-scatters per step over the network) on a network "
        "the source does not describe, with gradients reduced in fp32 (FSDP2's default there), which a plan cannot state"),
    Run("llmc_124m", "llmc", LLMC, 0.300, "8X A100 80GB SXM, '~300ms/iter', -b 64 -t 1024 -d 524288",
        inferred="approximate ('~'); vocab padded to 50304 as llm.c does",
        not_held="llm.c fuses its layernorm, residual, GELU and classifier+loss kernels by hand; the estimate charges the "
        "unfused elementwise work of the script dslc generates, which at hidden 768 is a third of the step"),
    Run("llmc_350m", "llmc", LLMC, 0.820, "'~820ms/iter', -b 64 -d 524288",
        inferred="approximate; llm.c fuses the classifier and loss, and dslc's script runs its loss in chunks: both fit"),
    Run("llmc_774m", "llmc", LLMC, 1.7, "'~1.7s/iter', -b 32 -d 524288 (2 micro-batches accumulated)", inferred="approximate"),
    Run("llmc_1558m", "llmc", LLMC, 2.80, "8X H100 80GB SXM, 'steps in 2.80s/iter', -b 16 -d 1048576 (8 micro-batches)"),
    Run("mcore_mixtral_8x7b", "megatron_moe", MCORE, tflops_step("mcore_mixtral_8x7b", "megatron_moe", 438),
        "438 TFLOP/s per GPU (MCore v0.8): step = model FLOPs / (438e12 × 64)",
        inferred="that 438 TFLOP/s is the reference mapping's (the README puts them side by side); no recompute; "
        "ZeRO-1 (Megatron's distributed optimizer); expert-data-parallel 2 over InfiniBand", settings=MEGATRON),
)


@dataclass(frozen=True)
class Compared:
    run: Run
    ex: Explanation

    @property
    def step(self) -> float:
        return self.ex.timing.step

    @property
    def memory(self) -> float:
        return max(s.reserved for s in self.ex.memory) / GiB

    @property
    def step_error(self) -> float:
        return self.step / self.run.step - 1

    @property
    def memory_error(self) -> float | None:
        return self.memory / self.run.memory - 1 if self.run.memory else None


def compare(run: Run) -> Compared:
    return Compared(run, explain(_plan(run.file, run.plan), run.settings))


def _short(source: str) -> str:
    """A repository's name, or a paper's authors and year."""
    first = source.split()[0]
    return first if "/" in first else source.split(",")[0]


def table(markdown: bool = False) -> str:
    rows = [compare(r) for r in RUNS]
    head = ["run", "GPUs", "published step", "estimated", "error", "time held", "published memory", "estimated", "error", "source"]
    lines = []
    for c in rows:
        r, p = c.run, c.ex.plan
        mem_cells = [f"{r.memory:.1f} GiB", f"{c.memory:.1f} GiB", f"{c.memory_error:+.1%}"] if r.memory else ["-", f"{c.memory:.1f} GiB", "-"]
        lines.append([r.plan, str(p.world_size), f"{r.step:.3g} s", f"{c.step:.3g} s", f"{c.step_error:+.1%}",
                      "no" if r.not_held else "yes", *mem_cells, _short(r.source)])
    if markdown:
        return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(x) + " |" for x in lines])
    widths = [max(len(x[i]) for x in [head] + lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(x, widths)) for x in [head] + lines)


if __name__ == "__main__":
    print(table(markdown="--markdown" in sys.argv))
