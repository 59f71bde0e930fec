"""Where the power items of a gate run spent their time: each row (subject x gate) of each power item in the run
folders' results.json, longest first, with the item's total. Usage: python benchmarks/power_times.py RUN_DIR..."""

import json
import sys
from pathlib import Path

for run in sys.argv[1:]:
    path = Path(run) / "results.json"
    if not path.is_file():  # a session killed before its end writes none
        print(f"{run}: no results.json; the run did not finish (its log says how it ended)")
        continue
    results = json.loads(path.read_text())["results"]
    for nodeid, result in sorted(results.items()):
        if result["gate"] != "power":
            continue
        if "rows" not in result["metrics"]:  # the item measured nothing (missing bounds, say): its failed checks
            print(f"{run} {nodeid}: no rows; " + "; ".join(c["name"] for c in result["checks"] if not c["passed"]))
            continue
        rows = sorted(result["metrics"]["rows"], key=lambda row: -row.get("seconds", 0.0))
        print(f"{run} {nodeid}: {sum(row.get('seconds', 0.0) for row in rows):.1f} s in {len(rows)} rows")
        for row in rows:
            print(f"  {row.get('seconds', 0.0):8.2f} s  {row['subject']} x {row['gate']}: {row['verdict']}")
