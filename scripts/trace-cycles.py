#!/usr/bin/env python3
"""Where a connection cycle's time goes: scripts/trace-wakes connect's analysis.

    trace-cycles.py SCHED CLIENT_LOG

SCHED is `perf script -F comm,pid,tid,time,event,trace` of sched_switch and sched_wakeup
recorded with CLOCK_MONOTONIC; CLIENT_LOG holds lat.c's `cycle I T0 .. T6` lines (-T), in
the same clock. Prints, for each phase of the cycle, its median length and each process's
runs and CPU per cycle (kernel threads by kind), then the runs of the median cycle in
order: when each began, for how long, what woke it.
"""
import collections
import re
import statistics
import sys

PHASES = ["resolve", "qp", "established", "message", "disconnected", "destroy"]
LINE = re.compile(r"\s*(.+?)\s+(\d+)/(\d+)\s+([\d.]+):\s+sched:sched_(\w+):(.*)")


def kind_of(comm):
    """Kernel threads by kind (kworker/u4:2 is a kworker); processes by their name."""
    return re.split(r"[/:]", comm)[0]


def main(sched_path, log_path):
    cycles = []
    for line in open(log_path):
        f = line.split()
        if len(f) == 2 + len(PHASES) + 1 and f[0] == "cycle":
            cycles.append([float(x) / 1e6 for x in f[2:]])
    if not cycles:
        sys.exit("trace-cycles: no cycle lines in the client's log")

    runs = []  # (start, end, tgid, tid, comm, waker)
    on_cpu = {}  # tid -> start
    woken_by = {}  # tid -> the waker's label, until it runs
    run_waker = {}
    tgid_of = {}
    names = collections.defaultdict(collections.Counter)
    main_name = {}  # tgid -> its main thread's name (a helper thread may run more often)
    for line in open(sched_path):
        m = LINE.match(line)
        if not m:
            continue
        comm, pid, tid, t, kind, rest = m.groups()
        pid, tid, t = int(pid), int(tid), float(t)
        if tid:
            tgid_of[tid] = pid
            names[pid][comm] += 1
            if tid == pid:
                main_name[pid] = comm
        if kind == "wakeup":
            w = re.search(r" pid=(\d+)", rest)
            if w:
                woken_by[int(w.group(1))] = (pid, comm) if tid else (0, "irq")
        elif kind == "switch":
            nxt = int(re.search(r"next_pid=(\d+)", rest).group(1))
            if tid and tid in on_cpu:
                runs.append((on_cpu.pop(tid), t, pid, tid, comm, run_waker.pop(tid, None)))
            if nxt:
                on_cpu[nxt] = t
                run_waker[nxt] = woken_by.pop(nxt, None)

    # A process's label: its name and, for two of one name (two urdmads, lat's server and
    # client), which one by order of start (lat's server starts first).
    def name_of(tgid):
        if tgid in main_name:
            return main_name[tgid]
        return names[tgid].most_common(1)[0][0] if names[tgid] else str(tgid)

    procs = sorted({r[2] for r in runs})
    label = {}
    by_name = collections.defaultdict(list)
    for tgid in procs:
        n = name_of(tgid)
        if tgid == 0 or n.startswith(("kworker", "ksoftirqd", "rcu", "migration", "kthreadd")):
            continue
        by_name[n].append(tgid)
    for n, tgids in by_name.items():
        for i, tgid in enumerate(tgids):
            if n == "lat" and len(tgids) == 2:
                label[tgid] = ["lat server", "lat client"][i]
            else:
                label[tgid] = n if len(tgids) == 1 else f"{n}[{i + 1}]"

    def who(r):
        tgid, comm = r[2], r[4]
        return label.get(tgid, kind_of(comm))

    def waker(w):
        if w is None:
            return "-"
        tgid, comm = w
        return label.get(tgid, kind_of(comm))

    groups = sorted({who(r) for r in runs if r[4] not in ("perf",)})
    # per phase: length of each cycle; per group: runs and CPU summed over cycles
    lengths = [[c[k + 1] - c[k] for c in cycles] for k in range(len(PHASES))]
    n_runs = collections.defaultdict(float)
    cpu = collections.defaultdict(float)
    runs.sort()
    for c in cycles:
        for r in runs:
            if r[1] <= c[0] or r[0] >= c[-1] or r[4] == "perf":
                continue
            for k in range(len(PHASES)):
                a, b = max(r[0], c[k]), min(r[1], c[k + 1])
                if b > a:
                    cpu[(k, who(r))] += b - a
                if c[k] <= r[0] < c[k + 1]:
                    n_runs[(k, who(r))] += 1
    nc = len(cycles)
    total = [c[-1] - c[0] for c in cycles]
    print(f"{nc} cycles, median {statistics.median(total) * 1e3:.2f} ms; per phase its median "
          "length, then per process (kernel threads by kind) runs begun and CPU ms, "
          "per cycle, largest first")
    for k, ph in enumerate(PHASES):
        busy = sorted(((cpu[(k, g)], n_runs[(k, g)], g) for g in groups), reverse=True)
        parts = [f"{g} {n / nc:.1f}x {c * 1e3 / nc:.2f}" for c, n, g in busy if c > 0 or n > 0]
        sum_cpu = sum(c for c, _, _ in busy) * 1e3 / nc
        print(f"  {ph:>12} {statistics.median(lengths[k]) * 1e3:8.2f} ms  CPU {sum_cpu:6.2f} ms: "
              + ", ".join(parts[:9]))
    # the median cycle, run by run
    order = sorted(range(nc), key=lambda i: total[i])
    c = cycles[order[nc // 2]]
    print(f"the median cycle ({(c[-1] - c[0]) * 1e3:.2f} ms), run by run: start ms, "
          "length ms, who ran, what woke it")
    k = 0
    for r in runs:
        if r[1] <= c[0] or r[0] >= c[-1] or r[4] == "perf":
            continue
        while k < len(PHASES) - 1 and r[0] >= c[k + 1]:
            k += 1
        start = max(r[0], c[0])
        print(f"  {(start - c[0]) * 1e3:8.3f} {(r[1] - r[0]) * 1e3:7.3f}  {PHASES[k]:>12}  "
              f"{who(r)} ({r[4]}) <- {waker(r[5])}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: trace-cycles.py SCHED CLIENT_LOG")
    main(sys.argv[1], sys.argv[2])
