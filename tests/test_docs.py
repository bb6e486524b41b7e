"""docs/language.md lists what the code has: every diagnostic code, every device and link
of the catalog, every key of every block, and every default of the language, with its
value. The language server's hover reads these tables (dslc.lsp.keydocs), with the same
reader as these tests."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dslc.catalog import DEVICES, LINKS
from dslc.codes import CODES
from dslc.front.defaults import DEFAULTS
from dslc.front.keys import BLOCKS, KEYS
from dslc.lsp.keydocs import docs, table_rows
from dslc.units import GB, GiB

DOC = (Path(__file__).resolve().parents[1] / "docs" / "language.md").read_text()

def spellings(value) -> set[str]:
    """Ways the docs may write a default: true/false, a name, 1e-5 or 1e-05, 10000 or 10000.0."""
    if isinstance(value, bool):
        return {"true" if value else "false"}
    if isinstance(value, tuple):
        return {"(" + ", ".join(f"{v:g}" for v in value) + ")"}
    if isinstance(value, float):
        mantissa, exponent = f"{value:e}".split("e")
        scientific = f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"  # 3e-4
        return {f"{value:g}", repr(value), scientific}
    return {str(value)}


@pytest.mark.parametrize("code", sorted(CODES))
def test_every_diagnostic_code_has_a_row(code):
    assert re.search(rf"^\| {code} \| \S", DOC, re.MULTILINE), f"docs/language.md has no row for {code}"


def test_no_code_in_the_docs_that_the_code_lacks():
    listed = set(re.findall(r"^\| ([EWN]\d{3}) \|", DOC, re.MULTILINE))
    assert listed == set(CODES)


@pytest.mark.parametrize("name", sorted(DEVICES))
def test_every_device_has_its_numbers(name):
    dev = DEVICES[name]
    (row,) = [r for r in table_rows(DOC, DOC.index("The device catalog")) if r["device"] == name]
    assert f"{dev.peak_flops / 1e12:g} TFLOP/s" in row["peak bf16"]
    memory = {f"{dev.memory / GiB:g} GiB", f"{dev.memory / GB:g} GB"}
    assert any(m in row["memory"] for m in memory), (row, memory)


def test_every_catalog_link_is_named():
    for name in LINKS:
        assert f"`{name}`" in DOC, name


@pytest.mark.parametrize("block", sorted(KEYS))
def test_every_key_of_a_block_has_a_row_and_every_row_is_a_key(block):
    rows = {key for b, key in docs() if b == block}
    assert rows == set(KEYS[block]) | set(BLOCKS.get(block, ())), f"the table of `{block}` in docs/language.md"


@pytest.mark.parametrize("key", sorted(DEFAULTS))
def test_every_default_is_documented_with_its_value(key):
    block, _, name = key.partition(".")
    row = docs().get((block, name))
    assert row, f"no row for `{name}` in the table of `{block}`"
    assert any(f"`{s}`" in row.default for s in spellings(DEFAULTS[key])), (key, row.default, spellings(DEFAULTS[key]))
