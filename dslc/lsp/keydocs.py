"""Every key's type, default and meaning, from the tables of docs/language.md: the page is
the one description of the language, shipped inside the wheel (``dslc/docs``) as the
grammar is, and tests/test_docs.py holds its tables to the code (a row for each key that
:data:`dslc.front.keys.KEYS` lists, each default as :data:`dslc.front.defaults.DEFAULTS`
has it). The hover adds what the code knows beside: the range a value may take
(:data:`~dslc.front.defaults.BOUNDS`) and the units of a quantity."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from ..front.defaults import BOUNDS
from ..front.keys import BLOCKS, KEYS
from ..front.schema import written
from ..resources import resource_dir
from ..units import UNITS

_CELL = re.compile(r"(?<!\\)\|")
_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")  # [Recompute](#recompute) → Recompute
# what a type cell says for a quantity, and its dimension in dslc.units.UNITS
_DIMS = {"size": "size", "bandwidth": "rate", "time": "time", "compute": "flops"}


@dataclass(frozen=True)
class KeyDoc:
    block: str
    key: str
    entry: str  # the first cell as written: `optimizer NAME { … }`, `model = NAME` or …
    type: str
    default: str
    meaning: str


def section(doc: str, kind: str) -> int:
    """Where the section documenting block ``kind`` starts: its heading, `kind …`."""
    m = re.search(rf"^#+ `{re.escape(kind)}\b", doc, re.MULTILINE)
    if m is None:
        raise KeyError(kind)
    return m.start()


def table_rows(doc: str, start: int) -> list[dict[str, str]]:
    """The rows of the first table after ``start``, each by its column's heading."""
    lines = doc[start:].splitlines()[1:]
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in _CELL.split(line.strip().strip("|"))])
    head = rows[0]
    return [dict(zip(head, r)) for r in rows[2:]]  # the |---| line


def key_of(entry: str) -> str | None:
    """The key or block a row documents: `nodes` → nodes, `optimizer NAME { … }` → optimizer."""
    m = re.match(r"`(\w+)", entry)
    return m.group(1) if m else None


@cache
def text() -> str:
    try:
        return (resource_dir("docs") / "language.md").read_text(encoding="utf-8")
    except OSError:  # installed without its docs: the hover says less
        return ""


@cache
def docs() -> dict[tuple[str, str], KeyDoc]:
    """(block, key) → its row, for every block with a table."""
    doc, out = text(), {}
    for block in KEYS:
        try:
            rows = table_rows(doc, section(doc, block))
        except (KeyError, StopIteration, IndexError):
            continue
        for row in rows:
            cells = list(row.values())
            entry, meaning = cells[0], cells[-1] if len(cells) > 1 else ""
            key = key_of(entry)
            if key:
                out[(block, key)] = KeyDoc(block, key, entry, row.get("type", ""), row.get("default", ""), meaning)
    return out


def plain(cell: str) -> str:
    """A table cell as markdown outside a table: ``\\|`` unescaped, links to the page's
    own sections as their words."""
    return _LINK.sub(r"\1", cell.replace("\\|", "|"))


def dimension(block: str, key: str) -> str | None:
    """The dimension of a quantity key (``link.bandwidth`` → rate), from its type cell."""
    kd = docs().get((block, key))
    word = kd.type.split(" ")[0] if kd else ""
    return _DIMS.get(word)


def is_bool(block: str, key: str) -> bool:
    kd = docs().get((block, key))
    return kd is not None and (kd.type == "bool" or kd.type.replace("\\|", "|") == "`true` | `false`")


def markdown(block: str, key: str, head: bool = False) -> str | None:
    """The hover of a key in ``block`` (``""``: the top level), or with ``head`` of the
    head of a block nested there (``optimizer`` in train)."""
    kd = docs().get((block, key))
    if kd is None and key not in KEYS.get(block, ()) + BLOCKS.get(block, ()):
        return None
    where = f"{block}." if block else ""
    lines = [f"**`{where}{key}`**" + (f" — {plain(kd.type)}" if kd and kd.type else "")]
    if kd and kd.default:
        lines.append(f"default: {plain(kd.default)}")
    bound = BOUNDS.get(f"{block}.{key}")
    if bound:
        lines.append(f"range: {written(bound[0])} to {written(bound[1])}")
    if dim := dimension(block, key):
        lines.append("units: " + " ".join(f"`{u}`" for u in UNITS[dim]))
    if head and key in KEYS:
        lines.append("keys: " + ", ".join(f"`{k}`" for k in KEYS[key] + BLOCKS.get(key, ())))
    return "  \n".join(lines) + (f"\n\n{plain(kd.meaning)}" if kd and kd.meaning else "")
