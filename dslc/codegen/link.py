"""Imports of the generated package, read off its code: each module imports exactly the
names it reads and does not define, from the one module that defines them.

The templates write no import lines: which modules a plan has, and which of their names
another module reads, change with the plan, and a hand-kept list of conditional imports
is where a missing or unused import hides. :func:`link` finds each module's free names
with :mod:`symtable` (the compiler's own scoping), resolves each to the standard library
or torch (:data:`EXTERNAL`) or to the sibling module that binds it at its top level, and
writes the block after the module's docstring in isort's order: the standard library,
torch, then the package. A name that no module defines, one that two define, an import
cycle, or a module that would import ``train.py`` (it runs as ``__main__``) is a bug of
a template: :class:`CodegenError`.
"""

from __future__ import annotations

import ast
import builtins
import symtable
from collections import defaultdict
from graphlib import CycleError, TopologicalSorter

from .errors import CodegenError

ENTRY = "train"  # the entry point: run, never imported

# name -> (module, imported name or None for ``import module [as name]``)
EXTERNAL: dict[str, tuple[str, str | None]] = {
    **{m: (m, None) for m in (
        "argparse", "contextlib", "datetime", "functools", "hashlib", "io", "json", "math", "mmap",
        "os", "pickle", "re", "shutil", "signal", "stat", "struct", "sys", "time", "warnings", "weakref", "torch",
    )},
    "TorchDispatchMode": ("torch.utils._python_dispatch", "TorchDispatchMode"),
    "tree_leaves": ("torch.utils._pytree", "tree_leaves"),
    "dist": ("torch.distributed", None),
    "nn": ("torch.nn", None),
    "F": ("torch.nn.functional", None),
    "dcp": ("torch.distributed.checkpoint", None),
    **{n: ("torch.distributed.checkpoint.metadata", n) for n in (
        "ChunkStorageMetadata", "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
        "TensorStorageMetadata",
    )},
    **{n: ("torch.distributed.checkpoint.planner", n) for n in (
        "LoadPlan", "SavePlan", "TensorWriteData", "WriteItem", "WriteItemType",
    )},
    "create_read_items_for_chunk_list": ("torch.distributed.checkpoint.planner_helpers", "create_read_items_for_chunk_list"),
    # torchao's float8 training (float8.py, plans with train { float8 })
    **{n: ("torchao.float8.config", n) for n in ("Float8LinearConfig", "ScalingGranularity", "ScalingType")},
    **{n: ("torchao.float8.float8_training_tensor", n) for n in (
        "GemmInputRole", "LinearMMConfig", "ScaledMMConfig", "hp_tensor_and_scale_to_float8",
    )},
    **{n: ("torchao.float8.float8_utils", n) for n in ("amax_to_scale", "tensor_to_amax")},
    **{n: ("torch.utils.checkpoint", n) for n in (
        "checkpoint", "CheckpointPolicy", "create_selective_checkpoint_contexts",
    )},
}
_BUILTINS = set(dir(builtins)) | {"__file__", "__name__"}


# packages beyond torch that a plan may need: their imports run in a try, and a missing
# one (or a build for another torch) stops the script with one line, not a traceback
OPTIONAL = {"torchao": "train { float8 } needs torchao's float8 training (pip install torchao)"}


def link(modules: dict[str, str]) -> dict[str, str]:
    """``{module name: source without imports}`` -> the same sources with their imports."""
    defined = {name: _top_level_bindings(src, name) for name, src in modules.items()}
    definer: dict[str, list[str]] = defaultdict(list)
    for module, names in defined.items():
        for n in names:
            definer[n].append(module)
    imports: dict[str, dict[str, set[tuple[str, bool]]]] = {}
    graph: dict[str, set[str]] = {}
    for module, src in modules.items():
        wanted: dict[str, set[tuple[str, bool]]] = defaultdict(set)  # source -> (name, plain import)
        for n in sorted(_free_names(src, module) - defined[module]):
            if n in EXTERNAL:
                source, what = EXTERNAL[n]
                wanted[source].add((what or n, what is None))
                continue
            found = [m for m in definer.get(n, ()) if m != module]
            if len(found) != 1:
                where = "no module" if not found else " and ".join(f"{m}.py" for m in found)
                raise CodegenError(f"internal error: {module}.py reads {n!r}, which {where} defines")
            if found[0] == ENTRY:
                raise CodegenError(f"internal error: {module}.py reads {n!r} from {ENTRY}.py, which is never imported")
            wanted[found[0]].add((n, False))
        imports[module] = wanted
        graph[module] = {m for m in wanted if m in modules}
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as e:
        raise CodegenError(f"internal error: the generated modules import each other: {' -> '.join(e.args[1])}") from None
    return {module: _insert(src, _import_block(imports[module], set(modules))) for module, src in modules.items()}


def _tables(table: symtable.SymbolTable):
    yield table
    for child in table.get_children():
        yield from _tables(child)


def _parse(src: str, module: str) -> symtable.SymbolTable:
    try:
        return symtable.symtable(src, f"{module}.py", "exec")
    except SyntaxError as e:
        raise CodegenError(f"internal error: generated {module}.py is not valid Python: {e}") from None


def _top_level_bindings(src: str, module: str) -> set[str]:
    """The names a module binds at its top level (not by importing them)."""
    top = _parse(src, module)
    return {s.get_name() for s in top.get_symbols() if s.is_assigned() and not s.is_imported()}


def _free_names(src: str, module: str) -> set[str]:
    """The module-level names that the module's code reads, in any scope, less builtins."""
    names = set()
    for table in _tables(_parse(src, module)):
        for s in table.get_symbols():
            if s.is_referenced() and s.is_global():
                names.add(s.get_name())
    return names - _BUILTINS


def _import_block(wanted: dict[str, set[tuple[str, bool]]], siblings: set[str]) -> str:
    """The import lines: the standard library, torch, the OPTIONAL packages (in a try),
    then the package's modules; in each, ``import`` lines before ``from`` lines, by module
    (isort's order)."""
    groups: list[list[tuple[bool, str, str]]] = [[], [], [], []]
    for source, names in wanted.items():
        root = source.split(".")[0]
        group = groups[3 if source in siblings else 2 if root in OPTIONAL else 1 if root == "torch" else 0]
        for n, plain in names:
            if plain:
                group.append((False, source, f"import {source}" + ("" if n == source else f" as {n}")))
        named = sorted((n for n, plain in names if not plain), key=_isort_key)
        if named:
            group.append((True, source, f"from {source} import {', '.join(named)}"))
    blocks = ["\n".join(line for *_, line in sorted(g)) for g in groups]
    if groups[2]:
        need = " and ".join(OPTIONAL[r] for r in sorted({s.split(".")[0] for _, s, _ in groups[2]}))
        need = need.replace("{", "{{").replace("}", "}}")  # in an f-string
        blocks[2] = ("try:\n" + "".join(f"    {line}\n" for line in blocks[2].splitlines()) + "except Exception as e:  # missing, or built for another torch\n"
                     f'    raise SystemExit(f"{ENTRY}.py: error: {need}: {{type(e).__name__}}: {{e}}") from None')
    return "\n\n".join(b for b, g in zip(blocks, groups) if g)


def _isort_key(name: str) -> tuple[int, str]:
    """isort's order of imported names: constants, classes, then the rest."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name.lower())


def _insert(src: str, block: str) -> str:
    """``src`` with ``block`` after its docstring (and any comments right after it)."""
    if not block:
        return src
    body = ast.parse(src).body
    has_doc = body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
    lines = src.splitlines(keepends=True)
    at = body[0].end_lineno if has_doc else 0
    if not has_doc:  # after the leading comment lines (the stamp)
        while at < len(lines) and lines[at].startswith("#"):
            at += 1
    return "".join(lines[:at]) + "\n" + block + "\n" + "".join(lines[at:])
