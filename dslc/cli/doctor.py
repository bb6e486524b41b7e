"""``dslc doctor RUN_DIR [PLAN]``: what a stopped job's ranks were doing, read from the
files its watchdog wrote into ``--run-dir`` (the generated watchdog.py): run.json (the
plan and its mesh, at start-up), state.rank<R>.json (each rank that saw the hang, or
raised) and progress.rank<R>.json (each rank's last heartbeat, rewritten at most once a
second). It names the rank that raised, or those that wrote no state (stopped, or their
host gone) with what they last completed, then each waiting rank's collective and group,
and the plan line of that group's axes (the plan: PLAN, or the file run.json names)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from ..diagnostics import printable
from .inputs import UsageError, load


def run(args) -> int:
    report = diagnose(Path(args.run_dir), args.plan_file)
    if args.json:
        print(json.dumps(report, indent=1, allow_nan=False))
    else:
        print("\n".join(printable(line) for line in render(report).splitlines()))  # names may hold ESC, CR
    return 0


def _read(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"{path}: cannot read it: {getattr(e, 'strerror', None) or e}") from None


def _ranked(run_dir: Path, kind: str, world: int) -> dict[int, dict]:
    out = {}
    for rank in range(world):
        path = run_dir / f"{kind}.rank{rank}.json"
        if path.is_file():
            out[rank] = value = _read(path)
            if not isinstance(value, dict) or not isinstance(value.get("time", 0), (int, float)):
                raise UsageError(f"{path}: not a state file of the watchdog")
            for key, typ in (("coords", dict), ("groups", dict), ("doing", dict), ("done", dict), ("stack", list)):
                if not isinstance(value.get(key), typ):
                    value[key] = None
    return out


def coords(mesh, rank: int) -> dict[str, int]:
    """The rank's coordinate on each axis: the last axis has stride 1, as the script lays them."""
    sizes = [n for _, n in mesh]
    return {a: rank // math.prod(sizes[i + 1:]) % n for i, (a, n) in enumerate(mesh)}


def diagnose(run_dir: Path, plan_file: str | None) -> dict:
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such folder (the script's --run-dir, default runs/<plan>)")
    if not (run_dir / "run.json").is_file():
        raise UsageError(f"{run_dir}: no run.json: not a --run-dir of a generated script, or its rank 0 never started")
    run = _read(run_dir / "run.json")
    try:
        world, mesh = int(run["world_size"]), [(str(a), int(n)) for a, n in run["mesh"]]
    except (KeyError, TypeError, ValueError):
        raise UsageError(f"{run_dir / 'run.json'}: not a run file of a generated script") from None
    states, progress = _ranked(run_dir, "state", world), _ranked(run_dir, "progress", world)
    if not states:
        raise UsageError(f"{run_dir}: no state.rank<R>.json: the watchdog never fired (the run ended, or is still going)")
    silent = [r for r in range(world) if r not in states]
    raised = [r for r, s in sorted(states.items()) if s.get("why") == "exception" and s.get("exception")]
    first = min(s.get("time", 0) for s in states.values())
    ranks = []
    for r in range(world):
        s = states.get(r) or progress.get(r) or {}
        entry = {"rank": r, "host": s.get("host"), "coords": s.get("coords") or coords(mesh, r), "wrote_state": r in states,
                 "why": s.get("why") if r in states else "no state", "message": s.get("message"),
                 "step": s.get("step"), "doing": s.get("doing"), "done": s.get("done"), "calling": s.get("calling"),
                 "groups": s.get("groups") or {}, "time": s.get("time"), "stack": s.get("stack") or []}
        if r not in states and r in progress:
            entry["heartbeat_before"] = round(first - progress[r].get("time", first), 1)
        if r in raised:
            entry["exception"] = (states[r]["exception"] or [""])[-1].strip()
        ranks.append(entry)
    axes = sorted({a for e in ranks if e["wrote_state"] for a in _axes(e["calling"])})
    lines = _plan_lines(plan_file or run.get("plan_file"), plan_file is not None, run.get("plan"), [a for a in axes if a in dict(mesh)])
    return {"run_dir": str(run_dir), "plan": run.get("plan"), "mesh": mesh, "world_size": world, "raised": raised,
            "silent": silent, "ranks": ranks, "axes": lines}


def _axes(calling: str | None) -> list[str]:
    """The mesh axes of the group a collective runs over: "all_reduce over dp+cp" -> dp, cp."""
    if not calling or " over " not in calling:
        return []
    return calling.rsplit(" over ", 1)[1].split("+")


def _plan_lines(path: str | None, given: bool, name: str | None, axes: list[str]) -> dict[str, str]:
    """axis -> "file:line: text" of the plan line that sets it, where the plan is found."""
    if not path or not (given or os.path.exists(path)):  # run.json's: relative to where dslc compile ran
        return {a: "" for a in axes}
    result = load([path])  # a file that cannot be read: one line (UsageError)
    plans = [p for p in result.program.plans if p.name == name] if result.program else []
    if not plans:
        return {a: "" for a in axes}
    out = {}
    for a in axes:
        axis = plans[0].mesh.axis(a)
        if axis is None:
            out[a] = ""
            continue
        out[a] = f"{axis.span.file}:{axis.span.line}: {(result.sources.line(axis.span.file, axis.span.line) or '').strip()}"
    return out


def _action(a: dict | None) -> str:
    if not a:
        return "nothing yet"
    if a.get("action") is None:
        return f"step {a.get('step')} (the whole step)"
    return f"step {a.get('step')}, {a['action']} of micro-batch {a.get('microbatch')}, chunk {a.get('chunk')}"


def _where(e: dict) -> str:
    return ", ".join(f"{a}={c}" for a, c in e["coords"].items()) + (f" on {e['host']}" if e["host"] else "")


def render(report: dict) -> str:
    mesh = " x ".join(f"{a}{n}" for a, n in report["mesh"])
    out = [f"run {report['run_dir']}: plan {report['plan']}, {report['world_size']} ranks ({mesh})"]
    by_rank = {e["rank"]: e for e in report["ranks"]}
    for r in report["raised"]:
        e = by_rank[r]
        out.append(f"rank {r} ({_where(e)}) raised: {e['exception']}")
        out.append(f"  while doing {_action(e['doing'])}; last completed {_action(e['done'])}")
    for r in report["silent"]:
        e = by_rank[r]
        out.append(f"rank {r} ({_where(e)}) did not arrive: it wrote no state (stopped, killed, or its host gone)")
        if "heartbeat_before" in e:
            out.append(f"  last completed {_action(e['done'])}; then began {_action(e['doing'])}"
                       f" ({e['calling']}); its last heartbeat {e['heartbeat_before']:g} s before the first state")
        else:
            out.append("  no heartbeat of it: it never started its watchdog")
    if not report["raised"] and not report["silent"]:  # every rank wrote: the first to stop
        e = min((e for e in report["ranks"] if e["why"] == "hang"), key=lambda e: e["time"] or 0, default=None)
        if e:
            out.append(f"every rank wrote its state; the first to stop was rank {e['rank']} ({_where(e)}),"
                       f" in {e['calling']} at {_action(e['doing'])}; its stack ends:")
            out += [f"    {line.rstrip()}" for frame in e["stack"][-2:] for line in frame.splitlines()]
    out.append("waiting ranks:")
    for e in report["ranks"]:
        if not e["wrote_state"] or e["rank"] in report["raised"]:
            continue
        group = "+".join(_axes(e["calling"]))
        members = e["groups"].get(group)
        missing = [r for r in members or [] if r in report["silent"] or r in report["raised"]]
        line = f"  rank {e['rank']} ({_where(e)}): {e['message']}; in {e['calling']}"
        if members:
            line += f" (group {members}" + (f", waiting for rank {', '.join(map(str, missing))})" if missing else ")")
        out.append(line + f" at {_action(e['doing'])}")
    for axis, where in report["axes"].items():
        out.append(f"axis {axis}: {where or '(give the plan file to see its line: dslc doctor RUN_DIR PLAN)'}")
    return "\n".join(out)
