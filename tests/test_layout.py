"""The compiler's layout is its pipeline (docs/architecture.md): no import cycle, no module
over 400 lines, and no stage that imports a later one."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PKG = Path(__file__).resolve().parents[1] / "dslc"
MODULES = sorted(PKG.rglob("*.py"))

# Stages in pipeline order; a module may import its own stage and earlier ones only.
# (cli and driver, the drivers of the pipeline, and the language server may import every stage.)
STAGES = [
    ("dslc", "dslc.source", "dslc.diagnostics", "dslc.codes", "dslc.units", "dslc.resources", "dslc.ir", "dslc.unknown",
     "dslc.catalog", "dslc.groups", "dslc.chunks", "dslc.pipeline_shapes", "dslc.knobs"),
    ("dslc.arch",),
    ("dslc.front",),
    ("dslc.check",),
    ("dslc.cost",),
    ("dslc.fit",),
    ("dslc.search",),
    ("dslc.report",),
    ("dslc.codegen",),
    ("dslc.verify",),
    ("dslc.driver", "dslc.cli", "dslc.lsp", "dslc.__main__"),
]


def name_of(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The dslc modules ``path`` imports (relative imports resolved, at any depth)."""
    here = name_of(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{target}.{alias.name}"
                out.add(full if full in NAMES else target)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("dslc")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dslc"):
            out.add(node.module)
    return {m for m in out if m in NAMES and m != here}


NAMES = {name_of(p) for p in MODULES}


def stage(module: str) -> int:
    best = max((len(prefix), i) for i, names in enumerate(STAGES) for prefix in names
               if module == prefix or module.startswith(prefix + "."))
    return best[1]


def test_no_import_cycle():
    graph = nx.DiGraph((name_of(p), m) for p in MODULES for m in imports(p))
    graph.remove_edges_from([(a, b) for a, b in graph.edges if b == "dslc"])  # the version
    cycles = list(nx.simple_cycles(graph))
    assert cycles == [], cycles[:3]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: name_of(p))
def test_module_under_400_lines(path):
    assert len(path.read_text().splitlines()) <= 400


@pytest.mark.parametrize("path", MODULES, ids=lambda p: name_of(p))
def test_stage_imports_only_earlier_stages(path):
    here = name_of(path)
    later = sorted(m for m in imports(path) if stage(m) > stage(here))
    assert later == [], f"{here} (stage {stage(here)}) imports later stages: {later}"


def test_every_module_has_a_stage():
    for m in NAMES:
        stage(m)  # raises ValueError (max of nothing) for a module outside the table
