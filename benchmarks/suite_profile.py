"""Where the test suite's time goes, by file: run the suite with FLEETRL_TEST_PROFILE=FILE (tests/conftest.py appends one
JSON line per test: wall time with its fixtures, this process's CPU, the CPU of the processes it started, how many it
started), then print the table:

    FLEETRL_TEST_PROFILE=/tmp/suite.jsonl make test
    python benchmarks/suite_profile.py /tmp/suite.jsonl [--top 25]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from bench import table

FIELDS = ("wall_s", "own_cpu_s", "children_cpu_s", "processes_started")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", help="the FLEETRL_TEST_PROFILE file")
    parser.add_argument("--top", type=int, default=25, help="also list the slowest N tests")
    args = parser.parse_args()
    with open(args.log) as file:
        records = [json.loads(line) for line in file if line.strip()]
    by_file: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(("tests", *FIELDS), 0.0))
    for record in records:
        row = by_file[record["test"].split("::")[0]]
        row["tests"] += 1
        for field in FIELDS:
            row[field] += record[field]
    total = {field: sum(row[field] for row in by_file.values()) for field in ("tests", *FIELDS)}
    rows = [[name, f"{row['tests']:.0f}", *(f"{row[f]:.0f}" for f in FIELDS)]
            for name, row in sorted(by_file.items(), key=lambda item: -item[1]["wall_s"])]
    print(table(["file", "tests", "wall s", "own CPU s", "started processes' CPU s", "processes started"],
                rows + [["**all**", f"{total['tests']:.0f}", *(f"{total[f]:.0f}" for f in FIELDS)]]))
    print(f"\nwall time summed over tests (the xdist workers run side by side, so the suite's own wall time is less); "
          f"the {args.top} slowest tests:\n")
    print(table(["test", "wall s", "own CPU s", "started processes' CPU s", "processes started"],
                [[r["test"], f"{r['wall_s']:.1f}", f"{r['own_cpu_s']:.1f}", f"{r['children_cpu_s']:.1f}", r["processes_started"]]
                 for r in sorted(records, key=lambda r: -r["wall_s"])[:args.top]]))

if __name__ == "__main__":
    main()
