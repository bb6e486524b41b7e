"""The view of the cluster launchers beside launch.sh: ``sbatch.sh`` (Slurm) and
``trainjob.yaml`` (Kubernetes, a Kubeflow Trainer v2 ``TrainJob``).

Both take the job's shape from the cluster (whole nodes, one process per GPU) and start
launch.sh's torchrun; what a site must fill in (partition, account, image, volumes) is
left to the user, marked EDIT. Every value here is a number, a validated name or a quoted
literal: shell words that only name plain paths, YAML scalars written as JSON strings.
"""

from __future__ import annotations

import json
import posixpath
import re

from ..ir import Plan

# The Kubeflow Trainer v2 release whose TrainJob CRD the manifest is written against
# (tests/fixtures/kubeflow/ holds that CRD), and its runtime for torchrun.
TRAINER_RELEASE = "v2.3.0"
TORCH_RUNTIME = "torch-distributed"
# Where the image holds this repository: the working directory of pytorch/pytorch images,
# which the torch-distributed runtime uses.
IMAGE_ROOT = "/workspace"
MASTER_PORT = 29500  # torchrun's default; the Trainer's PET_MASTER_PORT too
# A TrainJob's name is an RFC 1035 label (the CRD's rule); the runtime names the first
# pod <name>-node-0-0, which must be a label too (at most 63 characters).
_K8S_NAME_MAX = 63 - len("-node-0-0")
# A path the launchers may write into a shell word or a YAML string as it is.
_PLAIN_PATH = re.compile(r"[A-Za-z0-9._/][A-Za-z0-9._/-]*\Z")


def launcher_view(plan: Plan, name: str, out_dir: str, data_paths: list[str]) -> dict:
    """``name``: the validated plan name; ``out_dir``: the output root as the stamp names
    it (relative to the project, or absolute); ``data_paths``: the data files relative
    to the generated script (or absolute)."""
    gpus = plan.cluster.device.name != "cpu"
    folder = posixpath.join(out_dir, name) if _PLAIN_PATH.match(out_dir) else None
    return {
        "gpus": gpus,
        "cpus_per_node": 0 if gpus else plan.cluster.gpus_per_node,  # gloo: one CPU per rank
        "processes_are": "GPUs" if gpus else "CPU processes",  # what a node's processes run on
        # where sbatch.sh looks for this folder, from the folder sbatch was called in
        "slurm_folders": _slurm_folders(name, folder),
        "generated_folder": folder or name,  # for messages and comments only
        **_kubernetes(plan, name, folder, data_paths),
    }


def _slurm_folders(name: str, folder: str | None) -> list[str]:
    """Shell words, in the order sbatch.sh tries them: the submit folder itself (sbatch
    run inside the generated folder), the plan's folder in it (run in the output root),
    and the output folder from the project's root (run where the stamp's command runs)."""
    words = ['"$SUBMIT"', f'"$SUBMIT"/{name}']
    if folder is not None:
        words.append(folder if folder.startswith("/") else f'"$SUBMIT"/{folder}')
    return list(dict.fromkeys(words))


def _kubernetes(plan: Plan, name: str, folder: str | None, data_paths: list[str]) -> dict:
    in_image = posixpath.join(IMAGE_ROOT, folder or name)
    mounts = [posixpath.dirname(posixpath.normpath(posixpath.join(in_image, p))) for p in data_paths]
    ck = plan.train.checkpoint
    return {
        "k8s_name": k8s_name(name),  # for comments
        "k8s_name_yaml": _yaml(k8s_name(name)),  # quoted: a plan named yes or null stays a string
        "trainer_release": TRAINER_RELEASE,
        "torch_runtime": TORCH_RUNTIME,
        "image_root": IMAGE_ROOT,
        "k8s_image": _yaml(f"registry.example.com/EDIT/{k8s_name(name)}:latest"),
        "k8s_train_py": _yaml(posixpath.join(in_image, "train.py")),
        # one volume for every data file: the folder that holds them all
        "k8s_data_mount": _yaml(posixpath.commonpath(mounts)) if mounts else None,
        # the checkpoint folder is relative to the working directory, the image's
        "k8s_checkpoint_mount": _yaml(posixpath.normpath(posixpath.join(IMAGE_ROOT, ck.dir))) if ck else None,
        "master_port": MASTER_PORT,
    }


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
