"""The token files a plan names, as lint sees them: the format found from the file, where
its ids start, their type and count, read from headers without reading the whole file.

The generated script reads the same formats (templates/data.py.jinja) and checks the same
things when it starts; this module is its twin for ``dslc lint``. Three formats:

- raw ids (nanoGPT's ``train.bin``): no header; the type from the plan (``dtype =``) or
  the narrowest that holds the vocab (uint16 up to 65,536 ids, else uint32);
- llm.c's ``.bin`` (karpathy/llm.c, dev/data/data_common.py ``write_datafile``): a header
  of 256 little-endian int32 (magic, version, token count, zeros), then the ids;
- Megatron-LM's indexed dataset (megatron/core/datasets/indexed_dataset.py,
  ``_IndexWriter``): ``prefix.bin`` holds the documents' ids back to back, ``prefix.idx``
  the header ``MMIDIDX\\x00\\x00``, version (u64 = 1), dtype code (u8), sequence count
  (u64), document count (u64), then the sequences' lengths (int32), their byte offsets in
  the .bin (int64) and the document index (int64).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from . import reading

# llm.c: magic -> (version, id type); 20240520 for GPT-2's tokens, 20240801 for Llama 3's
LLMC = {20240520: (1, "uint16"), 20240801: (7, "uint32")}
LLMC_HEADER = 256 * 4  # bytes
# Megatron: the .idx magic and its dtype codes (DType in indexed_dataset.py) that hold ids;
# 6 and 7 are float64 and float32, which do not
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 8: "uint16"}
MEGATRON_FIXED = len(MEGATRON_MAGIC) + 8 + 1 + 8 + 8  # bytes before the arrays
HALVES_SCAN = 2**20  # ids of a raw 16-bit file read for "every second id is 0" (lint and script)
ITEMSIZE = {"uint8": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8}
SCAN_INDEX = 64 * 2**20  # bytes of a Megatron index whose sequences lint checks one by one


class Unreadable(Exception):
    """The file cannot be trained on: one line naming the file and why. ``kind`` is
    "missing", "file" (not a regular file, or a size no ids fit) or "format" (a header or
    index that does not match the file)."""

    def __init__(self, message: str, kind: str = "format"):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Layout:
    """Where a file's ids are: ``count`` ids of ``dtype`` from byte ``offset`` of ``path``."""

    format: str  # bytes | raw | llm.c | megatron
    path: str  # the file the ids are read from (a Megatron dataset's .bin)
    dtype: str
    offset: int
    count: int
    index_read: int = 0  # bytes of a Megatron index read past its header


def megatron_pair(path: str) -> tuple[str, str] | None:
    """(prefix.bin, prefix.idx) when ``path`` names a Megatron dataset: its prefix, its .idx,
    or a .bin with an .idx beside it; None for a single file."""
    stem, ext = os.path.splitext(path)
    if ext == ".idx":
        return stem + ".bin", path
    if ext == ".bin" and os.path.lexists(stem + ".idx"):
        return path, stem + ".idx"
    if not os.path.lexists(path) and (os.path.lexists(path + ".bin") or os.path.lexists(path + ".idx")):
        return path + ".bin", path + ".idx"
    return None


def regular_size(path: str) -> int:
    """The size of the regular file at ``path``; Unreadable when it is missing or is not
    one (a FIFO, a device, a directory: never opened)."""
    return _regular(path, 0, 0)[1].st_size


def read_head(path: str, n: int, at: int = 0) -> bytes:
    """Up to ``n`` bytes of the regular file ``path`` from byte ``at``."""
    return _regular(path, n, at)[0]


def _regular(path: str, n: int, at: int) -> tuple[bytes, os.stat_result]:
    """:func:`dslc.reading.read_bytes`, its refusals as Unreadable."""
    try:
        return reading.read_bytes(path, n, at, n)
    except (FileNotFoundError, NotADirectoryError):
        raise Unreadable(f"{path} not found", "missing") from None
    except (IsADirectoryError, reading.NotAFile):
        raise Unreadable(f"{reading.shown(path)} is not a regular file: the script memory-maps its data", "file") from None
    except OSError as e:
        raise Unreadable(f"{path} cannot be read: {e.strerror}", "file") from None


def layout(path: str, kind: str, raw_dtype: str, index_limit: int = SCAN_INDEX) -> Layout:
    """The layout of the text or tokens file ``path`` (Unreadable: why it cannot be read);
    a Megatron index of at most ``index_limit`` bytes is checked sequence by sequence."""
    if kind == "text":
        return Layout("bytes", path, "uint8", 0, regular_size(path))
    pair = megatron_pair(path)
    if pair is not None:
        return _megatron(*pair, index_limit)
    size = regular_size(path)
    head = read_head(path, LLMC_HEADER)
    magic = struct.unpack("<i", head[:4])[0] if len(head) >= 4 else None
    if magic in LLMC:
        version, dtype = LLMC[magic]
        if len(head) < LLMC_HEADER:
            raise Unreadable(f"{path} has llm.c's magic {magic} but a truncated header: {size} bytes, not {LLMC_HEADER}")
        got, count = struct.unpack("<2i", head[4:12])
        if got != version:
            raise Unreadable(f"{path} has llm.c's magic {magic}, whose version is {version}, but says version {got}")
        want = LLMC_HEADER + count * ITEMSIZE[dtype]
        if count < 0 or size != want:
            raise Unreadable(f"{path}: its llm.c header counts {count} tokens ({want} bytes with the header) but the file has {size} bytes")
        return Layout("llm.c", path, dtype, LLMC_HEADER, count)
    item = ITEMSIZE[raw_dtype]
    if size % item:
        raise Unreadable(f"{path} has {size} bytes, not a multiple of {item} ({raw_dtype} ids)", "file")
    return Layout("raw", path, raw_dtype, 0, size // item)


def _megatron(bin_path: str, idx_path: str, index_limit: int) -> Layout:
    if not os.path.lexists(bin_path) and not os.path.lexists(idx_path):
        raise Unreadable(f"{bin_path} and {os.path.basename(idx_path)} not found", "missing")
    for have, other in ((bin_path, idx_path), (idx_path, bin_path)):
        if not os.path.lexists(have):
            raise Unreadable(f"{other} has no {os.path.basename(have)} beside it: a Megatron dataset is a .bin and its .idx")
    size = regular_size(idx_path)
    head = read_head(idx_path, MEGATRON_FIXED)
    if not head.startswith(MEGATRON_MAGIC):
        raise Unreadable(f"{idx_path} does not start with Megatron's magic MMIDIDX: it is not an indexed dataset's index")
    if len(head) < MEGATRON_FIXED:
        raise Unreadable(f"{idx_path} has a truncated header: {size} bytes, fewer than {MEGATRON_FIXED}")
    version, code, sequences, documents = struct.unpack("<QBQQ", head[len(MEGATRON_MAGIC):])
    if version != 1:
        raise Unreadable(f"{idx_path} is version {version} of Megatron's index; dslc reads version 1")
    if code not in MEGATRON_DTYPES:
        raise Unreadable(f"{idx_path} has dtype code {code}, which is not an integer type of token ids")
    want = MEGATRON_FIXED + 12 * sequences + 8 * documents
    if size != want:
        raise Unreadable(f"{idx_path} has {size} bytes, but its header's {sequences} sequences and {documents} documents take {want}")
    dtype, bin_size = MEGATRON_DTYPES[code], regular_size(bin_path)
    end = 0
    if sequences:  # the last sequence ends where the .bin does
        (length,) = struct.unpack("<i", read_head(idx_path, 4, MEGATRON_FIXED + 4 * (sequences - 1)))
        (pointer,) = struct.unpack("<q", read_head(idx_path, 8, MEGATRON_FIXED + 4 * sequences + 8 * (sequences - 1)))
        end = pointer + length * ITEMSIZE[dtype]
    index_read = 12 * sequences if 12 * sequences <= index_limit else 0
    if index_read and not _back_to_back(idx_path, sequences, ITEMSIZE[dtype]):
        raise Unreadable(f"{idx_path}: its sequences are not stored back to back in {os.path.basename(bin_path)}")
    if end != bin_size:
        raise Unreadable(f"{bin_path} has {bin_size} bytes, but {os.path.basename(idx_path)} indexes {end}")
    return Layout("megatron", bin_path, dtype, 0, bin_size // ITEMSIZE[dtype], index_read)


def _back_to_back(idx_path: str, sequences: int, item: int) -> bool:
    """Whether each sequence starts where the one before it ended, from byte 0: the
    stream the script reads is then the documents in order."""
    import numpy as np

    arrays = read_head(idx_path, 12 * sequences, MEGATRON_FIXED)
    lengths = np.frombuffer(arrays[: 4 * sequences], dtype="<i4").astype(np.int64)
    pointers = np.frombuffer(arrays[4 * sequences :], dtype="<i8")
    return bool(pointers[0] == 0 and (pointers[1:] == pointers[:-1] + lengths[:-1] * item).all())


def scan(lay: Layout, limit: int) -> tuple[int, int, bool, bool]:
    """(smallest id, largest id, whether every second id is 0, whether all ids were read)
    over the first ``limit`` bytes of ids; the zeros are 32-bit ids read as 16-bit."""
    import numpy as np  # only plans with a data file pay for the import

    item = ITEMSIZE[lay.dtype]
    n = min(lay.count, limit // item)
    data = read_head(lay.path, n * item, lay.offset)
    ids = np.frombuffer(data[: len(data) // item * item], dtype="<" + np.dtype(lay.dtype).str[1:])
    if not len(ids):
        return 0, 0, False, lay.count == 0
    head = ids[:HALVES_SCAN]
    halves = item == 2 and len(head) >= 64 and not head[1::2].any() and head[::2].any()
    return int(ids.min()), int(ids.max()), bool(halves), n == lay.count
