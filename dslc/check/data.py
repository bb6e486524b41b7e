"""The rules about a plan's data files, which read them as the script will (a bounded
part of each): registered by :mod:`dslc.check` like the others."""

from __future__ import annotations

import os

from .. import tokenfiles
from ..diagnostics import error, note, warning
from ..ir import Plan

MAX_DATA_SCAN = 64 * 2**20  # bytes of a file's ids lint reads to check them against the vocab
MAX_DATA_READ = 256 * 2**20  # bytes of ids and indexes lint reads for all of a plan's files


def data_file(plan: Plan):
    """Each data file of the plan (training, its blend, the validation data) as the script
    will read it: missing (W083: it may exist where the script runs), not a regular file
    or too small (E085), a header or index that does not match the file (E087: llm.c's
    magic and count, Megatron's .idx and its .bin), ids the vocab does not hold (E084, in
    the first MAX_DATA_SCAN bytes, MAX_DATA_READ for all the files together; N086 when
    there are more), or a vocab that 16-bit ids reach only part of (W088)."""
    m, budget = plan.model, MAX_DATA_READ
    sources = plan.train.data.files + (plan.train.eval.data.files if plan.train.eval else ())
    for d in sources:
        budget -= yield from _data_source(d, m, budget)


def _data_source(d, m, budget: int):
    """One file's diagnostics; returns the bytes it read past the headers (of ``budget``)."""
    where = d.span
    if d.kind == "text" and m.vocab < 256:
        yield error("E084", where, f"text data is byte-level (ids 0–255) but vocab = {m.vocab}", "set vocab = 256 or more")
    if d.dtype == "uint16" and m.vocab > 2**16:
        yield warning("W088", where, f"data file {d.path}: dtype = uint16 holds ids 0–65535 but vocab = {m.vocab}: the other rows are never trained", "Llama 3's tokens need uint32")
    if not d.resolved_path or d.resolved_path.startswith("<"):
        return 0
    try:
        lay = tokenfiles.layout(d.resolved_path, d.kind, d.raw_dtype(m.vocab), min(tokenfiles.SCAN_INDEX, budget))
    except tokenfiles.Unreadable as e:
        if e.kind == "missing":
            yield warning("W083", where, f"data file {d.path} not found (looked for {d.resolved_path})", "the training script checks again when it starts")
        else:
            yield error("E085" if e.kind == "file" else "E087", where, f"data file {e}")
        return 0
    if lay.format != "raw" and d.dtype and d.dtype != lay.dtype:
        yield error("E087", where, f"data file {d.path}: its {lay.format} header says {lay.dtype} ids but the plan says dtype = {d.dtype}", "leave dtype out: it is for raw files")
        return lay.index_read
    # a plan's dtype = uint16 was warned about above; a header's 16 bits are said here
    if not d.dtype and lay.format in ("llm.c", "megatron") and tokenfiles.ITEMSIZE[lay.dtype] == 2 and m.vocab > 2**16:
        yield warning("W088", where, f"data file {d.path} holds {lay.dtype} ids ({lay.format}) but vocab = {m.vocab}: the rows past 65535 are never trained", "tokens for this vocabulary need 32-bit ids")
    if lay.count < m.seq_len + 1:
        yield error("E085", where, f"data file {d.path} holds {lay.count} token ids, fewer than seq_len + 1 = {m.seq_len + 1}")
        return lay.index_read
    limit = min(MAX_DATA_SCAN, max(0, budget - lay.index_read))
    lo, hi, halves, whole = tokenfiles.scan(lay, limit)
    if lay.format == "raw" and halves:
        yield error("E087", where, f"data file {d.path}: read as {lay.dtype}, every second id is 0: it looks like 32-bit ids", "write dtype = uint32 (or int32)")
    elif hi >= m.vocab or lo < 0:
        bad = hi if hi >= m.vocab else lo
        yield error("E084", where, f"data file {d.path} holds token id {bad}, not below vocab = {m.vocab}" if bad >= 0 else f"data file {d.path} holds token id {bad}, below 0",
                    f"the tokens were made with another vocabulary, or the file is not {lay.dtype} token ids")
    elif not whole:
        yield note("N086", where, f"token ids of {d.path} checked in its first {limit / 2**20:g} MiB only", "lint reads at most 64 MiB of a file and 256 MiB for a plan; the script checks the ids of every batch")
    return lay.index_read + min(limit, lay.count * tokenfiles.ITEMSIZE[lay.dtype])



def checkpoint_dir(plan: Plan):
    """``checkpoint.dir``, where the script will make its checkpoint folders (relative to
    the directory it runs in, taken here as the one lint runs in): a name (E025: not
    empty, no NUL byte) that is not a file nor under one (E025), in a folder this
    user may write (W026: the script may run as another user, elsewhere)."""
    ck = plan.train.checkpoint
    if ck is None:
        return
    where, path = plan.where("checkpoint.dir", "train.checkpoint"), ck.dir
    if not path.strip() or "\0" in path:
        why = "is empty" if not path.strip() else "holds a NUL byte, which no file name may"
        yield error("E025", where, f"checkpoint.dir {why}: the script makes its checkpoint folders there", 'name a folder, such as dir = "checkpoints/run1"')
        return
    if os.path.lexists(path) and not os.path.isdir(path):
        yield error("E025", where, f"checkpoint.dir {path} is a file, not a folder", "name a folder, or move the file away")
        return
    existing = path
    while existing and not os.path.lexists(existing):  # the nearest folder that exists
        existing = os.path.dirname(existing.rstrip("/")) or ("/" if path.startswith("/") else "")
    existing = existing or "."
    if not os.path.isdir(existing):
        yield error("E025", where, f"checkpoint.dir {path}: {existing} is a file, so no folder can be made in it", "name a folder, or move the file away")
    elif not os.access(existing, os.W_OK | os.X_OK):
        made = "" if existing == path else f" (the nearest existing folder of {path})"
        yield warning("W026", where, f"checkpoint.dir: {existing}{made} is not writable by this user", "the script's user must be able to make folders there")
