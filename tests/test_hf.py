"""Hugging Face out and in, and an independent reference for our model's math.

``--export-hf DIR`` writes a generated script's weights as a Hugging Face checkpoint
(model-0000k-of-0000n.safetensors and their index, or model.safetensors when one file holds
them, and config.json), every rank the tensors it owns, and ``train { init = hf("DIR") }``
starts a plan from one. The tests: the serial models of tests/golden (gpt2, llama, llama
with a head_dim apart from hidden / heads, mixtral), trained two steps (so no norm weight is
1 and no bias 0, and a misplaced one shows) and exported, give in ``transformers`` the
logits and loss of the script's own model, within 1e-5 (fp32, CPU); a bf16 pp2 x tp2 plan
exports in bf16 into several files of a small size, under a known umask, which
``transformers`` loads to the same logits, while no rank held more than a file's worth; a
checkpoint that ``transformers`` wrote comes back out of a plan byte for byte; tp2, dp2
ZeRO-3 and ep2 plans started from it take the serial plan's first step and export what
the serial plan exports; and a missing tensor, another model's config or a bad export
flag stops the script with one line. A folder from a stranger (HOSTILE: FIFOs and device
links in place of its files, links and index entries out of it, deep JSON, a corrupted
header, a wider fused qkv, an int tensor) stops the script with one line naming the file
and is E048 or E049 from lint at the init; and 60 fixed-seed mutations of an exported
folder each load the same weights or stop with one line, lint agreeing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import re
import shutil
import signal
from pathlib import Path

import pytest

from dslc import codegen
from dslc.driver import load_text

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

MODELS = {  # the golden tiny models
    "gpt2": "arch = gpt2; layers = 2; hidden = 64; heads = 4; vocab = 250; seq_len = 32",
    "llama": "arch = llama; layers = 2; hidden = 64; heads = 8; kv_heads = 4; vocab = 256; seq_len = 32",
    # head_dim apart from hidden / heads (Gemma, Qwen3): transformers' LlamaConfig(head_dim=24)
    "llamahd": "arch = llama; layers = 2; hidden = 64; heads = 4; kv_heads = 2; head_dim = 24; vocab = 256; seq_len = 32",
    "mixtral": "arch = mixtral; layers = 4; hidden = 32; heads = 4; kv_heads = 2; ffn = 48; vocab = 96; seq_len = 16; experts = 4; top_k = 2",
}

PLAN = """
cluster c {{ nodes = 1; gpus_per_node = {n}; device = cpu
            link shm {{ scope = node; bandwidth = 10 GB/s; latency = 10 us }} }}
plan p {{
    model m {{ {model} }}
    cluster = c
    {mesh}
    train {{
        steps = 1; micro_batch = 2; global_batch = 8; precision = {precision}; seed = 7
        optimizer adamw {{ lr = 1e-3 }}
        data = synthetic
        {init}
    }}
}}
"""


def compile_plan(tmp: Path, name: str, model: str, init: str | None, mesh: str = "", n: int = 1,
                 precision: str = "fp32") -> Path:
    """A plan file in ``tmp`` (init relative to it; None: drawn from the seed), compiled:
    its train.py."""
    init = f'init = hf("{init}")' if init else ""
    text = PLAN.format(n=n, model=model, mesh=mesh, init=init, precision=precision)
    res = load_text(text, str(tmp / f"{name}.plan"))
    errors = [f"{d.code} {d.message}" for d in res.diagnostics if d.is_error]
    assert not errors, errors
    return codegen.write(res.program.plans[0], tmp / name) / "train.py"


def model_section(script: Path, import_generated) -> dict:
    """The generated serial model: the names of its plan.py, model.py and moe.py (if any),
    imported from the script's folder."""
    folder = script.parent
    names = ["plan", "model"] + ["moe"] * (folder / "moe.py").exists()
    ns = {}
    for module in import_generated(folder, *names):
        ns.update(vars(module))
    return ns


def our_logits(ns: dict, weights: dict, x):
    """The serial model's logits: its own embed, blocks, norm and head (no router losses)."""
    model = ns["Transformer"]()
    model.load_state_dict(weights)
    model.eval()
    if "ROUTING" in ns:
        ns["ROUTING"].begin(1.0, model, torch.device("cpu"))
    with torch.no_grad():
        h = model.embed(x)
        rope = (model.rope_cos, model.rope_sin) if hasattr(model, "rope_cos") else ()
        for block in model.blocks:
            h = block(h, *rope)
        head = model.lm_head if hasattr(model, "lm_head") else model.wte.weight
        return torch.nn.functional.linear(model.norm(h), head)


def hf_model(folder: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.mark.parametrize("family", ["gpt2", "llama", "llamahd", "mixtral"])
def test_transformers_computes_our_logits(family, golden_plans, run_script, tmp_path, import_generated):
    plan = golden_plans[f"{family}_serial"]
    script = codegen.write(plan, tmp_path) / "train.py"
    out, weights = tmp_path / "hf", tmp_path / "w.pt"
    run = run_script(script, 1, "--steps", 2, "--export-hf", out, "--dump-weights", weights)
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]  # one file

    ns = model_section(script, import_generated)
    x = torch.randint(ns["VOCAB"], (2, ns["SEQ_LEN"]), generator=torch.Generator().manual_seed(0))
    ours = our_logits(ns, torch.load(weights), x)
    with torch.no_grad():
        theirs = hf_model(out)(input_ids=x, labels=x)  # their loss: each token predicts the next
    torch.testing.assert_close(theirs.logits, ours, rtol=1e-5, atol=1e-5)
    loss = torch.nn.functional.cross_entropy(ours[:, :-1].reshape(-1, ns["VOCAB"]), x[:, 1:].reshape(-1))
    torch.testing.assert_close(theirs.loss, loss, rtol=1e-5, atol=0)


INDEX = "model.safetensors.index.json"


def read_export(folder: Path) -> dict:
    """The tensors of an export by name, once its layout is checked: model.safetensors
    alone, or model-0000k-of-0000n.safetensors, every one of them named by the index,
    which names every tensor once, in the file that holds it, and their total size; and
    nothing else (no temporary file)."""
    names = sorted(p.name for p in folder.iterdir())
    if "model.safetensors" in names:
        assert names == ["config.json", "model.safetensors"]
        return safetensors_torch.load_file(folder / "model.safetensors")
    index = json.loads((folder / INDEX).read_text())
    files = sorted(set(index["weight_map"].values()))
    n = len(files)
    assert n > 1 and files == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    assert names == sorted(["config.json", INDEX, *files])
    tensors = {}
    for name in files:
        part = safetensors_torch.load_file(folder / name)
        assert part and not part.keys() & tensors.keys(), name  # each tensor in one file
        assert all(index["weight_map"][key] == name for key in part), name
        tensors.update(part)
    assert sorted(tensors) == sorted(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in tensors.values())
    return tensors


def exported_line(stdout: str) -> tuple[float, int, float]:
    """(bytes written, files, the most bytes one rank held) from the export's one line."""
    sizes = r"([\d.]+ [KMGT]?i?B)"
    found = re.findall(rf"^exported .+: {sizes} of \w+ weights in (\d+) files?, [\d.]+ s; one rank held at most {sizes} of them$", stdout, re.M)
    assert len(found) == 1, stdout
    total, n, held = found[0]
    return in_bytes(total), int(n), in_bytes(held)


def in_bytes(size: str) -> float:
    number, unit = size.split()
    return float(number) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}[unit]


def test_a_pp_tp_plan_exports_shards_that_transformers_loads(run_script, tmp_path, import_generated):
    """pp2 x tp2 in bf16, exported into files of at most 40 KB (no tensor is larger) under
    umask 027: every rank writes its own files, in the plan's dtype, each mode 0o640 as
    open() would create it (transformers' files are so; safetensors' own are 0o600);
    transformers loads them and computes the script's logits; and no rank held more than
    a file's worth of the model, a fraction of it."""
    mesh = "mesh { pp = 2 on shm; tp = 2 on shm }\n    pipeline { schedule = 1f1b }"
    script = compile_plan(tmp_path, "pptp", MODELS["llama"], None, mesh, 4, precision="bf16")
    out, weights, shard = tmp_path / "hf", tmp_path / "w.pt", 40_000
    mask = os.umask(0o027)  # torchrun's processes inherit it
    try:
        run = run_script(script, 4, "--steps", 1, "--export-hf", out, "--export-shard-size", "40KB", "--dump-weights", weights)
    finally:
        os.umask(mask)
    assert run.returncode == 0, run.stderr[-3000:]
    tensors = read_export(out)
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}  # the plan's precision
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert {oct(p.stat().st_mode & 0o777) for p in out.iterdir()} == {oct(0o640)}

    total, n, held = exported_line(run.stdout)
    biggest = max(t.nbytes for t in tensors.values())
    assert n == len(list(out.glob("model-*.safetensors"))) >= 2 * 4  # several files per rank
    assert math.isclose(total, sum(t.nbytes for t in tensors.values()), rel_tol=1e-3)
    assert biggest <= held <= shard < total / 4, (biggest, held, shard, total)  # a file's worth

    # the script's weights (bf16, dumped as fp32) in the serial model of the same plan
    serial = compile_plan(tmp_path, "serial", MODELS["llama"], None)
    ns = model_section(serial, import_generated)
    x = torch.randint(ns["VOCAB"], (2, ns["SEQ_LEN"]), generator=torch.Generator().manual_seed(0))
    ours = our_logits(ns, torch.load(weights), x)
    with torch.no_grad():
        theirs = hf_model(out)(input_ids=x, labels=x)
    torch.testing.assert_close(theirs.logits, ours, rtol=1e-5, atol=1e-5)
    loss = torch.nn.functional.cross_entropy(ours[:, :-1].reshape(-1, ns["VOCAB"]), x[:, 1:].reshape(-1))
    torch.testing.assert_close(theirs.loss, loss, rtol=1e-5, atol=0)


def saved_by_transformers(folder: Path, family: str, tie: bool) -> dict:
    """A transformers model of the golden tiny config, randomly initialized (seeded) and
    saved; returns its tensors by name."""
    config = {
        "gpt2": transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=250, n_positions=32,
                                        activation_function="gelu_new", tie_word_embeddings=tie),
        "llama": transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                                          intermediate_size=256, vocab_size=256, rms_norm_eps=1e-5, tie_word_embeddings=tie),
        "llamahd": transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                                            intermediate_size=256, vocab_size=256, rms_norm_eps=1e-5, tie_word_embeddings=tie),
        "mixtral": transformers.MixtralConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                              intermediate_size=48, vocab_size=96, num_local_experts=4, num_experts_per_tok=2,
                                              rope_theta=10000.0, tie_word_embeddings=tie),
    }[family]
    torch.manual_seed(3)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # no norm weight 1, no bias 0: a misplaced one shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    model.save_pretrained(folder, safe_serialization=True)
    return safetensors_torch.load_file(folder / "model.safetensors")


@pytest.mark.parametrize("family, tie", [("gpt2", True), ("llama", False), ("llama", True), ("llamahd", False), ("mixtral", False)])
def test_round_trip_is_byte_identical(family, tie, run_script, tmp_path):
    original = saved_by_transformers(tmp_path / "hf", family, tie)
    model = MODELS[family] + f"; tie_embeddings = {str(tie).lower()}"
    script = compile_plan(tmp_path, "rt", model, "hf")
    run = run_script(script, 1, "--steps", 0, "--export-hf", tmp_path / "out")
    assert run.returncode == 0, run.stderr[-3000:]
    back = safetensors_torch.load_file(tmp_path / "out" / "model.safetensors")
    assert sorted(back) == sorted(original)
    for name, t in original.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name


@pytest.mark.parametrize("family, meshes", [
    ("llama", ["mesh { tp = 2 on shm }", "mesh { dp = 2 on shm }\n    data_parallel { zero = 3 }"]),
    ("gpt2", ["mesh { tp = 2 on shm }"]),  # the tied embedding, vocab-parallel
    ("mixtral", ["mesh { ep = 2 on shm }"]),  # each rank's experts by their global index
])
def test_parallel_plans_start_from_the_checkpoint(family, meshes, run_script, tmp_path):
    """... and export what the serial plan exports after that step: tp ranks deal the
    tensors between them (gpt2's fused c_attn gathered from q, k, v), ZeRO-3 gathers one
    unit at a time, ep ranks write their own experts; the first parallel plan in bf16."""
    saved_by_transformers(tmp_path / "hf", family, tie=family == "gpt2")
    model = MODELS[family] + ("" if family == "gpt2" else "; tie_embeddings = false")
    losses, exports = [], []
    for k, mesh in enumerate(["", *meshes]):
        n = 2 if mesh else 1
        script = compile_plan(tmp_path, f"p{k}", model, "hf", mesh, n)
        dump, out = tmp_path / f"p{k}.json", tmp_path / f"p{k}.hf"
        dtype = ["--export-dtype", "bf16"] * (k == 1)
        run = run_script(script, n, "--steps", 1, "--dump-losses", dump, "--export-hf", out, *dtype)
        assert run.returncode == 0, run.stderr[-3000:]
        losses += json.loads(dump.read_text())["loss"]
        exports.append(read_export(out))
    assert len(losses) == 1 + len(meshes)
    assert all(math.isclose(loss, losses[0], rel_tol=1e-5) for loss in losses), losses
    # Adam's first step moves a weight whose gradient is near 0 by up to lr (1e-3) either
    # way, as its layout's rounding has it; a misplaced tensor or piece is off by far more
    for k, tensors in enumerate(exports[1:], 1):
        assert sorted(tensors) == sorted(exports[0]), meshes[k - 1]
        for name, t in tensors.items():
            assert t.dtype == (torch.bfloat16 if k == 1 else torch.float32), name
            rtol = 2**-8 if k == 1 else 1e-5  # bf16: within its rounding
            torch.testing.assert_close(t.float(), exports[0][name], rtol=rtol, atol=2e-3,
                                       msg=lambda m: f"{meshes[k - 1]}: {name}: {m}")
    if family != "mixtral":  # (whose logged loss adds the router's)
        # and it is transformers' loss on the step's batch: the weights came from the file
        x = first_batch(7, MODEL_SIZES[family])
        with torch.no_grad():
            logits = hf_model(tmp_path / "hf")(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
        assert math.isclose(loss.item(), losses[0], rel_tol=1e-5), (loss.item(), losses[0])


MODEL_SIZES = {"gpt2": (250, 32), "llama": (256, 32)}  # (vocab, seq_len)


def first_batch(seed: int, size: tuple[int, int]):
    """The global batch of step 0 of a plan with synthetic data, drawn as generator("data",
    0) of the generated script draws it (8 sequences)."""
    digest = hashlib.blake2b(repr((seed, "data", 0)).encode(), digest_size=8).digest()
    g = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
    vocab, seq = size
    return torch.randint(vocab, (8, seq + 1), generator=g)


def fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def link(target: str):
    def swap(path: Path) -> None:
        path.unlink()
        path.symlink_to(target)
    return swap


def edit_index(change):
    """change(weight_map) in the index's weight_map, its first key's value."""
    def edit(path: Path) -> None:
        index = json.loads(path.read_text())
        first = sorted(index["weight_map"])[0]
        index["weight_map"][first] = change(index["weight_map"][first])
        path.write_text(json.dumps(index))
    return edit


def edit_tensor(name: str, change):
    """model.safetensors with its tensor ``name`` replaced by change(tensor)."""
    def edit(path: Path) -> None:
        tensors = safetensors_torch.load_file(path)
        tensors[name] = change(tensors[name])
        safetensors_torch.save_file(tensors, path, {"format": "pt"})
    return edit


def flip_header_byte(path: Path) -> None:  # the header's first key's opening quote: not UTF-8
    data = bytearray(path.read_bytes())
    data[9] ^= 0x80
    path.write_bytes(bytes(data))


SHARD = "model-00001-of-00002.safetensors"
# (what, the layout: one file or two and their index, the file the case changes, how):
# each stops the gpt2 script with one line naming that file, and lint with E048 or E049
HOSTILE = [
    ("config.json a FIFO", 1, "config.json", fifo),
    ("config.json a link to /dev/stdin", 1, "config.json", link("/dev/stdin")),
    ("config.json nested 100000 deep", 1, "config.json", lambda p: p.write_text('{"n_embd": ' + "[" * 10**5 + "]" * 10**5 + "}")),
    ("model.safetensors a FIFO", 1, "model.safetensors", fifo),
    ("model.safetensors a link to /dev/zero", 1, "model.safetensors", link("/dev/zero")),
    ("model.safetensors a link to /dev/stdin", 1, "model.safetensors", link("/dev/stdin")),
    ("a shard a FIFO", 2, SHARD, fifo),
    ("a shard a link to /dev/zero", 2, SHARD, link("/dev/zero")),
    ("a shard a link to /dev/stdin", 2, SHARD, link("/dev/stdin")),
    ("a shard a link out of the folder", 2, SHARD, link(f"../outside/{SHARD}")),
    ("an unhashable weight_map value", 2, INDEX, edit_index(lambda name: [name])),
    ("a weight_map value not a string", 2, INDEX, edit_index(lambda name: 7)),
    ("a weight_map file in ../", 2, INDEX, edit_index(lambda name: f"../outside/{name}")),
    ("a weight_map file by its absolute path", 2, INDEX, edit_index(lambda name: str(OUTSIDE / name))),
    ("a corrupted byte in a header", 1, "model.safetensors", flip_header_byte),
    ("a wider fused qkv", 1, "model.safetensors", edit_tensor("transformer.h.0.attn.c_attn.weight", lambda t: torch.randn(64, 195))),
    ("an int tensor", 1, "model.safetensors", edit_tensor("transformer.h.1.ln_2.weight", lambda t: t.int())),
    ("a bool tensor", 1, "model.safetensors", edit_tensor("transformer.ln_f.bias", lambda t: t > 0)),
    ("an fp8 tensor", 1, "model.safetensors", edit_tensor("transformer.h.0.mlp.c_fc.bias", lambda t: t.to(torch.float8_e4m3fn))),
]
OUTSIDE = Path("/nonexistent")  # set by hostile_checkpoints: a folder beside the checkpoint's


def hostile_checkpoints(tmp: Path):
    """Yields ("unchanged", "") while tmp / "hf" holds transformers' gpt2 (the fused,
    transposed c_attn) in two files and their index, then each case of HOSTILE (what,
    the file it changes) while it holds that case; copies of the files lie outside the
    folder (tmp / "outside"), where a case that escapes it would read."""
    global OUTSIDE
    OUTSIDE = tmp / "outside"
    tensors = saved_by_transformers(tmp / "one", "gpt2", tie=True)
    names = sorted(tensors)
    (tmp / "two").mkdir()
    shutil.copy(tmp / "one" / "config.json", tmp / "two")
    halves = {SHARD: names[: len(names) // 2], "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for name, keys in halves.items():
        safetensors_torch.save_file({k: tensors[k] for k in keys}, tmp / "two" / name, {"format": "pt"})
    weight_map = {k: name for name, keys in halves.items() for k in keys}
    (tmp / "two" / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    OUTSIDE.mkdir()
    for source in [*(tmp / "one").iterdir(), *(tmp / "two").iterdir()]:
        shutil.copy(source, OUTSIDE)
    shutil.copytree(tmp / "two", tmp / "hf")
    yield "unchanged", ""
    for what, layout, name, change in HOSTILE:
        shutil.rmtree(tmp / "hf")
        shutil.copytree(tmp / ("one" if layout == 1 else "two"), tmp / "hf")
        change(tmp / "hf" / name)
        yield what, name


def test_bad_checkpoints_stop_with_one_line(run_script, tmp_path):
    original = saved_by_transformers(tmp_path / "hf", "llama", tie=False)
    script = compile_plan(tmp_path, "bad", MODELS["llama"] + "; tie_embeddings = false", "hf")

    def one_line(*needles: str, flags=(), script=script) -> None:
        run = run_script(script, 1, "--steps", 0, *flags, timeout=60)  # a hang: TimeoutExpired
        assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert run.stderr.startswith("train.py: error: "), run.stderr
        assert all(n in run.stderr for n in needles), run.stderr

    (tmp_path / "f").write_text("")
    one_line("--export-hf", "is a file, not a directory", flags=("--export-hf", tmp_path / "f"))
    for flags in (["--export-shard-size", "5XB"], ["--export-shard-size", "0"], ["--export-dtype", "fp8"]):
        run = run_script(script, 1, "--export-hf", tmp_path / "out", *flags)  # argparse's: exit 2
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
        assert len(run.stderr.strip().splitlines()) == 1 and flags[0] in run.stderr, run.stderr

    shutil.copytree(tmp_path / "hf", tmp_path / "on a volume")
    missing = "model.layers.1.mlp.up_proj.weight"
    safetensors_torch.save_file({k: v for k, v in original.items() if k != missing}, tmp_path / "hf" / "model.safetensors")
    one_line(missing, "blocks.1.mlp.up_proj.weight")
    # --init-hf: the folder read elsewhere (a pod's volume, trainjob.yaml's /init), not INIT_HF
    moved = run_script(script, 1, "--steps", 0, "--init-hf", tmp_path / "on a volume", timeout=60)
    assert moved.returncode == 0, moved.stderr[-3000:]
    one_line(str(tmp_path / "nowhere"), flags=("--init-hf", tmp_path / "nowhere"))

    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config | {"hidden_size": 128}))
    one_line("config.json", "hidden_size = 128", "hidden = 64")

    (tmp_path / "hf" / "model.safetensors").write_bytes(b"\x00" * 5)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    one_line("model.safetensors", "cannot read")

    # a folder from a stranger: files that hang a reader, escape the folder, break a parser
    # or hold another tensor than the model's
    cases = hostile_checkpoints(tmp_path / "gpt2")
    next(cases)  # the folder unchanged: the plan compiles
    gpt2 = compile_plan(tmp_path / "gpt2", "gpt2", MODELS["gpt2"] + "; tie_embeddings = true", "hf")
    assert sum(one_line(name, script=gpt2) is None for what, name in cases) == len(HOSTILE) == 19


def test_a_folder_whose_headers_grow_with_its_names_reads_each_file_once(run_script, tmp_path):
    """Issue 50: an index naming 72 files, links (symbolic and hard) to one
    model.safetensors whose header has 50,000 empty entries besides the model's (4 MB).
    The script reads that file once (its header parsed once, the model's entries kept)
    and starts from it within a 2 GiB address space, where it kept 72 parsed headers
    (some 2 GB) and ended in a MemoryError; lint, which counted the file 72 times against
    its 256 MiB of headers, agrees. Three real files whose headers are 270 MB together are
    one line from the script, and from lint, which has the same bound."""
    model = MODELS["gpt2"] + "; tie_embeddings = true"
    hf = tmp_path / "hf"
    tensors = saved_by_transformers(hf, "gpt2", tie=True)
    path, empty = hf / "model.safetensors", {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
    data = path.read_bytes()
    start = 8 + int.from_bytes(data[:8], "little")
    header = json.loads(data[8:start]) | {f"transformer.unused.{i:05d}": empty for i in range(50_000)}
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[start:])
    files = [f"model-{k:05d}-of-00072.safetensors" for k in range(1, 73)]
    for k, name in enumerate(files):
        os.link(path, hf / name) if k % 2 else (hf / name).symlink_to(path.name)
    weight_map = {f"transformer.unused.{k:05d}": name for k, name in enumerate(files)}
    weight_map |= {t: files[k % 72] for k, t in enumerate(sorted(tensors))}
    (hf / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert 72 * len(text) > 256 * 2**20  # lint's bound, had each name been a file
    script = compile_plan(tmp_path, "grown", model, "hf")  # lint: no error
    run = run_script(script, 1, "--steps", 0, timeout=120, max_bytes=2 << 30)
    assert run.returncode == 0, run.stderr[-3000:]

    for k, name in enumerate(files[:3]):  # three files of their own, 90 MB of header each
        padded = b'{"__metadata__": {"format": "pt"}}'.ljust(90_000_000)
        (hf / name).unlink()
        (hf / name).write_bytes(len(padded).to_bytes(8, "little") + padded)
    too_much = "cannot read it as safetensors (the headers of the checkpoint's files are more than 256 MiB)"
    run = run_script(script, 1, "--steps", 0, timeout=120, max_bytes=2 << 30)
    assert run.returncode == 1 and run.stderr.startswith("train.py: error: "), run.stderr[-3000:]
    assert run.stderr.endswith(f"{files[2]}: {too_much}\n") and len(run.stderr.splitlines()) == 1, run.stderr
    errors, _ = lint_init(tmp_path, model)
    assert [d.code for d in errors] == ["E048"] and too_much in errors[0].message, errors


@contextlib.contextmanager
def deadline(seconds: int):
    """TimeoutError in the block once it has run ``seconds`` (a blocking read included)."""
    def hang(*_):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def lint_init(tmp: Path, model: str, init: str = "hf") -> tuple[list, int]:
    """Lint's errors for a plan in tmp that starts from the checkpoint in tmp / init, and
    the line of its init = hf(...)."""
    text = PLAN.format(n=1, model=model, mesh="", init=f'init = hf("{init}")', precision="fp32")
    res = load_text(text, str(tmp / "p.plan"))
    line = 1 + text[: text.index("init = hf")].count("\n")
    return [d for d in res.diagnostics if d.is_error], line


def test_shard_sizes_read_as_transformers_writes_them(tmp_path, import_generated):
    script = compile_plan(tmp_path, "sizes", MODELS["llama"], None)
    (hf,) = import_generated(script.parent, "hf")
    sizes = {"5GB": 5 * 10**9, "500 MB": 5 * 10**8, "2GiB": 2 * 2**30, "1.5kb": 1500, "123": 123}
    assert {text: hf.shard_size(text) for text in sizes} == sizes
    for bad in ("", "GB", "-1GB", "5 XB", "0", "0.1B", "1e9"):
        with pytest.raises(hf.argparse.ArgumentTypeError):
            hf.shard_size(bad)


def test_lint_compares_the_config_with_the_model(tmp_path):
    saved_by_transformers(tmp_path / "hf", "llama", tie=False)
    text = PLAN.format(n=1, model=MODELS["llama"].replace("heads = 8", "heads = 4"), mesh="", init='init = hf("hf")',
                       precision="fp32")
    diags = load_text(text, str(tmp_path / "p.plan")).diagnostics
    assert [(d.code, "num_attention_heads = 8" in d.message) for d in diags if d.is_error] == [("E049", True)]
    # what changes the function but no shape: Llama 3.1's rope scaling, another activation
    conf = tmp_path / "hf" / "config.json"
    pristine = json.loads(conf.read_text())
    right = PLAN.format(n=1, model=MODELS["llama"], mesh="", init='init = hf("hf")', precision="fp32")
    for key, value, says in [("rope_scaling", {"rope_type": "llama3", "factor": 8.0}, 'rope_scaling.rope_type = "llama3"'),
                             ("hidden_act", "gelu", 'hidden_act = "gelu"'), ("attention_bias", True, "attention_bias = true")]:
        conf.write_text(json.dumps(pristine | {key: value}))
        errors = [d for d in load_text(right, str(tmp_path / "p.plan")).diagnostics if d.is_error]
        assert [(d.code, says in d.message) for d in errors] == [("E049", True)], (key, errors)
    conf.write_text(json.dumps(pristine))

    # ... and the files with the model, reading each file's header only: every hostile case
    # of the script is an error at the init, naming the file, and none hangs
    model = MODELS["gpt2"] + "; tie_embeddings = true"
    for what, name in hostile_checkpoints(tmp_path / "gpt2"):
        with deadline(20):
            errors, line = lint_init(tmp_path / "gpt2", model)
        if what == "unchanged":
            assert errors == []
            continue
        assert [d.code for d in errors] in (["E048"], ["E049"]), (what, errors)
        assert errors[0].span.line == line and name in errors[0].message, (what, errors[0])


FUZZ_MODEL = "arch = gpt2; layers = 1; hidden = 32; heads = 2; vocab = 64; seq_len = 16; tie_embeddings = true"
MUTATIONS = 60  # of a real exported folder, from a fixed seed


@pytest.mark.parametrize("mutations", [MUTATIONS], ids=lambda n: f"{n} mutations")  # the count in its name
def test_fuzzed_hugging_face_folders_give_the_same_weights_or_one_line(run_script, tmp_path, mutations):
    """A gpt2 checkpoint that --export-hf wrote into small files and an index, mutated
    MUTATIONS times from a fixed seed (bytes flipped in headers and data, fields of
    config.json, the index and headers changed, files swapped for links out of the
    folder, to /dev/zero or to a copy inside it, FIFOs, folders, truncated or removed).
    For each, the script started from it exits 0 with the weights of the unchanged
    folder (a flipped data byte: all but one element) or 1 with one line, never hangs
    nor creates or removes a file outside the folder; and lint agrees with it."""
    exporter = compile_plan(tmp_path, "exporter", FUZZ_MODEL, None)
    run = run_script(exporter, 1, "--steps", 0, "--export-hf", tmp_path / "pristine", "--export-shard-size", "10KB")
    assert run.returncode == 0, run.stderr[-3000:]
    pristine, scratch, outside = tmp_path / "pristine", tmp_path / "scratch", tmp_path / "outside"
    assert len(list(pristine.glob("model-*.safetensors"))) >= 3
    shutil.copytree(pristine, outside)
    shutil.copytree(pristine, scratch / "hf")
    script = compile_plan(tmp_path, "fz", FUZZ_MODEL, "scratch/hf")
    run = run_script(script, 1, "--steps", 0, "--dump-weights", scratch / "w.pt", timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    want = torch.load(scratch / "w.pt")

    rng, outcomes = random.Random(33), {0: 0, 1: 0}
    before = tree(tmp_path, skip=scratch)
    for n in range(mutations):
        shutil.rmtree(scratch)
        shutil.copytree(pristine, scratch / "hf")
        what, data = mutate(rng, scratch / "hf", outside)
        run = run_script(script, 1, "--steps", 0, "--dump-weights", scratch / "w.pt", timeout=60)
        assert "Traceback" not in run.stderr and run.returncode in (0, 1), (what, run.stderr[-3000:])
        if run.returncode == 0:
            got = torch.load(scratch / "w.pt")
            assert sorted(got) == sorted(want), what
            changed = sum(int((~((got[k] == want[k]) | (got[k].isnan() & want[k].isnan()))).sum()) for k in want)
            assert changed <= data, (what, changed)  # data: the elements a flip may change
        else:
            assert run.stderr.startswith("train.py: error: ") and len(run.stderr.splitlines()) == 1, (what, run.stderr)
        with deadline(20):
            errors, _ = lint_init(tmp_path, FUZZ_MODEL, init="scratch/hf")
        assert bool(errors) == bool(run.returncode), (what, run.stderr, errors)
        assert tree(tmp_path, skip=scratch) == before, what
        outcomes[run.returncode] += 1
    print(f"{mutations} mutations of a Hugging Face folder: {outcomes[0]} loaded the same weights, {outcomes[1]} stopped with one line")
    assert sum(outcomes.values()) == mutations and min(outcomes.values()) > 0


def tree(folder: Path, skip: Path) -> dict:
    """Every path under ``folder`` but ``skip``'s, with its size and modification time."""
    out = {}
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if Path(root, d) != skip]
        for name in files + dirs:
            st = os.lstat(Path(root, name))
            out[str(Path(root, name))] = (st.st_size, st.st_mtime_ns)
    return out


def mutate(rng: random.Random, folder: Path, outside: Path) -> tuple[str, int]:
    """One random change to the checkpoint in ``folder``: (what it did, how many weight
    elements it may change while the folder stays a valid checkpoint of the model)."""
    files = sorted(p.name for p in folder.iterdir())
    shards = [name for name in files if name.endswith(".safetensors")]
    kind = rng.choice(["header byte", "data byte", "config", "index", "header field", "swap"])
    if kind in ("header byte", "data byte"):
        path = folder / rng.choice(shards)
        data = bytearray(path.read_bytes())
        start = 8 + int.from_bytes(data[:8], "little")
        at = rng.randrange(start) if kind == "header byte" else rng.randrange(start, len(data))
        data[at] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
        return f"{path.name}: bit flipped at byte {at}", kind == "data byte"
    if kind in ("config", "index"):
        path = folder / ("config.json" if kind == "config" else INDEX)
        value = json.loads(path.read_text())
        table = value if kind == "config" else value[rng.choice(["metadata", "weight_map", "weight_map"])]
        key = rng.choice(sorted(table))
        new = rng.choice([None, 7, -1, 64.0, 1e308, True, "x", [], {}, [table[key]], "../outside/" + rng.choice(shards),
                          str(outside / rng.choice(shards)), rng.choice(shards), "", ".", "config.json", "a/b", "DELETE",
                          table[key], {"a": [[[[]]]]}])
        if new == "DELETE":
            del table[key]
        else:
            table[key] = new
        path.write_text(json.dumps(value))
        return f"{path.name}: {key} = {new!r}", 0
    if kind == "header field":
        path = folder / rng.choice(shards)
        data = path.read_bytes()
        start = 8 + int.from_bytes(data[:8], "little")
        header = json.loads(data[8:start])
        key = rng.choice(sorted(header))
        entry, field = header[key], rng.choice(["dtype", "shape", "data_offsets", "rename", "DELETE", "metadata"])
        if field == "rename":
            header[key + "x"] = header.pop(key)
        elif field == "DELETE":
            del header[key]
        elif field == "metadata":
            header["__metadata__"] = rng.choice([{"format": "pt", "note": "changed"}, {}, [1], "x"])
        elif key != "__metadata__":
            old = entry[field]
            if field == "dtype":
                choices = ["I32", "F16", "BF16", "BOOL", "XX", 5, None, "F8_E4M3", old]
            elif field == "shape":
                choices = [old[::-1], old + [1], old[:-1], [-1], ["a"], [2**70], None, [1] * 100]
            else:
                choices = [[old[0], old[1] + 4], [old[1], old[0]], [old[0] + 4, old[1] + 4], [0, old[1] - old[0]], [old[0]], None]
            entry[field] = rng.choice(choices)
        text = json.dumps(header).encode()
        path.write_bytes(len(text).to_bytes(8, "little") + text + data[start:])
        return f"{path.name}: header entry {key}'s {field} changed", 0
    name = rng.choice(files)
    path, how = folder / name, rng.choice(["fifo", "folder", "zero", "stdin", "outside", "inside", "dangling", "loop",
                                           "removed", "empty", "truncated"])
    content = path.read_bytes()
    path.unlink()
    if how == "fifo":
        os.mkfifo(path)
    elif how == "folder":
        path.mkdir()
    elif how in ("zero", "stdin", "outside", "dangling", "loop"):
        path.symlink_to({"zero": "/dev/zero", "stdin": "/dev/stdin", "outside": str(outside / name),
                         "dangling": "missing", "loop": name}[how])
    elif how == "inside":  # a link to a copy of itself in the folder: the same checkpoint
        (folder / ".copy").write_bytes(content)
        path.symlink_to(".copy")
    elif how in ("empty", "truncated"):
        path.write_bytes(content[: len(content) // 2 if how == "truncated" else 0])
    return f"{name}: {how}", 0
