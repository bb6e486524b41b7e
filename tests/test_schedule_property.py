"""Properties of every built-in schedule for p ≤ 16, m ≤ 64, v ≤ 4: it verifies (no deadlock
under rendezvous p2p, messages paired and ordered), runs every computation once, simulates to
the published bubble, and any single dropped action is caught. Hypothesis samples the whole
range; small grids are checked exhaustively."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dslc.chunks import V_SHAPED
from dslc.cost.deadlock import verify
from dslc.cost.schedule import SCHEDULES, SPLIT_BACKWARD, Schedule, build, simulate

SAMPLES = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def valid(schedule: str, p: int, m: int, v: int) -> bool:
    """The published constraints: 1f1b, zb_h1 and zb_v need m ≥ p, dualpipe_v m ≥ 2p (torch's
    ScheduleDualPipeV), interleaved needs p | m, only interleaved takes v > 1, the V schedules
    exactly v = 2."""
    if schedule in V_SHAPED:
        return v == 2 and m >= (2 * p if schedule == "dualpipe_v" else p)
    if v > 1 and schedule != "interleaved_1f1b":
        return False
    if schedule in ("1f1b", "zb_h1"):
        return m >= p
    return m % p == 0 if schedule == "interleaved_1f1b" else True


def published_bubble(schedule: str, p: int, m: int, v: int) -> float:
    """Narayanan et al. SC21: (p−1)/m, interleaved (p−1)/(v·m); Qi et al. ZB-H1 with
    T_F = T_B = T_W: (p−1)(T_F+T_B−T_W) / (m(T_F+T_B+T_W)) = (p−1)/(3m)."""
    if schedule == "zb_h1":
        return (p - 1) / (3 * m)
    return (p - 1) / (v * m) if schedule == "interleaved_1f1b" else (p - 1) / m


def costs(schedule: str) -> tuple[float, float, float]:
    return (1.0, 1.0, 1.0) if schedule in SPLIT_BACKWARD else (1.0, 2.0, 0.0)


def check_schedule(schedule: str, p: int, m: int, v: int) -> None:
    actions = build(schedule, p, m, v)
    assert len(actions) == p
    assert verify(actions) == [], (schedule, p, m, v)
    for acts in actions:
        kinds = [a.kind for a in acts]
        assert kinds.count("F") == kinds.count("B") == m * v
        assert kinds.count("W") == (m * v if schedule in SPLIT_BACKWARD else 0)
    sim = simulate(actions, *costs(schedule))
    if schedule in V_SHAPED:  # at T_F = T_B = T_W: never more than ZB-H1's (p−1)/(3m) (Qi et al. 2024)
        assert sim.bubble_fraction <= published_bubble("zb_h1", p, m, 1) + 1e-9, (schedule, p, m)
        # ZB-V: 2p chunks, p micro-batches' worth as 1F1B's first stage; DualPipeV one more
        assert max(sim.peak_inflight) == 2 * p + (schedule == "dualpipe_v")
        return
    assert sim.bubble_fraction == pytest.approx(published_bubble(schedule, p, m, v), abs=1e-9)
    if schedule in ("1f1b", "zb_h1"):
        assert max(sim.peak_inflight) == p  # Korthikanti et al.: the first stage holds p


@st.composite
def shapes(draw, schedule: str, min_p: int = 1, max_p: int = 16, max_m: int = 64):
    p = draw(st.integers(min_p, max_p))
    if schedule == "interleaved_1f1b":
        v = draw(st.integers(1, 4))
        m = p * draw(st.integers(1, max_m // p))
    elif schedule in V_SHAPED:
        v = 2
        m = draw(st.integers(2 * p if schedule == "dualpipe_v" else p, max(max_m, 2 * p)))
    else:
        v = 1
        m = draw(st.integers(p if schedule in ("1f1b", "zb_h1") else 1, max_m))
    return p, m, v


@pytest.mark.parametrize("schedule", SCHEDULES)
@SAMPLES
@given(data=st.data())
def test_every_schedule_verifies_and_meets_the_published_bubble(schedule, data):
    p, m, v = data.draw(shapes(schedule))
    check_schedule(schedule, p, m, v)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_small_grid_exhaustively(schedule):
    for p in range(1, 5):
        for m in range(1, 9):
            for v in range(1, 5):
                if valid(schedule, p, m, v):
                    check_schedule(schedule, p, m, v)
                else:
                    with pytest.raises(ValueError):
                        build(schedule, p, m, v)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_largest_shape(schedule):
    v = 4 if schedule == "interleaved_1f1b" else 2 if schedule in V_SHAPED else 1
    check_schedule(schedule, 16, 64, v)


@SAMPLES
@given(schedule=st.sampled_from(SCHEDULES), p=st.integers(1, 16), m=st.integers(1, 64),
       v=st.integers(1, 4))
def test_impossible_shapes_raise_with_the_numbers(schedule, p, m, v):
    if valid(schedule, p, m, v):
        build(schedule, p, m, v)
        return
    with pytest.raises(ValueError) as err:
        build(schedule, p, m, v)
    message = str(err.value)
    if schedule in V_SHAPED and v != 2:
        assert f"virtual_stages must be 2, got {v}" in message
        return
    assert (f"virtual_stages={v}" in message if v > 1 and schedule not in ("interleaved_1f1b", *V_SHAPED)
            else f"microbatches={m}" in message and (f"pp={p}" in message or f"< {2 * p}" in message))


@SAMPLES
@given(data=st.data(), schedule=st.sampled_from(SCHEDULES))
def test_dropping_any_one_action_is_caught(data, schedule):
    p, m, v = data.draw(shapes(schedule, max_p=4, max_m=8))
    built = build(schedule, p, m, v)
    actions = [list(acts) for acts in built]
    rank = data.draw(st.integers(0, p - 1))
    index = data.draw(st.integers(0, len(actions[rank]) - 1))
    dropped = actions[rank].pop(index)
    problems = verify(Schedule(actions, built.placement), split_backward=schedule in SPLIT_BACKWARD)
    assert problems, (schedule, p, m, v, rank, dropped)


def test_dropping_the_only_weight_gradient_is_caught():
    """zb_h1 on one stage with one micro-batch has a single W: without being told the
    backward is split, nothing in the list says a W is owed (found by hypothesis in CI)."""
    built = build("zb_h1", 1, 1, 1)
    (actions,) = built
    without_w = Schedule([[a for a in actions if a.kind != "W"]], built.placement)
    assert verify(without_w, split_backward=True) == ["rank 0 never runs W for micro-batch 0 of chunk 0"]
    assert verify(without_w, split_backward=False) == []


@SAMPLES
@given(data=st.data(), schedule=st.sampled_from(SCHEDULES))
def test_moving_a_receive_after_its_consumer_is_caught(data, schedule):
    p, m, v = data.draw(shapes(schedule, min_p=2, max_p=4, max_m=8))
    built = build(schedule, p, m, v)
    actions = [list(acts) for acts in built]
    rank = data.draw(st.integers(0, p - 1))
    receives = [i for i, a in enumerate(actions[rank]) if a.kind.startswith("RECV")]
    i = data.draw(st.sampled_from(receives))
    recv = actions[rank].pop(i)
    consumer = next(j for j, a in enumerate(actions[rank]) if j >= i and a.kind == recv.kind[-1]
                    and (a.microbatch, a.chunk) == (recv.microbatch, recv.chunk))
    actions[rank].insert(consumer + 1, recv)
    problems = verify(Schedule(actions, built.placement))
    assert any(p.startswith("deadlock") for p in problems), problems
