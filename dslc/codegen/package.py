"""The files of a plan's output folder: which modules a plan's package has, what each
holds, and which are the same in every plan.

:data:`MODULES` is every module dslc may write (and so may remove when a plan no longer
needs it), in import order: each imports only modules after it (docs/architecture.md
draws them). :func:`package` picks a plan's files from the view model's flags; its
descriptions go into the folder's README.md.
"""

from __future__ import annotations

MODULES = (
    "train.py", "checkpoint.py", "checkpoint_files.py", "data.py", "hf_init.py", "hf.py", "optimizer.py",
    "data_parallel.py", "host_optimizer.py", "pipeline_parallel.py", "model.py", "moe.py", "expert_parallel.py",
    "context_parallel.py", "tensor_parallel.py", "layers.py", "activation_offload.py", "zero_bubble.py", "float8.py", "watchdog.py", "health.py", "mesh.py", "meter.py", "plan.py", "utils.py",
)
# modules whose text does not depend on the plan: the same bytes in every plan that has
# them, so their stamp names no plan
SHARED = frozenset({"health.py", "mesh.py", "utils.py", "watchdog.py"})


def package(view: dict) -> list[tuple[str, str]]:
    """The files of the plan's output folder beside train.py, each with what it holds (the
    folder's README.md): only the modules the plan needs, in the order a reader goes down
    from the model to the kernels and the run's services."""
    zero = view["zero_stage"]
    dp = ("dp: ZeRO-3's fully sharded units (FSDP)" if zero == 3
          else f"dp: gradient buckets reduce-scattered, ZeRO-{zero}" if zero
          else "dp: gradient buckets all-reduced during backward")
    rows = [
        ("plan.py", "the model's, the mesh's, the gradients' and the batch's settings", True),
        ("model.py", "the transformer, and init_weights: the same weights in every layout", True),
        ("layers.py", "its parameters and leaf layers", True),
        ("moe.py", "the mixture-of-experts layer: router, experts, router losses", view["moe"]),
        ("mesh.py", "process groups and the collectives", view["distributed"]),
        ("health.py", "the stragglers named at log steps; --health-check before the first step", view["distributed"]),
        ("tensor_parallel.py", "tp" + (" and sp" if view["sequence_parallel"] else "") + ": Megatron's parallel layers", view["tensor_parallel"]),
        ("context_parallel.py", "cp: " + ("ring attention" if view["ring"] else "Ulysses' all-to-alls"), view["context_parallel"]),
        ("expert_parallel.py", "ep: GShard's dispatch and combine", view["expert_parallel"]),
        ("pipeline_parallel.py", f"pp: the {view.get('pp_schedule')} schedule's runner and messages", view["pipeline_parallel"]),
        ("activation_offload.py", "what each block saves for backward, in host memory until then", view["offload_activations"]),
        ("zero_bubble.py", "zb_h1's backward, split into B and W", view["split_backward"]),
        ("float8.py", f"float8 ({view.get('float8_recipe_name')}): the linears' GEMMs through torchao, their scales", view["float8"]),
        ("data_parallel.py", dp, view["data_parallel"]),
        ("optimizer.py", "the optimizer, learning rate and gradient norm", True),
        ("host_optimizer.py", "offload: the optimizer's state in host memory, stepped there; the copies", view["offload_optimizer"]),
        ("data.py", "the data files, cut into each step's batch", view["reads_files"]),
        ("checkpoint.py", "checkpoints that any layout resumes", view["checkpoint"]),
        ("checkpoint_files.py", "a checkpoint's files: summed when saved, checked before a load reads them", view["checkpoint"]),
        ("hf_init.py", "init = hf(...): the Hugging Face checkpoint the weights start from, read and checked", view["hf_init"]),
        ("hf.py", "Hugging Face checkpoints: --export-hf (each rank its part), init = hf(...); --dump-weights", True),
        ("meter.py", "--measure" + (" and --trace" if view["pipeline_parallel"] else "") + ": bytes sent and held; --tensorboard, --wandb", True),
        ("watchdog.py", "a hang or a rank's exception: each rank's state in --run-dir, for dslc doctor", view["distributed"]),
        ("utils.py", "one-line errors and seeded random generators", True),
        ("launch.sh", "torchrun for one or more nodes" if view["distributed"] else "python train.py", True),
        ("sbatch.sh", "Slurm: sbatch sbatch.sh runs launch.sh on each node; edit its #SBATCH lines at the top", True),
        ("trainjob.yaml", "Kubernetes: a Kubeflow Trainer TrainJob; edit its image and volumes (EDIT)", True),
        ("schedule.json", "the pipeline's action lists, which run_schedule executes", view["pipeline_parallel"]),
    ]
    return [(name, what) for name, what, needed in rows if needed]
