"""The view of the cluster launchers beside launch.sh: ``sbatch.sh`` (Slurm) and
``trainjob.yaml`` (Kubernetes, a Kubeflow Trainer v2 ``TrainJob``).

Both take the job's shape from the cluster (whole nodes, one process per GPU) and start
launch.sh's torchrun; what a site must fill in (partition, account, image, volumes) is
left to the user, marked EDIT. Every value here is a number, a validated name or a quoted
literal: shell words that name plain paths or are double-quoted literals, YAML scalars written as
JSON strings.
"""

from __future__ import annotations

import json
import posixpath
import re

from ..ir import Plan
from ..reading import within
from .literals import comment_safe

# The Kubeflow Trainer v2 release whose TrainJob CRD the manifest is written against
# (tests/fixtures/kubeflow/ holds that CRD), and its runtime for torchrun.
TRAINER_RELEASE = "v2.3.0"
TORCH_RUNTIME = "torch-distributed"
# Where the pod finds each thing, fixed, never a path from the plan (docs/security.md):
# the image holds the project (the folder the stamp's command runs in) at IMAGE_ROOT, the
# working directory of the runtime's pytorch/pytorch images; the data volume is mounted
# read-only at POD_DATA, the Hugging Face checkpoint the weights start from read-only at
# POD_INIT and the checkpoint volume at POD_CHECKPOINTS, and train.py is told each
# (--data-root, --init-hf, --checkpoint-dir). No mount lies in another, or in IMAGE_ROOT.
IMAGE_ROOT = "/workspace"
POD_DATA = "/data"
POD_INIT = "/init"
POD_CHECKPOINTS = "/checkpoints"
MASTER_PORT = 29500  # torchrun's default; the Trainer's PET_MASTER_PORT too
# A TrainJob's name is an RFC 1035 label (the CRD's rule); the runtime names the first
# pod <name>-node-0-0, which must be a label too (at most 63 characters).
_K8S_NAME_MAX = 63 - len("-node-0-0")
# A path the launchers may write into a shell word or a YAML string as it is.
_PLAIN_PATH = re.compile(r"[A-Za-z0-9._/][A-Za-z0-9._/-]*\Z")


def launcher_view(plan: Plan, name: str, out_dir: str, reads_files: bool) -> dict:
    """``name``: the validated plan name; ``out_dir``: the output root as the stamp names
    it (relative to the project, or absolute); ``reads_files``: whether the script reads
    data files."""
    gpus = plan.cluster.device.name != "cpu"
    folder = posixpath.join(out_dir, name)
    return {
        "gpus": gpus,
        "cpus_per_node": 0 if gpus else plan.cluster.gpus_per_node,  # gloo: one CPU per rank
        "processes_are": "GPUs" if gpus else "CPU processes",  # what a node's processes run on
        # where sbatch.sh looks for this folder, from the folder sbatch was called in
        "slurm_folders": _slurm_folders(name, folder),
        "generated_folder": folder if _PLAIN_PATH.match(folder) else name,  # for messages and comments only
        **_kubernetes(plan, name, out_dir, reads_files),
    }


def _slurm_folders(name: str, folder: str) -> list[str]:
    """Shell words, in the order sbatch.sh tries them: the submit folder itself (sbatch
    run inside the generated folder), the plan's folder in it (run in the output root),
    and the output folder from the project's root (run where the stamp's command runs),
    double-quoted where it is not a plain path (``-o "out put"``; ``$``, backquotes, ``"``
    and backslashes escaped: a literal, which shellcheck does not take for an expansion
    left unexpanded, as it would a single-quoted ``$(x)``)."""
    word = folder if _PLAIN_PATH.match(folder) else '"' + re.sub(r'([$`"\\])', r"\\\1", folder) + '"'
    words = ['"$SUBMIT"', f'"$SUBMIT"/{name}', word if folder.startswith("/") else f'"$SUBMIT"/{word}']
    return list(dict.fromkeys(words))


def _kubernetes(plan: Plan, name: str, out_dir: str, reads_files: bool) -> dict:
    program, whole = in_image(out_dir, name)
    ck = plan.train.checkpoint
    # train.py's flags for the volumes below: each mounted at its fixed path
    init = plan.train.init is not None
    args = ([f"--data-root={POD_DATA}"] * reads_files + [f"--init-hf={POD_INIT}"] * init
            + [f"--checkpoint-dir={POD_CHECKPOINTS}"] * bool(ck))
    return {
        "k8s_name": k8s_name(name),  # for comments
        "k8s_name_yaml": _yaml(k8s_name(name)),  # quoted: a plan named yes or null stays a string
        "trainer_release": TRAINER_RELEASE,
        "torch_runtime": TORCH_RUNTIME,
        "image_root": IMAGE_ROOT,
        "k8s_image": _yaml(f"registry.example.com/EDIT/{k8s_name(name)}:latest"),
        "k8s_train_py": _yaml(posixpath.join(program, "train.py")),
        # what the image must hold there, for the comment
        # what the image must hold, for the comment: the project, or this folder alone
        "k8s_image_holds": f"the project (the folder the command above runs in) at {IMAGE_ROOT}" if whole else f"this folder at {comment_safe(program)}",
        "k8s_args": [_yaml(a) for a in args],
        "k8s_volumes": [f"{POD_DATA}: the data files, read-only"] * reads_files
        + [f"{POD_INIT}: the Hugging Face checkpoint the weights start from, read-only"] * init
        + [f"{POD_CHECKPOINTS}: the checkpoints, on a volume every pod sees"] * bool(ck),
        "k8s_data_mount": _yaml(POD_DATA) if reads_files else None,
        "k8s_init_mount": _yaml(POD_INIT) if init else None,
        "k8s_checkpoint_mount": _yaml(POD_CHECKPOINTS) if ck else None,
        "master_port": MASTER_PORT,
    }


def in_image(out_dir: str, name: str) -> tuple[str, bool]:
    """The generated folder in the pod, and whether it is there as part of the project:
    where the project's copy at IMAGE_ROOT holds it (any name, spaces included), or
    IMAGE_ROOT/<plan> when the output shares no folder with the plan (``out_dir``
    absolute). Never outside IMAGE_ROOT, never IMAGE_ROOT itself."""
    folder = posixpath.join(IMAGE_ROOT, posixpath.normpath(posixpath.join(out_dir, name)))
    if posixpath.isabs(out_dir) or not within(folder, IMAGE_ROOT) or folder == IMAGE_ROOT:
        return posixpath.join(IMAGE_ROOT, name), False
    return folder, True


def k8s_name(name: str) -> str:
    """The plan's name as a Kubernetes object name (an RFC 1035 label: lower case
    letters, digits and ``-``, starting with a letter), short enough for its pods'."""
    label = re.sub(r"-+", "-", name.lower().replace("_", "-")).strip("-")
    if not label[:1].isalpha():
        label = "plan-" + label
    return label[:_K8S_NAME_MAX].rstrip("-")


def _yaml(text: str) -> str:
    """A YAML double-quoted scalar (a JSON string, which YAML reads the same)."""
    return json.dumps(text, ensure_ascii=True)
