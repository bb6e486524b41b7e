"""Reading a block's keys: unknown and duplicate keys, types, units, ranges.

Every reader method records a diagnostic and returns the default (or None
for a required key) instead of raising, so one run reports every mistake.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..diagnostics import Diagnostic, error, note
from ..source import Span
from ..units import UNITS, quantity, resolve
from . import ast
from .defaults import BOUNDS

_DIM_WORDS = {"size": "a size", "rate": "a bandwidth", "time": "a time", "flops": "a compute rate"}
_EXAMPLE = {"size": "80 GiB", "rate": "450 GB/s", "time": "2 us", "flops": "989 TFLOP/s"}


def suggest(word: str, options: Iterable[str]) -> str | None:
    """'did you mean …?' for a misspelled key or name: the options of its family first
    (``h100`` is ``h100_sxm`` or ``h100_pcie``: the word then ``_``), then by spelling."""
    opts = list(options)
    family = [o for o in opts if o.lower().startswith(word.lower() + "_")]
    if family:
        best = sorted(family, key=lambda o: (-difflib.SequenceMatcher(None, word, o).ratio(), o))
        return "' or '".join(best[:3])
    close = difflib.get_close_matches(word, opts, n=1, cutoff=0.6)
    if not close:
        low = {o.lower(): o for o in opts}
        close = difflib.get_close_matches(word.lower(), list(low), n=1, cutoff=0.6)
        close = [low[c] for c in close]
    return close[0] if close else None


def _spelled(words: str, hint: str) -> dict[str, str]:
    return dict.fromkeys(words.split(), hint)


# Keys that other frameworks use, or that belong to another block of a plan, and where
# this language writes them: the hint of E010/E016 for such a key instead of a guess by
# spelling (grad_accum is not grad_clip). Looked up only for a key that the block does not
# know, so a real key always wins.
ELSEWHERE: dict[str, str] = {
    **_spelled("grad_accum gradient_accumulation gradient_accumulation_steps accumulation_steps accum_steps",
               "gradient accumulation is `pipeline { microbatches = N }` (left out: global_batch / (micro_batch × dp × ep))"),
    **_spelled("microbatches num_microbatches micro_batches",
               "micro-batches per step are `pipeline { microbatches = N }`"),
    **_spelled("batch_size", "the batch is `train { micro_batch = N }` (sequences per micro-batch per data-parallel rank) "
               "or `train { global_batch = N }` (sequences per step)"),
    **_spelled("micro_batch micro_batch_size", "the micro-batch size is `train { micro_batch = N }`"),
    **_spelled("global_batch global_batch_size", "the global batch is `train { global_batch = N }`"),
    **_spelled("lr learning_rate", "the learning rate is the optimizer's: `train { optimizer adamw { lr = 3e-4 } }`"),
    **_spelled("weight_decay", "weight decay is the optimizer's: `train { optimizer adamw { weight_decay = 0.1 } }`"),
    **_spelled("warmup warmup_steps", "warmup is the lr schedule's: `train { lr_schedule cosine { warmup = N } }`"),
    **{axis: f"mesh axes are placed in the plan's mesh: `mesh {{ {axis} = N on LINK }}`" for axis in ("dp", "tp", "pp", "cp", "ep")},
    **_spelled("num_stages pipeline_stages", "pipeline stages are the mesh's pp axis: `mesh { pp = N on LINK }`"),
    **_spelled("activation_checkpointing gradient_checkpointing activation_recompute checkpoint_activations",
               "activation checkpointing is `train { recompute = full }` (or `selective`)"),
    **_spelled("fsdp", "FSDP is `data_parallel { zero = 3 }`"),
    **_spelled("zero zero_stage", "the ZeRO stage is `data_parallel { zero = N }`"),
    **_spelled("sequence_parallel", "sequence parallelism is `tensor_parallel { sequence_parallel = true }`"),
    **_spelled("num_layers n_layer n_layers num_hidden_layers", "the number of transformer blocks is the model's `layers = N`"),
    **_spelled("n_embd d_model hidden_size", "the model width is the model's `hidden = N`"),
    **_spelled("num_attention_heads n_head num_heads", "attention heads are the model's `heads = N`"),
    **_spelled("num_key_value_heads", "key/value heads are the model's `kv_heads = N`"),
    **_spelled("intermediate_size", "the MLP's inner size is the model's `ffn = N`"),
    **_spelled("max_position_embeddings block_size context_length seq_length", "the sequence length is the model's `seq_len = N`"),
}


def describe(v: ast.Value) -> str:
    match v:
        case ast.Number():
            return f"the number {shown(v.value)}"
        case ast.Quantity():
            return f"the quantity {shown(v.value)} {v.unit}"
        case ast.String():
            return "a string"
        case ast.Bool():
            return f"the boolean {'true' if v.value else 'false'}"
        case ast.Ident():
            return f"the name '{v.name}'"
        case ast.Call():
            return f"a call of {v.name}(…)"
        case ast.Tuple() | ast.List():
            return "a list"
        case ast.Every():
            return f"'{v.name} every …'"
    return "a value"  # pragma: no cover


def as_float(x: int | float) -> float:
    """``float(x)``, with ±inf for an integer too large for a float (no OverflowError)."""
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def shown(x: int | float) -> str:
    """A number for a message: ``1e-320``, ``inf``, ``128``, ``1.00e400`` (a long integer)."""
    if isinstance(x, float):
        return f"{x:g}"
    digits = str(abs(x))
    text = digits if len(digits) <= 20 else f"{digits[0]}.{digits[1:3]}e{len(digits) - 1}"
    return "-" * (x < 0) + text


def written(bound: int | float | str) -> str:
    """A bound of :data:`BOUNDS` as docs/language.md writes it: 262144, 1e-30, 1e12, 1 MiB."""
    return f"{bound:g}".replace("e+", "e") if isinstance(bound, float) else str(bound)


@dataclass
class Fields:
    """A block's statements, sorted by kind; duplicates already diagnosed."""

    block: ast.Block
    assigns: dict[str, ast.Assign] = field(default_factory=dict)
    blocks: dict[str, list[ast.Block]] = field(default_factory=dict)
    axes: list[ast.Axis] = field(default_factory=list)


class Reader:
    def __init__(self, diags: list[Diagnostic]):
        self.diags = diags
        self.guessed: set[Span] = set()  # keys written wrong, read as their default: unknown to the checks

    def _fallback(self, a: ast.Assign, required: bool, default):
        """After the error of a value written wrong: None for a required key, else its default,
        so that the rest lowers; the checks read it as unknown (``front.lower.checked``)."""
        if required:
            return None
        self.guessed.add(a.span)
        return default

    def unknown(self, code: str, message: str, word: str, options: Iterable[str], span: Span, hint: str | None = None) -> Diagnostic:
        """``hint`` (where the language writes ``word``, :data:`ELSEWHERE`) wins over a guess."""
        opts = sorted(options)
        if hint is None and (guess := suggest(word, opts)):
            hint = f"did you mean '{guess}'?"
        elif hint is None and opts and len(opts) <= 12:
            hint = "expected one of: " + ", ".join(opts)
        return error(code, span, message, hint)

    def fields(self, block: ast.Block, keys: Iterable[str], blocks: Iterable[str] = (), axes: bool = False) -> Fields:
        keys, blocks = tuple(keys), tuple(blocks)
        f = Fields(block)
        where = f"in {block.kind}" + (f" '{block.name}'" if block.name else "")
        for st in block.body:
            if isinstance(st, ast.Assign):
                # `model = name` / `cluster = name` refer to a block kind
                if st.key not in keys and st.key not in blocks:
                    self.diags.append(self.unknown("E010", f"unknown key '{st.key}' {where}", st.key, keys + blocks, st.key_span, ELSEWHERE.get(st.key)))
                elif st.key in f.assigns:
                    self.diags.append(error("E011", st.key_span, f"'{st.key}' is set twice {where}", f"first set at {f.assigns[st.key].key_span}"))
                else:
                    f.assigns[st.key] = st
            elif isinstance(st, ast.Block):
                if st.kind not in blocks:
                    self.diags.append(self.unknown("E016", f"unknown block '{st.kind}' {where}", st.kind, blocks + keys, st.kind_span, ELSEWHERE.get(st.kind)))
                else:
                    f.blocks.setdefault(st.kind, []).append(st)
            elif axes:
                f.axes.append(st)
            else:
                self.diags.append(error("E013", st.span, f"'{st.name} = … on {st.link}' places a mesh axis, which only a mesh block holds", "move it into `mesh { }`"))
        return f

    def single(self, f: Fields, kind: str) -> ast.Block | None:
        """The one sub-block of ``kind`` (duplicates diagnosed)."""
        found = f.blocks.get(kind, [])
        for extra in found[1:]:
            self.diags.append(error("E011", extra.kind_span, f"'{kind}' block is given twice", f"first given at {found[0].kind_span}"))
        return found[0] if found else None

    # -- typed getters ------------------------------------------------------
    def _missing(self, f: Fields, key: str) -> None:
        b = f.block
        where = f"{b.kind}" + (f" '{b.name}'" if b.name else "")
        self.diags.append(error("E012", b.name_span or b.kind_span, f"{where} is missing required key '{key}'", f"add `{key} = …` to the block"))

    def wrong(self, a: ast.Assign, want: str, hint: str | None = None) -> None:
        self.diags.append(error("E013", a.value.span, f"'{a.key}' must be {want}, not {describe(a.value)}", hint))

    def _in_bounds(self, f: Fields, a: ast.Assign, v: int | float, got: str) -> bool:
        """Whether ``v`` (SI for a quantity) lies in the row of :data:`BOUNDS` for the key;
        E015 at the value, naming the range as a plan writes it, when it does not."""
        row = BOUNDS.get(f"{f.block.kind}.{a.key}")
        if row is None:
            return True
        lo, hi = (resolve(b) if isinstance(b, str) else b for b in row)
        if lo <= v <= hi:  # exact for ints of any size; inf and subnormals fall outside
            return True
        want = "positive" if lo == 1 and v < 1 and isinstance(v, int) else f"between {written(row[0])} and {written(row[1])}"
        if isinstance(v, float) and not math.isfinite(v):
            got = "a number too large for a 64-bit float (beyond ±1.8e308)"
        self.diags.append(error("E015", a.value.span, f"'{a.key}' must be {want}, got {got}"))
        return False

    def _get(self, f: Fields, key: str, required: bool):
        a = f.assigns.get(key)
        if a is None and required:
            self._missing(f, key)
        return a

    def int(self, f: Fields, key: str, default=None, required=False):
        a = self._get(f, key, required)
        if a is None:
            return default
        v = a.value
        if not isinstance(v, ast.Number) or not isinstance(v.value, int):
            hint = None
            if isinstance(v, ast.Number) and math.isfinite(v.value) and float(v.value).is_integer():
                hint = f"write {int(v.value)}"
            self.wrong(a, "a whole number", hint)
            return self._fallback(a, required, default)
        if not self._in_bounds(f, a, v.value, shown(v.value)):
            return self._fallback(a, required, default)
        return v.value

    def float(self, f: Fields, key: str, default=None, required=False):
        a = self._get(f, key, required)
        if a is None:
            return default
        if not isinstance(a.value, ast.Number):
            self.wrong(a, "a number")
            return self._fallback(a, required, default)
        value = as_float(a.value.value)
        if not self._in_bounds(f, a, value, shown(a.value.value)):
            return self._fallback(a, required, default)
        return value

    def bool(self, f: Fields, key: str, default=None, required=False):
        a = self._get(f, key, required)
        if a is None:
            return default
        if not isinstance(a.value, ast.Bool):
            self.wrong(a, "true or false")
            return self._fallback(a, required, default)
        return a.value.value

    def string(self, f: Fields, key: str, default=None, required=False):
        a = self._get(f, key, required)
        if a is None:
            return default
        if not isinstance(a.value, ast.String):
            self.wrong(a, 'a string in quotes ("…")')
            return self._fallback(a, required, default)
        return a.value.value

    def ident(self, a: ast.Assign) -> str | None:
        if not isinstance(a.value, ast.Ident):
            self.wrong(a, "a name")
            return None
        return a.value.name

    def choice(self, f: Fields, key: str, choices: tuple[str, ...], default=None, required=False):
        a = self._get(f, key, required)
        if a is None:
            return default
        v = a.value
        word = v.name if isinstance(v, ast.Ident) else v.text if isinstance(v, ast.Number) else None
        if word is None:
            self.wrong(a, "one of " + ", ".join(choices))
            return self._fallback(a, required, default)
        if word not in choices:
            self.diags.append(self.unknown("E019", f"'{word}' is not a valid {key}", word, choices, v.span))
            return self._fallback(a, required, default)
        return word

    def quantity(self, f: Fields, key: str, dim: str, default=None, required=False, catalog: str | None = None):
        a = self._get(f, key, required)
        if a is None:
            if catalog is not None and default is not None:
                self.diags.append(note("N021", f.block.span, f"{key} of {catalog} not given; using the catalog's {quantity(default, dim)}", f"set `{key} = …` to override"))
            return default
        v = a.value
        table = UNITS[dim]
        if isinstance(v, ast.Number):
            if v.value == 0:
                value = 0.0
            else:
                self.diags.append(error("E014", v.span, f"'{key}' needs a unit", f"write it as {describe_dim(dim)}, e.g. `{key} = {_EXAMPLE[dim]}`"))
                return self._fallback(a, required, default)
        elif isinstance(v, ast.Quantity):
            if v.unit not in table:
                other = next((d for d, t in UNITS.items() if v.unit in t), None)
                if other:
                    msg = f"'{key}' needs {describe_dim(dim)}, but '{v.unit}' is the unit of {describe_dim(other)}"
                else:
                    msg = f"unknown unit '{v.unit}' for '{key}'"
                guess = suggest(v.unit, table)
                hint = f"did you mean '{guess}'?" if guess else f"e.g. `{key} = {_EXAMPLE[dim]}`"
                self.diags.append(error("E014", v.span, msg, hint))
                return self._fallback(a, required, default)
            value = as_float(v.value) * table[v.unit]
        else:
            self.wrong(a, f"{describe_dim(dim)} such as {_EXAMPLE[dim]}")
            return self._fallback(a, required, default)
        if not self._in_bounds(f, a, value, f"{shown(v.value)} {v.unit}" if isinstance(v, ast.Quantity) else "0"):
            return self._fallback(a, required, default)
        return value


def describe_dim(dim: str) -> str:
    return _DIM_WORDS[dim]
