"""The activation offload of a generated script (activation_offload.py), imported as it is
and run on a CPU on a chain of small blocks: what a block saves leaves for a host buffer
of its own and comes back as another tensor (real copies, so the bookkeeping that a GPU
runs asynchronously runs here too), one block ahead of the backward, with the gradients
of the same blocks run without it; the weights stay where they are. The golden plans
(tests/test_golden.py) and --measure's bytes (tests/test_measure.py) cover whole scripts."""

from __future__ import annotations

import sys

import pytest

from dslc import codegen
from dslc.driver import load_text

PLAN = """
cluster c { nodes = 1; gpus_per_node = 1; device = cpu
            link shm { scope = node; bandwidth = 10 GB/s; latency = 10 us } }
plan p {
    model llama { layers = 2; hidden = 16; heads = 2; vocab = 64; seq_len = 8 }
    cluster = c
    train { micro_batch = 2; global_batch = 2; data = synthetic; offload { activations = true } }
}
"""
MODULES = ("activation_offload", "meter", "plan", "utils")


@pytest.fixture
def offload(tmp_path, unformatted):
    """The generated activation_offload module."""
    pytest.importorskip("torch")
    with unformatted():
        folder = str(codegen.write(load_text(PLAN).program.plans[0], tmp_path))
    for name in MODULES:
        sys.modules.pop(name, None)
    sys.path.insert(0, folder)
    try:
        import activation_offload
    finally:
        sys.path.remove(folder)
        for name in MODULES:
            sys.modules.pop(name, None)
    return activation_offload


def test_saved_tensors_are_copied_out_and_back_one_block_ahead(offload, monkeypatch):
    import torch

    Block = offload.OffloadedBlock  # its calls spied on
    groups, originals, hosts, unpacked, arrived = [], [], [], [], []
    pack, close, unpack, arrive, init = Block.pack, Block.close, Block.unpack, Block.arrive, Block.__init__

    def spy_init(self, *args):
        init(self, *args)
        groups.append(self)

    def spy_pack(self, t):
        originals.append(t)  # kept alive: no later tensor can take its address
        return pack(self, t)

    def spy_close(self):
        close(self)
        hosts.extend(self.host.values())

    def spy_unpack(self, packed):
        t = unpack(self, packed)
        unpacked.append((packed, t))
        return t

    def spy_arrive(self):
        arrived.append((groups.index(self), self.back is not None))  # (block, prefetched)
        arrive(self)

    for name, spy in [("__init__", spy_init), ("pack", spy_pack), ("close", spy_close), ("unpack", spy_unpack), ("arrive", spy_arrive)]:
        monkeypatch.setattr(Block, name, spy)

    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()) for _ in range(3))
    inputs = [torch.randn(4, 8, requires_grad=True) for _ in range(2)]  # two micro-batches

    def forward(x, run):
        for block in blocks:
            x = run(block)(x)
        return x

    want = [forward(x, lambda b: b).square().sum() for x in inputs]
    want_grads = torch.autograd.grad(sum(want), [*blocks.parameters(), *inputs])

    offload.ACTIVATION_OFFLOAD.start(blocks, torch.device("cpu"))
    got = [forward(x, offload.offloaded).square().sum() for x in inputs]
    assert len(groups) == 6 and all(g.saved is None for g in groups)  # every forward closed
    # each micro-batch's blocks are a chain of their own: its first block follows none
    assert [g.previous is None for g in groups] == [True, False, False, True, False, False]
    got_grads = torch.autograd.grad(sum(got), [*blocks.parameters(), *inputs])

    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    weights = {p.untyped_storage().data_ptr() for p in blocks.parameters()}
    moved = [(packed, t) for packed, t in unpacked if not torch.is_tensor(packed)]
    assert moved and all(torch.is_tensor(t) for _, t in unpacked)
    assert not any(t.untyped_storage().data_ptr() in weights for _, t in moved)  # weights stay
    before = {t.untyped_storage().data_ptr() for t in originals}
    host = {h.untyped_storage().data_ptr() for h in hosts}
    assert host and not host & before  # host buffers of their own
    for packed, t in moved:  # back on the "device" as new storage, equal to what was saved
        assert t.untyped_storage().data_ptr() not in before | host
        saved = next(o for o in originals if o.untyped_storage().data_ptr() == packed[0])
        torch.testing.assert_close(t, saved.as_strided(packed[3], packed[4], packed[2]), rtol=0, atol=0)
    # backward runs micro-batch 1 then 0, each block 2, 1, 0: the last block's tensors are
    # fetched when its backward begins, every other block's while the one after it runs
    assert arrived == [(5, False), (4, True), (3, True), (2, False), (1, True), (0, True)]
