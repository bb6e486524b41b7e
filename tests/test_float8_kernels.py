"""The float8 linears of a generated script against the serial plan's, on the same tensors.

A plan with ``train { float8 }`` and tp = 2 is compiled; its float8.py is imported as it is,
with the process groups its mesh.py builds, and run under torchrun (CPU, gloo, torchao's
emulation) on a random x and W whose parts each rank takes as its column- or row-parallel
linear holds them. Its scales (tensorwise: the amax of the whole weight, reduced over tp;
rowwise: per row along the contraction dim, reduced over tp where that dim is split) equal
torchao's own over the whole tensors (``tensor_to_scale``, as ``Float8Linear`` takes them),
and so the forward output and both gradients equal a serial float8 linear's: bit for bit
where no rank sums another's partial products, within fp32 summation order where one does.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from dslc import codegen
from dslc.driver import load_text

pytestmark = pytest.mark.slow

PLAN = """
cluster c {{ nodes = 1; gpus_per_node = 2; device = cpu
            link shm {{ scope = node; bandwidth = 10 GB/s; latency = 10 us }} }}
plan p {{
    model llama {{ layers = 1; hidden = 64; heads = 4; vocab = 64; seq_len = 16 }}
    cluster = c
    mesh {{ tp = 2 on shm }}
    train {{ micro_batch = 2; global_batch = 2; data = synthetic; float8 = {recipe} }}
}}
"""

# Runs on every rank: for each recipe, the generated modules, then the comparison.
DRIVER = textwrap.dedent(
    """
    import datetime, json, sys, traceback
    import torch, torch.distributed as dist
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.float8_utils import tensor_to_scale

    dist.init_process_group("gloo")
    TP, RANK = dist.get_world_size(), dist.get_rank()
    for folder, recipe in json.loads(sys.argv[1]):
        for name in ("mesh", "float8", "plan", "meter", "utils"):
            sys.modules.pop(name, None)
        sys.path.insert(0, folder)
        import mesh, float8
        sys.path.remove(folder)
        mesh.build_process_groups(RANK, (("tp", TP),), (("tp",),), datetime.timedelta(seconds=60))
        float8.use_float8(torch.device("cpu"))
        c = float8.RECIPE
        g = torch.Generator().manual_seed(0)  # the same global tensors on every rank
        N, K, O = 32, 64, 48
        x, w, dy = torch.randn(N, K, generator=g), torch.randn(O, K, generator=g) * 0.02, torch.randn(N, O, generator=g)
        w[O - 1, K - 1] = 0.5  # the weight's amax, in the last rank's part of both splits
        ref_x, ref_w = x.clone().requires_grad_(), w.clone().requires_grad_()
        ref = float8.Float8Matmul.apply(ref_x, ref_w, ((), (), ()), c)  # the serial plan's
        ref.backward(dy)
        rows, cols = slice(RANK * O // TP, (RANK + 1) * O // TP), slice(RANK * K // TP, (RANK + 1) * K // TP)
        try:
            # the scales of the weight's forward cast: its tp part, reduced, against the whole's
            axis = None if c.cast_config_weight.scaling_granularity is ScalingGranularity.TENSORWISE else 0
            want = tensor_to_scale(w.t(), c.cast_config_weight.target_dtype, scaling_granularity=c.cast_config_weight.scaling_granularity,
                                   axiswise_dim=axis, round_scales_to_power_of_2=c.round_scales_to_power_of_2)
            col_q = float8.to_float8(w[rows].t(), c.cast_config_weight, float8.GemmInputRole.WEIGHT, 0, float8.SPLIT["column"][1:], c)
            row_q = float8.to_float8(w[:, cols].t(), c.cast_config_weight, float8.GemmInputRole.WEIGHT, 0, float8.SPLIT["row"][1:], c)
            if axis is None:
                assert col_q._scale.item() == row_q._scale.item() == want.item(), (col_q._scale, row_q._scale, want)
                assert want.item() == 448.0 / 0.5  # e4m3's largest over the amax
            else:  # one per output row, over K: whole in a column-parallel part, split in a row-parallel one
                assert torch.equal(col_q._scale, want[:, rows]) and torch.equal(row_q._scale, want), (col_q._scale, want)
            # column-parallel: W's rows split; x whole on every rank; dx summed over tp
            xc, wc = x.clone().requires_grad_(), w[rows].clone().requires_grad_()
            y = float8.float8_linear(xc, wc, None, "column")
            y.backward(dy[:, rows])
            dist.all_reduce(xc.grad)  # Megatron's f in backward
            assert torch.equal(y, ref[:, rows]), "column-parallel y"
            assert torch.equal(wc.grad, ref_w.grad[rows]), "column-parallel dW"
            torch.testing.assert_close(xc.grad, ref_x.grad, rtol=1e-6, atol=1e-6, msg="column-parallel dx")
            # row-parallel: W's columns and x's features split; y summed over tp
            xr, wr = x[:, cols].clone().requires_grad_(), w[:, cols].clone().requires_grad_()
            y = float8.float8_linear(xr, wr, None, "row")
            y.backward(dy)
            y = y.detach().clone()
            dist.all_reduce(y)  # Megatron's g in forward
            torch.testing.assert_close(y, ref.detach(), rtol=1e-6, atol=1e-6, msg="row-parallel y")
            assert torch.equal(wr.grad, ref_w.grad[:, cols]), "row-parallel dW"
            assert torch.equal(xr.grad, ref_x.grad[:, cols]), "row-parallel dx"
            # torchao's Float8TrainingTensor reached the GEMM: not a high-precision matmul
            assert type(col_q).__name__ == "Float8TrainingTensor" and col_q._data.dtype == torch.float8_e4m3fn
            assert not torch.equal(ref, x @ w.t()), "the output is the fp32 product: nothing was cast"
            print(f"{recipe} rank {RANK} ok", flush=True)
        except AssertionError:
            print(f"{recipe} rank {RANK} differs:", traceback.format_exc(), flush=True)
        mesh.GROUPS.clear()
    dist.destroy_process_group()
    """
)


def test_tp_float8_linears_cast_with_the_serial_scales(run_script, tmp_path):
    pytest.importorskip("torchao")
    (tmp_path / "driver.py").write_text(DRIVER)
    jobs = []
    for recipe in ("tensorwise", "rowwise"):
        plan = load_text(PLAN.format(recipe=recipe)).program.plans[0]
        jobs.append([str(codegen.write(plan, tmp_path / recipe)), recipe])
    run = run_script(tmp_path / "driver.py", 2, json.dumps(jobs))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    for recipe in ("tensorwise", "rowwise"):
        assert {int(r) for r in re.findall(rf"{recipe} rank (\d+) ok", run.stdout)} == {0, 1}, run.stdout[-4000:]
