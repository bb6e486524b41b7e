"""The chunked loss (the generated layers.py's linear_cross_entropy) against
F.cross_entropy on the whole logits: values and gradients, for chunk counts from one row
a chunk to one chunk, with a last short chunk, and without gradients (validation)."""

from __future__ import annotations

import sys

import pytest

from dslc import codegen


@pytest.fixture(scope="module")
def layers(golden_plans, unformatted, tmp_path_factory):
    pytest.importorskip("torch")
    with unformatted():
        folder = codegen.write(golden_plans["gpt2_serial"], tmp_path_factory.mktemp("loss"))
    sys.path.insert(0, str(folder))
    try:
        for name in ("layers", "plan", "meter", "mesh", "utils"):
            sys.modules.pop(name, None)
        import layers as module
    finally:
        sys.path.remove(str(folder))
    yield module
    for name in ("layers", "plan", "meter", "mesh", "utils"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("rows", [1, 5, 16, 37, 64])
def test_chunked_loss_equals_cross_entropy_on_whole_logits(layers, rows, monkeypatch):
    import torch
    import torch.nn.functional as F

    monkeypatch.setattr(layers, "LOSS_CHUNK_ROWS", rows)
    g = torch.Generator().manual_seed(0)
    B, T, C, V = 1, 37, 16, 50
    x0, w0 = torch.randn(B, T, C, generator=g), torch.randn(V, C, generator=g) * 0.3
    targets = torch.randint(0, V, (B, T), generator=g)
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    want = F.cross_entropy(F.linear(x, w).view(-1, V), targets.view(-1))
    (want * 3.0).backward()  # a grad_output other than 1, as the micro-batch's scale
    xc, wc = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    got = layers.linear_cross_entropy(xc, wc, targets)
    (got * 3.0).backward()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(xc.grad, x.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(wc.grad, w.grad, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(layers.linear_cross_entropy(x0, w0, targets), want.detach(), rtol=1e-6, atol=1e-6)
