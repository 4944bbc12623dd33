#!/usr/bin/env python
"""Per-kernel summary of an Nsight Compute profile: how long each kernel ran and what bounds it.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section MemoryWorkloadAnalysis --section WarpStateStats -o prof \\
        python benchmarks/profile_whole_op.py --device cuda --batch 8 --seqlen 4096 --heads 32 --backend triton --ncu
    ncu --import prof.ncu-rep --csv --page details > prof.csv
    python benchmarks/ncu_summary.py prof.csv [--title "..."] [--out summary.md]

Reads the ``details`` page as CSV (one row per kernel launch and metric) and writes a markdown table, one row per
kernel name (launches summed): launches, summed duration and its share of the profiled call, the duration-weighted
speed-of-light figures (compute (SM) throughput, memory throughput, DRAM throughput, in % of peak), the achieved
DRAM bandwidth, achieved and theoretical occupancy, registers per thread, and a reading of the bound:

* ``memory``: memory throughput >= 60 % of peak (the kernel moves bytes as fast as the memory system allows);
* ``compute``: SM throughput >= 60 % and above memory;
* ``latency``: neither above 60 % (too few warps in flight or warps stalled on dependencies: occupancy and the
  warp-state figures say which).

The main stall reason and the occupancy limiter are read from the texts of ncu's ``CPIStall`` and occupancy rules.

Durations under ncu are replayed, serialised kernels with the clocks left alone (``--clock-control none``): use them
for shares and bounds; the benchmark figures come from ``bench_whole_op.py``.
"""

from __future__ import annotations

import argparse
import collections
import csv
import io
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional

#: Unit -> factor to seconds / bytes per second.
_TIME_UNITS = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0, "ns": 1e-9, "us": 1e-6,
               "ms": 1e-3}
_RATE_UNITS = {"byte/second": 1.0, "Kbyte/second": 1e3, "Mbyte/second": 1e6, "Gbyte/second": 1e9,
               "Tbyte/second": 1e12, "byte/s": 1.0, "Kbyte/s": 1e3, "Mbyte/s": 1e6, "Gbyte/s": 1e9, "Tbyte/s": 1e12}
#: The rule texts read for the table: the main stall reason and what limits the theoretical occupancy.
_STALL = re.compile(r"stalled (?:waiting )?(?:for |on )?(.*?)\. .*?represents about ([0-9.]+)%", re.S)
_OCC_LIMIT = re.compile(r"theoretical occupancy \([0-9.]+%\) is limited by (?:the )?(.*?)\.", re.S)
#: Throughput (% of peak) above which a kernel is read as bound by that unit.
BOUND_PCT = 60.0


def _number(text: str) -> Optional[float]:
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def read_launches(text: str) -> List[dict]:
    """The launches of a ``--page details --csv`` export: ``[{"name", "id", "metrics": {(section, metric): (value,
    unit)}}]`` in launch order. Lines before the CSV header (the profiled program's own output) are skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no ncu CSV header (a line starting with \"ID\") found: export with "
                         "`ncu --import REP --csv --page details`")
    launches: Dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        launch = launches.setdefault(row["ID"], {"name": row["Kernel Name"], "id": row["ID"], "metrics": {},
                                                  "rules": []})
        if row.get("Rule Description"):
            launch["rules"].append((row.get("Rule Name", ""), row["Rule Description"]))
        key = (row.get("Section Name", ""), row.get("Metric Name", ""))
        if key[1]:
            launch["metrics"][key] = (row.get("Metric Value", ""), row.get("Metric Unit", ""))
    return list(launches.values())


def _short_stall(text: str) -> str:
    """ncu's stall sentence as its usual name (long scoreboard = L1TEX: global/local memory; short = MIO)."""
    text = " ".join(text.split())
    for key, name in (("L1TEX", "long scoreboard (global/local memory)"),
                      ("MIO", "short scoreboard (shared memory, MUFU)"), ("barrier", "barrier"),
                      ("math pipe", "math pipe throttle"), ("execution dependency", "execution dependency")):
        if key in text:
            return name
    return text[:60]


def _metric(launch: dict, section: str, name: str, units=None) -> Optional[float]:
    value, unit = launch["metrics"].get((section, name), (None, None))
    number = _number(value) if value is not None else None
    if number is None:
        return None
    if units is not None:
        if unit not in units:
            return None
        number *= units[unit]
    return number


def launch_figures(launch: dict) -> dict:
    """Duration (s), SM / memory / DRAM throughput (%), DRAM bandwidth (B/s), occupancy (%), registers."""
    sol = "GPU Speed Of Light Throughput"
    stall = limit = None
    for rule, text in launch.get("rules", ()):
        found = _STALL.search(text) if rule == "CPIStall" and stall is None else None
        if found:
            stall = (_short_stall(found.group(1)), float(found.group(2)))
        found = _OCC_LIMIT.search(text) if limit is None else None
        if found:
            limit = " ".join(found.group(1).split())[:50]
    return {
        "stall": stall, "occupancy_limit": limit,
        "seconds": _metric(launch, sol, "Duration", _TIME_UNITS),
        "sm_pct": _metric(launch, sol, "Compute (SM) Throughput"),
        "mem_pct": _metric(launch, sol, "Memory Throughput"),
        "dram_pct": _metric(launch, sol, "DRAM Throughput"),
        "dram_rate": _metric(launch, "Memory Workload Analysis", "Memory Throughput", _RATE_UNITS),
        "achieved_occ": _metric(launch, "Occupancy", "Achieved Occupancy"),
        "theoretical_occ": _metric(launch, "Occupancy", "Theoretical Occupancy"),
        "registers": _metric(launch, "Launch Statistics", "Registers Per Thread"),
        "spills": _metric(launch, "Memory Workload Analysis", "Local Memory Spilling Requests"),
        "cycles_per_issue": _metric(launch, "Warp State Statistics", "Warp Cycles Per Issued Instruction"),
    }


def bound(sm_pct: Optional[float], mem_pct: Optional[float]) -> str:
    """``memory``, ``compute`` or ``latency`` (module docstring); ``?`` without the figures."""
    if sm_pct is None or mem_pct is None:
        return "?"
    if mem_pct >= BOUND_PCT and mem_pct >= sm_pct:
        return "memory"
    if sm_pct >= BOUND_PCT:
        return "compute"
    return "latency"


def summarize(launches: List[dict]) -> List[dict]:
    """One row per kernel name, sorted by summed duration (longest first)."""
    groups: Dict[str, List[dict]] = collections.OrderedDict()
    for launch in launches:
        groups.setdefault(launch["name"], []).append(launch_figures(launch))
    total = sum(f["seconds"] or 0.0 for figures in groups.values() for f in figures)
    rows = []
    for name, figures in groups.items():
        seconds = sum(f["seconds"] or 0.0 for f in figures)

        def weighted(key):
            pairs = [(f[key], f["seconds"] or 0.0) for f in figures if f[key] is not None]
            weight = sum(w for _, w in pairs)
            return sum(v * w for v, w in pairs) / weight if weight > 0 else None

        sm, mem = weighted("sm_pct"), weighted("mem_pct")
        regs = [f["registers"] for f in figures if f["registers"] is not None]
        rows.append({"name": name, "launches": len(figures), "seconds": seconds,
                     "share": seconds / total if total > 0 else None, "sm_pct": sm, "mem_pct": mem,
                     "dram_pct": weighted("dram_pct"), "dram_rate": weighted("dram_rate"),
                     "achieved_occ": weighted("achieved_occ"), "theoretical_occ": weighted("theoretical_occ"),
                     "cycles_per_issue": weighted("cycles_per_issue"),
                     "registers": max(regs) if regs else None, "bound": bound(sm, mem),
                     "spills": sum(f["spills"] or 0.0 for f in figures),
                     "stall": next((f["stall"] for f in figures if f["stall"]), None),
                     "occupancy_limit": next((f["occupancy_limit"] for f in figures if f["occupancy_limit"]), None)})
    rows.sort(key=lambda r: -r["seconds"])
    return rows


def _fmt(value, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, spec)


def markdown(rows: List[dict], title: str, top: int = 25) -> str:
    """The table of :func:`summarize` as markdown (the ``top`` longest kernels, the rest summed in one line)."""
    total = sum(r["seconds"] for r in rows)
    lines = [f"### {title}", "",
             f"{sum(r['launches'] for r in rows)} launches of {len(rows)} kernels, {total * 1e3:.2f} ms summed under "
             "ncu (serialised replays, clocks not locked).", "",
             "| kernel | launches | ms | share | SM % | memory % | DRAM % | DRAM GB/s | occupancy % (achieved / "
             "theoretical) | regs | spill requests | cycles per issue | bound | main stall (share of cycles) | occupancy "
             "limited by |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows[:top]:
        name = r["name"] if len(r["name"]) <= 60 else r["name"][:57] + "..."
        lines.append(
            f"| `{name}` | {r['launches']} | {r['seconds'] * 1e3:.3f} | {_fmt(r['share'], '.1%')} | "
            f"{_fmt(r['sm_pct'], '.0f')} | {_fmt(r['mem_pct'], '.0f')} | {_fmt(r['dram_pct'], '.0f')} | "
            f"{_fmt(r['dram_rate'], '.0f', 1e-9)} | {_fmt(r['achieved_occ'], '.0f')} / "
            f"{_fmt(r['theoretical_occ'], '.0f')} | {_fmt(r['registers'], '.0f')} | {_fmt(r['spills'], '.0f')} | "
            f"{_fmt(r['cycles_per_issue'], '.1f')} | {r['bound']} | "
            + (f"{r['stall'][0]} ({r['stall'][1]:.0f} %)" if r["stall"] else "-")
            + f" | {r['occupancy_limit'] or '-'} |")
    rest = rows[top:]
    if rest:
        lines.append(f"| ({len(rest)} other kernels) | {sum(r['launches'] for r in rest)} | "
                     f"{sum(r['seconds'] for r in rest) * 1e3:.3f} | "
                     f"{sum(r['seconds'] for r in rest) / total:.1%} | | | | | | | | | | | |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", type=Path, help="`ncu --import REP --csv --page details` output")
    parser.add_argument("--title", default="Nsight Compute profile")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", type=Path, default=None, help="write the markdown here (default: stdout)")
    args = parser.parse_args(argv)
    text = markdown(summarize(read_launches(args.csv.read_text(errors="replace"))), args.title, args.top)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
