"""Pipeline schedules: the lists build() emits, the deadlock checker on hand-broken lists, the
simulated bubble against the published formulas, and the pictures.

Expected values come from the papers (Narayanan et al. SC21, Korthikanti et al. 2022, Qi et
al. 2023 Figure 3, Huang et al. 2019) or are derived by hand in the comments, never from the
code's own output."""

from __future__ import annotations

import copy
import pickle
import re
import subprocess
import sys

import pytest

from dslc.chunks import Placement
from dslc.cost.deadlock import check, verify
from dslc.cost.schedule import Action, Schedule, ScheduleError, build, message, send_waits, simulate
from dslc.report.draw import draw, pairs, text_grid

A = Action


def ops(text: str) -> list[Action]:
    """'F0 SEND_F0→1 RECV_B0←1 B0·1' → actions (the label format of Action.label)."""
    out = []
    for tok in text.split():
        kind, mb, chunk, peer = re.fullmatch(
            r"(SEND_F|RECV_F|SEND_B|RECV_B|F|B|W)(\d+)(?:·(\d+))?(?:[→←](\d+))?", tok).groups()
        out.append(A(kind, int(mb), int(chunk or 0), None if peer is None else int(peer)))
    return out


def computes(actions, rank: int) -> list[str]:
    return [a.label(chunks=True) for a in actions[rank] if not a.is_comm]


def lists(actions) -> list[list[Action]]:
    return [list(acts) for acts in actions]


def frozen(lists_) -> Schedule:
    """Hand-made lists on the interleaved placement of their ranks and chunks."""
    chunks = 1 + max((a.chunk for acts in lists_ for a in acts), default=0)
    return Schedule(lists_, Placement(len(lists_), chunks))


# ---------------------------------------------------------------------------- build


def test_1f1b_two_stages_three_microbatches_exact_lists():
    # rank 0: one warm-up forward (p − r − 1 = 1), then F,B pairs; each send right after its
    # producer, each receive right before its consumer; rank 1 (last) alternates F, B.
    actions = build("1f1b", 2, 3)
    assert list(actions[0]) == ops(
        "F0 SEND_F0→1 F1 SEND_F1→1 RECV_B0←1 B0 F2 SEND_F2→1 RECV_B1←1 B1 RECV_B2←1 B2")
    assert list(actions[1]) == ops(
        "RECV_F0←0 F0 B0 SEND_B0→0 RECV_F1←0 F1 B1 SEND_B1→0 RECV_F2←0 F2 B2 SEND_B2→0")


def test_gpipe_runs_all_forwards_then_all_backwards():
    actions = build("gpipe", 3, 4)
    for r in range(3):
        assert computes(actions, r) == [f"F{i}·0" for i in range(4)] + [f"B{i}·0" for i in range(4)]


def test_zb_h1_matches_figure_3_of_qi_et_al():
    # Qi et al. 2023, Figure 3 (top), p = 4, m = 8, written 0-based. Device 1 runs F1–F4, idles,
    # then B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 F8 B5 W5 … B8 W8; device 4 runs F1 B1 … F4 B4,
    # then W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 F8 B8 W5 W6 W7 W8.
    actions = build("zb_h1", 4, 8)
    first = "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7"
    last = ("F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7")
    assert [a.label() for a in actions[0] if not a.is_comm] == first.split()
    assert [a.label() for a in actions[3] if not a.is_comm] == last.split()


def test_interleaved_follows_megatron_order():
    # p = 2, v = 2, m = 4: chunk-step k runs mb (k // 4)·2 + k % 2 on chunk (k % 4) // 2
    # (reversed for B). Warm-up: rank 0 2·(2−0−1) + (2−1)·2 = 4, rank 1 0 + 2 = 2 forwards.
    actions = build("interleaved_1f1b", 2, 4, 2)
    rank0 = "F0·0 F1·0 F0·1 F1·1 F2·0 B0·1 F3·0 B1·1 F2·1 B0·0 F3·1 B1·0 B2·1 B3·1 B2·0 B3·0"
    rank1 = "F0·0 F1·0 F0·1 B0·1 F1·1 B1·1 F2·0 B0·0 F3·0 B1·0 F2·1 B2·1 F3·1 B3·1 B2·0 B3·0"
    assert computes(actions, 0) == rank0.split()
    assert computes(actions, 1) == rank1.split()


def test_interleaved_steady_state_exchanges_one_batch_per_forward_backward_pair():
    # After F(k), B(k') a rank posts {SEND_F, SEND_B, RECV_F, RECV_B} together (Megatron's
    # send_forward_backward_recv_forward_backward). Rank 1 runs F2·0 (global chunk 1) and
    # B0·0, then sends both results to rank 0 (global chunks 2 and 0) and receives the inputs
    # of its next pair, F3·0 (from global 0) and B1·0 (from global 2), all in one batch.
    acts = list(build("interleaved_1f1b", 2, 4, 2)[1])
    i = acts.index(A("B", 0, 0))
    assert acts[i - 1] == A("F", 2, 0)
    assert acts[i + 1:i + 6] == ops("SEND_F2·0→0 SEND_B0·0→0 RECV_F3·0←0 RECV_B1·0←0 F3·0")


def test_one_stage_has_no_communication():
    for actions in (build("1f1b", 1, 3), build("interleaved_1f1b", 1, 2, 3)):
        assert not any(a.is_comm for a in actions[0])
        assert verify(actions) == []


@pytest.mark.parametrize("args, words", [
    (("1f1b", 4, 3), ["microbatches=3", "pp=4"]),
    (("zb_h1", 8, 5), ["microbatches=5", "pp=8"]),
    (("interleaved_1f1b", 4, 6, 2), ["microbatches=6", "pp=4", "remainder 2"]),
    (("gpipe", 2, 4, 2), ["virtual_stages=2", "gpipe"]),
    (("pipedream", 2, 4), ["pipedream", "gpipe", "zb_h1"]),
    (("gpipe", 0, 4), ["0"]),
])
def test_build_rejects_impossible_shapes_with_the_numbers(args, words):
    with pytest.raises(ValueError) as err:
        build(*args)
    for word in words:
        assert word in str(err.value)


def test_gpipe_accepts_fewer_microbatches_than_stages():
    assert verify(build("gpipe", 4, 2)) == []


# ---------------------------------------------------------------------------- verify


def test_cross_rank_cycle_is_named_with_ranks_actions_and_microbatches():
    # rank 0 waits for B0's gradient before it sends F1; rank 1 waits for F1 before it runs B0.
    r0 = ops("F0 SEND_F0→1 RECV_B0←1 B0 F1 SEND_F1→1 RECV_B1←1 B1")
    r1 = ops("RECV_F0←0 F0 RECV_F1←0 F1 B0 SEND_B0→0 B1 SEND_B1→0")
    problems = verify(frozen([r0, r1]))
    assert len(problems) == 1
    assert problems[0].startswith("deadlock: cycle through ranks 0, 1 (micro-batches 0, 1)")
    assert "RECV_B mb 0 chunk 0 from rank 1 (#2)" in problems[0]
    assert "RECV_F mb 1 chunk 0 from rank 0 (#2)" in problems[0]
    with pytest.raises(ScheduleError) as err:
        check(frozen([r0, r1]))
    assert "deadlock" in err.value.message and "ranks 0, 1" in err.value.message
    with pytest.raises(ScheduleError, match="waits forever"):
        simulate(frozen([r0, r1]), 1.0, 2.0)


def test_swapped_receive_order_is_caught():
    acts = lists(build("1f1b", 2, 2))
    # rank 1: RECV_F0 F0 B0 SEND_B0 RECV_F1 F1 …: swap the two receives
    i, j = acts[1].index(A("RECV_F", 0, 0, 0)), acts[1].index(A("RECV_F", 1, 0, 0))
    acts[1][i], acts[1][j] = acts[1][j], acts[1][i]
    problems = verify(frozen(acts))
    assert any("rank 1 receives from rank 0 in a different order" in p for p in problems)
    cycle = [p for p in problems if p.startswith("deadlock")]
    assert cycle and "rank 1" in cycle[0] and "RECV_F mb 0 chunk 0 from rank 0" in cycle[0]
    assert "needed by F mb 0 chunk 0" in cycle[0]


def test_missing_receive_is_caught():
    acts = lists(build("1f1b", 3, 4))
    acts[2].remove(A("RECV_F", 1, 0, 1))
    problems = verify(frozen(acts))
    assert problems == [
        "rank 1 action #5 (SEND_F mb 1 chunk 0 to rank 2) has no matching RECV_F on rank 2"]


def test_duplicate_send_is_caught():
    acts = lists(build("1f1b", 3, 4))
    acts[0].insert(2, A("SEND_F", 0, 0, 1))
    problems = verify(frozen(acts))
    assert any("activation of mb 0 from global chunk 0 to 1 is sent 2 times" in p for p in problems)


def test_backward_before_its_forward_is_caught():
    acts = frozen([ops("B0 F0 F1 B1")])
    problems = verify(acts)
    assert "rank 0 runs B mb 0 chunk 0 (#0) before its F (#1)" in problems
    assert any(p.startswith("deadlock: cycle through rank 0 (micro-batch 0)") for p in problems)


def test_weight_gradient_before_its_backward_is_caught():
    acts = frozen([ops("F0 W0 B0 F1 B1 W1")])
    assert "rank 0 runs W mb 0 chunk 0 (#1) before its B (#2)" in verify(acts)


def test_wrong_peer_is_caught():
    acts = lists(build("1f1b", 3, 4))
    i = acts[1].index(A("SEND_F", 0, 0, 2))
    acts[1][i] = A("SEND_F", 0, 0, 0)
    problems = verify(frozen(acts))
    assert f"rank 1 action #{i} (SEND_F mb 0 chunk 0 to rank 0): wrong peer: global chunk 2 " \
           "lives on rank 2, not rank 0" in problems


def test_mismatched_kind_is_caught():
    # rank 1 posts a gradient receive where rank 0 sends an activation: same shape, wrong tensor
    acts = lists(build("1f1b", 2, 2))
    i = acts[1].index(A("RECV_F", 1, 0, 0))
    acts[1][i] = A("RECV_B", 1, 0, 0)
    problems = verify(frozen(acts))
    assert any("nothing to send or receive" in p for p in problems)
    assert any("has no matching RECV_F on rank 1; kind mismatch: rank 1 has RECV_B mb 1" in p
               for p in problems)


def test_missing_computation_and_missing_message_pair_are_caught():
    acts = lists(build("1f1b", 2, 3))
    acts[1].remove(A("B", 2, 0))
    assert "rank 1 never runs B for micro-batch 2 of chunk 0" in verify(frozen(acts))
    acts = lists(build("1f1b", 2, 3))
    acts[0].remove(A("SEND_F", 1, 0, 1))
    acts[1].remove(A("RECV_F", 1, 0, 0))
    assert any(p.startswith("micro-batch 1 never crosses from rank 0 to rank 1")
               for p in verify(frozen(acts)))


def test_unknown_kind_and_compute_with_peer_are_caught():
    problems = verify(frozen([[A("F", 0, 0), A("X", 0, 0), A("B", 0, 0, 3)]]))
    assert any("unknown kind 'X'" in p for p in problems)
    assert any("a B computation has no peer (got 3)" in p for p in problems)


def test_a_chunk_the_placement_does_not_give_the_rank_is_caught():
    """The placement says how many chunks a rank holds: an action on another is named, not
    read off the largest chunk in the lists (a V of pp2 holds two chunks a rank)."""
    built = build("zb_v", 2, 4, 2)
    acts = lists(built)
    acts[0].insert(0, A("F", 0, 2))
    problems = verify(Schedule(acts, built.placement), split_backward=True)
    assert any("rank 0 holds 2 chunks, not a chunk 2" in p for p in problems), problems


def _send_right_after_compute(actions):
    """Re-place comm naively: each receive right before its consumer, each send right after
    its producer, even inside the interleaved steady state."""
    out = []
    for r, acts in enumerate(actions):
        sends = {(a.microbatch, a.chunk, a.kind[-1]): a for a in acts if a.kind.startswith("SEND")}
        recvs = {(a.microbatch, a.chunk, a.kind[-1]): a for a in acts if a.kind.startswith("RECV")}
        row = []
        for a in (a for a in acts if not a.is_comm):
            key = (a.microbatch, a.chunk, a.kind)
            row += ([recvs[key]] if key in recvs else []) + [a]
            row += [sends[key]] if key in sends else []
        out.append(row)
    return frozen(out)


def test_rendezvous_deadlock_that_eager_sends_would_hide():
    # Interleaved p = 2, v = 2, m = 4 with each send right after its producer: a rank's batch
    # {SEND_B} completes only once the peer's batch with the matching receive starts, which on
    # the peer's stream waits for the peer's own {SEND_B}, waiting for this rank's next batch;
    # with buffered (eager) sends it would run.
    naive = _send_right_after_compute(build("interleaved_1f1b", 2, 4, 2))
    problems = verify(naive)
    assert len(problems) == 1 and problems[0].startswith("deadlock: cycle through ranks 0, 1")
    assert "batch at #" in problems[0]
    simulate(naive, 1.0, 2.0)  # eager semantics: completes


# ---------------------------------------------------------------------------- simulate


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("t_f, t_b", [(1.0, 2.0), (1.0, 1.0), (1.0, 3.0)])
def test_bubble_is_p_minus_1_over_m(schedule, t_f, t_b):
    # Narayanan et al. SC21 §2.2.1: bubble time / ideal time = (p − 1) / m
    for p in (1, 2, 3, 4, 6):
        for m in (p, p + 1, 2 * p, 4 * p + 3):
            sim = simulate(build(schedule, p, m), t_f, t_b)
            assert sim.bubble_fraction == pytest.approx((p - 1) / m, abs=1e-12), (p, m)


def test_interleaved_bubble_is_p_minus_1_over_v_m():
    # Narayanan et al. SC21 §2.2.2: (p − 1) / (v · m), with per-chunk costs t_f, t_b
    for p in (2, 3, 4):
        for v in (2, 3, 4):
            for m in (p, 2 * p, 3 * p):
                sim = simulate(build("interleaved_1f1b", p, m, v), 1.0, 2.0)
                assert sim.bubble_fraction == pytest.approx((p - 1) / (v * m), abs=1e-12)


@pytest.mark.parametrize("t_f, t_b, t_w", [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (1.0, 1.0, 0.5)])
def test_zb_h1_bubble_matches_qi_et_al(t_f, t_b, t_w):
    # Qi et al. 2023 §2.1: bubble (p − 1)(T_F + T_B − T_W) against m (T_F + T_B + T_W) of work
    for p in (2, 3, 4, 5):
        for m in (p, 2 * p, 3 * p + 1):
            sim = simulate(build("zb_h1", p, m), t_f, t_b, t_w)
            want = (p - 1) * (t_f + t_b - t_w) / (m * (t_f + t_b + t_w))
            assert sim.bubble_fraction == pytest.approx(want, abs=1e-12), (p, m)


def test_zb_h1_has_a_third_of_the_1f1b_bubble_at_equal_costs():
    # Qi et al.: with T_F = T_B = T_W, ZB-H1's bubble is 1/3 of 1F1B's (B+W = full backward)
    zb = simulate(build("zb_h1", 4, 8), 1.0, 1.0, 1.0)
    one = simulate(build("1f1b", 4, 8), 1.0, 2.0)
    assert zb.bubble_fraction == pytest.approx(one.bubble_fraction / 3)


def test_makespan_and_idle_fraction_by_hand():
    # 1F1B: (m + p − 1) slots of (t_f + t_b) = (8 + 3)·3 = 33; idle (p−1)/(m+p−1) (Huang et al.)
    sim = simulate(build("1f1b", 4, 8), 1.0, 2.0)
    assert sim.makespan == 33.0
    assert sim.idle_fraction == pytest.approx(3 / 11)
    # One micro-batch through 3 stages with p2p: p·(t_f + t_b) + 2(p − 1)·t_comm = 9 + 2 = 11
    assert simulate(build("gpipe", 3, 1), 1.0, 2.0, 0.0, 0.5).makespan == pytest.approx(11.0)


def test_messages_overlap_computes_as_the_runtime_waits_for_them():
    """1F1B, p = 2, m = 2, t_f = 1, t_b = 2, t_comm = 0.5. Rank 0: F0 0–1, posts SEND_F0
    (arrives 1.5) and runs F1 1–2 without waiting, posts SEND_F1. Rank 1: F0 1.5–2.5, B0
    2.5–4.5, then the batch {SEND_B0, RECV_F1}: F1 waits for the whole batch (one request
    on NCCL), SEND_B0 done at 5; F1 5–6, B1 6–8, SEND_B1 arrives 8.5. Rank 0: B0 5–7 and
    B1 8.5–10.5. A send that held its rank for t_comm would end at 11."""
    sim = simulate(build("1f1b", 2, 2), 1.0, 2.0, 0.0, 0.5)
    assert sim.makespan == pytest.approx(10.5)
    ends = {(r, a.kind, a.microbatch): end for r, a, _, end in sim.timeline}
    assert ends[0, "F", 1] == 2.0 and ends[1, "F", 1] == 6.0 and ends[0, "B", 0] == 7.0


def test_peak_inflight_matches_the_published_counts():
    for p in (1, 2, 3, 4):
        m = 3 * p
        # Korthikanti et al. §4.2.3: 1F1B's first stage holds p micro-batches, stage r p − r
        assert simulate(build("1f1b", p, m), 1.0, 2.0).peak_inflight == tuple(range(p, 0, -1))
        # GPipe keeps every micro-batch until the backward phase
        assert simulate(build("gpipe", p, m), 1.0, 2.0).peak_inflight == (m,) * p
        # ZB-H1: the same peak as 1F1B's first stage (Qi et al. §2.1), on every rank: W still
        # needs the activations, and rank r runs p − r warm-up plus r steady forwards before
        # its first W (the r postponed ones)
        assert simulate(build("zb_h1", p, m), 1.0, 1.0, 1.0).peak_inflight == (p,) * p
        for v in (2, 3):
            # Korthikanti et al.: interleaving multiplies rank 0's p micro-batches by
            # 1 + (p − 1)/(p·v); counted in chunk activations (1/v of a micro-batch each)
            peak = simulate(build("interleaved_1f1b", p, m, v), 1.0, 2.0).peak_inflight[0]
            assert peak / v == pytest.approx(p * (1 + (p - 1) / (p * v)))


def test_timeline_is_consistent():
    actions = build("interleaved_1f1b", 3, 6, 2)
    sim = simulate(actions, 1.0, 2.0, 0.0, 0.25)
    assert [a for _, a, _, _ in sim.timeline] == [a for acts in actions for a in acts]
    at = actions.placement
    arrives = {message(a, r, at): s + 0.25 for r, a, s, e in sim.timeline if a.kind.startswith("SEND")}
    for r in range(3):
        # a rank runs its list back to back, posting its messages without waiting; a compute
        # waits for the message it reads and the sends of that receive's batch (the receive's
        # row ends then), a B for the gradients sent since the last B and its own activation's send
        rows = [row for row in sim.timeline if row[0] == r]
        clock, since_b, activation, inbound = 0.0, [], {}, {}
        for k, (_, a, s, e) in enumerate(rows):
            if a.kind.startswith("SEND"):
                assert s == clock and e == s  # posted: the rank goes on
                if a.kind == "SEND_B":
                    since_b.append(s + 0.25)
                else:
                    activation[(a.microbatch, a.chunk)] = s + 0.25
            elif a.kind.startswith("RECV"):
                assert s == clock
                inbound[(a.kind[-1], a.microbatch, a.chunk)] = k
            else:
                ready = [clock]
                if (k_recv := inbound.pop((a.kind, a.microbatch, a.chunk), None)) is not None:
                    _, recv, post, got = rows[k_recv]
                    # its batch: the sends between the computes around the receive
                    before = max((i for i in range(k_recv) if not rows[i][1].is_comm), default=-1)
                    after = min(i for i in range(k_recv, len(rows)) if not rows[i][1].is_comm)
                    sends = [rows[i][2] + 0.25 for i in range(before + 1, after) if rows[i][1].kind.startswith("SEND")]
                    assert got == max([post, arrives[message(recv, r, at)], *sends])
                    ready.append(got)
                if a.kind == "B":
                    ready += since_b + [activation.pop((a.microbatch, a.chunk), 0.0)]
                assert s == max(ready), (r, a)
                since_b = [] if a.kind == "B" else since_b
                clock = e


# ---------------------------------------------------------------------------- pictures


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<svg")])
def test_draw_writes_the_file(tmp_path, suffix, magic):
    actions = build("zb_h1", 3, 4)
    path = draw(actions, simulate(actions, 1.0, 1.0, 1.0, 0.1), tmp_path / f"s{suffix}",
                schedule="zb_h1")
    data = path.read_bytes()
    assert len(data) > 1000
    assert data.startswith(magic) if suffix == ".png" else magic in data[:2000]
    if suffix == ".svg":
        assert b"zb_h1" in data and b"pp=3, m=4, v=1" in data


def test_draw_rejects_other_formats(tmp_path):
    actions = build("gpipe", 2, 2)
    with pytest.raises(ValueError, match=r"\.png or \.svg"):
        draw(actions, simulate(actions, 1.0, 2.0), tmp_path / "s.jpg")


def test_text_grid_by_hand():
    # 1F1B, p = 2, m = 2, t_f = 1, t_b = 2. Rank 1: F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7];
    # rank 0: F0 [0,1] F1 [1,2] B0 [4,6] (after rank 1's B0) B1 [7,9] (after rank 1's B1).
    actions = build("1f1b", 2, 2)
    lines = text_grid(actions, simulate(actions, 1.0, 2.0), time_unit="ms").splitlines()
    assert lines == [
        "2 ranks, m=2, v=1; bubble 50.0% of ideal, makespan 9 ms",
        "one column = 1 ms",
        "F3 forward of micro-batch 3, B3 backward, ~ continues, . idle",
        "        t = 0 ms",
        "rank 0  F0 F1 .  .  B0 ~  .  B1 ~",
        "rank 1  .  F0 B0 ~  F1 B1 ~  .  .",
    ]


def test_text_grid_fits_80_columns_in_bands_with_micro_batch_ids():
    """Interleaved 1F1B on 4 ranks: every line within 80 columns, each band a ruler and one
    row per rank, every forward of every micro-batch and chunk labelled once per rank."""
    actions = build("interleaved_1f1b", 4, 8, 2)
    text = text_grid(actions, simulate(actions, 1.0, 2.0))
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines) and len(lines) <= 60
    bands = lines[3:]
    assert len(bands) % 5 == 0 and len(bands) > 5
    for i in range(0, len(bands), 5):
        assert bands[i].strip().startswith("t = ")
        assert [row.split()[:2] for row in bands[i + 1:i + 5]] == [["rank", str(r)] for r in range(4)]
    for r in range(4):
        cells = " ".join(b.split(maxsplit=2)[2] if len(b.split()) > 2 else "" for b in bands[r + 1::5]).split()
        assert sorted(c for c in cells if c.startswith("F")) == sorted(f"F{mb}·{c}" for mb in range(8) for c in range(2))


def test_text_grid_of_a_long_schedule_is_one_character_a_slot():
    actions = build("interleaved_1f1b", 8, 16, 4)
    lines = text_grid(actions, simulate(actions, 1.0, 2.0)).splitlines()
    assert all(len(line) <= 80 for line in lines) and len(lines) <= 63
    rows = [line for line in lines[3:] if line.startswith("rank")]
    assert [row.split()[:2] for row in rows[:8]] == [["rank", str(r)] for r in range(8)]
    assert set("".join(row[8:] for row in rows)) <= set("FBW.")
    assert lines[2] == "F forward, B backward, . idle"


def test_placement_says_where_each_chunk_lives_and_whom_it_talks_to():
    # Narayanan et al. SC21 §2.2.2: chunk g on rank g % p; Qi et al. 2024: rank r holds r and 2p−1−r
    inter, vee = Placement(3, 2), Placement(3, 2, v_shape=True)
    assert [inter.ids(r) for r in range(3)] == [(0, 3), (1, 4), (2, 5)]
    assert [vee.ids(r) for r in range(3)] == [(0, 5), (1, 4), (2, 3)]
    assert [(vee.rank(g), vee.local(g)) for g in range(6)] == [(0, 0), (1, 0), (2, 0), (2, 1), (1, 1), (0, 1)]
    # rank 2's chunk 0 (global 2) feeds global 3: rank 0 interleaved, itself in the V (the turn)
    assert (inter.peer(2, 0, 1), inter.turn(2, 0, 1)) == (0, None)
    assert (vee.peer(2, 0, 1), vee.turn(2, 0, 1), vee.turn(2, 1, -1)) == (None, 1, 0)
    assert vee.peer(0, 1, 1) is None and vee.peer(0, 1, -1) == 1  # the loss's chunk ends the model


@pytest.mark.parametrize("schedule", ["zb_v", "dualpipe_v"])
def test_a_copied_schedule_keeps_its_placement(schedule):
    """A schedule is one value, its lists and where their chunks live: a copy through the same
    type keeps the V and verifies, while a bare tuple of the lists, which has lost the V, is
    refused rather than taken for the interleaved placement (whose peers it would fail)."""
    built = build(schedule, 2, 4, 2)
    copied = Schedule([list(acts) for acts in built], built.placement)
    assert copied == built and copied.placement == Placement(2, 2, v_shape=True)
    assert copy.deepcopy(built).placement.v_shape and pickle.loads(pickle.dumps(built)) == built
    assert verify(copied, split_backward=True) == []
    for bare in (tuple(built), tuple(map(tuple, built))):
        for use in (verify, lambda s: simulate(s, 1.0, 1.0, 1.0), lambda s: text_grid(s, simulate(built, 1.0, 1.0))):
            with pytest.raises(TypeError, match="placement"):
                use(bare)


def test_importing_draw_does_not_import_matplotlib():
    code = "import sys, dslc.report.draw, dslc.cost.schedule; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("schedule", ["zb_v", "dualpipe_v"])
def test_v_schedule_picture_and_turn_without_message(schedule):
    """The V: rank 1 of 2 holds chunks 1 and 2, so its F0·0 feeds its F0·1 with no message
    between them, and rank 0 holds the embedding's chunk 0 and the loss's chunk 3; the
    picture names every F, B and W with its local chunk (``dslc schedule`` draws this)."""
    actions = build(schedule, 2, 4, 2)
    assert actions.placement.v_shape and check(actions, split_backward=True) is None
    # the turn stays on rank 1: its chunk 0's output and chunk 1's input gradient are never
    # sent, its chunk 1's input and chunk 0's output gradient never received
    turn = {("SEND_F", 0), ("RECV_F", 1), ("SEND_B", 1), ("RECV_B", 0)}
    assert not [a for a in actions[1] if (a.kind, a.chunk) in turn]
    assert [a.kind for a in actions[1]].count("RECV_F") == 4  # chunk 0's input, from rank 0
    # every message goes to the other rank; rank 0 sends chunk 0's output and receives chunk
    # 1's (the loss's input), and the reverse for the gradients
    assert all(a.peer == 1 - r for r, acts in enumerate(actions) for a in acts if a.is_comm)
    assert {(a.kind, a.chunk) for a in actions[0] if a.is_comm} == {("SEND_F", 0), ("RECV_F", 1), ("SEND_B", 1), ("RECV_B", 0)}
    assert message(actions[0][[a.kind for a in actions[0]].index("SEND_F")], 0, actions.placement) == ("F", 0, 0)
    text = text_grid(actions, simulate(actions, 1.0, 1.0, 1.0), time_unit="ms")
    assert "v=2" in text and "W3 weight gradient" in text
    for label in ("F0·0", "F0·1", "B0·1", "W0·0"):
        assert label in text


@pytest.mark.parametrize("p, m", [(2, 4), (2, 8), (3, 6), (4, 8), (4, 13)])
def test_dualpipe_v_pairs_overlap_their_messages(p, m):
    """DeepSeek's DualPipe: an F&B pair runs the forward of one micro-batch and the backward of
    another with one half's messages in flight while the other half computes. In the lists:
    each pair's B (marked ``overlaps``) follows its F with only messages between them; the F's
    activation, when another rank takes it, is sent before the B, and the B's input gradient
    before its W; the runtime waits for neither before the next compute (an activation's send
    at its own B, a gradient's at the next B), and the proof holds with those waits."""
    built = build("dualpipe_v", p, m, 2)
    assert verify(built, split_backward=True) == []
    at = built.placement
    overlapped = 0
    for r, acts in enumerate(built):
        waits = send_waits(acts)
        computes = [i for i, a in enumerate(acts) if not a.is_comm]
        for i, j in zip(computes, computes[1:]):
            f, b = acts[i], acts[j]
            if not b.overlaps:
                continue
            overlapped += 1
            assert f.kind == "F" and b.kind == "B" and (f.microbatch, f.chunk) != (b.microbatch, b.chunk)
            if at.peer(r, f.chunk, 1) is not None:  # the activation leaves before the B runs
                send = acts.index(A("SEND_F", f.microbatch, f.chunk, at.peer(r, f.chunk, 1)))
                assert i < send < j and waits[send] != j
            if at.peer(r, b.chunk, -1) is not None:  # the gradient leaves before the W runs
                send = acts.index(A("SEND_B", b.microbatch, b.chunk, at.peer(r, b.chunk, -1)))
                assert acts.index(A("W", b.microbatch, b.chunk)) > send > j
    assert overlapped >= p * (m - 2 * p)  # the steady state is pairs


def test_send_waits_follow_the_runtime():
    """Contract 4: an activation's send is waited for at its own B, an input gradient's at
    the next B, what is left at the end of the step."""
    acts = [A("F", 0, 0), A("SEND_F", 0, 0, 1), A("F", 1, 0), A("SEND_F", 1, 0, 1), A("RECV_B", 0, 0, 1),
            A("B", 0, 0), A("SEND_B", 0, 0, 1), A("RECV_B", 1, 0, 1), A("B", 1, 0), A("SEND_B", 1, 0, 1)]
    assert send_waits(acts) == {1: 5, 3: 8, 6: 8, 9: None}


def test_a_pair_split_apart_is_caught():
    built = build("dualpipe_v", 2, 8, 2)
    acts = lists(built)
    i = next(i for i, a in enumerate(acts[0]) if a.overlaps)
    acts[0].insert(i, acts[0].pop(next(j for j in range(i + 1, len(acts[0])) if acts[0][j].kind == "W")))
    problems = verify(Schedule(acts, built.placement), split_backward=True)
    assert any("an overlapped pair is an F and a B with only messages between them" in p for p in problems)


def test_dualpipe_v_picture_shows_the_overlapped_pairs(tmp_path):
    """`dslc schedule`: the text grid labels a pair's B ``&B`` and says so in its legend;
    the picture outlines each pair and names it in its legend."""
    built = build("dualpipe_v", 2, 8, 2)
    sim = simulate(built, 1.0, 1.0, 1.0, 0.25)
    text = text_grid(built, sim, time_unit="ms")
    n = sum(a.overlaps for acts in built for a in acts)
    cells = [c for line in text.splitlines() if line.startswith("rank") for c in line.split()[2:]]
    assert sum(c.startswith("&B") for c in cells) == n > 0
    assert "&B3 backward overlapped with the forward before it (an F&B pair)" in text
    assert len(pairs(sim)) == n
    for r, start, end in pairs(sim):  # a pair spans its F and its B, back to back on the rank
        f, b = [(a, s, e) for q, a, s, e in sim.timeline if q == r and not a.is_comm and start <= s < end]
        assert f[0].kind == "F" and b[0].overlaps and f[2] == b[1] and b[2] == end
    svg = draw(built, sim, tmp_path / "s.svg", schedule="dualpipe_v").read_text()
    assert "overlapped F&amp;B pair" in svg
    zb_v = build("zb_v", 2, 8, 2)  # no pairs: nothing outlined or marked
    zb_sim = simulate(zb_v, 1.0, 1.0, 1.0)
    assert "overlapped" not in draw(zb_v, zb_sim, tmp_path / "z.svg").read_text()
    assert "&" not in text_grid(zb_v, zb_sim) and pairs(zb_sim) == []


def test_dualpipe_v_receiving_just_before_the_consumer_deadlocks_on_an_ordered_stream():
    """The pairs' sends are posted early; their receives must be too. With each receive moved
    to just before the compute that reads it (as a runtime that receives on demand would post
    them), rank 1's gradient send waits on rank 0's stream behind a send that waits for rank
    1's receive, queued behind that first send: a cycle on NCCL, whose batches complete in
    order on a rank, though gloo's messages, progressing on their own, would run it."""
    built = build("dualpipe_v", 2, 8, 2)

    def on_demand(acts):
        receives = [a for a in acts if a.kind.startswith("RECV")]
        out = []
        for a in (a for a in acts if not a.kind.startswith("RECV")):
            if not a.is_comm:
                out += [x for x in receives if (x.kind[-1], x.microbatch, x.chunk) == (a.kind, a.microbatch, a.chunk)]
            out.append(a)
        return out

    late = Schedule([list(built[0]), on_demand(built[1])], built.placement)
    problems = verify(late, split_backward=True)
    assert len(problems) == 1 and problems[0].startswith("deadlock: cycle through ranks 0, 1"), problems
    assert "SEND_B" in problems[0]
    simulate(late, 1.0, 1.0, 1.0, 0.25)  # eager sends: completes
