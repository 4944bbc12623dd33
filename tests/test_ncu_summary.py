"""``benchmarks/ncu_summary.py``: the per-kernel reading of an Nsight Compute ``details`` export.

A synthetic export in ncu's CSV layout (the columns and metric names of Nsight Compute 2025.3's details page, as
the H200 run of 2026-12-03 wrote them): two launches of one memory-bound kernel and one latency-bound launch with
spills and a stall rule. The summary must sum the launches, weight the percentages by duration, convert units and
read the bound, the stall and the occupancy limiter.
"""

import csv
import importlib.util
import io
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("ncu_summary", ROOT / "benchmarks" / "ncu_summary.py")
ncu_summary = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ncu_summary)

HEADER = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
          "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value", "Rule Name",
          "Rule Type", "Rule Description", "Estimated Speedup Type", "Estimated Speedup"]
SOL = "GPU Speed Of Light Throughput"


def _rows(launch_id, name, metrics, rules=()):
    for section, metric, unit, value in metrics:
        yield {"ID": launch_id, "Kernel Name": name, "Section Name": section, "Metric Name": metric,
               "Metric Unit": unit, "Metric Value": value}
    for section, rule, text in rules:
        yield {"ID": launch_id, "Kernel Name": name, "Section Name": section, "Rule Name": rule,
               "Rule Description": text}


def _export() -> str:
    buffer = io.StringIO()
    buffer.write("program output before the table\n==PROF== Disconnected\n")
    writer = csv.DictWriter(buffer, HEADER, quoting=csv.QUOTE_ALL)
    writer.writeheader()
    mem = lambda dur, unit, dram: [(SOL, "Duration", unit, dur), (SOL, "Compute (SM) Throughput", "%", "20"),
                                   (SOL, "Memory Throughput", "%", "80"), (SOL, "DRAM Throughput", "%", dram),
                                   ("Memory Workload Analysis", "Memory Throughput", "Tbyte/s", "3.20"),
                                   ("Launch Statistics", "Registers Per Thread", "register/thread", "56")]
    for row in _rows("0", "copy_kernel", mem("10.00", "us", "70")):
        writer.writerow(row)
    for row in _rows("1", "copy_kernel", mem("0.03", "ms", "90")):
        writer.writerow(row)
    slow = [(SOL, "Duration", "ms", "1.5"), (SOL, "Compute (SM) Throughput", "%", "25"),
            (SOL, "Memory Throughput", "%", "35"), ("Occupancy", "Achieved Occupancy", "%", "12.1"),
            ("Occupancy", "Theoretical Occupancy", "%", "12.5"),
            ("Memory Workload Analysis", "Local Memory Spilling Requests", "", "1,024"),
            ("Launch Statistics", "Registers Per Thread", "register/thread", "255")]
    rules = [("WarpStateStats", "CPIStall", "On average, each warp of this workload spends 4.2 cycles being stalled "
              "waiting for a scoreboard dependency on a L1TEX (local, global, surface, texture) operation. Find the "
              "instruction. This stall type represents about 45.7% of the total average of 9.2 cycles."),
             ("Occupancy", "TheoreticalOccupancy", "This kernel's theoretical occupancy (12.5%) is limited by the "
              "number of required registers.")]
    for row in _rows("2", "_stage2_kernel", slow, rules):
        writer.writerow(row)
    return buffer.getvalue()


def test_summary_sums_launches_weights_figures_and_reads_bounds():
    rows = {r["name"]: r for r in ncu_summary.summarize(ncu_summary.read_launches(_export()))}
    copy, stage2 = rows["copy_kernel"], rows["_stage2_kernel"]
    assert copy["launches"] == 2 and copy["seconds"] == pytest.approx(40e-6)
    assert copy["dram_pct"] == pytest.approx((70 * 10 + 90 * 30) / 40)  # weighted by duration
    assert copy["dram_rate"] == pytest.approx(3.2e12) and copy["bound"] == "memory"
    assert stage2["bound"] == "latency" and stage2["registers"] == 255 and stage2["spills"] == 1024
    assert stage2["stall"] == ("long scoreboard (global/local memory)", 45.7)
    assert stage2["occupancy_limit"] == "number of required registers"
    assert list(rows) == ["_stage2_kernel", "copy_kernel"]  # longest first
    assert stage2["share"] == pytest.approx(1.5e-3 / (1.5e-3 + 40e-6))


def test_markdown_has_one_row_per_kernel_and_a_rest_line():
    rows = ncu_summary.summarize(ncu_summary.read_launches(_export()))
    text = ncu_summary.markdown(rows, "t", top=1)
    assert "| `_stage2_kernel` | 1 | 1.500 |" in text and "(1 other kernels) | 2 |" in text


@pytest.mark.parametrize("sm, mem, want", [(70, 50, "compute"), (50, 70, "memory"), (30, 40, "latency"),
                                           (None, 40, "?")])
def test_bound_reading(sm, mem, want):
    assert ncu_summary.bound(sm, mem) == want


def test_an_export_without_the_table_is_refused():
    with pytest.raises(ValueError, match="ncu CSV header"):
        ncu_summary.read_launches("no table here\n")
