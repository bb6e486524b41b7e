"""Golden execution tests: every parallel plan computes what the serial plan computes.

Each plan of tests/golden/*.plan is compiled and trained for 5 steps under
torchrun (CPU, gloo, fp32), once per module; every step's global loss must equal
the serial plan's within 1e-5 relative, and the final full weights (the tp shards
gathered by --dump-weights) within 1e-5. All tests here share one xdist group so
the multi-process runs never overlap each other on a small machine."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest

from dslc import codegen
from dslc.ir import Checkpoint, Data

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("golden")]

GOLDEN = Path(__file__).resolve().parent / "golden"
ROOT = GOLDEN.parents[1]
PLANS = [
    m
    for f in ("gpt2.plan", "llama.plan")
    for m in re.findall(r"^plan (\w+)", (GOLDEN / f).read_text(), re.MULTILINE)
]
PARALLEL = [name for name in PLANS if not name.endswith("_serial")]
RTOL = 1e-5


def serial_of(name: str) -> str:
    return name.split("_")[0] + "_serial"


@pytest.mark.parametrize("name", PARALLEL)
def test_parallel_plan_matches_serial(name, golden_plans, trained):
    import torch

    plan, ref = golden_plans[name], golden_plans[serial_of(name)]
    assert plan.model == dataclasses.replace(ref.model, span=plan.model.span)
    assert plan.train.global_batch == ref.train.global_batch and plan.world_size > 1
    losses, weights = trained(plan)
    ref_losses, ref_weights = trained(ref)
    assert len(losses) == len(ref_losses) == plan.train.steps
    for step, (got, want) in enumerate(zip(losses, ref_losses), 1):
        assert abs(got - want) <= RTOL * abs(want), f"step {step}: {got} != {want} (serial)"
    assert sorted(weights) == sorted(ref_weights)
    for key, want in ref_weights.items():
        torch.testing.assert_close(weights[key], want, rtol=RTOL, atol=RTOL, msg=f"{name}: {key}")


def test_weights_moved_and_loss_is_sane(golden_plans, trained):
    """The comparison above is meaningful: training changed the weights, from the
    first loss of an untrained model, ln(vocab)."""
    import torch

    for name in ("gpt2_serial", "llama_serial"):
        plan = golden_plans[name]
        losses, weights = trained(plan)
        assert abs(losses[0] - math.log(plan.model.vocab)) < 0.1
        initial = trained(dataclasses.replace(plan, name=name + "_init"), "--steps", "0")[1]
        moved = max((weights[k] - initial[k]).abs().max().item() for k in weights)
        assert moved > 10 * RTOL
        assert torch.equal(initial["blocks.0.attn_norm.weight"], torch.ones(plan.model.hidden))


def test_bundled_text_loss_falls(run_script, tmp_path):
    from dslc.driver import load_paths

    plan = load_paths([ROOT / "plans" / "tiny_demo.plan"]).program.plans[0]
    script = codegen.write(plan, tmp_path) / "train.py"
    dump = tmp_path / "losses.json"
    out = run_script(
        script, plan.world_size, "--steps", "50", "--dump-losses", dump, "--log-every", "10"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    losses = json.loads(dump.read_text())
    assert len(losses) == 50 and abs(losses[0] - math.log(256)) < 0.2
    assert sum(losses[-5:]) / 5 < 0.6 * losses[0], losses
    assert "step 50/50 | loss" in out.stdout


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_tracks_fp32(precision, golden_plans, trained):
    """16-bit working weights with fp32 master weights: the serial llama plan and
    dp2 x tp2 + sp with ZeRO-1 stay within 16-bit rounding of the fp32 serial run."""
    ref_losses = trained(golden_plans["llama_serial"])[0]
    for name in ("llama_serial", "llama_dp2_tp2_sp_zero1"):
        plan = golden_plans[name]
        plan = dataclasses.replace(
            plan,
            name=f"{name}_{precision}",
            train=dataclasses.replace(plan.train, precision=precision),
        )
        losses = trained(plan)[0]
        for got, want in zip(losses, ref_losses):
            assert abs(got - want) <= 1e-3 * want, (plan.name, losses, ref_losses)
        assert losses != ref_losses  # it really ran in 16 bits


def test_checkpoint_resume_continues_the_same_run(golden_plans, trained, tmp_path):
    plan = golden_plans["gpt2_dp2_zero1"]
    ck = Checkpoint(every=2, dir=str(tmp_path / "ck"), span=None)
    plan = dataclasses.replace(
        plan, name="gpt2_ckpt", train=dataclasses.replace(plan.train, checkpoint=ck)
    )
    full = trained(plan, "--steps", "4")[0]
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step0000002", "step0000004"]
    for f in (tmp_path / "ck" / "step0000004").iterdir():
        f.unlink()
    (tmp_path / "ck" / "step0000004").rmdir()
    resumed = trained(plan, "--steps", "4", "--resume")[0]
    assert resumed == pytest.approx(full[2:], rel=1e-6)


def test_tokens_file_sgd_dropout_fp16_smoke(golden_plans, trained, tmp_path):
    """The remaining branches run: a nanoGPT uint16 token file, SGD, dropout, fp16."""
    text = (ROOT / "data" / "verse.txt").read_bytes()[:4000]
    (tmp_path / "t.bin").write_bytes(b"".join((b % 250).to_bytes(2, "little") for b in text))
    plan = golden_plans["gpt2_serial"]
    train = plan.train
    plan = dataclasses.replace(
        plan,
        name="gpt2_smoke",
        model=dataclasses.replace(plan.model, dropout=0.1),
        train=dataclasses.replace(
            train,
            precision="fp16",
            data=Data("tokens", "t.bin", str(tmp_path / "t.bin"), None),
            optimizer=dataclasses.replace(train.optimizer, name="sgd"),
        ),
    )
    losses = trained(plan, "--steps", "3")[0]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
