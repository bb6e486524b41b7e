"""The bad-plan corpus: each tests/cases/<name>.plan comes with
<name>.expected, one line per diagnostic (`CODE line:col`) that the author of
the case meant it to produce. The linter must report exactly those errors and
warnings, at those places, and exit with the matching code."""

from __future__ import annotations

from pathlib import Path

import pytest

from dslc.cli import main
from dslc.driver import load_paths, load_text

CASES = Path(__file__).parent / "cases"
PLANS = sorted(CASES.glob("*.plan"))


def expected(plan: Path) -> list[tuple[str, str]]:
    text = plan.with_suffix(".expected").read_text()
    return sorted(tuple(line.split()) for line in text.splitlines() if line.strip())


def test_corpus_is_large():
    assert len(PLANS) >= 40
    codes = {code for p in PLANS for code, _ in expected(p)}
    assert len(codes) >= 40, sorted(codes)


@pytest.mark.parametrize("plan", PLANS, ids=[p.stem for p in PLANS])
def test_case(plan: Path, capsys):
    result = load_paths([plan])
    got = sorted(
        (d.code, f"{d.span.line}:{d.span.col}")
        for d in result.diagnostics
        if d.severity.value != "note" and d.span and Path(d.span.file) == plan
    )
    assert got == expected(plan)
    has_error = any(code.startswith("E") for code, _ in expected(plan))
    assert main(["lint", str(plan)]) == (1 if has_error else 0)
    assert main(["lint", "--strict", str(plan)]) == 1
    out = capsys.readouterr().out
    code, where = expected(plan)[0]
    assert f"{plan}:{where}: " in out and f"[{code}]" in out


MOE = """cluster c {{ nodes = 1; gpus_per_node = 2; device = cpu; link shm {{ scope = node; bandwidth = 10 GB/s }} }}
plan p {{
    model {arch} {{ layers = 2; hidden = 64; heads = 4; vocab = 256; seq_len = 32{model} }}
    cluster = c
    mesh {{ dp = 2 on shm }}
    {experts}
}}
"""


@pytest.mark.parametrize("arch, model, experts, want", [
    ("mixtral", "; experts = 4", "", ("topk_softmax", 0.0, 0.0)),
    ("mixtral", "; experts = 4; router = softmax_topk; z_loss_weight = 0.001; capacity_factor = 1.25", "", ("softmax_topk", 0.001, 1.25)),
    ("mixtral", "", "experts { count = 4; router = softmax_topk; z_loss_weight = 0.01; capacity_factor = 2 }", ("softmax_topk", 0.01, 2.0)),
    ("llama", "", "", ("", 0.0, 0.0)),
])
def test_router_keys_reach_the_ir(arch, model, experts, want):
    """router, z_loss_weight and capacity_factor, from the model or the plan's experts block;
    left out: Mixtral's top-k-then-softmax router, no z-loss, dropless (0.0)."""
    res = load_text(MOE.format(arch=arch, model=model, experts=experts), "<t>")
    assert not [d.message for d in res.diagnostics if d.is_error]
    m = res.plans[0].model
    assert (m.router, m.z_loss_weight, m.capacity_factor) == want
