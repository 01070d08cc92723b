#!/usr/bin/env python3
"""What the Python binding costs, measured in one run on this machine.

1. Round trips (broadcast + sum reduction) and back-to-back reductions per second
   from a Python front-end, against the Rust API on a tree of the same shape
   (``treecast bench microbench``, the binary that came with the package): the
   same back-ends (the generic back-end answers both), the same protocol.
2. A command on 64 local back-ends: ``net.run`` (a cold start: launch, run, close;
   and warm: the tree already up) against ClusterShell's ``Task.run`` with its
   ``exec`` worker (the same 64 commands run locally), both as a script writes them.

    python bench.py [--local 16] [--topology balanced:4x4] [--rt 1000] [--tp 2000] [--rounds 3] [--runs 5] [--json]

Needs ClusterShell for part 2 (pip install ClusterShell); without it that part
says so and is left out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# This file's folder holds the package's source, without its compiled part: the
# installed package is the one to measure.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import treecast  # noqa: E402

# Requests the generic back-end answers, as the binary defines them.
TAG_ADD_RANK = treecast._native._TAG_ADD_RANK  # answers its rank + the value sent
TAG_BURST = treecast._native._TAG_BURST  # answers 1, that many times


def python_microbench(local: int, topology: str, rt: int, tp: int) -> dict[str, float]:
    with treecast.Network(local=local, topology=topology) as net:
        n = net.backends
        s = net.stream(filter="sum")
        expected = n * (n - 1) // 2
        rtts = []
        for i in range(10 + rt):
            t = time.perf_counter()
            s.send(TAG_ADD_RANK, "%d", 0)
            p = s.recv(timeout=30)
            dt = time.perf_counter() - t
            if p.values[0] != expected:
                raise SystemExit(f"round trip {i}: sum {p.values[0]}, expected {expected}")
            if i >= 10:
                rtts.append(dt * 1e6)
        t = time.perf_counter()
        s.send(TAG_BURST, "%d", tp)
        for i in range(tp):
            p = s.recv(timeout=30)
            if p.values[0] != n:
                raise SystemExit(f"reduction {i}: sum {p.values[0]}, expected {n}")
        tp_s = time.perf_counter() - t
    rtts.sort()
    return {
        "rtt_us_mean": statistics.fmean(rtts),
        "rtt_us_median": statistics.median(rtts),
        "reductions_per_s": tp / tp_s,
    }


def rust_microbench(local: int, topology: str, rt: int, tp: int) -> dict[str, float]:
    out = subprocess.run(
        [treecast.binary(), "bench", "microbench", "--local", str(local), "--topology", topology,
         "--rt", str(rt), "--tp", str(tp), "--json"],
        capture_output=True, text=True, check=True,
    ).stdout
    data = json.loads(out)
    rows = data if isinstance(data, list) else data.get("results", [data])
    r = rows[0]
    return {k: float(r[k]) for k in ("rtt_us_mean", "rtt_us_median", "reductions_per_s")}


def treecast_run(n: int, runs: int) -> dict[str, float]:
    cold, warm = [], []
    cmd = ["sh", "-c", "echo $TREECAST_RANK"]
    for _ in range(runs):
        t = time.perf_counter()
        with treecast.Network(local=n, topology=f"kary:{max(2, int(n ** 0.5))}") as net:
            res = net.run(cmd, timeout=60)
        cold.append(time.perf_counter() - t)
        assert sum(len(r) for _, r in res.groups()) == n, res
    with treecast.Network(local=n, topology=f"kary:{max(2, int(n ** 0.5))}") as net:
        for _ in range(runs):
            t = time.perf_counter()
            res = net.run(cmd, timeout=60)
            warm.append(time.perf_counter() - t)
            assert sum(len(r) for _, r in res.groups()) == n, res
    return {"cold_s": statistics.median(cold), "warm_s": statistics.median(warm)}


def clustershell_run(n: int, runs: int) -> dict[str, float] | None:
    try:
        from ClusterShell.NodeSet import NodeSet
        from ClusterShell.Task import task_self
        from ClusterShell.Worker.Exec import ExecWorker
    except ImportError:
        return None
    nodes = str(NodeSet(f"n[0-{n - 1}]"))
    times = []
    for _ in range(runs):
        # As a script writes it: Task.run over a node set, its distant worker the
        # exec worker (commands run locally through a shell, as treecast's do).
        t = time.perf_counter()
        task = task_self()
        task.set_default("distant_worker", ExecWorker)
        task.set_info("fanout", n)
        task.run("echo %h", nodes=nodes)
        groups = list(task.iter_buffers())
        times.append(time.perf_counter() - t)
        assert sum(len(keys) for _, keys in groups) == n, groups
    return {"run_s": statistics.median(times)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--local", type=int, default=16)
    p.add_argument("--topology", default="balanced:4x4")
    p.add_argument("--rt", type=int, default=1000)
    p.add_argument("--tp", type=int, default=2000)
    p.add_argument("--run-backends", type=int, default=64)
    p.add_argument("--runs", type=int, default=5, help="runs of each command on the 64 back-ends")
    p.add_argument("--rounds", type=int, default=3, help="alternated Python and Rust measurements")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()

    # Alternated, medians of each figure: a shared machine's load drifts during a run.
    pys, rss = [], []
    for _ in range(a.rounds):
        pys.append(python_microbench(a.local, a.topology, a.rt, a.tp))
        rss.append(rust_microbench(a.local, a.topology, a.rt, a.tp))
    py = {k: statistics.median(r[k] for r in pys) for k in pys[0]}
    rs = {k: statistics.median(r[k] for r in rss) for k in rss[0]}
    tc = treecast_run(a.run_backends, a.runs)
    cs = clustershell_run(a.run_backends, a.runs)
    report = {
        "tree": {"local": a.local, "topology": a.topology, "rt": a.rt, "tp": a.tp, "rounds": a.rounds},
        "python": py,
        "rust": rs,
        "rtt_ratio": py["rtt_us_mean"] / rs["rtt_us_mean"],
        "reductions_ratio": rs["reductions_per_s"] / py["reductions_per_s"],
        "run": {"backends": a.run_backends, "runs": a.runs, "treecast": tc, "clustershell_exec": cs},
    }
    if a.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"tree {a.topology}, {a.local} back-ends; {a.rt} round trips, {a.tp} reductions; "
          f"medians of {a.rounds} alternated rounds")
    print(f"  round trip, mean (median): Python {py['rtt_us_mean']:.1f} us ({py['rtt_us_median']:.1f}), "
          f"Rust {rs['rtt_us_mean']:.1f} us ({rs['rtt_us_median']:.1f}): {report['rtt_ratio']:.2f}x")
    print(f"  reductions/s: Python {py['reductions_per_s']:.0f}, Rust {rs['reductions_per_s']:.0f}: "
          f"Rust {report['reductions_ratio']:.2f}x")
    print(f"a command on {a.run_backends} local back-ends, median of {a.runs}:")
    print(f"  treecast net.run: {tc['cold_s'] * 1e3:.0f} ms cold (launch, run, close), "
          f"{tc['warm_s'] * 1e3:.0f} ms on a running tree")
    if cs is None:
        print("  ClusterShell: not installed (pip install ClusterShell): left out")
    else:
        print(f"  ClusterShell Task.run (exec worker, fanout {a.run_backends}): {cs['run_s'] * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
