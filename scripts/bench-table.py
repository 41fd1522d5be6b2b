#!/usr/bin/env python3
"""Prints a markdown table of the headline figures of tarn bench runs.
Usage: scripts/bench-table.py bench-results/full/*/"""
import json, sys

def row(cells):
    return "| " + " | ".join(str(c) for c in cells) + " |"

print(row(["workload", "step", "operation", "per s", "× health", "p50 ms", "p99 ms", "server CPU", "RSS MiB", "5xx"]))
print(row(["---"] * 10))
for d in sys.argv[1:]:
    r = json.load(open(d.rstrip("/") + "/results.json"))
    for s in r["steps"]:
        ops = s["ops"]
        # One line per step: the busiest operations of the step.
        shown = sorted(ops.items(), key=lambda kv: -kv[1]["count"])[:3] if len(ops) > 3 else ops.items()
        for name, o in shown:
            u = s.get("server") or {}
            print(row([r["workload"], s["name"], name, f'{o["per_second"]:.0f}',
                       f'{o["ratio_to_health"]:.4f}' if o.get("ratio_to_health") is not None else "-",
                       f'{o["p50_ms"]:.1f}', f'{o["p99_ms"]:.1f}',
                       f'{u.get("cpu_cores", 0):.2f}', f'{u.get("rss_max_mib", 0):.0f}', o["server_errors"]]))
    for m in r["marks"]:
        pass
