"""Token files as users have them (llm.c's .bin, Megatron-LM's indexed dataset, raw ids),
read by ``dslc lint`` and by the generated script.

The files are written here from the formats' published descriptions, with struct and
numpy, not with dslc's reader (dslc/tokenfiles.py, templates/data.jinja):

- llm.c (karpathy/llm.c, dev/data/data_common.py ``write_datafile``): a header of 256
  little-endian int32 (magic, version, token count, zeros), then the ids: GPT-2 magic
  20240520, version 1, uint16 ids; Llama 3 magic 20240801, version 7, uint32 ids;
- Megatron-LM (megatron/core/datasets/indexed_dataset.py ``_IndexWriter``): prefix.bin,
  the sequences' ids back to back; prefix.idx, b"MMIDIDX\\x00\\x00", version (<Q, 1),
  dtype code (<B), sequence count (<Q), document count (<Q, len(document_indices)), then
  the sequence lengths (int32), their byte offsets in the .bin (int64) and the document
  indices (int64, from 0 to the sequence count).

Each test compiles a tiny plan into tmp_path and runs the real script on CPU: what the
model learns from a file, the bad files lint and the script refuse (one line each), a
blend's proportions and the validation loss.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from dslc import codegen
from dslc.cli import main
from dslc.driver import load_text

torch = pytest.importorskip("torch")

SEQ_LEN = 16

PLAN = """
cluster c {{
    nodes = 1; gpus_per_node = 1; device = cpu
    link shm {{ scope = node; bandwidth = 10 GB/s; latency = 10 us }}
}}
plan p {{
    model {arch} {{ layers = 1; hidden = {hidden}; heads = 2; vocab = {vocab}; seq_len = {seq_len} }}
    cluster = c
    train {{
        steps = 2; micro_batch = {batch}; global_batch = {batch}
        optimizer adamw {{ lr = {lr}; weight_decay = 0 }}; lr_schedule constant {{ warmup = 0 }}
        grad_clip = 0.0
        data = {data}
        {extra}
    }}
}}
"""


def plan_text(data: str, vocab: int = 256, arch: str = "llama", hidden: int = 32, batch: int = 8,
              lr: str = "1e-2", extra: str = "") -> str:
    return PLAN.format(arch=arch, hidden=hidden, vocab=vocab, seq_len=SEQ_LEN, batch=batch, lr=lr, data=data, extra=extra)


def compile_plan(folder: Path, data: str, out: str = "out", **kw) -> Path:
    """The plan's train.py under folder/<out>/p/ (its data paths relative to folder)."""
    res = load_text(plan_text(data, **kw), str(folder / "p.plan"))
    errors = [d.message for d in res.diagnostics if d.is_error]
    assert not errors, errors
    return codegen.write(res.program.plans[0], folder / out) / "train.py"


def lint(folder: Path, capsys, data: str, **kw) -> tuple[int, list[tuple[str, str, str]]]:
    """``dslc lint`` of the plan written to folder/p.plan: (exit code, [(severity, code,
    message)] of every diagnostic, from the JSON output: the text folds a repeated note)."""
    path = folder / "p.plan"
    path.write_text(plan_text(data, **kw), encoding="utf-8")
    capsys.readouterr()
    rc = main(["lint", "--format", "json", str(path)])
    found = [(d["severity"], d["code"], d["message"]) for d in json.loads(capsys.readouterr().out or "[]")]
    return rc, found


def error_line(out) -> str:
    """The script's one error line, without a traceback (as in test_script_inputs.py)."""
    assert 'train.py", line' not in out.stderr, out.stderr
    lines = {ln for ln in out.stderr.splitlines() if ln.startswith("train.py: error: ")}
    assert len(lines) == 1, out.stderr
    return lines.pop().removeprefix("train.py: error: ")


# ---------------------------------------------------------------------------------
# writers, from the formats' published descriptions

LLMC_GPT2 = (20240520, 1, "<u2")
LLMC_LLAMA3 = (20240801, 7, "<u4")
MEGATRON_CODES = {1: "u1", 2: "i1", 3: "<i2", 4: "<i4", 5: "<i8", 8: "<u2"}


def write_llmc(path: Path, ids, kind=LLMC_GPT2, count: int | None = None, version: int | None = None) -> None:
    """llm.c's write_datafile: 256 int32 of header, then the ids."""
    magic, v, dtype = kind
    header = np.zeros(256, dtype="<i4")
    header[0], header[1] = magic, v if version is None else version
    header[2] = len(ids) if count is None else count
    path.write_bytes(header.tobytes() + np.asarray(ids, dtype=dtype).tobytes())


def write_megatron(prefix: Path, sequences, code: int, documents=None) -> None:
    """Megatron-LM's _IndexWriter: prefix.bin and prefix.idx. ``documents``: the document
    indices (default one sequence per document)."""
    dtype = np.dtype(MEGATRON_CODES[code])
    arrays = [np.asarray(s, dtype=dtype) for s in sequences]
    Path(f"{prefix}.bin").write_bytes(b"".join(a.tobytes() for a in arrays))
    lengths = np.array([len(a) for a in arrays], dtype="<i4")
    sizes = lengths.astype(np.int64) * dtype.itemsize
    pointers = (np.cumsum(sizes) - sizes).astype("<i8")  # where each sequence starts
    docs = np.arange(len(arrays) + 1) if documents is None else np.asarray(documents)
    assert docs[0] == 0 and docs[-1] == len(arrays)
    head = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code)
    head += struct.pack("<Q", len(arrays)) + struct.pack("<Q", len(docs))
    Path(f"{prefix}.idx").write_bytes(head + lengths.tobytes() + pointers.tobytes() + docs.astype("<i8").tobytes())


def shift_second_pointer(index: bytes, by: int) -> bytes:
    """A Megatron .idx with its second sequence's byte offset moved by ``by``."""
    (sequences,) = struct.unpack_from("<Q", index, 18)
    at = 34 + 4 * sequences + 8  # past the header, the lengths and the first pointer
    raw = bytearray(index)
    struct.pack_into("<q", raw, at, struct.unpack_from("<q", index, at)[0] + by)
    return bytes(raw)


def write_raw(path: Path, ids, dtype="<u2") -> None:
    path.write_bytes(np.asarray(ids, dtype=dtype).tobytes())


# ---------------------------------------------------------------------------------
# 1. what the model learns from a file: the embedding rows of the ids it reads

WINDOWS = 8  # one global batch of 8 rows covers every window: an epoch per step
FIRST = WINDOWS * SEQ_LEN  # the inputs: all distinct, so every window must be read


def stream(lo: int) -> np.ndarray:
    """WINDOWS * SEQ_LEN + 1 ids: the inputs are lo … lo + FIRST - 1, each once, shuffled
    (37 is prime to FIRST), and the last id, lo + FIRST + 7, occurs only there: it is the
    last window's last target, never an input."""
    inputs = lo + np.arange(WINDOWS * SEQ_LEN) * 37 % FIRST
    return np.concatenate([inputs, [lo + FIRST + 7]])


def split(ids: np.ndarray, lengths) -> list[np.ndarray]:
    """ids as sequences of the given lengths (the last takes the rest)."""
    cuts = np.cumsum(lengths)
    assert cuts[-1] < len(ids)
    return np.split(ids, cuts)


def llmc_llama3(d: Path):
    """uint32 ids past 65535: read as uint16, or from byte 0, they would name other rows
    (or the magic would exceed the vocab)."""
    ids = stream(66000)
    write_llmc(d / "f.bin", ids, LLMC_LLAMA3)
    return 'tokens("f.bin")', 70000, ids


def llmc_gpt2(d: Path):
    """uint16 ids: the header read as ids would put rows 0, 1 (version) and 129 (count)
    among the changed ones, and the ids read as uint32 pairs would exceed the vocab."""
    ids = stream(1500)
    write_llmc(d / "f.bin", ids, LLMC_GPT2)
    return 'tokens("f.bin")', 2048, ids


def megatron_prefix_int32(d: Path):
    """int32 ids through the prefix form: read as raw uint16 (the plan's default for this
    vocab), every second id would be 0. Four sequences in two documents (document indices
    0, 2, 4: the document count, 3, differs from the sequence count)."""
    ids = stream(1500)
    write_megatron(d / "ds", split(ids, [40, 7, 50]), code=4, documents=[0, 2, 4])
    return 'tokens("ds")', 2048, ids


def megatron_bin_uint16(d: Path):
    """uint16 ids through the .bin's own path: a vocab above 65,536 makes the raw default
    uint32, so the .bin is read as Megatron's only if its .idx beside it is seen (lint
    warns W088: 16-bit ids for that vocab)."""
    ids = stream(60000)
    write_megatron(d / "ds", split(ids, [3, 60, 33]), code=8)
    return 'tokens("ds.bin")', 70000, ids


def megatron_idx_uint8(d: Path):
    """uint8 ids through the .idx's path: read as the raw default uint16, pairs of ids
    would exceed the vocab (ids 120 to 255)."""
    ids = stream(120)
    write_megatron(d / "ds", split(ids, [64, 1, 32]), code=1)
    return 'tokens("ds.idx")', 256, ids


@pytest.fixture(scope="module")
def initial_weights():
    """vocab -> the embedding before training (--steps 0): it depends on the model and
    the seed only, so one run per vocab serves every file."""
    return {}


@pytest.mark.parametrize(
    "make", [llmc_llama3, llmc_gpt2, megatron_prefix_int32, megatron_bin_uint16, megatron_idx_uint8]
)
def test_the_embedding_rows_that_learn_are_the_files_input_ids(tmp_path, make, run_script, initial_weights):
    """An untied llama, no weight decay, no clipping, one epoch per step: after training
    exactly the embedding rows of the ids that enter as inputs have changed. Every other
    row, the final target's included (windows of seq_len + 1 every seq_len ids), keeps its
    initial value, so a header read as ids, a wrong id width or a Megatron .bin read as a
    raw file would change other rows or stop the script."""
    data, vocab, ids = make(tmp_path)
    script = compile_plan(tmp_path, data, vocab=vocab)
    if vocab not in initial_weights:
        out = run_script(script, 1, "--steps", 0, "--dump-weights", tmp_path / "init.pt")
        assert out.returncode == 0, out.stderr
        initial_weights[vocab] = torch.load(tmp_path / "init.pt")["wte.weight"]
    out = run_script(script, 1, "--steps", 2, "--dump-weights", tmp_path / "w.pt")
    assert out.returncode == 0, out.stderr
    before, after = initial_weights[vocab], torch.load(tmp_path / "w.pt")["wte.weight"]
    assert before.shape == after.shape == (vocab, 32)
    changed = set((before != after).any(dim=1).nonzero().flatten().tolist())
    inputs = set(ids[: WINDOWS * SEQ_LEN].tolist())
    assert len(inputs) == FIRST and int(ids[-1]) not in inputs
    assert changed == inputs, (sorted(changed - inputs)[:10], sorted(inputs - changed)[:10])


# ---------------------------------------------------------------------------------
# 2. bad files: lint's diagnostic, and the script's one line when the file changed


def good_llmc(d: Path) -> None:
    write_llmc(d / "f.bin", np.arange(40) % 200)


def good_megatron(d: Path, code: int = 8) -> None:
    write_megatron(d / "ds", [np.arange(10), np.arange(20, 33), np.arange(50, 67)], code)


def truncate(path: Path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])


def patch(path: Path, at: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[at : at + len(data)] = data
    path.write_bytes(bytes(raw))


ONE_WINDOW = np.arange(SEQ_LEN + 1) + 7  # 17 ids: one window, which every row reads


def past_vocab(ids, at: int, bad: int) -> np.ndarray:
    ids = np.array(ids, dtype=np.int64)
    ids[at] = bad
    return ids


@dataclass(frozen=True)
class Bad:
    """A data file that turns bad: ``good`` writes a file the plan compiles with, ``bad``
    spoils it. ``lint`` is lint's message and ``script`` the script's error line (None:
    lint only), as regular expressions where ``{d}`` is the folder and ``{u16}`` uint16
    however the script spells it; everything else in them is literal."""

    id: str
    data: str
    good: Callable[[Path], None]
    bad: Callable[[Path], None]
    code: str
    lint: str
    script: str | None
    vocab: int = 256


BAD = [
    Bad(
        # well formed, but empty: a count of 0 (the script used to fail in torch.frombuffer)
        "llmc-empty", 'tokens("f.bin")', good_llmc, lambda d: write_llmc(d / "f.bin", []),
        "E085", "data file f.bin holds 0 token ids, fewer than seq_len + 1 = 17",
        "data file {d}/f.bin: 0 token ids, fewer than 17",
    ),
    Bad(
        "megatron-no-sequences", 'tokens("ds")', good_megatron, lambda d: write_megatron(d / "ds", [], 8),
        "E085", "data file ds holds 0 token ids, fewer than seq_len + 1 = 17",
        "data file {d}/ds.bin: 0 bytes, not 17 or more ids",
    ),
    Bad(
        "megatron-magic", 'tokens("ds")', good_megatron,
        lambda d: patch(d / "ds.idx", 0, b"NOTMEGATR"),
        "E087", "data file {d}/ds.idx does not start with Megatron's magic MMIDIDX: it is not an indexed dataset's index",
        "data file {d}/ds.idx: does not start with Megatron's magic MMIDIDX",
    ),
    Bad(
        "llmc-truncated-header", 'tokens("f.bin")', good_llmc,
        lambda d: truncate(d / "f.bin", 600),
        "E087", "data file {d}/f.bin has llm.c's magic 20240520 but a truncated header: 600 bytes, not 1024",
        "data file {d}/f.bin: llm.c's magic 20240520 but a truncated header (600 bytes)",
    ),
    Bad(
        "llmc-count-not-size", 'tokens("f.bin")', good_llmc,
        lambda d: write_llmc(d / "f.bin", np.arange(40), count=45),
        "E087", "data file {d}/f.bin: its llm.c header counts 45 tokens (1114 bytes with the header) but the file has 1104 bytes",
        "data file {d}/f.bin: its header counts 45 tokens but it has 1104 bytes",
    ),
    Bad(
        "llmc-version", 'tokens("f.bin")', lambda d: write_llmc(d / "f.bin", np.arange(40), LLMC_LLAMA3),
        lambda d: write_llmc(d / "f.bin", np.arange(40), LLMC_LLAMA3, version=1),
        "E087", "data file {d}/f.bin has llm.c's magic 20240801, whose version is 7, but says version 1",
        "data file {d}/f.bin: llm.c's magic 20240801 is version 7, not 1",
    ),
    Bad(
        "megatron-no-idx", 'tokens("ds")', good_megatron,
        lambda d: (d / "ds.idx").unlink(),
        "E087", "data file {d}/ds.bin has no ds.idx beside it: a Megatron dataset is a .bin and its .idx",
        "data file {d}/ds.bin: no ds.idx beside it (a Megatron dataset)",
    ),
    Bad(
        "megatron-no-bin", 'tokens("ds")', good_megatron,
        lambda d: (d / "ds.bin").unlink(),
        "E087", "data file {d}/ds.idx has no ds.bin beside it: a Megatron dataset is a .bin and its .idx",
        "data file {d}/ds.idx: no ds.bin beside it (a Megatron dataset)",
    ),
    Bad(
        "megatron-bin-longer-than-index", 'tokens("ds")', good_megatron,
        lambda d: (d / "ds.bin").write_bytes((d / "ds.bin").read_bytes() + b"\x01\x00"),
        "E087", "data file {d}/ds.bin has 82 bytes, but ds.idx indexes 80",
        "data file {d}/ds.bin: 82 bytes, not the size its index says",
    ),
    Bad(
        # the second sequence's pointer 2 bytes early: the stream would repeat an id
        "megatron-not-back-to-back", 'tokens("ds")', good_megatron,
        lambda d: (d / "ds.idx").write_bytes(shift_second_pointer((d / "ds.idx").read_bytes(), -2)),
        "E087", "data file {d}/ds.idx: its sequences are not stored back to back in ds.bin",
        "data file {d}/ds.idx: its sequences are not stored back to back in {d}/ds.bin",
    ),
    Bad(
        # byte 1024 (the header) + 5 * 2: one window, so whichever row comes first reads it
        "llmc-id-past-vocab", 'tokens("f.bin")', lambda d: write_llmc(d / "f.bin", ONE_WINDOW),
        lambda d: write_llmc(d / "f.bin", past_vocab(ONE_WINDOW, 5, 300)),
        "E084", "data file f.bin holds token id 300, not below vocab = 256",
        "data file {d}/f.bin: id 300 at byte 1034 is not below vocab = 256",
    ),
    Bad(
        # int32 sequences of 10 and 7 ids: id 12 is the second's third, at byte 12 * 4 of the
        # .bin, which the script names
        "megatron-id-past-vocab", 'tokens("ds")', lambda d: write_megatron(d / "ds", split(ONE_WINDOW, [10]), 4),
        lambda d: write_megatron(d / "ds", split(past_vocab(ONE_WINDOW, 12, 1000), [10]), 4),
        "E084", "data file ds holds token id 1000, not below vocab = 256",
        "data file {d}/ds.bin: id 1000 at byte 48 is not below vocab = 256",
    ),
    Bad(
        # a negative id (int32)
        "megatron-negative-id", 'tokens("ds")', lambda d: write_megatron(d / "ds", split(ONE_WINDOW, [10]), 4),
        lambda d: write_megatron(d / "ds", split(past_vocab(ONE_WINDOW, 12, -5), [10]), 4),
        "E084", "data file ds holds token id -5, below 0",
        "data file {d}/ds.bin: id -5 at byte 48 is below 0",
    ),
    Bad(
        # 64 uint32 ids below 65,536 read as uint16 (vocab 256: the default): every second is 0
        "uint32-read-as-uint16", 'tokens("f.bin")', lambda d: write_raw(d / "f.bin", np.arange(64) % 200 + 1),
        lambda d: write_raw(d / "f.bin", np.arange(64) % 200 + 1, "<u4"),
        "E087", "data file f.bin: read as uint16, every second id is 0: it looks like 32-bit ids",
        "data file {d}/f.bin: read as {u16}, every second id is 0: it looks like 32-bit ids",
    ),
    Bad(
        # lint only: the plan's dtype is for raw files; compile refuses it, the script
        # would follow the header
        "llmc-header-against-dtype", 'tokens("f.bin", dtype = uint32)', good_llmc, lambda d: None,
        "E087", "data file f.bin: its llm.c header says uint16 ids but the plan says dtype = uint32",
        None,
    ),
]


def pattern(template: str, d: Path) -> str:
    """The regular expression of a Bad message: literal but for {d}, {u16} and the
    optional parts written (…)? or .* in it."""
    out = re.escape(template)
    for literal, regex in (("{d}", re.escape(str(d))), ("{u16}", r"(torch\.)?uint16"),
                           ("(.bin)?", r"(\.bin)?"), (".*", ".*")):
        out = out.replace(re.escape(literal), regex)
    return out


@pytest.mark.parametrize("case", BAD, ids=[b.id for b in BAD])
def test_a_bad_data_file_is_one_diagnostic_and_one_line(tmp_path, case, capsys, run_script):
    """Lint names the file in one error with the code the docs give; the script, compiled
    while the file was good, refuses the bad file at start-up with one line naming it
    (exit 1, no step, no traceback)."""
    case.good(tmp_path)
    script = compile_plan(tmp_path, case.data, vocab=case.vocab) if case.script else None
    case.bad(tmp_path)
    rc, found = lint(tmp_path, capsys, case.data, vocab=case.vocab)
    assert rc == 1
    assert [(sev, code) for sev, code, _ in found] == [("error", case.code)], found
    assert re.fullmatch(pattern(case.lint, tmp_path), found[0][2]), found[0][2]
    if script is None:
        return
    out = run_script(script, 1, "--dump-losses", tmp_path / "l.json")
    assert out.returncode == 1 and "step" not in out.stdout, out.stdout
    got = error_line(out)
    assert re.fullmatch(pattern(case.script, tmp_path), got), got
    assert not (tmp_path / "l.json").exists()


@pytest.mark.parametrize(
    "data, write, message",
    [
        (
            'tokens("f.bin", dtype = uint16)', lambda d: write_raw(d / "f.bin", np.arange(64)),
            "data file f.bin: dtype = uint16 holds ids 0–65535 but vocab = 70000: the other rows are never trained",
        ),
        (
            'tokens("f.bin")', lambda d: write_llmc(d / "f.bin", np.arange(64)),
            "data file f.bin holds uint16 ids (llm.c) but vocab = 70000: the rows past 65535 are never trained",
        ),
        (
            'tokens("ds")', lambda d: good_megatron(d, 8),
            "data file ds holds uint16 ids (megatron) but vocab = 70000: the rows past 65535 are never trained",
        ),
        (
            # the plan's dtype and the header agree: one warning, not one for each
            'tokens("f.bin", dtype = uint16)', lambda d: write_llmc(d / "f.bin", np.arange(64)),
            "data file f.bin: dtype = uint16 holds ids 0–65535 but vocab = 70000: the other rows are never trained",
        ),
    ],
    ids=["raw-dtype", "llmc-gpt2", "megatron-uint16", "llmc-gpt2-and-dtype"],
)
def test_16_bit_ids_for_a_larger_vocab_are_a_warning(tmp_path, capsys, data, write, message):
    """W088, a warning (exit 0): the plan's dtype = uint16, or a header's 16-bit ids, for
    a vocab of 70,000, whose rows past 65,535 no id reaches."""
    write(tmp_path)
    rc, found = lint(tmp_path, capsys, data, vocab=70000)
    assert rc == 0
    assert found == [("warning", "W088", message)]


# ---------------------------------------------------------------------------------
# 3. a blend draws its sources in proportion to their weights

BLEND_STEPS = 1000


@pytest.mark.parametrize(
    "weights",
    [("0.7", "0.3"), ("5", "3", "2")],  # the second scaled to 0.5, 0.3, 0.2
    ids=["two", "three-unscaled"],
)
def test_a_blend_draws_rows_in_proportion(tmp_path, run_script, weights):
    """1000 steps of 8 rows: the shares the script prints at the end are each within 2 %
    (relative) of the source's weight; the sources are of three formats (a raw file, an
    llm.c file, a Megatron dataset)."""
    write_raw(tmp_path / "a.bin", np.arange(200) % 256)
    write_llmc(tmp_path / "b.bin", np.arange(300) % 256)
    write_megatron(tmp_path / "c", [np.arange(30), np.arange(100, 180)], 8)
    names = ["a.bin", "b.bin", "c"]
    data = "blend(" + ", ".join(f'{w}, tokens("{n}")' for w, n in zip(weights, names)) + ")"
    script = compile_plan(tmp_path, data, arch="gpt2", hidden=16)
    out = run_script(script, 1, "--steps", BLEND_STEPS, "--log-every", BLEND_STEPS)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("data blend, rows drawn (weight): ")]
    assert len(lines) == 1, out.stdout
    shares = re.findall(r"([\d.]+)% (\S+) \(([\d.]+)\)", lines[0])
    total = sum(float(w) for w in weights)
    # the file the rows came from: a Megatron dataset's .bin
    assert [n for _, n, _ in shares] == ["a.bin", "b.bin", "c.bin"][: len(weights)], lines[0]
    for (share, name, shown), w in zip(shares, weights):
        want = float(w) / total
        assert math.isclose(float(shown), want, rel_tol=1e-5), lines[0]
        assert abs(float(share) / 100 - want) <= 0.02 * want, (name, lines[0])


def test_each_blend_source_goes_through_its_own_epochs(tmp_path, run_script, initial_weights):
    """blend(0.5, a, 0.5, b): a raw uint16 file and a Llama-3 llm.c file (uint32: the batch
    mixes id types) of 8 windows each. 3 steps of 8 rows give each source 12 rows, so each
    draws its whole first epoch (a source's k-th row takes its k-th sample): exactly the
    embedding rows of both files' inputs learn. --steps 0 draws nothing and says nothing."""
    a, b = stream(0), stream(1000)
    write_raw(tmp_path / "a.bin", a)
    write_llmc(tmp_path / "b.bin", b, LLMC_LLAMA3)
    script = compile_plan(tmp_path, 'blend(0.5, tokens("a.bin"), 0.5, tokens("b.bin"))', vocab=2048)
    if 2048 not in initial_weights:
        out = run_script(script, 1, "--steps", 0, "--dump-weights", tmp_path / "init.pt")
        assert out.returncode == 0 and "data blend" not in out.stdout, out.stderr
        initial_weights[2048] = torch.load(tmp_path / "init.pt")["wte.weight"]
    out = run_script(script, 1, "--steps", 3, "--dump-weights", tmp_path / "w.pt")
    assert out.returncode == 0, out.stderr
    assert "data blend, rows drawn (weight): 50.0% a.bin (0.5), 50.0% b.bin (0.5)" in out.stdout
    before, after = initial_weights[2048], torch.load(tmp_path / "w.pt")["wte.weight"]
    changed = set((before != after).any(dim=1).nonzero().flatten().tolist())
    inputs = set(a[:FIRST].tolist()) | set(b[:FIRST].tolist())
    assert changed == inputs, (sorted(inputs - changed)[:10], sorted(changed - inputs)[:10])


def test_a_resumed_blend_draws_what_the_whole_run_draws(tmp_path, run_script):
    """A blend's state is each source's count of rows; --resume recomputes the counts from
    the step (Blend.seek), so steps 3-5 of a resumed run read the same rows, and give the
    same losses, as those of an uninterrupted run."""
    for name, lo in (("a.bin", 0), ("b.bin", 40), ("c.bin", 80)):
        write_raw(tmp_path / name, (lo + np.arange(200) * 7) % 256)
    data = 'blend(0.5, tokens("a.bin"), 0.3, tokens("b.bin"), 0.2, tokens("c.bin"))'
    losses = {}
    for run in ("whole", "resumed"):
        ck = tmp_path / f"ck_{run}"
        script = compile_plan(tmp_path, data, out=run, arch="gpt2", extra=f'checkpoint {{ every = 2; dir = "{ck}" }}')
        if run == "resumed":
            assert run_script(script, 1, "--steps", 2).returncode == 0
        out = run_script(script, 1, "--steps", 5, *(["--resume"] if run == "resumed" else []), "--dump-losses", tmp_path / f"{run}.json")
        assert out.returncode == 0, out.stderr
        losses[run] = json.loads((tmp_path / f"{run}.json").read_text())["loss"]
    assert len(losses["whole"]) == 5 and losses["resumed"] == losses["whole"][2:]


def test_a_missing_megatron_dataset_is_a_warning(tmp_path, capsys):
    """W083 (it may exist where the script runs) for a dataset named by its prefix, its
    .bin or its .idx when neither file is there; E087 only when one of the pair is."""
    for data in ('tokens("ds")', 'tokens("ds.bin")', 'tokens("ds.idx")'):
        rc, found = lint(tmp_path, capsys, data)
        assert rc == 0 and [(sev, code) for sev, code, _ in found] == [("warning", "W083")], (data, found)


def test_lint_reads_a_bounded_part_of_a_plans_files(tmp_path, capsys):
    """A hostile plan cannot make lint read without end: a blend has at most 1024 sources
    (E015), and lint reads at most 64 MiB of each file's ids and 256 MiB for the plan
    (N086 says how much of each it checked). A 100 MiB sparse file named 5 times: the
    first four take 64 MiB each, the fifth nothing."""
    with open(tmp_path / "big.bin", "wb") as f:
        f.truncate(100 * 2**20)  # zeros: valid uint16 ids, and no disk
    rc, found = lint(tmp_path, capsys, "blend(" + ", ".join(['1, tokens("big.bin")'] * 5) + ")")
    assert rc == 0
    checked = [re.search(r"first ([\d.]+) MiB only", msg).group(1) for _, code, msg in found if code == "N086"]
    assert checked == ["64", "64", "64", "64", "0"], found
    rc, found = lint(tmp_path, capsys, "blend(" + ", ".join(['1, tokens("big.bin")'] * 1025) + ")")
    assert rc == 1 and found[0][1:] == ("E015", "a blend may have at most 1024 sources, got 1025"), found[:2]


# ---------------------------------------------------------------------------------
# 4. the validation loss


def test_the_validation_loss_is_logged_and_dumped(tmp_path, run_script, read_scalars):
    """eval { every = 5; batches = 2 } over 12 steps: validation at steps 5, 10 and 12 (the
    last), in --dump-losses, in the log and in TensorBoard's validation_metrics/loss, each
    finite. Training and validation read the same repeating text, so the validation loss
    falls as the model learns it."""
    pattern_ids = np.tile(np.array([3, 141, 59, 26, 5, 35, 89, 79, 32, 38, 46]), 30)
    write_llmc(tmp_path / "train.bin", pattern_ids)
    write_raw(tmp_path / "val.bin", pattern_ids)
    extra = 'eval { every = 5; batches = 2; data = tokens("val.bin") }'
    script = compile_plan(tmp_path, 'tokens("train.bin")', arch="gpt2", extra=extra)
    out = run_script(script, 1, "--steps", 12, "--dump-losses", tmp_path / "l.json", "--tensorboard", tmp_path / "tb")
    assert out.returncode == 0, out.stderr
    dumped = json.loads((tmp_path / "l.json").read_text())
    assert len(dumped["loss"]) == 12
    assert [s for s, _ in dumped["val_loss"]] == [5, 10, 12]
    board = read_scalars(tmp_path / "tb")["validation_metrics/loss"]
    assert board == [(s, pytest.approx(v, rel=1e-6)) for s, v in dumped["val_loss"]]
    losses = [v for _, v in dumped["val_loss"]]
    assert all(math.isfinite(v) for v in losses)
    logged = re.findall(r"^step (\d+)/12 \| val loss ([\d.]+)$", out.stdout, re.M)
    assert [(int(s), float(v)) for s, v in logged] == [(s, pytest.approx(v, abs=1e-4)) for s, v in dumped["val_loss"]]
    assert losses[0] > losses[1] > losses[2]


def test_the_log_evaluations_and_checkpoints_of_the_same_n_fall_on_the_same_steps(tmp_path, run_script, read_scalars):
    """Issue 49 item 9: `--log-every 2` logged steps 1, 3, 5 and the last while
    `eval { every = 2 }` evaluated at 2, 4, 6. One rule (utils.py's `due`) places the log
    lines, the evaluations and the checkpoints: the multiples of N and the last step. Over
    5 steps with N = 2: steps 2, 4 and 5, in the log, in TensorBoard, in --dump-losses and
    in the checkpoint folders; --log-every 0 logs the last step only, as `every = 0`
    evaluates after the last step only."""
    ck = tmp_path / "ck"
    extra = f'eval {{ every = 2; batches = 1; data = synthetic }}\n checkpoint {{ every = 2; dir = "{ck}" }}'
    script = compile_plan(tmp_path, "synthetic", arch="gpt2", extra=extra)
    dump, board = tmp_path / "l.json", tmp_path / "tb"
    out = run_script(script, 1, "--steps", 5, "--log-every", 2, "--dump-losses", dump, "--tensorboard", board)
    assert out.returncode == 0, out.stderr
    logged = [int(s) for s in re.findall(r"^step (\d)/5 \| loss ", out.stdout, re.M)]
    evaluated = [int(s) for s in re.findall(r"^step (\d)/5 \| val loss ", out.stdout, re.M)]
    assert logged == evaluated == [2, 4, 5], out.stdout
    assert [s for s, _ in json.loads(dump.read_text())["val_loss"]] == [2, 4, 5]
    scalars = read_scalars(board)
    assert {tag: [s for s, _ in values] for tag, values in scalars.items()} == dict.fromkeys(scalars, [2, 4, 5])
    assert sorted(p.name for p in ck.iterdir()) == ["step0000002", "step0000004", "step0000005"]
    out = run_script(script, 1, "--steps", 3, "--log-every", 0, "--checkpoint-dir", tmp_path / "ck0")
    assert out.returncode == 0, out.stderr
    assert re.findall(r"^step (\d)/3 \| loss ", out.stdout, re.M) == ["3"], out.stdout


def test_an_untrained_models_validation_loss_is_ln_vocab(tmp_path, run_script):
    """After one step of lr 1e-9 the model is its initialization, whose logits are near
    0: the validation loss is close to ln(vocab), the loss of a uniform guess."""
    write_megatron(tmp_path / "val", [np.arange(100) * 7 % 256, np.arange(60)], 3)
    write_raw(tmp_path / "train.bin", np.arange(100) % 256)
    extra = 'eval { batches = 2; data = tokens("val") }'
    script = compile_plan(tmp_path, 'tokens("train.bin")', arch="gpt2", lr="1e-9", extra=extra)
    out = run_script(script, 1, "--steps", 1, "--dump-losses", tmp_path / "l.json")
    assert out.returncode == 0, out.stderr
    ((step, loss),) = json.loads((tmp_path / "l.json").read_text())["val_loss"]
    assert step == 1
    assert abs(loss - math.log(256)) < 0.05, loss
    assert f"step 1/1 | val loss {loss:.4f}" in out.stdout


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_the_validation_loss_has_no_dropout(tmp_path, run_script, recompute):
    """Dropout 0.5 in training, none in validation (attention's too, recomputed or not):
    after one step at lr 1e-9 a model with dropout and the same model without validate
    alike, while their training losses differ."""
    write_raw(tmp_path / "t.bin", np.arange(300) * 7 % 256)
    losses = {}
    for p in (0.0, 0.5):
        text = plan_text('tokens("t.bin")', arch="gpt2", lr="1e-9", extra='eval { batches = 2; data = tokens("t.bin") }')
        text = text.replace("seq_len =", f"dropout = {p}; seq_len =").replace("grad_clip = 0.0", f"grad_clip = 0.0; recompute = {recompute}")
        res = load_text(text, str(tmp_path / "p.plan"))
        assert not [d for d in res.diagnostics if d.is_error]
        script = codegen.write(res.program.plans[0], tmp_path / f"out{p}") / "train.py"
        out = run_script(script, 1, "--steps", 1, "--dump-losses", tmp_path / f"{p}.json")
        assert out.returncode == 0, out.stderr
        losses[p] = json.loads((tmp_path / f"{p}.json").read_text())
    assert losses[0.0]["loss"] != losses[0.5]["loss"]  # dropout did act in training
    (_, plain), (_, dropped) = losses[0.0]["val_loss"][0], losses[0.5]["val_loss"][0]
    assert abs(plain - dropped) <= 1e-6 * plain, (plain, dropped)


def test_a_bad_id_in_the_validation_data_is_one_line(tmp_path, capsys, run_script):
    """Lint reads the validation file too (E084); the script checks the validation
    batches' ids when it starts (they are the same batches at every evaluation): one line
    naming val.bin and the id's byte (file order, one window: byte 3 * 2), exit 1, before
    the first step."""
    write_raw(tmp_path / "train.bin", np.arange(100) % 256)
    write_raw(tmp_path / "val.bin", ONE_WINDOW)
    extra = 'eval { batches = 1; data = tokens("val.bin") }'
    script = compile_plan(tmp_path, 'tokens("train.bin")', arch="gpt2", extra=extra)
    write_raw(tmp_path / "val.bin", past_vocab(ONE_WINDOW, 3, 999))
    rc, found = lint(tmp_path, capsys, 'tokens("train.bin")', arch="gpt2", extra=extra)
    assert rc == 1 and found == [("error", "E084", "data file val.bin holds token id 999, not below vocab = 256")]
    out = run_script(script, 1, "--steps", 2, "--dump-losses", tmp_path / "l.json")
    assert out.returncode == 1 and "step" not in out.stdout
    assert error_line(out) == f"data file {tmp_path / 'val.bin'}: id 999 at byte 6 is not below vocab = 256"
    assert not (tmp_path / "l.json").exists()


def test_blend_weights_whose_sum_overflows_are_still_shares(tmp_path, run_script):
    """blend(1e308, a, 1e308, b): the weights' sum is past a float's range, yet each is a
    half (scaled by the largest before they are summed), as lint and the script both say;
    and --data "" is refused in one line rather than training on the plan's data."""
    write_raw(tmp_path / "a.bin", np.arange(200) % 256)
    write_raw(tmp_path / "b.bin", np.arange(200) % 256)
    script = compile_plan(tmp_path, 'blend(1e308, tokens("a.bin"), 1e308, tokens("b.bin"))', arch="gpt2", hidden=16)
    out = run_script(script, 1, "--steps", 8, "--log-every", 8)
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("data blend, rows drawn (weight): "))
    assert [float(w) for w in re.findall(r"\(([\d.]+)\)", line)] == [0.5, 0.5], line
    out = run_script(script, 1, "--data", "")
    assert out.returncode == 2 and out.stderr.strip() == "train.py: error: argument --data: an empty file name"
