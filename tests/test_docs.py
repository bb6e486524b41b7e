"""docs/language.md lists what the code has: every diagnostic code, every device and link
of the catalog, and every default of the language, with its value."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dslc.catalog import DEVICES, LINKS
from dslc.codes import CODES
from dslc.front.defaults import DEFAULTS
from dslc.units import GB, GiB

DOC = (Path(__file__).resolve().parents[1] / "docs" / "language.md").read_text()

# the heading of the section that documents the keys of each block
SECTION = {
    "link": "### `link NAME",
    "model": "## `model NAME",
    "tensor_parallel": "### `tensor_parallel",
    "data_parallel": "### `data_parallel",
    "pipeline": "### `pipeline",
    "context_parallel": "### `context_parallel",
    "train": "### `train",
    "optimizer": "#### `optimizer NAME",
    "lr_schedule": "#### `lr_schedule NAME",
    "eval": "#### `eval",
}


def table_rows(heading: str) -> list[list[str]]:
    """The cells of the rows of the first table after ``heading``."""
    start = DOC.index(heading)
    lines = DOC[start:].splitlines()[1:]
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))])
    return rows[2:]  # the header and the |---| line


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
    (row,) = [r for r in table_rows("The device catalog") if r[0] == name]
    assert f"{dev.peak_flops / 1e12:g} TFLOP/s" in row[1]
    memory = {f"{dev.memory / GiB:g} GiB", f"{dev.memory / GB:g} GB"}
    assert any(m in row[2] for m in memory), (row, memory)


def test_every_catalog_link_is_named():
    for name in LINKS:
        assert f"`{name}`" in DOC, name


@pytest.mark.parametrize("key", sorted(DEFAULTS))
def test_every_default_is_documented_with_its_value(key):
    block, _, name = key.partition(".")
    rows = [r for r in table_rows(SECTION[block]) if re.match(rf"`{name}( NAME \{{ … \}})?`", r[0])]
    assert rows, f"no row for `{name}` under {SECTION[block]!r}"
    default = rows[0][2]
    assert any(f"`{s}`" in default for s in spellings(DEFAULTS[key])), (key, default, spellings(DEFAULTS[key]))
