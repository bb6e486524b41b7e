"""The cluster launchers beside launch.sh (issue 30): sbatch.sh and trainjob.yaml.

sbatch.sh runs under bash with fake ``srun``, ``scontrol`` and ``torchrun`` on PATH that
record what they were asked to run; trainjob.yaml is validated against the TrainJob CRD
of Kubeflow Trainer's release (tests/fixtures/kubeflow/README.md says which)."""

from __future__ import annotations

import ast
import copy
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from dslc import codegen
from dslc.codegen.launchers import in_image, k8s_name
from dslc.driver import load_paths, load_text
from dslc.reading import within

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "tests" / "fixtures" / "kubeflow" / "trainer.kubeflow.org_trainjobs.yaml"
HOSTS = ["node-a", "node-b", "node-c", "node-d", "node-e", "node-f", "node-g", "node-h"]


def _plans() -> dict:
    return {p.name: p for p in load_paths(sorted((ROOT / "plans").glob("*.plan"))).program.plans}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """Every plan of plans/ compiled into a copy of the repository's layout: plans/ and
    generated/ side by side, as `dslc compile plans/` writes them."""
    root = tmp_path_factory.mktemp("repo")
    for plan in _plans().values():
        moved = dataclasses.replace(plan, file=str(root / "plans" / Path(plan.file).name))
        codegen.write(moved, root / "generated")
    return root


# --------------------------------------------------------------------------------------
# sbatch.sh under fake Slurm

RECORDER = """#!{python}
import json, os, sys
keep = ("NNODES", "NPROC_PER_NODE", "MASTER_ADDR", "MASTER_PORT", "RDZV_ID", "LOG_DIR",
        "SLURM_NODEID", "SLURM_PROCID", "SLURMD_NODENAME", "OMP_NUM_THREADS")
with open(os.environ["RECORD"], "a") as f:
    f.write(json.dumps({{"tool": "{tool}", "argv": sys.argv[1:],
                        "env": {{k: os.environ[k] for k in keep if k in os.environ}}}}) + "\\n")
"""

# srun: runs its command once per node of the job, as Slurm would, with each task's ids
FAKE_SRUN = """#!/usr/bin/env bash
{record} "$@"
while [ "${{1#--}}" != "$1" ]; do shift; done
i=0
for host in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
    SLURM_NODEID=$i SLURM_PROCID=$i SLURMD_NODENAME=$host "$@" || exit $?
    i=$((i + 1))
done
"""

FAKE_SCONTROL = """#!/usr/bin/env bash
[ "$1 $2" = "show hostnames" ] || exit 1
for host in $FAKE_HOSTS; do echo "$host"; done
"""


def _fake_slurm(tmp_path: Path) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("torchrun", "python3", "srun-record"):
        (bindir / tool).write_text(RECORDER.format(python=sys.executable, tool=tool))
    (bindir / "srun").write_text(FAKE_SRUN.format(record=bindir / "srun-record"))
    (bindir / "scontrol").write_text(FAKE_SCONTROL)
    for f in bindir.iterdir():
        f.chmod(0o755)
    return bindir


def _sbatch(repo: Path, tmp_path: Path, name: str, submit: Path, *args: str, nodes: int | None = None,
            folder: Path | None = None, **extra: str):
    """Run generated/<name>/sbatch.sh (or ``folder``'s) as sbatch would (a copy in a spool
    folder, the job's SLURM_* variables) from ``submit``; what srun, torchrun and python
    were asked."""
    bindir = _fake_slurm(tmp_path)
    spool = tmp_path / "spool"
    spool.mkdir()
    script = spool / "slurm_script"  # sbatch runs a copy: BASH_SOURCE says nothing of the folder
    script.write_bytes(((folder or repo / "generated" / name) / "sbatch.sh").read_bytes())
    n = nodes or int(_directive(repo, name, "nodes") if folder is None else 1)
    record = tmp_path / "record.jsonl"
    env = {
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "RECORD": str(record),
        "FAKE_HOSTS": " ".join(HOSTS[:n]),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": name,
        "SLURM_JOB_NODELIST": f"node-[a-{'abcdefgh'[n - 1]}]",
        "SLURM_NNODES": str(n),
        "SLURM_SUBMIT_DIR": str(submit),
        "SLURM_CPUS_ON_NODE": "96",
        **extra,
    }
    run = subprocess.run(
        ["bash", str(script), *args], cwd=submit, env=env, capture_output=True, text=True, check=False
    )
    calls = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    return run, calls


def _directive(repo: Path, name: str, option: str) -> str | None:
    """The value of ``#SBATCH --option=value`` in the plan's sbatch.sh."""
    text = (repo / "generated" / name / "sbatch.sh").read_text()
    found = re.findall(rf"^#SBATCH --{option}(?:=(.*))?$", text, re.M)
    return (found[0] or "") if found else None


def _flags(argv: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)


def test_every_sbatch_sh_is_valid_bash(repo):
    folders = sorted((repo / "generated").iterdir())
    assert len(folders) == len(_plans())
    for folder in folders:
        script = folder / "sbatch.sh"
        bash = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
        assert bash.returncode == 0, (folder.name, bash.stderr)
        assert os.access(script, os.X_OK)
        head = script.read_text().splitlines()
        assert head[0] == "#!/usr/bin/env bash" and head[1].startswith("# @generated by dslc")
        plan_file = f"plans/{Path(_plans()[folder.name].file).name}"
        assert head[3] == f"# Plan {folder.name} from {plan_file}; regenerate with: dslc compile {plan_file}"


@pytest.mark.parametrize("name", sorted(_plans()))
def test_sbatch_directives_say_the_plans_shape(repo, name):
    """The edit section comes first and holds the site's lines only; the job's shape
    follows from the cluster: one task per node, a GPU per process (no GPU request for
    gloo on CPUs, a CPU per process instead), the plan's name."""
    plan = _plans()[name]
    text = (repo / "generated" / name / "sbatch.sh").read_text()
    edit, _, shape = text.partition("# ---- The job's shape, from the plan")
    assert "# ---- EDIT" in edit and "#SBATCH" not in shape.split("set -euo")[1]
    for option in ("partition", "account", "time"):
        assert f"##SBATCH --{option}=" in edit and f"#SBATCH --{option}" not in shape
    assert "#SBATCH --output=" in edit
    assert _directive(repo, name, "job-name") == name
    assert _directive(repo, name, "nodes") == str(plan.cluster.nodes)
    assert _directive(repo, name, "ntasks-per-node") == "1"
    gpus = plan.cluster.device.name != "cpu"
    assert _directive(repo, name, "gpus-per-node") == (str(plan.cluster.gpus_per_node) if gpus else None)
    assert _directive(repo, name, "cpus-per-task") == (None if gpus else str(plan.cluster.gpus_per_node))
    assert "gres" not in shape


@pytest.mark.parametrize("where", ["root", "folder"])
def test_a_multi_node_job_runs_one_torchrun_per_node(repo, tmp_path, where):
    """llama3_70b: 8 nodes of 8 GPUs; srun starts launch.sh once per node, each starts
    torchrun with c10d rendezvous on the job's first node, the job id as its id, a log
    folder per node and the extra arguments for train.py; from the repository's root or
    from the generated folder."""
    submit = repo if where == "root" else repo / "generated" / "llama3_70b"
    run, calls = _sbatch(repo, tmp_path, "llama3_70b", submit, "--steps", "100", "--dump-losses", "a b.json")
    assert run.returncode == 0, run.stderr
    (srun,), torchruns = [c for c in calls if c["tool"] == "srun-record"], [c for c in calls if c["tool"] == "torchrun"]
    assert _flags(srun["argv"])["ntasks-per-node"] == "1" and _flags(srun["argv"])["nodes"] == "8"
    assert _flags(srun["argv"])["cpus-per-task"] == "96"
    assert srun["argv"][-5:] == [str(repo / "generated" / "llama3_70b" / "launch.sh"), "--steps", "100", "--dump-losses", "a b.json"]
    assert [c["env"]["SLURM_NODEID"] for c in torchruns] == [str(i) for i in range(8)]
    for call in torchruns:
        flags = _flags(call["argv"])
        assert flags["nnodes"] == "8" and flags["nproc-per-node"] == "8"
        assert flags["rdzv-backend"] == "c10d" and flags["rdzv-endpoint"] == "node-a:29500"
        assert flags["rdzv-id"] == "4242"
        assert "max-restarts" not in flags  # llama3_70b has no checkpoint
        assert flags["log-dir"] == f"{submit}/logs/llama3_70b-4242/{call['env']['SLURMD_NODENAME']}"
        assert flags["redirects"] == "3" and flags["tee"] == "3"
        assert call["argv"][-5:] == [str(repo / "generated" / "llama3_70b" / "train.py"), "--steps", "100", "--dump-losses", "a b.json"]


def test_a_plans_max_restarts_reaches_torchrun(repo, tmp_path):
    """llama3_8b's checkpoint { max_restarts = 2 }: torchrun --max-restarts=2 on both nodes."""
    run, calls = _sbatch(repo, tmp_path, "llama3_8b", repo)
    assert run.returncode == 0, run.stderr
    torchruns = [c for c in calls if c["tool"] == "torchrun"]
    assert len(torchruns) == 2
    for call in torchruns:
        flags = _flags(call["argv"])
        assert flags["max-restarts"] == "2" and flags["nnodes"] == "2" and flags["rdzv-endpoint"] == "node-a:29500"


@pytest.mark.parametrize("name, nproc", [("gpt2_124m_dp8", "8"), ("tiny_demo", "4")])
def test_a_one_node_job_runs_torchrun_standalone(repo, tmp_path, name, nproc):
    """One node (8 GPUs; tiny_demo: 4 CPU processes): one task, torchrun --standalone,
    whatever MASTER_ADDR the submitting shell exported."""
    run, calls = _sbatch(repo, tmp_path, name, repo / "generated" / name, "--steps", "3", MASTER_ADDR="elsewhere")
    assert run.returncode == 0, run.stderr
    (torchrun,) = [c for c in calls if c["tool"] == "torchrun"]
    assert "--standalone" in torchrun["argv"] and "MASTER_ADDR" not in torchrun["env"]
    assert _flags(torchrun["argv"])["nproc-per-node"] == nproc and _flags(torchrun["argv"])["nnodes"] == "1"
    assert torchrun["argv"][-3:] == [str(repo / "generated" / name / "train.py"), "--steps", "3"]
    assert _flags(torchrun["argv"])["log-dir"] == f"{repo / 'generated' / name}/logs/{name}-4242/node-a"


def test_sbatch_finds_an_output_folder_with_any_name(tmp_path):
    """`dslc compile -o "out $(x) put"` from the project's root: sbatch.sh submitted from
    there looked only in plain-named folders ("cannot find p"); now it tries the output
    folder as a quoted word, and runs the program in it."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "p.plan").write_text(POD_PLAN.format(data="synthetic", blocks="", model=POD_MODEL))
    out = "out $(x) `y` 'put' \\ \"q\" ! *"
    done = subprocess.run([sys.executable, "-m", "dslc", "compile", "-q", "p.plan", "-o", out], cwd=project,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    run, calls = _sbatch(ROOT, tmp_path, "p", project, "--steps", "3", folder=project / out / "p")
    assert run.returncode == 0, run.stderr
    (torchrun,) = [c for c in calls if c["tool"] == "torchrun"]
    assert torchrun["argv"][-3:] == [str(project / out / "p" / "train.py"), "--steps", "3"]


@pytest.mark.parametrize("torchrun", [None, "/nowhere/torchrun"])
def test_launch_without_torchrun_says_how_to_get_it(repo, tmp_path, torchrun):
    """Issue 49 item 7: launch.sh with no torchrun on PATH ended in `exec: torchrun: not
    found` (127): now one line saying to activate the environment or set TORCHRUN."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)} | ({"TORCHRUN": torchrun} if torchrun else {})
    run = subprocess.run(["bash", str(repo / "generated" / "tiny_demo" / "launch.sh"), "--steps", "1"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 127 and run.stdout == "", run.stderr
    assert run.stderr == f"launch.sh: error: {torchrun or 'torchrun'}: not found; activate the environment torch is installed in, or set TORCHRUN=/path/to/torchrun\n"


@pytest.mark.parametrize("nproc", [2, 1])
def test_ctrl_c_stops_launch_sh_in_one_line(tmp_path, nproc):
    """Issue 49 item 7: Ctrl-C during launch.sh printed torchrun's traceback and each
    rank's (about 40 lines), status 1. Now rank 0 says at which step the run stopped and
    where --resume goes on, in one line; the status is 130; the checkpoint being written
    is removed and the committed ones are whole. SIGINT goes to launch.sh's process group,
    as a terminal sends it, once the first step is logged (every step saves: the signal
    often lands in a save). One process: launch.sh runs python, which stops the same."""
    text = POD_PLAN.format(data="synthetic", blocks='checkpoint { every = 1; dir = "ck" }', model=POD_MODEL)
    if nproc == 1:
        text = text.replace("gpus_per_node = 2", "gpus_per_node = 1").replace("mesh { dp = 2 on shm }", "")
    res = load_text(text, str(tmp_path / "p.plan"))
    assert not [d for d in res.diagnostics if d.is_error]
    folder = codegen.write(res.program.plans[0], tmp_path / "out")
    env = dict(os.environ, TORCHRUN=str(Path(sys.executable).parent / "torchrun"), PYTHON=sys.executable, OMP_NUM_THREADS="1")
    run = subprocess.Popen(["bash", str(folder / "launch.sh"), "--steps", "100000"], cwd=tmp_path, env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        seen = []
        for line in run.stdout:
            seen.append(line)
            if line.startswith("step "):
                os.killpg(run.pid, signal.SIGINT)
                break
        seen += run.stdout.readlines()
        status = run.wait(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    out = "".join(seen)
    assert status == 130 and "Traceback" not in out and "SignalException" not in out, out
    stopped = [line for line in seen if "Ctrl-C" in line]
    assert len(stopped) == 1 and re.fullmatch(r"train\.py: stopped by Ctrl-C at step (\d+); --resume goes on from step (\d+)\n", stopped[0]), out
    assert seen[-1] == stopped[0], out  # nothing from torchrun after it
    steps = sorted(os.listdir(tmp_path / "ck"))
    assert steps and all(re.fullmatch(r"step\d+", s) and (tmp_path / "ck" / s / "COMMIT.json").is_file() for s in steps), steps


def test_a_single_process_plan_runs_python(repo, tmp_path):
    """long_context_serial (one CPU process): one task, python train.py, no torchrun."""
    run, calls = _sbatch(repo, tmp_path, "long_context_serial", repo, "--steps", "2")
    assert run.returncode == 0, run.stderr
    assert [c["tool"] for c in calls] == ["srun-record", "python3"]
    assert calls[1]["argv"] == [str(repo / "generated" / "long_context_serial" / "train.py"), "--steps", "2"]


def test_sbatch_refuses_a_job_of_another_size_and_a_missing_folder(repo, tmp_path):
    (tmp_path / "a").mkdir()
    run, calls = _sbatch(repo, tmp_path / "a", "llama3_70b", repo, nodes=4)
    assert run.returncode == 2 and "runs on 8 node(s), this job has 4" in run.stderr and calls == []
    (tmp_path / "b").mkdir()
    run, calls = _sbatch(repo, tmp_path / "b", "llama3_70b", tmp_path)
    assert run.returncode == 2 and "cannot find generated/llama3_70b" in run.stderr and calls == []
    # another plan's folder is not this plan's
    (tmp_path / "c").mkdir()
    run, calls = _sbatch(repo, tmp_path / "c", "llama3_70b", repo / "generated" / "llama3_8b")
    assert run.returncode == 2 and "cannot find" in run.stderr


# --------------------------------------------------------------------------------------
# shellcheck on every shell file dslc writes (issue 49 item 8)

# A folder name with what the shell treats specially: spaces, quotes, expansions, a glob
ODD = "my $(x) `y` \"q\" 's' \\ * [a] {b,c} ~ ! dir"


def test_every_committed_shell_file_passes_shellcheck(repo, shellcheck):
    """shellcheck 0.11 found SC2046 in every launch.sh and sbatch.sh (`unset -f $(compgen
    -A function)`, whose names it split and globbed): the shell files under generated/,
    and those of every plan compiled here, pass it at its default level."""
    committed = sorted((ROOT / "generated").rglob("*.sh"))
    assert {p.name for p in committed} == {"launch.sh", "sbatch.sh"} and len(committed) == 2 * len(_plans())
    shellcheck([*committed, *sorted((repo / "generated").rglob("*.sh"))])


@pytest.mark.parametrize("out", ["generated", "../up", "/abs", "out put", ODD, "sub/" + ODD, "../" + ODD, "/" + ODD],
                         ids=["generated", "up", "abs", "spaces", "odd", "sub-odd", "up-odd", "abs-odd"])
def test_shell_files_pass_shellcheck_wherever_they_are_written(tmp_path, shellcheck, out):
    """Every plan of plans/ (one process, one node, several nodes, max restarts), its file in
    a folder named ``ODD``, compiled to output folders with names of that sort, inside the
    project, beside it and sharing no folder with it (an absolute path in the stamp and in
    sbatch.sh's search): their launch.sh and sbatch.sh pass shellcheck."""
    project = Path("/nonexistent", ODD) if out.startswith("/") else tmp_path / ODD  # only / in common
    root = tmp_path / out.lstrip("/") if out.startswith("/") else project / out
    scripts = []
    for plan in _plans().values():
        moved = dataclasses.replace(plan, file=str(project / ODD / Path(plan.file).name))
        for name, text in codegen.render(moved, root, layout=False).items():
            if name.endswith(".sh"):
                scripts.append(tmp_path / "scripts" / plan.name / name)
                scripts[-1].parent.mkdir(parents=True, exist_ok=True)
                scripts[-1].write_text(text)
    assert len(scripts) == 2 * len(_plans())
    shellcheck(scripts)


# --------------------------------------------------------------------------------------
# trainjob.yaml against the TrainJob CRD


def _strict(schema: dict) -> dict:
    """The CRD's schema as the API server applies it with strict field validation
    (kubectl's default): an object that lists its properties takes no others, and an
    int-or-string is one of the two. CEL rules (x-kubernetes-validations) are not run
    here; the one on the name is checked by the test."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if node.get("x-kubernetes-int-or-string"):
                node["type"] = ["integer", "string"]
            if "properties" in node and "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


@pytest.fixture(scope="module")
def validator():
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    assert crd["spec"]["group"] == "trainer.kubeflow.org" and version["name"] == "v1alpha1"
    schema = _strict(version["schema"]["openAPIV3Schema"])
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def _manifest(repo: Path, name: str) -> dict:
    return yaml.safe_load((repo / "generated" / name / "trainjob.yaml").read_text())


@pytest.mark.parametrize("name", sorted(_plans()))
def test_every_trainjob_is_valid_against_the_crd(repo, validator, name):
    plan = _plans()[name]
    doc = _manifest(repo, name)
    errors = sorted(validator.iter_errors(doc), key=str)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]
    assert doc["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and doc["kind"] == "TrainJob"
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"]) and len(doc["metadata"]["name"]) <= 54
    trainer = doc["spec"]["trainer"]
    assert doc["spec"]["runtimeRef"] == {"name": "torch-distributed"}
    assert trainer["numNodes"] == plan.cluster.nodes
    assert trainer["numProcPerNode"] == plan.cluster.gpus_per_node
    limits = trainer["resourcesPerNode"]["limits"]
    if plan.cluster.device.name == "cpu":
        assert limits == {"cpu": plan.cluster.gpus_per_node}
    else:
        assert limits == {"nvidia.com/gpu": plan.cluster.gpus_per_node}
    command = trainer["command"]
    assert command[0] == "torchrun" and command[-1] == f"/workspace/generated/{name}/train.py"
    ck = plan.train.checkpoint
    restarts = ck.max_restarts if ck else 0
    assert [c for c in command if c.startswith("--max-restarts")] == [f"--max-restarts={restarts}"] * bool(restarts)
    text = (repo / "generated" / name / "trainjob.yaml").read_text()
    assert "# EDIT" in text.split("image:")[1].splitlines()[0]
    (patch,) = doc["spec"]["runtimePatches"]
    pod = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["dshm"] == "/dev/shm"
    assert ("data" in mounts) == bool(plan.train.data.files)
    if ck:  # at a fixed path, never the plan's (the pod's view: test_the_pod_finds_...)
        assert mounts["checkpoints"] == "/checkpoints" and "--checkpoint-dir=/checkpoints" in trainer["args"]


def test_the_data_volume_holds_the_data_files(monkeypatch):
    """tiny_demo reads verse.txt below DATA_ROOT, ../../data from generated/tiny_demo/:
    the volume is mounted at /data, and train.py told so."""
    monkeypatch.chdir(ROOT)
    doc = yaml.safe_load(codegen.render(_plans()["tiny_demo"], Path("generated"))["trainjob.yaml"])
    pod = doc["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    container = pod["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "data", "mountPath": "/data", "readOnly": True} in container["volumeMounts"]
    assert doc["spec"]["trainer"]["args"] == ["--data-root=/data"]


@pytest.mark.parametrize("breakage, path", [
    (lambda d: d["spec"]["trainer"].update(numNodes="8"), ["spec", "trainer", "numNodes"]),
    (lambda d: d["spec"]["trainer"].update(numGPUs=8), ["spec", "trainer"]),  # no such field
    (lambda d: d["spec"].pop("runtimeRef"), ["spec"]),  # required
    (lambda d: d["spec"]["trainer"]["command"].append(3), ["spec", "trainer", "command", 3]),
    (lambda d: d["spec"]["runtimePatches"][0].pop("manager"), ["spec", "runtimePatches", 0]),
])
def test_a_broken_manifest_is_rejected(repo, validator, breakage, path):
    doc = _manifest(repo, "llama3_8b")
    assert not list(validator.iter_errors(doc))
    breakage(doc)
    errors = list(validator.iter_errors(doc))
    assert errors and any(list(e.absolute_path) == path for e in errors), [e.message for e in errors]


@pytest.mark.parametrize("name, label", [
    ("llama3_70b", "llama3-70b"), ("_x", "x"), ("X__Y_", "x-y"), ("yes", "yes"), ("_1", "plan-1"),
    ("a" * 80, "a" * 54),
])
def test_kubernetes_names(name, label):
    assert k8s_name(name) == label


def test_a_plan_named_like_a_yaml_keyword_stays_a_string(tmp_path):
    plan = dataclasses.replace(_plans()["tiny_demo"], name="null")
    doc = yaml.safe_load(codegen.render(plan, tmp_path)["trainjob.yaml"])
    assert doc["metadata"]["name"] == "null"


# --------------------------------------------------------------------------------------
# trainjob.yaml as the pod sees it: every path its command and args use, through the mounts

POD_MODEL = "layers = 2; hidden = 64; heads = 8; vocab = 256; seq_len = 32"
POD_PLAN = """
cluster c {{ nodes = 1; gpus_per_node = 2; device = cpu; link shm {{ scope = node; bandwidth = 10 GB/s; latency = 10 us }} }}
plan p {{
    model gpt2 {{ {model} }}
    cluster = c
    mesh {{ dp = 2 on shm }}
    train {{
        steps = 3; micro_batch = 2; global_batch = 4; precision = fp32
        optimizer adamw {{ lr = 1e-3 }}; lr_schedule cosine {{ warmup = 1 }}
        data = {data}
        {blocks}
    }}
}}
"""


def _pod_sees(project: Path, plan_file: str, out: str, data: str, blocks: str, files: dict[str, str],
              model: str = POD_MODEL) -> dict:
    """Compiles the plan at ``project/plan_file`` with ``-o out`` (from ``project``, as the
    stamp's command runs), then follows each path the manifest's command and args use
    through its volume mounts (:func:`_follow`)."""
    for name, text in files.items():
        path = project / name if not os.path.isabs(name) else Path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (project / plan_file).parent.mkdir(parents=True, exist_ok=True)
    (project / plan_file).write_text(POD_PLAN.format(data=data, blocks=blocks, model=model))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "dslc", "compile", "-q", plan_file, "-o", out], cwd=project, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return _follow(project, project / out / "p" if not os.path.isabs(out) else Path(out) / "p")


def _follow(project: Path, folder: Path) -> dict:
    """What the pod of ``folder``'s trainjob.yaml finds at each path its command and args
    use, the image holding ``project`` at /workspace: {"program": the file on this machine
    (None when the folder is not in the project), "data": each data file as the data
    claim must hold it, "checkpoints": --checkpoint-dir}."""
    doc = yaml.safe_load((folder / "trainjob.yaml").read_text())
    pod = doc["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    spec = pod["template"]["spec"]["template"]["spec"]
    claims = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in spec["containers"][0]["volumeMounts"]}
    # no mount in another, none over the image's project, none but at a fixed path
    assert set(mounts) <= {"/dev/shm", "/data", "/init", "/checkpoints"}
    for a in mounts:
        assert not within("/workspace", a) and not within(a, "/workspace")
        assert not any(a != b and within(a, b) for b in mounts), (a, list(mounts))

    def serves(path: str) -> dict | None:
        assert os.path.isabs(path) and os.path.normpath(path) == path, path
        found = [m for m in mounts if within(path, m)]
        return mounts[max(found, key=len)] if found else None  # None: the image

    command, args = doc["spec"]["trainer"]["command"], doc["spec"]["trainer"]["args"]
    program = command[-1]
    assert serves(program) is None and within(program, "/workspace"), program
    seen = {"program": Path(project, os.path.relpath(program, "/workspace")) if folder.is_relative_to(project) else None}
    if seen["program"] is not None:
        assert seen["program"].samefile(folder / "train.py")
    flags = dict(a.split("=", 1) for a in args)
    assert set(flags) <= {"--data-root", "--init-hf", "--checkpoint-dir"}
    # the data files: DATA_ROOT as this machine has it is what the claim must hold, and
    # each file is read at --data-root/<its path below DATA_ROOT>
    script = ast.parse((folder / "train.py").read_text())
    consts = {t.id: ast.literal_eval(n.value) for n in script.body if isinstance(n, ast.Assign)
              for t in n.targets if isinstance(t, ast.Name) and t.id in ("DATA_ROOT", "DATA", "EVAL_DATA", "INIT_HF")}
    seen["data"] = []
    if "DATA_ROOT" in consts:
        root = flags["--data-root"]
        mount = serves(root)
        assert mount is not None and mount["name"] == "data" and mount["readOnly"] and claims["data"]["persistentVolumeClaim"]["readOnly"]
        held = os.path.normpath(os.path.join(folder, consts["DATA_ROOT"]))  # what the claim holds
        for _, _, below, _ in consts.get("DATA", []) + consts.get("EVAL_DATA", []):
            in_pod = os.path.normpath(os.path.join(root, below))
            assert serves(in_pod) is mount
            seen["data"].append(os.path.join(held, os.path.relpath(in_pod, mount["mountPath"])))
    else:
        assert "--data-root" not in flags and "/data" not in mounts
    # the Hugging Face checkpoint the weights start from: INIT_HF as this machine has it is
    # what the init claim must hold, read at --init-hf
    seen["init"] = None
    if "INIT_HF" in consts:
        mount = serves(flags["--init-hf"])
        assert mount is not None and mount["name"] == "init" and mount["readOnly"] and claims["init"]["persistentVolumeClaim"]["readOnly"]
        assert flags["--init-hf"] == mount["mountPath"]
        seen["init"] = os.path.normpath(os.path.join(folder, consts["INIT_HF"]))
    else:
        assert "--init-hf" not in flags and "/init" not in mounts
    ck = flags.get("--checkpoint-dir")
    if ck is not None:
        mount = serves(ck)
        assert mount is not None and mount["name"] == "checkpoints" and not mount.get("readOnly")
    else:
        assert "/checkpoints" not in mounts
    seen["checkpoints"] = ck
    return seen


@pytest.mark.parametrize("case", ["normal", "etc", "dot", "beside", "spaces", "absolute"])
def test_the_pod_finds_the_program_its_data_and_its_checkpoints(tmp_path, shellcheck, case):
    """Issue 49 item 1, issue 50 item 2: a mount point never comes from a plan's path.
    `checkpoint { dir = "/etc" }` mounted the read-write volume at /etc, `dir = "."` at
    /workspace over the program; a data file beside a plan at the project's root mounted
    the read-only data volume at /workspace, over train.py; `-o "out put"` dropped the
    folder from the command. Now the program is at its own path in the image, the data at
    /data and the checkpoints at /checkpoints, whatever the plan says."""
    project = tmp_path / "proj"
    text = {"verse.txt": "x" * 4096}
    plan_file, out, data, blocks, files = "plans/p.plan", "generated", 'text("../data/verse.txt")', "", {"data/verse.txt": "x" * 4096}
    if case == "normal":
        blocks = 'checkpoint { every = 2; dir = "checkpoints/p" }'
    elif case == "etc":
        blocks = 'checkpoint { every = 2; dir = "/etc" }'
    elif case == "dot":
        blocks = 'checkpoint { every = 2; dir = "." }'
    elif case == "beside":  # the plan and its data at the project's root
        plan_file, out, data, files = "p.plan", "build", 'text("verse.txt")', text
    elif case == "spaces":
        project = tmp_path / "my project"
        plan_file, out, files = "plans dir/p.plan", "out put", {"my data/v erse.txt": "x" * 4096, "eval s/e.txt": "y" * 4096}
        data = 'blend(0.5, text("../my data/v erse.txt"), 0.5, text("../eval s/e.txt")) eval { every = 1; batches = 1; data = text("../eval s/e.txt") }'
        blocks = 'checkpoint { every = 2; dir = "ck dir" }'
    elif case == "absolute":  # a data file named by its absolute path, another in a subfolder
        elsewhere = tmp_path / "shared data" / "a.txt"
        files = {str(elsewhere): "z" * 4096, "plans/sub/b.txt": "w" * 4096}
        data = f'blend(0.5, text("{elsewhere}"), 0.5, text("sub/b.txt"))'
    seen = _pod_sees(project, plan_file, out, data, blocks, files)
    assert seen["init"] is None
    program = seen["program"]
    assert program is not None and program.name == "train.py" and program.parent.name == "p"
    assert program.parent.parent == (project / out).resolve() or program.parent.parent.samefile(project / out)
    shellcheck(sorted(program.parent.glob("*.sh")))  # issue 49 item 8, in these folders too
    wanted = {"normal": ["data/verse.txt"], "etc": ["data/verse.txt"], "dot": ["data/verse.txt"], "beside": ["verse.txt"],
              "spaces": ["my data/v erse.txt", "eval s/e.txt", "eval s/e.txt"],
              "absolute": [str(tmp_path / "shared data" / "a.txt"), "plans/sub/b.txt"]}[case]
    assert [os.path.realpath(f) for f in seen["data"]] == [os.path.realpath(project / w) for w in wanted]
    assert seen["checkpoints"] == (None if case in ("beside", "absolute") else "/checkpoints")


@pytest.mark.parametrize("name", sorted(_plans()))
def test_every_committed_trainjob_finds_its_program_and_data(name):
    """generated/: the image holds this repository at /workspace; each data file the pod
    reads through the data volume is the file the plan names."""
    plan = _plans()[name]
    seen = _follow(ROOT, ROOT / "generated" / name)
    assert seen["program"] == ROOT / "generated" / name / "train.py"
    ev = plan.train.eval
    named = plan.train.data.files + (ev.data.files if ev else ())
    wanted = [os.path.normpath(os.path.join(os.path.dirname(plan.file), s.path)) for s in named]
    assert seen["data"] == wanted
    assert seen["checkpoints"] == ("/checkpoints" if plan.train.checkpoint else None)


@pytest.mark.parametrize("where", ["plans/hf", "weights elsewhere/hf"])
def test_the_pod_finds_the_checkpoint_the_weights_start_from(tmp_path, where):
    """`init = hf("DIR")` was read relative to train.py in the image, where no volume
    holds it: the folder is mounted read-only at /init and train.py told so (--init-hf)."""
    from test_hf import MODELS, saved_by_transformers

    project = tmp_path / "proj"
    hf = project / where if where.startswith("plans") else tmp_path / where
    saved_by_transformers(hf, "gpt2", tie=True)
    named = "hf" if where.startswith("plans") else str(hf)
    seen = _pod_sees(project, "plans/p.plan", "out put", "synthetic", f'init = hf("{named}")', {},
                     model=MODELS["gpt2"].replace("arch = gpt2; ", ""))
    assert seen["init"] == str(hf) and seen["data"] == []


@pytest.mark.parametrize("out, folder", [
    ("generated", "/workspace/generated/p"),
    ("out put", "/workspace/out put/p"),
    (".", "/workspace/p"),
    ("/abs/out", "/workspace/p"),  # the output shares no folder with the plan: the folder alone
    ("../x", "/workspace/p"),
])
def test_the_program_is_inside_the_image_root(out, folder):
    assert in_image(out, "p")[0] == folder
