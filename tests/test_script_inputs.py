"""Issue 10: the generated script meets hostile or wrong inputs with one line on stderr.

Each test compiles a tiny plan into tmp_path and runs the real script (python, or
torchrun on CPU with gloo): bad token ids, a loss that stops being finite, torchrun's
environment, output paths and the checkpoint folder, --device cuda without CUDA, and
launch.sh under a caller's shell that sets CDPATH or exports a function named cd.
Start-up errors exit with 1, as the script's others do (test_codegen.py), but for a flag
whose package is not installed (--tensorboard, --wandb): 2, as argparse's usage errors."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dslc import codegen
from dslc.driver import load_paths, load_text

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]

PLAN = """
cluster c {{
    nodes = 1; gpus_per_node = {world}; device = cpu
    link shm {{ scope = node; bandwidth = 10 GB/s; latency = 10 us }}
}}
plan p {{
    model gpt2 {{ layers = 1; hidden = 32; heads = 2; vocab = 256; seq_len = 16 }}
    cluster = c
    {mesh}
    train {{
        steps = 2; micro_batch = 1; global_batch = {batch}; precision = {precision}
        optimizer adamw {{ lr = {lr} }}; lr_schedule constant {{ warmup = 0 }}
        grad_clip = 0.0
        data = {data}
    }}
}}
"""
SERIAL = "this plan runs on 1 process, not {}: start it with python train.py"


def compile_plan(
    tmp_path: Path, world=1, mesh="", lr="1e-3", data="synthetic", batch=1, precision="fp32",
    out="out",
) -> Path:
    """The plan's train.py, written under tmp_path/<out>/p/."""
    text = PLAN.format(world=world, mesh=mesh, lr=lr, data=data, batch=batch, precision=precision)
    res = load_text(text, str(tmp_path / "p.plan"))
    errors = [d.message for d in res.diagnostics if d.is_error]
    assert not errors, errors
    return codegen.write(res.program.plans[0], tmp_path / out) / "train.py"


def error_line(out) -> str:
    """The script's one error line (the same from every rank that printed it; torchrun
    adds its own report, and a traceback of its own, after it)."""
    assert 'train.py", line' not in out.stderr, out.stderr  # no traceback of the script
    lines = {ln for ln in out.stderr.splitlines() if ln.startswith("train.py: error: ")}
    assert len(lines) == 1, out.stderr
    return lines.pop().removeprefix("train.py: error: ")


# ---------------------------------------------------------------------------------
# finding 1: garbage tokens, non-finite losses


def test_token_ids_beyond_the_vocab_are_refused_where_they_are_read(tmp_path, run_script):
    """dslc lint reads the plan's data file (E084), but the file may change after the
    compile, and --data names another: the script checks every batch it reads, and names
    the file and the byte of the first bad id."""
    ids = torch.arange(64, dtype=torch.int32) % 256
    (tmp_path / "t.bin").write_bytes(ids.to(torch.int16).numpy().tobytes())
    serial = compile_plan(tmp_path, data='tokens("t.bin")')
    tp2 = compile_plan(tmp_path, world=2, mesh="mesh { tp = 2 on shm }", data='tokens("t.bin")', out="tp2")
    ids[::4] = 300  # vocab = 256: every window holds one; the first window read decides
    (tmp_path / "t.bin").write_bytes(ids.to(torch.int16).numpy().tobytes())
    out = run_script(serial, 1, "--dump-losses", tmp_path / "l.json")
    assert out.returncode == 1 and "step" not in out.stdout
    path = os.path.normpath(tmp_path / "t.bin")
    got = error_line(out)
    m = re.fullmatch(rf"data file {re.escape(path)}: id 300 at byte (\d+) is not below vocab = 256", got)
    assert m, got
    assert int(m.group(1)) % 8 == 0  # ids 0, 4, 8, …: bytes 0, 8, 16, …
    # under tp, where an id past the vocab made the loss Infinity instead of an error
    (tmp_path / "t.bin").rename(tmp_path / "other.bin")
    out = run_script(tp2, 2, "--data", tmp_path / "other.bin")
    assert out.returncode != 0 and "step" not in out.stdout
    assert error_line(out) == got.replace("t.bin", "other.bin")
    assert not (tmp_path / "l.json").exists()


def test_a_loss_that_is_not_finite_stops_every_rank(tmp_path, run_script):
    # a step of lr 100 makes weights of 100, whose products overflow fp16 in the next step
    script = compile_plan(
        tmp_path, world=2, mesh="mesh { dp = 2 on shm }", lr="100", batch=2, precision="fp16"
    )
    losses = tmp_path / "losses.json"
    out = run_script(script, 2, "--steps", 4, "--dump-losses", losses, timeout=180)
    assert out.returncode != 0, out.stdout
    assert re.fullmatch(r"step \d: the loss is (nan|inf|-inf); stopping", error_line(out))
    assert not losses.exists()  # never a file with NaN or Infinity in it
    # the losses are read at log steps only: the stop still names the step that diverged
    later = run_script(script, 2, "--steps", 4, "--log-every", 3, timeout=180)
    assert later.returncode != 0 and error_line(later) == error_line(out)


def test_every_json_the_scripts_write_is_strict():
    """json.dump(..., allow_nan=False) everywhere: no NaN or Infinity, which is not JSON
    (a serial script, and one with every output: --measure per rank, --trace)."""
    plans = load_paths([ROOT / "tests" / "golden" / "gpt2_pp.plan"]).program.plans
    plans = [p for p in plans if p.name in ("gpt2pp_serial", "gpt2pp_dp2_pp2_tp2")]
    assert len(plans) == 2
    for plan in plans:
        modules = [text for name, text in codegen.render(plan).items() if name.endswith(".py")]
        calls = [n for text in modules for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call)]
        dumps = [c for c in calls if ast.unparse(c.func) in ("json.dump", "json.dumps")]
        assert dumps, plan.name
        for call in dumps:
            strict = [k for k in call.keywords if k.arg == "allow_nan"]
            assert strict and ast.literal_eval(strict[0].value) is False, ast.unparse(call)


# ---------------------------------------------------------------------------------
# finding 2: the environment, output paths, the device, launch.sh


def test_a_serial_plan_refuses_two_processes(tmp_path, run_script):
    script = compile_plan(tmp_path)
    losses = tmp_path / "losses.json"
    out = run_script(script, 2, "--dump-losses", losses)
    assert out.returncode != 0 and "step" not in out.stdout
    assert error_line(out) == SERIAL.format(2)
    assert not losses.exists()


@pytest.mark.parametrize(
    "env, want",
    [
        ({"WORLD_SIZE": "abc"}, SERIAL.format("abc")),
        ({"RANK": "0", "LOCAL_RANK": "0"}, SERIAL.format("unset")),
        ({"WORLD_SIZE": "1", "LOCAL_RANK": "0"}, "RANK=unset, LOCAL_RANK=0: each must be 0 to 0"),
        (
            {"WORLD_SIZE": "1", "RANK": "1", "LOCAL_RANK": "0"},
            "RANK=1, LOCAL_RANK=0: each must be 0 to 0",
        ),
        (
            {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "-1"},
            "RANK=0, LOCAL_RANK=-1: each must be 0 to 0",
        ),
    ],
)
def test_torchrun_variables_are_checked(tmp_path, env, want, run_script):
    """All three or none (python train.py), whole numbers, the ranks below the world."""
    out = run_script(compile_plan(tmp_path), 1, env=env)
    assert out.returncode == 1 and out.stdout == ""
    assert error_line(out) == want


def test_a_rank_beyond_the_world_is_refused(tmp_path, run_script):
    """Not left to hang in the rendezvous (or, serial, to run without logging as rank 1)."""
    script = compile_plan(tmp_path, world=2, mesh="mesh { tp = 2 on shm }")
    out = run_script(script, 1, env={"WORLD_SIZE": "2", "RANK": "2", "LOCAL_RANK": "0"})
    assert out.returncode == 1 and out.stdout == ""
    assert error_line(out) == "RANK=2, LOCAL_RANK=0: each must be 0 to 1"


def test_outputs_are_checked_before_training(tmp_path, run_script):
    script = compile_plan(tmp_path)
    folder = tmp_path / "a folder"
    folder.mkdir()
    for flag in ("--dump-losses", "--dump-weights", "--measure"):
        out = run_script(script, 1, flag, folder)
        assert out.returncode == 1 and out.stdout == ""  # no step ran
        assert error_line(out) == f"{flag} {folder}: is a directory, not a file"


def test_a_dashboard_without_its_package_is_one_line(tmp_path, run_script):
    """--tensorboard and --wandb import their package only when asked, at start-up: one
    that is missing is one line and exit 2 before anything runs or is written. Modules
    beside train.py (the first place Python looks) that fail to import as a missing
    package does stand in for an environment without them (tensorboard is installed
    here; wandb may be). A --tensorboard DIR that is a file is one line too."""
    script = compile_plan(tmp_path)
    board, losses = tmp_path / "board", tmp_path / "l.json"
    for flag, value, package in (("--tensorboard", board, "tensorboard"), ("--wandb", "p", "wandb")):
        absent = script.parent / f"{package}.py"
        absent.write_text(f'raise ModuleNotFoundError("No module named {package!r}", name={package!r})\n')
        out = run_script(script, 1, flag, value, "--dump-losses", losses)
        absent.unlink()
        assert out.returncode == 2 and out.stdout == "", out.stderr
        assert error_line(out) == f"{flag} needs {package}: pip install {package}"
    assert not board.exists() and not losses.exists()
    board.write_text("")
    out = run_script(script, 1, "--tensorboard", board)
    assert out.returncode == 1 and out.stdout == ""
    assert error_line(out) == f"--tensorboard {board}: is a file, not a directory"


def test_a_dashboard_folder_is_checked_like_the_other_outputs(tmp_path, run_script):
    """Issue 50: --tensorboard DIR is checked before anything starts, as the output files
    and --export-hf's folder are (one rule): a folder of the kernel's is one line, where
    TensorBoard's writer thread printed a traceback after the script's error line, and ''
    is argparse's one line, as --dump-losses '' is, where it was ignored. A folder to make
    two levels down in a writable one is made, and logged into."""
    script = compile_plan(tmp_path)
    for flag, folder in (("--tensorboard", "/proc/self"), ("--tensorboard", "/sys/kernel"), ("--tensorboard", "/dev"),
                         ("--tensorboard", "/proc/self/new"), ("--export-hf", "/proc/self")):
        out = run_script(script, 1, flag, folder)
        assert out.returncode == 1 and out.stdout == ""
        assert out.stderr.startswith(f"train.py: error: {flag} {folder}") and len(out.stderr.splitlines()) == 1, out.stderr
        assert out.stderr.endswith(": a folder of the kernel's, not one to write into\n")  # /proc/self: (a link to /proc/PID)
    for flag in ("--tensorboard", "--dump-losses"):
        out = run_script(script, 1, flag, "")
        assert out.returncode == 2 and out.stdout == "", out.stderr
        assert out.stderr.splitlines()[-1] == f"train.py: error: argument {flag}: an empty file name"
    board = tmp_path / "runs" / "first"
    out = run_script(script, 1, "--steps", 1, "--tensorboard", board)
    assert out.returncode == 0, out.stderr
    assert [p.name.split(".")[0] for p in board.iterdir()] == ["events"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda_is_one_line(tmp_path, run_script):
    out = run_script(compile_plan(tmp_path), 1, "--device", "cuda")
    assert out.returncode == 1 and out.stdout == ""
    assert error_line(out).startswith("--device cuda: ")
    script = compile_plan(tmp_path, world=2, mesh="mesh { tp = 2 on shm }")
    out = run_script(script, 1, "--device", "cuda", env={"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"})
    assert out.returncode == 1 and out.stdout == ""
    assert error_line(out) == "local rank 0 sees 0 GPUs: NCCL needs one per rank"
    out = run_script(script, 1, "--device", "cuda", "--share-gpu", env={"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"})
    assert out.returncode == 1 and out.stdout == ""
    assert error_line(out) == "local rank 0 sees 0 GPUs: --share-gpu needs one"


def test_launch_sh_ignores_the_callers_shell(tmp_path):
    compile_plan(tmp_path)
    decoy = tmp_path / "decoy"
    (decoy / "out" / "p").mkdir(parents=True)  # where `cd out/p` goes with this CDPATH
    env = {
        "CDPATH": f"{decoy}:.",
        "BASH_FUNC_cd%%": "() {  echo hijacked; builtin cd /; }",
        "BASH_FUNC_dirname%%": "() {  echo /; }",
        "PYTHON": sys.executable,
    }
    out = subprocess.run(
        ["bash", "out/p/launch.sh", "--steps", "1"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "step 1/1" in out.stdout and "hijacked" not in out.stdout


def test_data_root_and_checkpoint_dir_move_what_the_plan_names(tmp_path, run_script):
    """trainjob.yaml mounts the data volume at /data and the checkpoints' at /checkpoints
    and says so in train.py's args (issue 49 item 1, issue 50 item 2): --data-root reads
    each data file at its path below DATA_ROOT there, --checkpoint-dir saves and resumes
    there; the plan's own folders are not touched."""
    (tmp_path / "data" / "sub").mkdir(parents=True)
    (tmp_path / "data" / "sub" / "v.txt").write_bytes(bytes(range(32)) * 8)
    script = compile_plan(tmp_path, data='text("data/sub/v.txt"); checkpoint { every = 1; dir = "ck" }')
    mounted = tmp_path / "volume"  # the data volume, holding what DATA_ROOT (data/sub) holds
    mounted.mkdir()
    (tmp_path / "data" / "sub" / "v.txt").rename(mounted / "v.txt")
    run = tmp_path / "run"
    run.mkdir()
    out = run_script(script, 1, "--data-root", str(mounted), "--checkpoint-dir", str(tmp_path / "ckpt"), cwd=run)
    assert out.returncode == 0, out.stderr
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["step0000001", "step0000002"] and not (run / "ck").exists()
    again = run_script(script, 1, "--data-root", str(mounted), "--checkpoint-dir", str(tmp_path / "ckpt"), "--resume", cwd=run)
    assert again.returncode == 0 and "step 2" in again.stdout, again.stdout + again.stderr
    # without it the script reads DATA_ROOT beside itself, where the file no longer is
    missing = run_script(script, 1, cwd=run)
    assert missing.returncode == 1 and "v.txt" in error_line(missing)


def test_a_checkpoint_folder_that_is_a_file_is_refused_at_start(tmp_path, run_script):
    """The checkpoint folder, the plan's or --checkpoint-dir's, is checked as the other
    output folders are (utils.output_folder): a file, a folder of the kernel's or one that
    cannot be written is one line before training, not a traceback at the first save."""
    script = compile_plan(tmp_path, data='synthetic; checkpoint { every = 1; dir = "ck" }')
    (tmp_path / "ck").write_text("")  # CHECKPOINT_DIR is relative to the working directory
    out = run_script(script, 1, cwd=tmp_path)
    assert out.returncode == 1 and out.stdout == ""
    assert error_line(out) == "--checkpoint-dir ck: is a file, not a directory"
    for folder in ("/proc/self", "/sys/kernel/new"):
        out = run_script(script, 1, "--checkpoint-dir", folder, cwd=tmp_path)
        assert out.returncode == 1 and out.stdout == "", out.stderr
        assert error_line(out).endswith("a folder of the kernel's, not one to write into")
