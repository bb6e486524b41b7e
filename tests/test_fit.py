"""The E090 hint proposes only plans a user could write and lint clean.

The hint names single changes ("tp = 4 with dp = 2", "zero = 3"). These tests apply each
named change to the plan the way a user would edit the file (set the key, keep the global
batch, let the micro-batch count follow) and lint the result with the same driver as
``dslc lint``: a change said to fit must lint without any error, the "closest" change
without any error but E090."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from irbuild import GiB, model, plan

from dslc import driver, fit
from dslc.check import check_plan
from dslc.ir import Offload

LABEL = re.compile(r"(zero|recompute|micro_batch|tp|pp) = (\w+(?: every \d+)?)(?: with dp = (\d+))?|offload \{ [^}]* \}")


def edited(p, label: str):
    """The plan a user gets by writing the change ``label`` into the plan file."""
    if label.startswith("offload"):  # offload { optimizer = true; activations = true }
        o = Offload("optimizer = true" in label, "activations = true" in label, None)
        return replace(p, train=replace(p.train, offload=o))
    knob, value, dp = LABEL.fullmatch(label).groups()
    if knob == "zero":
        return replace(p, data_parallel=replace(p.data_parallel, zero=int(value)))
    if knob == "recompute":  # `full every 2`
        policy, _, every = value.partition(" every ")
        return replace(p, train=replace(p.train, recompute=policy, recompute_every=int(every or 1)))
    train, mesh = p.train, p.mesh
    if knob == "micro_batch":
        train = replace(train, micro_batch=int(value))
    else:
        axes = [replace(a, size=int(dp)) if a.name == "dp" else a for a in mesh.axes]
        if mesh.axis(knob):
            axes = [replace(a, size=int(value)) if a.name == knob else a for a in axes]
        else:  # a new axis, placed where the dp axis was (its link too)
            dp_axis = mesh.axis("dp")
            axes.append(replace(dp_axis, name=knob, size=int(value)))
        mesh = replace(mesh, axes=tuple(axes))
    ranks = mesh.size("dp") * mesh.size("ep")
    micro = train.global_batch // (train.micro_batch * ranks)
    return replace(p, train=train, mesh=mesh, pipeline=replace(p.pipeline, microbatches=micro, layers_per_stage=None))


def proposals(diag) -> tuple[list[str], list[str]]:
    """(labels said to fit, the closest label) from an E090 hint."""
    hint = diag.hint
    if hint.startswith("it fits with any one of: "):
        return [m.group(0) for m in LABEL.finditer(hint)], []
    close = re.search(r"closest: (.*?) \(", hint)
    return [], [close.group(1)] if close else []


def errors(p) -> list[str]:
    return sorted(d.code for d in driver.lint(p) if d.is_error)


@st.composite
def plans(draw):
    arch = draw(st.sampled_from(["gpt2", "llama"]))
    heads = draw(st.sampled_from([4, 8, 12, 16, 32]))
    kv = heads if arch == "gpt2" else draw(st.sampled_from([k for k in (1, 2, 4, 8, heads) if heads % k == 0]))
    hidden = heads * draw(st.sampled_from([64, 128]))
    layers = draw(st.integers(2, 48))
    ffn = draw(st.sampled_from([2 * hidden, 3 * hidden, 4 * hidden + 64]))
    mdl = model(arch, layers, hidden, heads, draw(st.sampled_from([32000, 50257, 128256])), draw(st.sampled_from([1024, 4096])),
                kv=kv, ffn=ffn)
    dp, pp, tp = (draw(st.sampled_from(s)) for s in ([1, 2, 4, 8, 16], [1, 2, 4], [1, 2, 4, 8]))
    axes = [(n, s, lk) for n, s, lk in (("dp", dp, "ib"), ("pp", pp, "nvlink"), ("tp", tp, "nvlink")) if s > 1]
    return plan(mdl, *axes, zero=draw(st.integers(0, 3)), recompute=draw(st.sampled_from(["none", "selective", "selective_ops", "full"])),
                b=draw(st.sampled_from([1, 2, 4, 8])), m=draw(st.sampled_from([4, 8])), sp=tp > 1 and draw(st.booleans()),
                memory=draw(st.sampled_from([4, 8, 16, 40])) * GiB)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(p=plans())
def test_every_change_the_hint_proposes_lints_clean(p):
    assume(not any(d.is_error for d in check_plan(p)))
    (diag,) = [d for d in driver.lint(p) if d.code == "E090"] or [None]
    assume(diag is not None)
    fit, close = proposals(diag)
    for label in fit:
        assert errors(edited(p, label)) == [], (label, diag.hint)
    for label in close:
        assert errors(edited(p, label)) in ([], ["E090"]), (label, diag.hint)


def test_gqa_hint_keeps_tp_within_the_kv_heads():
    """The bug this search fixes: a llama with 2 kv heads was told to use tp = 4, which
    lint rejects (E042): the kv heads are split over tp."""
    mdl = model("llama", 32, 4096, 32, 128256, 4096, kv=2, ffn=14336, tie=False)
    p = plan(mdl, ("dp", 8, "nvlink"), zero=0, b=4, m=1, memory=40 * GiB)
    assert not any(d.is_error for d in check_plan(p))
    (diag,) = fit.fit_diagnostics(p)
    assert [c.plan.tp for c in fit.variants(p) if c.knob == "tp"] == [2, 4, 8]  # what was on offer
    tps = [c.plan.tp for c in fit.candidates(p) if c.knob == "tp"]
    assert tps == [2]
    assert "tp = 4" not in diag.hint and "tp = 8" not in diag.hint
    for label in proposals(diag)[0] + proposals(diag)[1]:
        assert "E042" not in errors(edited(p, label))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_more_recompute_is_offered_by_the_memory_it_saves(arch):
    """none → selective → full every 2 → selective_ops → full for these models: each
    candidate keeps fewer activation bytes than the one before (the least change first)."""
    from dslc.cost import memory as est

    p = plan(model(arch, 8, 1024, 16, 32000, 1024, kv=4 if arch == "llama" else 16), ("dp", 8, "nvlink"), zero=0, b=4, m=1)
    cands = [c for c in fit.variants(p) if c.knob == "recompute"]
    assert [c.label for c in cands] == ["recompute = selective", "recompute = full every 2", "recompute = selective_ops", "recompute = full"]
    held = [est.layer_activation_bytes(c.plan) for c in cands]
    assert held == sorted(held, reverse=True) and held[0] < est.layer_activation_bytes(p)
    full = replace(p, train=replace(p.train, recompute="full"))
    assert not [c for c in fit.variants(full) if c.knob == "recompute"]  # nothing keeps less


@pytest.mark.parametrize("label, key", [("zero = 3", "zero"), ("tp = 2 with dp = 4", "tp"), ("micro_batch = 2", "micro_batch"),
                                        ("recompute = full every 2", "recompute"), ("recompute = selective_ops", "recompute")])
def test_labels_are_what_the_candidates_are(label, key):
    """edited() reads a label as a user would; it builds the same plan as the search."""
    mdl = model("llama", 8, 1024, 16, 32000, 1024, kv=4)
    p = plan(mdl, ("dp", 8, "nvlink"), zero=0, b=4, m=1)
    cand = next(c for c in fit.variants(p) if c.label == label)
    assert cand.knob == key and edited(p, label) == cand.plan



@pytest.mark.parametrize("axes, schedule, v, split, head, tail", [
    ((("dp", 2, "nvlink"),), "1f1b", 1, None, "the plan needs ", "(1 micro-batch in flight × 16 layers)"),
    ((("pp", 2, "nvlink"),), "1f1b", 1, None, "pipeline stage 0 needs ", "(2 micro-batches in flight × 8 layers)"),
    # interleaved: a stage holds v chunks of L/(p·v) layers, and what is in flight is chunks
    ((("pp", 2, "nvlink"),), "interleaved_1f1b", 2, None, "pipeline stage 0 needs ",
     "(5 micro-batch chunks in flight × 4 layers each: the stage's 8 layers in 2 chunks)"),
    ((("pp", 2, "nvlink"),), "interleaved_1f1b", 2, (3, 2, 5, 6), "pipeline stage 0 needs ",
     "(5 micro-batch chunks in flight × 4 layers each on average: the stage's 8 layers in chunks of 3 and 5)"),
])
def test_memory_error_counts_what_is_in_flight(axes, schedule, v, split, head, tail):
    """E090's activations: micro-batches × the stage's layers without interleaving; with it,
    chunks in flight × the layers of one chunk (not of the whole stage)."""
    mdl = model("llama", 16, 4096, 32, 32000, 4096, kv=8)
    p = plan(mdl, *axes, schedule=schedule, v=v, m=4, memory=GiB)
    if split:
        p = replace(p, pipeline=replace(p.pipeline, layers_per_stage=split))
    (d, *_) = fit.fit_diagnostics(p)
    assert d.message.startswith(head) and tail in d.message, d.message


def test_the_hint_offers_offload_beyond_what_the_plan_offloads():
    """`offload { optimizer = false }` offloads nothing: the hint still offers the optimizer;
    a plan that offloads its optimizer already is offered the activations beside it."""
    from dslc.ir import Offload

    p = plan(model("llama", l=32, h=4096, a=32, kv=8, ffn=14336, V=128256, s=4096), ("tp", 1, "nvlink"))
    both = "offload { optimizer = true; activations = true }"
    for now, offered in ((Offload(False, False, None), ["offload { optimizer = true }", "offload { activations = true }", both]),
                         (Offload(True, False, None), [both])):
        labels = [c.label for c in fit.variants(replace(p, train=replace(p.train, offload=now))) if c.knob == "offload"]
        assert labels == offered
