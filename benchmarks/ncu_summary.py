"""The lines of an Nsight Compute ``--csv --page details`` log that a reviewer reads first, per kernel.

Usage: python benchmarks/ncu_summary.py NCU_LOG [--metrics "Duration,Memory Throughput,..."]

The log mixes ncu's CSV rows with the profiled program's own output and ``==PROF==`` notes; only quoted rows
are read, with the csv module, so quoted kernel names with commas survive.
"""

import argparse
import csv
import sys

DEFAULT_METRICS = ("Duration", "Memory Throughput", "DRAM Throughput", "L2 Cache Throughput",
                   "Compute (SM) Throughput", "Issue Slots Busy", "Achieved Occupancy", "Registers Per Thread")


def summary(lines, metrics) -> list[tuple[str, str, str, str]]:
    """(kernel, metric, unit, value) for each wanted metric, in the log's order."""
    rows = csv.reader(line for line in lines if line.startswith('"'))
    header = next(rows, None)
    if header is None:
        raise ValueError("no ncu CSV rows: ncu profiled no kernel (is the program's profiler range reached?)")
    column = {name: i for i, name in enumerate(header)}
    needed = ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value")
    missing = [name for name in needed if name not in column]
    if missing:
        raise ValueError(f"not an ncu --csv --page details log: no column {', '.join(missing)}")
    # Metric rows end at their value: ncu leaves out the trailing rule columns they do not fill.
    width = max(column[name] for name in needed) + 1
    return [
        tuple(row[column[name]] for name in needed)
        for row in rows
        if len(row) >= width and row[column["Metric Name"]] in metrics
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="the output of ncu --csv --page details")
    parser.add_argument("--metrics", default=",".join(DEFAULT_METRICS), help="comma-separated metric names")
    args = parser.parse_args()
    with open(args.log, errors="replace") as file:
        try:
            found = summary(file, set(args.metrics.split(",")))
        except ValueError as error:
            sys.exit(f"{args.log}: {error}")
    for kernel, metric, unit, value in found:
        print(f"  {kernel[:60]:60s} {metric:26s} {value:>12s} {unit}")


if __name__ == "__main__":
    main()
