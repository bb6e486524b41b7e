"""dslc.front.edit: the plan file ``dslc search -o`` writes, one layout in the input plan's
own text. Every plan of plans/ with layouts of the search and layouts made by hand lints
clean and lowers to the layout; comments survive; a second write is the same; paths still
resolve from another folder; a resized cluster is written as a new block."""

from __future__ import annotations

import functools
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dslc import check, driver, search
from dslc.fit import fits
from dslc.front import edit
from dslc.front.fmt import format_text
from dslc.front.parse import parse
from dslc.front.textedit import quote
from dslc.ir import MeshAxis

ROOT = Path(__file__).resolve().parents[1]
PLANS = sorted((ROOT / "plans").glob("*.plan"))
CASES = [(path, plan.name) for path in PLANS for plan in driver.load_paths([str(path)]).own_plans]


@functools.cache
def plan_of(path: Path, name: str):
    return next(p for p in driver.load_paths([str(path)]).own_plans if p.name == name)


@functools.cache
def ranked(path: Path, name: str) -> list:
    return [f.plan for f in search.search(plan_of(path, name), beam=2).ranked]


def passes(p) -> bool:
    return not any(d.severity.value in ("error", "warning") for d in check.check_plan(p, files=False))


def by_hand(plan) -> list:
    """Layouts made from the plan itself: full every 2, another micro-batch, sp off, zero 3
    with an HSDP shard, no context parallel options (those that pass the rules)."""
    t = plan.train
    out = [replace(plan, train=replace(t, recompute="full", recompute_every=2)),
           replace(plan, tensor_parallel=replace(plan.tensor_parallel, sequence_parallel=False))]
    ranks = plan.data_parallel_size
    for mb in (t.micro_batch * 2, max(1, t.micro_batch // 2)):
        if t.global_batch % (mb * ranks) == 0:
            out.append(replace(plan, train=replace(t, micro_batch=mb), pipeline=replace(plan.pipeline, microbatches=t.global_batch // (mb * ranks))))
    if plan.dp >= 4:
        out.append(replace(plan, data_parallel=replace(plan.data_parallel, zero=3, shard=2, reshard_after_forward=False)))
    return [p for p in out if p != plan and passes(p) and fits(p)[0]]


def sample(path: Path, name: str) -> list:
    """The search's three fastest and its slowest, and the first of each kind it found (pp 1
    and more, cp and none, zero 3 with a shard, full every 2, sp off, ep), and by_hand's."""
    pool = ranked(path, name)
    kinds = [lambda p: p.pp > 1, lambda p: p.pp == 1, lambda p: p.cp > 1, lambda p: p.cp == 1,
             lambda p: p.data_parallel.hsdp(p.dp), lambda p: p.train.recompute_every > 1,
             lambda p: p.tp > 1 and not p.tensor_parallel.sequence_parallel, lambda p: p.ep > 1,
             lambda p: p.context_parallel.method == "ulysses" and p.cp > 1]
    picked = pool[:3] + pool[-1:] + [next((p for p in pool if kind(p)), None) for kind in kinds]
    return list(dict.fromkeys(p for p in picked + by_hand(plan_of(path, name)) if p is not None))


def comments(text: str) -> list[str]:
    """The comments of a plan's text (none of plans/ has '//' or '#' in a string)."""
    blank = [re.sub(r'"[^"]*"', lambda m: '"' + "x" * (len(m.group(0)) - 2) + '"', line) for line in text.split("\n")]
    return [line[m.start():].rstrip() for line, b in zip(text.split("\n"), blank) if (m := re.search(r"(//|#).*", b))]


def plan_text(path: Path, name: str) -> str:
    text = path.read_text()
    tree, _ = parse(text, str(path))
    b = next(i for i in tree.items if getattr(i, "kind", None) == "plan" and i.name == name)
    lines = text.split("\n")
    return "\n".join(lines[b.span.line - 1 : b.span.end_line])


def lowered(text: str, out: str, name: str):
    result = driver.load_text(text, out)
    bad = [f"{d.code} {d.message}" for d in result.diagnostics if d.severity.value in ("error", "warning")]
    assert bad == [], text
    return next(p for p in result.plans if p.name == name)


def body(text: str) -> str:
    assert text.startswith(edit.HEADER)
    return text.split("\n\n", 1)[1]


@pytest.mark.parametrize("path, name", CASES, ids=[n for _, n in CASES])
def test_layouts_of_every_plan(path, name):
    plan = plan_of(path, name)
    out = str(path.parent / f"{name}_searched.plan")
    own = comments(plan_text(path, name))
    layouts_ = sample(path, name)
    assert len(layouts_) >= 2
    for layout in layouts_:
        text = driver.layout_file(plan, layout, out, f"{name}_searched", ["mesh a→b"])
        got = lowered(text, out, f"{name}_searched")
        assert edit.same_layout(got, layout) == [], text
        assert all(c in text for c in own if "microbatches" not in c or layout.pp > 1 or "pipeline" in text), text
        # written again from what it wrote, with the same layout: the same text, and formatted
        again = driver.layout_file(got, layout, out, f"{name}_searched", source=text)
        assert body(again) == body(text) and format_text(text, out) == text
        assert "mesh a→b" in text and "\n\n" in text


def test_the_plans_own_layout_is_its_text():
    """With nothing changed the plan block is the plan's, but for its name."""
    path = ROOT / "plans" / "llama3_70b.plan"
    plan = plan_of(path, "llama3_70b")
    text = edit.layout_text(plan, plan, str(path), "same")
    assert "Changed: nothing" in text
    assert body(text).replace("plan same {", "plan llama3_70b {") == path.read_text()


def test_another_folder(tmp_path):
    """Imports and data paths are rewritten for the output's folder and still resolve
    (lint checks the data file is there), and the file written there loads."""
    for file, name in (("tiny_demo.plan", "tiny_demo"), ("gpt2_124m_dp8.plan", "gpt2_124m_dp8"), ("long_context.plan", "long_context_cp4")):
        path = ROOT / "plans" / file
        plan = plan_of(path, name)
        out = tmp_path / "sub" / "x.plan"
        text = driver.layout_file(plan, ranked(path, name)[0], str(out), "x")
        assert "../data/verse.txt" not in text or file == "gpt2_124m_dp8.plan"
        out.parent.mkdir(exist_ok=True)
        out.write_text(text)
        result = driver.load_paths([str(out)])
        assert [d.code for d in result.diagnostics if d.severity.value != "note"] == []
        assert result.plans[0].train.data.resolved_path in (None, str((ROOT / "data" / "verse.txt").resolve()).replace(str(ROOT), str(ROOT)))
        assert "plan long_context_serial" not in text and "cluster cpu {" not in text


def test_resized_cluster_is_a_new_block():
    """--gpus: the imported cluster is copied under a new name with the new node count; the
    plan names it. Less than a node: gpus_per_node too, and the file's own cluster goes."""
    path = ROOT / "plans" / "llama3_70b.plan"
    plan = plan_of(path, "llama3_70b")
    mesh = replace(plan.mesh, axes=(replace(plan.mesh.axes[0], size=4), *plan.mesh.axes[1:]))
    layout = replace(plan, cluster=search.resize(plan.cluster, 128), mesh=mesh, pipeline=replace(plan.pipeline, microbatches=16))
    text = driver.layout_file(plan, layout, str(path), "big")
    assert "cluster h100_8x8_128gpus {" in text and "cluster = h100_8x8_128gpus" in text and "nodes = 16" in text
    assert "link ib     { scope = cluster; bandwidth = 400 Gb/s; latency = 8 us }" in text  # its text, copied
    got = lowered(text, str(path), "big")
    assert (got.cluster.nodes, got.cluster.name) == (16, "h100_8x8_128gpus")
    assert body(edit.layout_text(got, layout, str(path), "big", source=text)) == body(text)

    path = ROOT / "plans" / "tiny_demo.plan"
    plan = plan_of(path, "tiny_demo")
    small = search.search(plan, gpus=2).ranked[0].plan
    text = driver.layout_file(plan, small, str(path), "small")
    assert "cluster cpu4 {" not in text and "cluster cpu4_2gpus {" in text and "gpus_per_node = 2" in text
    assert lowered(text, str(path), "small").cluster.world_size == 2


def test_a_resized_cluster_is_said_to_grow_or_shrink_in_the_header_and_its_note():
    """--gpus 1024 of a 64-GPU plan grows the cluster (it said "cut to 1024 GPUs"); --gpus 2
    of a 4-GPU plan cuts it; the header's list of changes names the cluster's too."""
    path = ROOT / "plans" / "llama3_70b.plan"
    plan = plan_of(path, "llama3_70b")
    best = search.search(plan, gpus=1024).ranked[0]
    text = driver.layout_file(plan, best.plan, str(path), "big", best.changes)
    grown = "h100_8x8 grown from 64 GPUs (8 × 8) to 1024 (128 × 8)"
    assert f"// Changed: cluster {grown}\n" in text and f"// {grown} by dslc search\n" in text and " cut " not in text
    path = ROOT / "plans" / "tiny_demo.plan"
    plan = plan_of(path, "tiny_demo")
    small = search.search(plan, gpus=2).ranked[0]
    text = driver.layout_file(plan, small.plan, str(path), "small", small.changes)
    assert "// Changed: cluster cpu4 cut from 4 GPUs (1 × 4) to 2 (1 × 2)\n" in text and "grown" not in text


def test_inline_blocks_and_every_entry_added(tmp_path):
    """A plan with an inline cluster and none of the parallel blocks or train keys: each is
    added where it reads best, and the inline cluster is resized in place."""
    src = ("plan p {\n    model llama { layers = 4; hidden = 64; heads = 4; vocab = 256; seq_len = 64 }  // tiny\n"
           "    cluster c { nodes = 1; gpus_per_node = 1; device = cpu\n        link shm { scope = node; bandwidth = 10 GB/s } }\n"
           "    train { steps = 2; global_batch = 16 }\n}\n")
    plan = lowered(src, str(tmp_path / "p.plan"), "p")
    mesh = replace(plan.mesh, axes=tuple(MeshAxis(n, s, "shm", plan.mesh.span) for n, s in (("dp", 4), ("pp", 2), ("cp", 2), ("tp", 2))))
    layout = replace(plan, mesh=mesh, cluster=replace(plan.cluster, nodes=1, gpus_per_node=32),
                     tensor_parallel=replace(plan.tensor_parallel, sequence_parallel=True),
                     data_parallel=replace(plan.data_parallel, zero=1),
                     pipeline=replace(plan.pipeline, schedule="interleaved_1f1b", virtual_stages=2, microbatches=2),
                     context_parallel=replace(plan.context_parallel, method="ring", load_balance=False),
                     train=replace(plan.train, micro_batch=2, recompute="full", recompute_every=2))
    assert passes(layout)
    text = edit.layout_text(plan, layout, str(tmp_path / "q.plan"), "q", source=src)
    assert "cluster c { nodes = 1; gpus_per_node = 32;" in text and "micro_batch = 2" in text and "recompute = full every 2" in text
    assert "context_parallel { method = ring; load_balance = false }" in text and "// tiny" in text
    # and back: every block removed again, no key left behind that would warn
    back = edit.layout_text(lowered(text, str(tmp_path / "q.plan"), "q"), replace(plan, train=replace(plan.train, micro_batch=1)),
                            str(tmp_path / "r.plan"), "r", source=text)
    for word in ("mesh", "tensor_parallel", "data_parallel", "pipeline", "context_parallel", "every"):
        assert f"{word} " not in body(back).split("train")[0] or word == "every", back


def test_strings_that_need_quoting(tmp_path):
    """A data file and a plan folder whose names hold a quote, a backslash, non-ASCII and a
    newline: the paths are written so that they read back as the same file, and the header
    shows the plan's path on one line."""
    weird = 'v\u00e9"r\\s\ne \u2028.txt'
    (tmp_path / "data").mkdir()
    shutil.copy(ROOT / "data" / "verse.txt", tmp_path / "data" / weird)
    folder = tmp_path / "p\nq"
    folder.mkdir()
    src = (ROOT / "plans" / "tiny_demo.plan").read_text().replace('text("../data/verse.txt")', f"text({quote('../data/' + weird)})")
    (folder / "t.plan").write_text(src)
    plan = driver.load_paths([str(folder / "t.plan")]).plans[0]
    assert plan.train.data.path == "../data/" + weird
    out = tmp_path / "o" / "u" / "t.plan"
    layout = ranked(ROOT / "plans" / "tiny_demo.plan", "tiny_demo")[-1]
    layout = replace(layout, train=replace(layout.train, data=plan.train.data))
    text = driver.layout_file(plan, layout, str(out), "t2")
    header = text.split("\n\n")[0]
    assert len(header.split("\n")) == len([c for c in header.split("\n") if c.startswith("//")])
    assert "p\\x0aq" in header and "\u2028" not in text  # escaped as diagnostics escape it
    assert lowered(text, str(out), "t2").train.data.resolved_path == str(tmp_path / "data" / weird)
    with pytest.raises(ValueError):
        edit.layout_text(plan, plan, str(out), "true")


def test_a_wrong_layout_is_refused():
    """A layout the writer cannot express (another device) is caught by its own check."""
    path = ROOT / "plans" / "tiny_demo.plan"
    plan = plan_of(path, "tiny_demo")
    other = replace(plan, cluster=replace(plan.cluster, device=replace(plan.cluster.device, memory=1)))
    with pytest.raises(edit.WriteError, match="cluster.device.memory"):
        edit.layout_text(plan, other, str(path), "x")


SMALL = [("tiny_demo.plan", "tiny_demo"), ("tiny_moe.plan", "tiny_moe"), ("long_context.plan", "long_context_cp4"), ("llama3_8b.plan", "llama3_8b")]


@st.composite
def random_layout(draw):
    file, name = draw(st.sampled_from(SMALL))
    plan = plan_of(ROOT / "plans" / file, name)
    sizes = draw(st.sampled_from(list(search.degrees(plan, plan.cluster.world_size))))
    mesh = draw(st.sampled_from(list(search.meshes(plan, sizes))))
    ranks = sizes["dp"] * sizes["ep"]
    mb = draw(st.sampled_from(search.micro_batches(plan, plan.train.global_batch // ranks)))
    schedule, v = draw(st.sampled_from(search.schedules(plan, sizes["pp"])))
    zero, shard = draw(st.sampled_from(search.zero_stages(plan, mesh)))
    layout = search.with_layout(plan, mesh, schedule, v, mb, draw(st.booleans()) and sizes["tp"] > 1, draw(st.sampled_from(("ring", "ulysses"))),
                           zero, shard, draw(st.sampled_from(search.RECOMPUTE)))
    layout = replace(layout, data_parallel=replace(layout.data_parallel, reshard_after_forward=draw(st.booleans())),
                     context_parallel=replace(layout.context_parallel, load_balance=draw(st.booleans())))
    return plan, layout


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(random_layout())
def test_random_layouts(case):
    plan, layout = case
    assume(passes(layout))
    out = str(Path(plan.file).parent / "random.plan")
    text = edit.layout_text(plan, layout, out, "random")  # lowers to the layout, or raises
    got = driver.load_text(text, out, check=False).plans
    assert [d.code for d in check.check_plan(got[0], files=False) if d.severity.value != "note"] == []


def test_crlf_and_one_line_plans():
    """A file with CRLF line ends keeps them; a plan written on one line gets its new
    blocks on that line, joined by ';'."""
    path = ROOT / "plans" / "tiny_demo.plan"
    crlf = path.read_text().replace("\n", "\r\n")
    plan = lowered(crlf, str(path), "tiny_demo")
    for layout in ranked(path, "tiny_demo")[:3] + ranked(path, "tiny_demo")[-2:]:
        text = edit.layout_text(plan, layout, str(path), "c", source=crlf)
        assert "\n" not in text.replace("\r\n", ""), repr(text)
    one = path.read_text().split("plan tiny_demo")[0] + "plan one { model gpt2 { layers = 3; hidden = 128; heads = 4; vocab = 256; seq_len = 64 }; cluster = cpu4; mesh { dp = 4 on shm }; train { global_batch = 16; data = text(\"../data/verse.txt\") } }\n"
    plan = lowered(one, str(path), "one")
    for layout in ranked(path, "tiny_demo")[:3]:
        layout = replace(layout, train=replace(layout.train, steps=plan.train.steps, seed=plan.train.seed, optimizer=plan.train.optimizer,
                                               lr_schedule=plan.train.lr_schedule, grad_clip=plan.train.grad_clip))
        text = edit.layout_text(plan, layout, str(path), "one", source=one)
        line = next(x for x in text.split("\n") if x.startswith("plan one"))
        for word in ("tensor_parallel", "data_parallel", "pipeline", "context_parallel"):
            assert f"{word} {{" not in text or f"{word} {{" in line, text
        assert body(text).count("\n") == one.count("\n"), text


def test_every_path_the_plan_resolves(tmp_path):
    """Data of a blend, eval data and init = hf(…) are relative to the plan file: rewritten
    for the output's folder; checkpoint.dir is relative to the working directory: kept."""
    path = ROOT / "plans" / "tiny_demo.plan"
    src = path.read_text().replace('data = text("../data/verse.txt")',
                                   'data = blend(0.5, text("../data/verse.txt"), 0.5, tokens("/abs/x.bin"))\n'
                                   '        eval { data = text("../data/verse.txt") }\n        init = hf("ckpt/hf")\n'
                                   '        checkpoint { every = 5; dir = "ck/run" }')
    plan = lowered_quietly(src, str(path))
    layout = ranked(path, "tiny_demo")[0]
    layout = replace(layout, train=replace(plan.train, micro_batch=layout.train.micro_batch, recompute=layout.train.recompute,
                                           recompute_every=layout.train.recompute_every))
    out = tmp_path / "a" / "b.plan"
    text = edit.layout_text(plan, layout, str(out), "b", source=src)
    rel = os.path.relpath(ROOT, out.parent)
    assert text.count(f'text("{rel}/data/verse.txt")') == 2 and f'hf("{rel}/plans/ckpt/hf")' in text
    assert 'tokens("/abs/x.bin")' in text and 'dir = "ck/run"' in text


def lowered_quietly(text: str, out: str):
    return driver.load_text(text, out, check=False).plans[0]
