"""Checkpoints that survive failures and move between layouts.

A plan with ``checkpoint { every = N; dir = "…" }`` saves with torch.distributed.checkpoint:
each rank writes its pieces of the serial model's tensors with their offsets, into
step<N>.partial, which the master renames to step<N> once every rank's part is written.
These runs check what a user whose job just lost a node relies on: a save killed on
every rank leaves the checkpoint before it as the latest and the resumed run's losses are
the uninterrupted run's, bit for bit; a checkpoint resumes under another layout of the
same model within 1e-5; torchrun's --max-restarts brings a job whose rank died back by
itself; a dead or hung peer is named in one line; a truncated, foreign, incomplete or
hostile checkpoint is refused in one line, before anything is read. Each save says where
it went, how big it is and how long it took, in one line.

Failures are injected from outside the script: a sitecustomize.py on PYTHONPATH wraps
torch.distributed.checkpoint.save in the launched processes (SIGKILL after a save's
data is written and before its commit, or one rank killed or stopped before a save).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import random
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch

from dslc import codegen
from dslc.check import check_plan
from dslc.driver import load_text
from dslc.ir import Checkpoint

pytestmark = pytest.mark.slow

CLUSTERS = Path(__file__).resolve().parent / "golden" / "clusters.plan"
INJECT = '''
import os, signal, time
if "RANK" in os.environ and os.environ.get("PID_DIR"):  # for a test that stops a rank
    with open(os.path.join(os.environ["PID_DIR"], os.environ["RANK"]), "w") as f:
        f.write(str(os.getpid()))
if "RANK" in os.environ and os.environ.get("FAIL_AT_SAVE"):
    import torch.distributed.checkpoint as dcp
    real, calls = dcp.save, [0]
    def save(*args, **kwargs):
        calls[0] += 1
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if calls[0] == int(os.environ["FAIL_AT_SAVE"]) and first_attempt:
            rank, how = os.environ.get("FAIL_RANK"), os.environ["FAIL_HOW"]
            if how == "kill_after_write":  # every rank: the data and metadata are written
                real(*args, **kwargs)
                os.kill(os.getpid(), signal.SIGKILL)
            if rank == os.environ["RANK"]:
                if how == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(3600)  # "hang"
        return real(*args, **kwargs)
    dcp.save = save
if "RANK" in os.environ and os.environ.get("FAIL_AT_P2P") and os.environ.get("FAIL_RANK") == os.environ["RANK"]:
    import torch.distributed as dist
    real_p2p, p2p_calls = dist.batch_isend_irecv, [0]
    def batch_isend_irecv(ops):  # the pipeline's messages: the rank stops or raises at the Nth batch
        p2p_calls[0] += 1
        if p2p_calls[0] == int(os.environ["FAIL_AT_P2P"]):
            if os.environ["FAIL_HOW"] == "raise":
                raise ValueError("injected at a pipeline message")
            time.sleep(1.5)  # its watchdog's thread writes its last progress, then all stops
            os.kill(os.getpid(), signal.SIGSTOP)
        return real_p2p(ops)
    dist.batch_isend_irecv = batch_isend_irecv
'''

LAYOUTS = {  # 4-layer gpt2 with tied embeddings: name -> (cluster, mesh and parallel blocks)
    "serial": ("cpu1", ""),
    "dp2_tp2": ("cpu4", "mesh { dp = 2 on shm; tp = 2 on shm }"),
    "pp2_tp2": ("cpu4", "mesh { pp = 2 on shm; tp = 2 on shm }\n tensor_parallel { sequence_parallel = true }"),
    "dp2_zero3": ("cpu2", "mesh { dp = 2 on shm }\n data_parallel { zero = 3 }"),
    "pp2": ("cpu2", "mesh { pp = 2 on shm }"),
}


def gpt2_plan(tmp_path: Path, layout: str, ck: Path, extra="", train="", every=2, precision="fp32",
              model="layers = 4; hidden = 64; heads = 4; vocab = 250; seq_len = 32"):
    cluster, mesh = LAYOUTS[layout]
    text = f"""
import "{CLUSTERS}"
model gpt2_4 {{ arch = gpt2; {model} }}
plan ck_{layout} {{
    model = gpt2_4
    cluster = {cluster}
    {mesh}
    train {{
        steps = 4; micro_batch = 2; global_batch = 8; precision = {precision}; seed = 7; grad_clip = 1.0
        optimizer adamw {{ lr = 1e-3; betas = (0.9, 0.95); weight_decay = 0.1 }}
        lr_schedule cosine {{ warmup = 1 }}
        data = synthetic
        {train}
        checkpoint {{ every = {every}; dir = "{ck}"{extra} }}
    }}
}}
"""
    res = load_text(text, str(tmp_path / f"{layout}.plan"))
    errors = [d.message for d in res.diagnostics if d.is_error]
    assert not errors, errors
    return res.program.plans[0]


def launcher(run_script, folder: Path):
    """launch(plan, *flags, fail=None) -> (losses, first step, completed process): the plan
    compiled into ``folder`` and run (torchrun for several ranks) with --dump-losses;
    fail: the environment of the injected failure."""
    (folder / "inject").mkdir()
    (folder / "inject" / "sitecustomize.py").write_text(INJECT)

    def run(plan, *flags, fail=None, ok=True, torchrun=None):
        script = codegen.write(plan, folder / "out") / "train.py"
        dump = folder / f"{plan.name}.json"
        dump.unlink(missing_ok=True)
        env = {"PYTHONPATH": str(folder / "inject"), **fail} if fail else None  # None: one process is forked
        out = run_script(script, plan.world_size, "--dump-losses", dump, *flags, env=env, timeout=300, torchrun=torchrun)
        if not ok:
            return None, None, out
        assert out.returncode == 0, f"{plan.name}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
        dumped = json.loads(dump.read_text())
        return dumped["loss"], dumped["first_step"], out

    return run


@pytest.fixture
def launch(run_script, tmp_path):
    return launcher(run_script, tmp_path)


@pytest.fixture(scope="module")
def uninterrupted(run_script, tmp_path_factory):
    """(losses, checkpoint folder) of the dp2 x tp2 plan run to the end, saving every 2
    steps in the background: the run the tests below compare with and read from (copy
    the folder to change it). Saving does not change training: its losses are a
    synchronous save's too."""
    base = tmp_path_factory.mktemp("uninterrupted")
    ck = base / "ck"
    losses, _, _ = launcher(run_script, base)(gpt2_plan(base, "dp2_tp2", ck, extra="; async = true"))
    return losses, ck


def steps(ck: Path) -> list[str]:
    return sorted(p.name for p in ck.iterdir())


def only_up_to(ck: Path, step: int) -> None:
    """Drops the committed checkpoints after `step`, as if the run had stopped there."""
    for p in ck.iterdir():
        if int(p.name[4:11]) > step:
            shutil.rmtree(p)


def error_line(out) -> str:
    """The script's one error line (the same from every rank that printed it), and no
    traceback of the script."""
    assert 'train.py", line' not in out.stderr, out.stderr
    lines = {ln for ln in out.stderr.splitlines() if ln.startswith("train.py: error: ")}
    assert len(lines) == 1, out.stderr
    return lines.pop().removeprefix("train.py: error: ")


def test_a_save_killed_on_every_rank_leaves_the_one_before(tmp_path, launch, uninterrupted):
    """SIGKILL on every rank after the second save's data is written and before its
    commit: step 4's folder stays .partial, --resume takes step 2, and the resumed run's
    losses are the uninterrupted run's bit for bit (the same layout: dp2 x tp2)."""
    whole, written = uninterrupted
    assert steps(written) == ["step0000002", "step0000004"]
    ck = tmp_path / "ck"
    plan = gpt2_plan(tmp_path, "dp2_tp2", ck)
    _, _, out = launch(plan, fail={"FAIL_AT_SAVE": "2", "FAIL_HOW": "kill_after_write"}, ok=False)
    assert out.returncode != 0
    assert steps(ck) == ["step0000002", "step0000004.partial"]
    assert (ck / "step0000004.partial" / ".metadata").is_file()  # written, not committed
    resumed, first, out = launch(plan, "--resume")
    assert "resumed from" in out.stdout and first == 2
    assert resumed == whole[2:]  # bit-identical
    assert steps(ck) == ["step0000002", "step0000004"]  # committed now, the .partial gone


@pytest.mark.parametrize("reader", ["pp2_tp2", "serial", "dp2_zero3"])
def test_a_checkpoint_resumes_under_another_layout(tmp_path, launch, uninterrupted, reader):
    """Written by dp2 x tp2 (tp shards; saved in the background), read by tp2 x pp2 with sp (stages, the tied
    embedding's copy on the last stage), by one process, and by ZeRO-3 over dp2 (flat
    shards cut across parameters): steps 3-4 equal the writer's within 1e-5."""
    whole, ck = uninterrupted
    mine = tmp_path / "ck"
    shutil.copytree(ck, mine)
    only_up_to(mine, 2)
    resumed, first, out = launch(gpt2_plan(mine.parent, reader, mine), "--resume")
    assert first == 2 and "written by dp2 x tp2" in out.stdout
    assert resumed == pytest.approx(whole[2:], rel=1e-5)
    assert saved(out.stdout, r"in [\d.]+ s") == [(str(mine / "step0000004"), "4")]


@pytest.mark.parametrize("offloaded", ["reader", "writer"])
def test_an_offloaded_optimizer_resumes_without_offload_and_back(tmp_path, launch, uninterrupted, offloaded):
    """train { offload { optimizer } } keeps the optimizer's state in host memory, and its
    checkpoints hold the same tensors by name: the uninterrupted dp2 x tp2 run's checkpoint
    resumed with the optimizer offloaded, and one written offloaded (its losses the
    uninterrupted run's) resumed without it, steps 3-4 within 1e-5 of the uninterrupted run."""
    whole, ck = uninterrupted
    mine, offload = tmp_path / "ck", "offload { optimizer = true }"
    if offloaded == "writer":
        losses, _, _ = launch(gpt2_plan(tmp_path, "dp2_tp2", mine, train=offload))
        assert losses == pytest.approx(whole, rel=1e-5)
    else:
        shutil.copytree(ck, mine)
    only_up_to(mine, 2)
    reader = gpt2_plan(tmp_path, "dp2_tp2", mine, train=offload if offloaded == "reader" else "")
    resumed, first, _ = launch(reader, "--resume")
    assert first == 2 and resumed == pytest.approx(whole[2:], rel=1e-5)
    # the last compiled (the reader) steps on the host, or on the device
    assert (tmp_path / "out" / reader.name / "host_optimizer.py").is_file() == (offloaded == "reader")


def saved(stdout: str, took: str) -> list[tuple[str, str]]:
    """(folder, step) of each save's line: where, how big, how long (`took`, a pattern)."""
    return re.findall(rf"^checkpoint (\S+): step (\d+), [\d.]+ [KMGT]?i?B,? {took}$", stdout, re.M)


@pytest.mark.parametrize(
    "writer, reader",
    [("mixtral_ep2_zero1", "mixtral_serial"), ("llama_cp2_tp2_sp", "llama_dp4_zero2"), ("mixtral_dp2_ep2_zero3", "mixtral_ep4")],
)
def test_experts_and_context_parallel_checkpoints_move_too(golden_plans, tmp_path, launch, writer, reader):
    """Expert-parallel shards with ZeRO-1 over them, read by one process; a cp x tp + sp
    checkpoint read by ZeRO-2 over dp4; ZeRO-3 over dp2 x ep2 (dense units over dp x ep, the
    experts' over dp) read by ep4 (one expert per rank, nothing sharded)."""
    ck = tmp_path / "ck"

    def with_checkpoint(name):
        plan = golden_plans[name]
        train = dataclasses.replace(plan.train, steps=4, checkpoint=Checkpoint(every=2, dir=str(ck), span=None))
        return dataclasses.replace(plan, train=train)

    whole, _, _ = launch(with_checkpoint(writer))
    only_up_to(ck, 2)
    resumed, first, _ = launch(with_checkpoint(reader), "--resume")
    assert first == 2 and resumed == pytest.approx(whole[2:], rel=1e-5)


def test_fp16_with_dropout_resumes_bit_for_bit_and_keeps_the_newest(tmp_path, launch):
    """One process in fp16 with dropout: the fp32 master weights, the loss scaler and the
    RNG come back, so the resumed losses are the whole run's exactly; keep = 2 prunes
    (after each background save's commit)."""
    ck = tmp_path / "ck"
    plan = gpt2_plan(tmp_path, "serial", ck, extra="; keep = 2; async = true", precision="fp16", every=1)
    plan = dataclasses.replace(plan, model=dataclasses.replace(plan.model, dropout=0.1))
    whole, _, out = launch(plan)
    assert steps(ck) == ["step0000003", "step0000004"]
    background = r"committed [\d.]+ s after the save began \(written in the background\)"
    assert saved(out.stdout, background) == [(str(ck / f"step000000{k}"), str(k)) for k in range(1, 5)]
    only_up_to(ck, 3)
    resumed, first, _ = launch(plan, "--resume")
    assert first == 3 and resumed == whole[3:]


def test_a_resumed_run_takes_over_its_steps_in_tensorboard(tmp_path, launch, read_scalars):
    """Issue 49 item 9: a resumed run wrote a second event file whose steps overlapped the
    first's, so TensorBoard drew steps 3 and 4 twice. One process saving every step runs 4
    steps into --tensorboard DIR, is resumed from step 2 into the same DIR, and TensorBoard's
    reader sees each tag's steps once, 1 to 4 in order: steps 1-2 the first run's, 3-4 the
    resumed run's (the losses are the same, bit for bit; its time per step, read from each
    run's log, tells the two apart)."""
    ck, board = tmp_path / "ck", tmp_path / "board"
    plan = gpt2_plan(tmp_path, "serial", ck, every=1)
    whole, _, out = launch(plan, "--tensorboard", board)
    only_up_to(ck, 2)
    # TensorBoard reads a folder's event files in name order, which starts with the
    # second each was made in: the resumed run's must be the later one, as it is whenever
    # a job resumes more than a second after it started
    (made,) = [int(p.name.split(".")[3]) for p in board.iterdir()]
    time.sleep(max(0.0, made + 1.05 - time.time()))
    resumed, first, again = launch(plan, "--resume", "--tensorboard", board)
    assert first == 2 and resumed == whole[2:]
    assert len(list(board.iterdir())) == 2
    scalars = read_scalars(board)
    assert {tag: [s for s, _ in values] for tag, values in scalars.items()} == dict.fromkeys(scalars, [1, 2, 3, 4])
    assert [v for _, v in scalars["loss_metrics/global_avg_loss"]] == pytest.approx(whole, rel=1e-6)
    ms = [float(t) for t in re.findall(r"\| ([\d.]+) ms \|", out.stdout)][:2]
    ms += [float(t) for t in re.findall(r"\| ([\d.]+) ms \|", again.stdout)]
    assert [1000 * v for _, v in scalars["time_metrics/end_to_end(s)"]] == pytest.approx(ms, abs=0.051)


def test_a_killed_rank_restarts_the_job_by_itself(tmp_path, launch, uninterrupted):
    """max_restarts = 1: rank 1 dies before the second save; torchrun restarts every rank,
    which resume from step 2 on their own and finish with the uninterrupted run's losses."""
    whole, _ = uninterrupted
    ck = tmp_path / "ck"
    plan = gpt2_plan(tmp_path, "dp2_tp2", ck, extra="; max_restarts = 1")
    fail = {"FAIL_AT_SAVE": "2", "FAIL_HOW": "kill", "FAIL_RANK": "1"}
    losses, first, out = launch(plan, fail=fail, torchrun=("--max-restarts", plan.train.checkpoint.max_restarts))
    assert "a peer is gone or hung" in out.stderr  # the survivors said which collective
    assert first == 2 and losses == whole[2:]
    assert steps(ck) == ["step0000002", "step0000004"]


def test_a_hung_peer_is_named_after_the_timeout(tmp_path, launch):
    """Rank 1 stops in the first save; the others give up after the plan's 3 s timeout,
    each with one line naming itself and the collective."""
    plan = gpt2_plan(tmp_path, "dp2_tp2", tmp_path / "ck", train="timeout = 3 s")
    _, _, out = launch(plan, fail={"FAIL_AT_SAVE": "1", "FAIL_HOW": "hang", "FAIL_RANK": "1"}, ok=False)
    assert out.returncode != 0
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("train.py: error: rank ")]
    assert lines and all("the save of" in ln and "a peer is gone or hung (timeout 3 s)" in ln for ln in lines)
    assert 'train.py", line' not in out.stderr




@pytest.fixture(scope="module")
def received(run_script, uninterrupted, tmp_path_factory):
    """resume(mutate) -> (completed process, losses or None): the serial plan resumed
    from a fresh copy of the dp2 x tp2 run's step-2 checkpoint that ``mutate(step
    folder)`` changed first, as a checkpoint received from someone else may be (``flags``:
    instead of --dump-losses). One process, forked: each run takes about a second.
    ``resume.base``: the run's folder."""
    base = tmp_path_factory.mktemp("received")
    ck, dump = base / "ck", base / "losses.json"
    script = codegen.write(gpt2_plan(base, "serial", ck, every=4), base / "out") / "train.py"

    def resume(mutate=lambda step: None, *flags, timeout=60):
        shutil.rmtree(ck, ignore_errors=True)
        shutil.copytree(uninterrupted[1], ck, symlinks=True)
        only_up_to(ck, 2)
        mutate(ck / "step0000002")
        dump.unlink(missing_ok=True)
        out = run_script(script, 1, "--resume", *(flags or ("--dump-losses", dump)), cwd=base, timeout=timeout)
        return out, json.loads(dump.read_text())["loss"] if out.returncode == 0 and not flags else None

    resume.base = base
    return resume


def rewrite_manifest(step: Path, edit) -> None:
    """manifest.json changed by ``edit(manifest)``, and COMMIT.json's digest of it too: as
    someone who rewrote both would leave them."""
    manifest = json.loads((step / "manifest.json").read_text())
    edit(manifest)
    data = json.dumps(manifest).encode()
    (step / "manifest.json").write_bytes(data)
    edit_json(step / "COMMIT.json", lambda c: c.update(manifest=hashlib.sha256(data).hexdigest()))


def edit_json(path: Path, edit) -> None:
    value = json.loads(path.read_text())
    edit(value)
    path.write_text(json.dumps(value))


def first_chunk(m: dict, key: str = "model.wte.weight") -> dict:
    return m["tensors"][key]["chunks"][0]


def swap_chunks(m: dict) -> None:
    """The weights' first chunk and its exp_avg's traded places (file, offset, length
    and sum): each entry is whole, but under another name."""
    a, b = first_chunk(m), first_chunk(m, "optimizer.wte.weight.exp_avg")
    for k in ("file", "at", "bytes", "sha256"):
        a[k], b[k] = b[k], a[k]


def twice(m: dict) -> None:
    """The weights' chunks [chunk 0, chunk 0]: their volume is the tensor's, rows 125 to
    249 are in none (the issue's hole: a load that read rows 0 to 124 twice)."""
    chunks = m["tensors"]["model.wte.weight"]["chunks"]
    chunks[1] = dict(chunks[0])


def flip_byte(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def forged_item(step: Path) -> None:
    """The first chunk's bytes replaced by other bytes of its length, its sum and the
    manifest's digest recomputed, as a forger would: the sums pass, torch.load refuses."""
    def edit(m):
        c = first_chunk(m)
        path = step / c["file"]
        data = bytearray(path.read_bytes())
        data[c["at"] : c["at"] + c["bytes"]] = b"x" * c["bytes"]
        path.write_bytes(bytes(data))
        c["sha256"] = hashlib.sha256(f"model.wte.weight {c['offsets']}\n".encode() + b"x" * c["bytes"]).hexdigest()
    rewrite_manifest(step, edit)


def replace(path: Path, how: str) -> None:
    """``path`` swapped for a FIFO, a folder, or a link to ``how``."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    if how == "fifo":
        os.mkfifo(path)
    elif how == "folder":
        path.mkdir()
    else:
        path.symlink_to(how)


RECEIVED = {  # how a received checkpoint was changed -> what the error line says of it
    "a shard truncated": (lambda s: (s / "__1_0.distcp").write_bytes((s / "__1_0.distcp").read_bytes()[:1000]), "truncated"),
    "a shard missing": (lambda s: (s / "__1_0.distcp").unlink(), "missing (a rank's part of the checkpoint)"),
    "another model's": (lambda s: edit_json(s / "COMMIT.json", lambda c: c["model"].update(layers=2)), "a checkpoint of another model: layers 2 there, 4 here"),
    "a file ../ in another step": (lambda s: rewrite_manifest(s, lambda m: first_chunk(m).update(file="../step0000004/__0_0.distcp")), "model.wte.weight's chunk 0: its file '../step0000004/__0_0.distcp' is not one DCP writes"),
    "an absolute file": (lambda s: rewrite_manifest(s, lambda m: first_chunk(m).update(file="/etc/passwd")), "model.wte.weight's chunk 0: its file '/etc/passwd' is not one DCP writes"),
    "a negative offset": (lambda s: rewrite_manifest(s, lambda m: first_chunk(m).update(at=-8)), "model.wte.weight's chunk 0: outside its tensor"),
    "a negative length": (lambda s: rewrite_manifest(s, lambda m: first_chunk(m).update(bytes=-1)), "model.wte.weight's chunk 0: outside its tensor"),
    "an offset past the file": (lambda s: rewrite_manifest(s, lambda m: first_chunk(m).update(at=2**40)), "truncated"),
    "two tensors' entries swapped": (lambda s: rewrite_manifest(s, swap_chunks), "do not have the SHA-256 manifest.json gives them"),
    "a byte of a shard flipped": (lambda s: flip_byte(s / "__0_0.distcp", 700), "do not have the SHA-256 manifest.json gives them"),
    "the manifest changed, COMMIT.json not": (lambda s: flip_byte(s / "manifest.json", 40), "not the manifest COMMIT.json was written with"),
    "a forged item": (forged_item, "not a saved tensor"),
    "a 2**50-element tensor": (lambda s: rewrite_manifest(s, lambda m: m["tensors"]["model.wte.weight"].update(shape=[2**50])), "model.wte.weight is [1125899906842624] 'float32' there"),
    "a chunk left out": (lambda s: rewrite_manifest(s, lambda m: m["tensors"]["model.wte.weight"]["chunks"].pop()), "model.wte.weight's chunks hold"),
    "a chunk listed twice, the other left out": (lambda s: rewrite_manifest(s, twice), "model.wte.weight's chunks overlap, and leave as many"),
    "a chunk moved onto the other": (lambda s: rewrite_manifest(s, lambda m: m["tensors"]["model.wte.weight"]["chunks"][1].update(offsets=[124, 0])), "model.wte.weight's chunks overlap"),
    "a float64 tensor": (lambda s: rewrite_manifest(s, lambda m: m["tensors"]["model.wte.weight"].update(dtype="float64")), "model.wte.weight is [250, 64] 'float64' there"),
    "step true": (lambda s: edit_json(s / "COMMIT.json", lambda c: c.update(step=True)), "step True, but the folder is step 2's"),
    "step 1,000,000": (lambda s: edit_json(s / "COMMIT.json", lambda c: c.update(step=10**6)), "step 1000000, but the folder is step 2's"),
    "a layout that is not text": (lambda s: edit_json(s / "COMMIT.json", lambda c: c.update(layout=[1])), "its layout is [1], not a str"),
    "COMMIT.json nested 100,000 deep": (lambda s: (s / "COMMIT.json").write_text("[" * 10**5 + "]" * 10**5), "cannot read it as a checkpoint's commit marker (nested more than 64 deep)"),
    "COMMIT.json a link to /dev/stdin": (lambda s: replace(s / "COMMIT.json", "/dev/stdin"), "not a regular file"),
    "manifest.json a FIFO": (lambda s: replace(s / "manifest.json", "fifo"), "not a regular file (a FIFO)"),
    "a shard a FIFO": (lambda s: replace(s / "__0_0.distcp", "fifo"), "not a file of the checkpoint's own (a FIFO)"),
    "a shard a link to /dev/zero": (lambda s: replace(s / "__0_0.distcp", "/dev/zero"), "not a file of the checkpoint's own (a link)"),
    "a shard a folder": (lambda s: replace(s / "__0_0.distcp", "folder"), "not a file of the checkpoint's own (a folder)"),
    "the step folder a link": (lambda s: replace(s, shutil.copytree(s, s.parent.parent / "elsewhere", dirs_exist_ok=True)), "not a folder a save made"),
}


def test_a_resume_with_no_step_left_says_so(received):
    """Issue 49 item 3: `--steps 2 --resume` on a checkpoint of step 2 (or later) printed the
    resume line and exited 0 without a step or a word why."""
    out, _ = received(lambda step: None, "--steps", "2")
    assert out.returncode == 0, out.stderr
    assert "nothing to train: step 2 is at or past --steps 2; ask for more to go on" in out.stdout, out.stdout


@pytest.mark.parametrize("case", list(RECEIVED))
def test_a_received_checkpoint_is_checked_before_it_is_read(received, case):
    """Each way a checkpoint from someone else can be wrong that the adversarial review
    tried: exit 1 with one line naming the file and what is wrong, before a byte of the
    weights is loaded; nothing hangs (a timeout), nothing is a traceback."""
    mutate, says = RECEIVED[case]
    out, _ = received(mutate)
    assert out.returncode == 1, out.stderr
    assert says in error_line(out)


def test_the_metadata_pickle_is_never_read(received, tmp_path):
    """DCP's .metadata, a pickle, is written for DCP's own tools and never read: one that
    would run code (os.system) changes nothing, and the run resumes with the untouched
    checkpoint's losses, bit for bit."""
    _, losses = received()

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    out, evil = received(lambda s: (s / ".metadata").write_bytes(pickle.dumps(Evil())))
    assert out.returncode == 0 and evil == losses and len(losses) == 2
    assert not (tmp_path / "pwned").exists()


def test_a_shared_folder_loses_nothing_the_script_did_not_make(tmp_path, run_script):
    """checkpoint.dir a folder others use too: a commit prunes (keep = 1) and clears
    crashed saves of this model only (their MADE_BY.json says so); another program's
    ``*.partial`` and another model's checkpoint stay. A folder of someone else's where a
    save would go stops the run in one line, untouched."""
    shared = tmp_path / "shared"
    plan = gpt2_plan(tmp_path, "serial", shared, extra="; keep = 1", every=1)
    script = codegen.write(plan, tmp_path / "out") / "train.py"
    out = run_script(script, 1, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert steps(shared) == ["step0000004"]
    (shared / "step0000004").rename(shared / "step0000000.partial")  # this model's crashed save
    (shared / "notes.partial").mkdir()  # another program's
    (shared / "notes.partial" / "todo.txt").write_text("mine")
    other = shared / "step0000001x"
    shutil.copytree(shared / "step0000000.partial", other)  # another model's committed checkpoint
    edit_json(other / "MADE_BY.json", lambda m: m["model"].update(layers=2))
    other.rename(shared / "step0000000")
    out = run_script(script, 1, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert steps(shared) == ["notes.partial", "step0000000", "step0000004"]
    assert (shared / "notes.partial" / "todo.txt").read_text() == "mine"

    (shared / "step0000002").mkdir()  # someone else's, where the second save goes
    (shared / "step0000002" / "data").write_text("theirs")
    out = run_script(script, 1, cwd=tmp_path)
    assert out.returncode == 1
    assert error_line(out) == f"{shared / 'step0000002'} is there and is not a checkpoint of this model and data; the save would replace it: move it away"
    assert (shared / "step0000002" / "data").read_text() == "theirs"


@pytest.mark.parametrize("folder, code, says", [
    ('""', "E025", "checkpoint.dir is empty"),
    ('"{file}"', "E025", "is a file, not a folder"),
    ('"{file}/sub/ck"', "E025", "is a file, so no folder can be made in it"),
    ('"/proc/1/checkpoints"', "W026", "/proc/1 (the nearest existing folder of /proc/1/checkpoints) is not writable"),
])
def test_lint_checks_the_checkpoint_folder_at_its_value(tmp_path, folder, code, says):
    """checkpoint.dir is where the script makes and deletes folders: lint says at the
    value when it is empty, holds a NUL byte, is a file or lies under one
    (errors: no folder can be made there), or lies in a folder this user cannot write
    (a warning: the script may run elsewhere, as another user)."""
    (tmp_path / "afile").write_text("")
    text = f"""import "{CLUSTERS}"
model m {{ arch = gpt2; layers = 2; hidden = 64; heads = 4; vocab = 250; seq_len = 32 }}
plan p {{ model = m; cluster = cpu1
    train {{ steps = 2; micro_batch = 2; global_batch = 2; data = synthetic
        checkpoint {{ every = 1; dir = {folder.format(file=tmp_path / "afile")} }} }} }}
"""
    res = load_text(text, str(tmp_path / "p.plan"))
    found = [(d.code, d.span.line, d.span.col, d.message) for d in res.diagnostics if d.code in ("E025", "W026")]
    col = text.splitlines()[4].index("dir = ") + len("dir = ") + 1
    assert [(c, line, at) for c, line, at, _ in found] == [(code, 5, col)] and says in found[0][3], found


def test_a_checkpoint_folder_with_a_nul_byte_is_refused():
    """A plan cannot hold a NUL byte (E004), but a plan built in Python can: the rule
    refuses it too, at the checkpoint block."""
    plan = gpt2_plan(Path("/tmp"), "serial", Path("ck"))
    plan = dataclasses.replace(plan, train=dataclasses.replace(plan.train, checkpoint=dataclasses.replace(plan.train.checkpoint, dir="ck\0x")))
    found = [d for d in check_plan(plan) if d.code == "E025"]
    assert len(found) == 1 and "holds a NUL byte" in found[0].message


MUTATIONS = 80  # the fuzz test's: about a third of a second each
HOSTILE = [-1, 0, 2**63, 2**50, True, None, "", "../x", "/etc/passwd", [], {}, 1e308, "a" * 300, [[[[[]]]]]]


def mutation(rng: random.Random, outside: Path):
    """A random change to a checkpoint's step folder, and its name: a byte flipped, a file
    cut short, a JSON field set to a hostile value (the manifest's digest rewritten to
    match, or not), a file swapped for a FIFO, a folder or a link out, the folder for a
    link."""
    kind = rng.choice(["flip", "cut", "field", "field", "swap", "folder"])
    pick = rng.random()  # which file, chosen once the folder is seen: the same for a seed

    def apply(step: Path):
        files = sorted(p.name for p in step.iterdir())
        name = files[int(pick * len(files))]
        path = step / name
        if kind in ("flip", "cut"):
            data = bytearray(path.read_bytes())
            at = rng.randrange(max(1, len(data)))
            if kind == "flip" and data:
                data[at] ^= rng.randrange(1, 256)
            path.write_bytes(bytes(data if kind == "flip" else data[:at]))
        elif kind == "field":
            target = step / rng.choice(["COMMIT.json", "manifest.json"])
            value = json.loads(target.read_text())
            holder, key = value, None
            while key is None or (isinstance(holder[key], (dict, list)) and holder[key] and rng.random() < 0.8):
                holder = holder if key is None else holder[key]
                key = rng.choice(list(holder)) if isinstance(holder, dict) else rng.randrange(len(holder))
            holder[key] = rng.choice(HOSTILE)
            if target.name == "manifest.json" and rng.random() < 0.5:
                rewrite_manifest(step, lambda m: m.clear() or m.update(value))
            else:
                target.write_text(json.dumps(value))
        elif kind == "swap":
            replace(path, rng.choice(["fifo", "folder", str(outside / "secret"), str(outside / "fifo"), "/dev/zero"]))
        else:
            replace(step, rng.choice([str(outside), str(outside / "secret")]))
    return f"{kind} {pick:.2f}", apply


def snapshot(folder: Path) -> dict:
    return {p.name: (p.is_fifo() or p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir()}


@pytest.mark.parametrize("mutations", [MUTATIONS], ids=lambda n: f"{n} mutations")  # the count in its name
def test_received_checkpoints_fuzzed_load_the_same_weights_or_stop_in_one_line(received, tmp_path, mutations):
    """Fixed-seed mutations of a real checkpoint (dp2 x tp2's, read by one process):
    for every one, the run either loads exactly the weights of the untouched checkpoint
    (--dump-weights), or exits 1 with one line; never a traceback, never a hang (30 s),
    and a folder outside the run's, which links point into, keeps every file as it was."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("not a checkpoint's")
    os.mkfifo(outside / "fifo")
    before = snapshot(outside)
    weights = received.base / "weights.pt"
    out, _ = received(lambda s: None, "--steps", "2", "--dump-weights", weights)
    assert out.returncode == 0, out.stderr
    want = torch.load(weights)
    rng, counts = random.Random(33), {"loaded": 0, "refused": 0}
    for _ in range(mutations):
        name, apply = mutation(rng, outside)
        weights.unlink(missing_ok=True)
        try:
            out, _ = received(apply, "--steps", "2", "--dump-weights", weights, timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name}: hung")
        assert out.returncode in (0, 1) and "Traceback" not in out.stderr, (name, out.stderr)
        if out.returncode == 0:
            got = torch.load(weights)
            assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), name
        else:
            error_line(out)
        counts["loaded" if out.returncode == 0 else "refused"] += 1
        assert snapshot(outside) == before, name
    print(f"{mutations} mutations of a checkpoint: {counts['loaded']} loaded the same weights, {counts['refused']} refused in one line")
    assert counts["refused"] >= mutations // 2 and counts["loaded"] >= 1


def doctor_plan(tmp_path: Path):
    """The pp2 x tp2 plan with a 60 s timeout, and its file (dslc doctor quotes its lines)."""
    plan = gpt2_plan(tmp_path, "pp2_tp2", tmp_path / "ck", train="timeout = 60 s", every=100)
    cluster, mesh = LAYOUTS["pp2_tp2"]
    path = tmp_path / "pp2_tp2.plan"  # the same plan, as a file: its mesh on line 4
    path.write_text(f'import "{CLUSTERS}"\nmodel gpt2_4 {{ arch = gpt2; layers = 4; hidden = 64; heads = 4; vocab = 250; seq_len = 32 }}\n'
                    f"plan {plan.name} {{ model = gpt2_4; cluster = {cluster}\n{mesh}\n"
                    "train { steps = 4; micro_batch = 2; global_batch = 8; data = synthetic; optimizer adamw { lr = 1e-3 } } }\n")
    return plan, path


def action(a: dict) -> str:
    """An action as dslc doctor names it."""
    if "action" not in a:
        return f"step {a['step']} (the whole step)"
    return f"step {a['step']}, {a['action']} of micro-batch {a['microbatch']}, chunk {a['chunk']}"


@pytest.mark.parametrize("how", ["stop", "raise"])
def test_a_stopped_or_raising_rank_is_named_by_dslc_doctor(tmp_path, launch, run_script, how):
    """Rank 1 of a pp2 x tp2 job stops for good (SIGSTOP) or raises at its 12th pipeline
    message, in step 3: every other rank writes its state into --run-dir and exits within the
    watchdog's limit (2 s: --watchdog-limit, above 5 x a step here) plus a margin, one line
    each, and dslc doctor names rank 1 and the action it last completed."""
    plan, plan_file = doctor_plan(tmp_path)
    run_dir = tmp_path / "run"
    _, _, out = launch(plan, "--steps", "6", "--run-dir", run_dir, "--watchdog-limit", "2",
                       fail={"FAIL_AT_P2P": "12", "FAIL_RANK": "1", "FAIL_HOW": how}, ok=False,
                       torchrun=("--shutdown-timeout", "2"))
    assert out.returncode != 0
    states = {r: json.loads((run_dir / f"state.rank{r}.json").read_text()) for r in (0, 2, 3)}
    last = json.loads((run_dir / "progress.rank1.json").read_text())  # rank 1's last heartbeat
    for r, state in states.items():
        assert state["rank"] == r and state["step"] == 3 and state["stack"], state
        # within the limit and the stopping ranks' grace (2 x 0.5 s + 2 s) of rank 1's last beat
        assert state["time"] - last["time"] < state["limit"] + 3 + 2, (r, state["time"] - last["time"])
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith(("train.py: error: rank ", "train.py: stopping: rank "))]
    assert {int(re.match(r"\S+ \S+ rank (\d+)", ln)[1]) for ln in lines} >= {0, 2, 3}, out.stderr[-3000:]
    report = run_script.dslc("doctor", run_dir, plan_file)
    text = report.stdout.decode()
    assert report.returncode == 0, report.stderr
    print(text)
    if how == "stop":  # its last heartbeat is current: it slept 1.5 s before it stopped
        done = action(last["done"])
        assert (run_dir / "state.rank1.json").exists() is False
        assert "rank 1 (pp=0, tp=1" in text and "did not arrive" in text and f"last completed {done};" in text
        assert "waiting for rank 1" in text
    else:
        raised = json.loads((run_dir / "state.rank1.json").read_text())
        assert "ValueError: injected at a pipeline message" in raised["exception"][-1]
        assert "rank 1 (pp=0, tp=1" in text and "raised: ValueError: injected" in text
        assert f"last completed {action(raised['done'])}" in text
    assert f"axis pp: {plan_file}:4: mesh {{ pp = 2 on shm; tp = 2 on shm }}" in text
    as_json = json.loads(run_script.dslc("doctor", run_dir, "--json").stdout)
    assert as_json[("silent" if how == "stop" else "raised")] == [1]
