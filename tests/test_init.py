"""The start-up of a generated script: the model is built on the meta device and each rank
draws only its own part of the global weights, the same values the serial plan draws.

utils.py's counter-based draws (normal_at, fill_normal) are checked for their statistics
and for giving any part of a tensor what a draw of the whole gives there; then the
generated model of each rank of pp4 plans (with tp and a padded vocabulary, tied
embeddings, experts over ep) is built in this process, as train.py builds it, on the CPU
and with each rank's coordinates: every tensor the start-up allocates is one of that
rank's own parameters or a small temporary, the elements it draws are its parameters'
own, and its parameters equal their part of the serial model's.
"""

from __future__ import annotations

import itertools
import math

import pytest

from dslc import codegen
from dslc.driver import load_text

torch = pytest.importorskip("torch")

PLAN = """
cluster c {{ nodes = 1; gpus_per_node = {n}; device = cpu
            link shm {{ scope = node; bandwidth = 10 GB/s; latency = 10 us }} }}
plan p {{
    model {arch} {{ {model} }}
    cluster = c
    {mesh}
    train {{ micro_batch = 1; global_batch = 8; data = synthetic; seed = 5 }}
}}
"""

# The pp4 plan, compared with its model's serial plan: tied embeddings (the first and the
# last stage hold wte), 95 ids over tp 2 (the last tp rank's last row pads the vocabulary),
# 4 experts over ep 2 (each ep rank draws experts 2r and 2r + 1), rope
MODEL = ("mixtral", "layers = 4; hidden = 32; heads = 4; kv_heads = 2; ffn = 48; vocab = 95; seq_len = 16; "
         "experts = 4; top_k = 2; tie_embeddings = true")
MESH = {"pp": 4, "tp": 2, "ep": 2}


def compiled(tmp_path, import_generated, name, arch, model, mesh):
    """The plan of `model` over `mesh` ({axis: degree}) compiled: its model and utils
    modules, imported together (with the mesh.COORDS they share)."""
    axes = "; ".join(f"{a} = {d} on shm" for a, d in mesh.items())
    if mesh:  # (sequence parallel: experts over tp need it)
        axes = f"mesh {{ {axes} }} tensor_parallel {{ sequence_parallel = true }}"
    text = PLAN.format(n=math.prod(mesh.values()), arch=arch, model=model, mesh=axes)
    res = load_text(text)
    errors = [f"{d.code} {d.message}" for d in res.diagnostics if d.is_error]
    assert not errors, errors
    folder = codegen.write(res.program.plans[0], tmp_path / name)
    return dict(zip(("model", "utils"), import_generated(folder, "model", "utils")))


@pytest.fixture(scope="module")
def serial(tmp_path_factory, import_generated):
    return compiled(tmp_path_factory.mktemp("init"), import_generated, "serial", *MODEL, {})


@pytest.fixture
def utils(serial):
    return serial["utils"]


def test_draws_are_standard_normal(utils):
    n = 1 << 20
    z = utils.normal_at(utils.seed_key(1, "init", "w"), torch.arange(n))
    assert z.dtype == torch.float64
    assert abs(z.mean().item()) < 5 / math.sqrt(n) and abs(z.std().item() - 1) < 5 / math.sqrt(2 * n)
    for k, share in ((1, 0.682689), (2, 0.954500), (3, 0.997300)):  # within k sigma
        assert abs((z.abs() < k).double().mean().item() - share) < 5 * math.sqrt(share * (1 - share) / n), k
    assert z.abs().max().item() < 6.7
    other = utils.normal_at(utils.seed_key(1, "init", "v"), torch.arange(n))
    assert abs(torch.corrcoef(torch.stack([z, other]))[0, 1].item()) < 5 / math.sqrt(n)
    pairs = torch.corrcoef(torch.stack([z[:-1], z[1:]]))[0, 1].item()  # neighbouring indices
    assert abs(pairs) < 5 / math.sqrt(n)


def test_any_part_of_a_tensor_is_the_whole_draws_part(utils, monkeypatch):
    shape, key, std = (5, 12, 34), utils.seed_key(3, "init", "x"), 0.02
    whole = torch.empty(shape)
    utils.fill_normal(whole, key, shape, [(0, n) for n in shape], std)
    assert whole.std().item() == pytest.approx(std, rel=0.1)
    monkeypatch.setattr(utils, "DRAW_CHUNK", 40)  # several rows at a time, and one
    for box in ([(1, 4), (0, 12), (30, 34)], [(2, 3), (5, 11), (0, 34)], [(0, 5), (3, 4), (7, 8)]):
        part = torch.empty([z - a for a, z in box], dtype=torch.bfloat16)
        utils.fill_normal(part, key, shape, box, std)
        want = whole[tuple(slice(a, z) for a, z in box)].to(torch.bfloat16)
        assert torch.equal(part, want), box


def built(m, coords, seed):
    """The model of the rank at `coords`, as train.py builds it on the CPU: on the meta
    device, then its parameters given storage and drawn."""
    if coords:  # (a serial plan has none)
        m["model"].COORDS.update(coords)
    with torch.device("meta"):
        model = m["model"].Transformer()
    assert all(p.is_meta for p in model.parameters())  # no weight held yet
    m["model"].materialize(model, torch.device("cpu"))
    m["model"].init_weights(model.named_parameters(), seed)
    return model


class Allocations(torch.utils._python_dispatch.TorchDispatchMode):
    """The bytes of every tensor an op allocates: the outputs of the ops whose outputs
    alias no input (not views, not in-place)."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not any(r.alias_info for r in func._schema.returns):
            for t in torch.utils._pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor) and not t.is_meta:
                    self.sizes.append(t.untyped_storage().nbytes())
        return out


def test_a_pp4_rank_draws_only_its_own_part(serial, tmp_path, monkeypatch, import_generated):
    want = dict(built(serial, {}, 5).named_parameters())  # the global weights
    m = compiled(tmp_path, import_generated, "parallel", *MODEL, MESH)
    drawn, normal_at = [], m["utils"].normal_at

    def counted(key, index):
        drawn.append(index.numel())
        return normal_at(key, index)

    monkeypatch.setattr(m["utils"], "normal_at", counted)
    monkeypatch.setattr(m["utils"], "DRAW_CHUNK", 256)
    held = set()
    for at in itertools.product(*(range(d) for d in MESH.values())):
        coords = dict(zip(MESH, at))
        drawn.clear()
        with Allocations() as allocated:
            params = dict(built(m, coords, 5).named_parameters())
        assert {int(n.split(".")[1]) for n in params if n.startswith("blocks.")} == {coords["pp"]}  # its layer
        held |= set(params)
        own, normal, row = [], 0, 0
        for name, p in params.items():
            shape, box = m["model"].global_part(p)
            part = want[name][tuple(slice(a, z) for a, z in box)]
            rows = box[0][1] - box[0][0]  # the rest pad the vocabulary
            assert torch.equal(p[:rows], part) and not p[rows:].any(), (coords, name)
            own.append(p.untyped_storage().nbytes())
            normal += part.numel() if p.init == "normal" else 0
            row = max(row, p.size(-1))
        assert sum(drawn) == normal, coords  # not one element of another rank's
        # every allocation is one of its parameters or a temporary of the draws' chunk
        # (int64 and float64: 8 bytes an element): no other stage's tensor, nor a whole
        # tensor drawn and cut, was ever held
        others = list(allocated.sizes)
        for size in own:
            others.remove(size)
        assert max(others, default=0) <= 8 * max(256, row), (coords, max(others))
    assert held == set(want)  # the ranks together hold the whole model
