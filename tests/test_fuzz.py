"""Random and mutated plans never crash the linter: every input gets
diagnostics (or none) and exit code 0, 1 or 2 — never an exception."""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dslc.cli import main
from dslc.driver import load_text

ROOT = Path(__file__).resolve().parent.parent
SEEDS = [p.read_bytes().decode("utf-8", "replace") for p in sorted((ROOT / "tests" / "cases").glob("*.plan"))]
SEEDS += [(ROOT / "plans" / "llama3_8b.plan").read_text().replace('import "../clusters/h100.plan"', (ROOT / "clusters" / "h100.plan").read_text())]

TOKENS = ["plan", "model", "cluster", "mesh", "{", "}", "=", ";", "on", "(", ")", "[", "]", ",", '"x"', "1", "0", "-3", "1e-3",
          "2.5", "450 GB/s", "2 us", "tp", "dp", "pp", "cp", "ep", "llama", "gpt2", "mixtral", "import", "true", "nvlink",
          "layers", "hidden", "heads", "train", "pipeline", "1f1b", "\n", "//c\n", "#c\n", "é", "\t"]


def lint_in_process(text: str | bytes) -> None:
    """Lint through the real CLI entry point, with the text on stdin."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    result = load_text(data, "<stdin>")  # must not raise
    for d in result.diagnostics:
        assert d.code and d.message
        assert d.span is None or d.span.line >= 1
    stdin, out = io.TextIOWrapper(io.BytesIO(data)), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        old, sys.stdin = sys.stdin, stdin
        try:
            code = main(["lint", "-"])
        finally:
            sys.stdin = old
    assert code == (1 if any(d.is_error for d in result.diagnostics) else 0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(TOKENS), max_size=60))
def test_random_token_soup(tokens):
    lint_in_process(" ".join(tokens))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SEEDS), st.data())
def test_mutated_plans(seed, data):
    text = seed
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(text)))
        op = data.draw(st.sampled_from(["delete", "insert", "duplicate"]))
        if op == "delete":
            j = data.draw(st.integers(i, min(len(text), i + 20)))
            text = text[:i] + text[j:]
        elif op == "insert":
            text = text[:i] + data.draw(st.sampled_from(TOKENS)) + text[i:]
        else:
            j = data.draw(st.integers(i, min(len(text), i + 40)))
            text = text[:j] + text[i:j] + text[j:]
    lint_in_process(text)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000))
def test_random_bytes(data):
    lint_in_process(data)


# --------------------------------------------------------------------------
# the campaign's sample: benchmarks/fuzz.py's targets, a few hundred cases each

sys.path.insert(0, str(ROOT / "benchmarks"))
import fuzz  # noqa: E402

SAMPLE = {"plans": 300, "checkpoints": 150, "hf": 150, "lsp": 300}  # the campaign's: CASES
REACHED = {  # endings each sample must reach, so that its mutations are neither all fatal nor all harmless
    "plans": ["lint 0, fmt 0", "lint 1, fmt 0", "lint 1, fmt 1"],
    "checkpoints": ["loaded the same", "refused in one line"],
    "hf": ["loaded the same", "refused in one line"],
    "lsp": ["hover: result", "hover: error", "notification", "bad frame"],
}


@pytest.mark.slow
@pytest.mark.parametrize("target", list(SAMPLE))
def test_the_fuzz_campaign_sample_finds_no_traceback_and_no_hang(target):
    """The first cases of each target of the fuzz campaign (the README's counts are its
    full run): every case ends as it should, within fuzz.LIMIT seconds, in bounded memory."""
    tally, seconds = fuzz.campaign(target, SAMPLE[target], jobs=1)
    print(fuzz.report(target, tally, seconds))
    assert tally.cases == SAMPLE[target]
    assert not tally.failures, sorted(tally.failures.items())[:5]
    assert tally.peak_rss < fuzz.MEMORY_BOUND
    for ending in REACHED[target]:
        assert any(ending in outcome for outcome in tally.outcomes), (ending, tally.outcomes)
