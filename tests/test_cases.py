"""The bad-plan corpus: each tests/cases/<name>.plan comes with
<name>.expected, one line per diagnostic (`CODE line:col`) that the author of
the case meant it to produce. The linter must report exactly those errors and
warnings, at those places, and exit with the matching code."""

from __future__ import annotations

from pathlib import Path

import pytest

from dslc.cli import main
from dslc.driver import load_paths

CASES = Path(__file__).parent / "cases"
PLANS = sorted(CASES.glob("*.plan"))


def expected(plan: Path) -> list[tuple[str, str]]:
    text = plan.with_suffix(".expected").read_text()
    return sorted(tuple(line.split()) for line in text.splitlines() if line.strip())


def test_corpus_is_large():
    assert len(PLANS) >= 40
    codes = {code for p in PLANS for code, _ in expected(p)}
    assert len(codes) >= 40, sorted(codes)


@pytest.mark.parametrize("plan", PLANS, ids=[p.stem for p in PLANS])
def test_case(plan: Path, capsys):
    result = load_paths([plan])
    got = sorted(
        (d.code, f"{d.span.line}:{d.span.col}")
        for d in result.diagnostics
        if d.severity.value != "note" and d.span and Path(d.span.file) == plan
    )
    assert got == expected(plan)
    has_error = any(code.startswith("E") for code, _ in expected(plan))
    assert main(["lint", str(plan)]) == (1 if has_error else 0)
    assert main(["lint", "--strict", str(plan)]) == 1
    out = capsys.readouterr().out
    code, where = expected(plan)[0]
    assert f"{plan}:{where}: " in out and f"[{code}]" in out
