"""`python -m bench.compare RESULTS.json`: a before/after table for a run made with `--compare`.

Both daemons ran in the same run against the same limits, so their ratio
(before time / after time, > 1 = the change helps) is as free of the shared
machine's noise as the harness can make it.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

FIELDS = [
    ("single", "ack_s", "ack, 1 file"),
    ("sharded", "ack_s", "ack, 8 writers"),
    ("single", "rename_s", "rename"),
    ("single", "durable_from_close_s", "drain, 1 file"),
    ("sharded", "durable_from_close_s", "drain, 8 files"),
    ("daemon", "cpu_per_gib_written", "CPU s/GiB written"),
    ("daemon", "cpu_per_gib_drained", "CPU s/GiB drained"),
    ("daemon", "peak_rss_bytes", "peak RSS"),
]


def main(argv: list[str]) -> int:
    result = json.loads(Path(argv[0]).read_text())
    print("| what | before (median) | after (median) | before/after per run: median [min, max] |")
    print("| --- | --- | --- | --- |")
    for part, field, label in FIELDS:
        pairs = [(r["ckptfs_base"][part][field], r["ckptfs"][part][field]) for r in result["runs"]
                 if field in r.get("ckptfs_base", {}).get(part, {}) and field in r.get("ckptfs", {}).get(part, {})]
        if not pairs:
            continue
        ratios = [b / a for b, a in pairs if a]
        print(f"| {label} | {statistics.median(b for b, _ in pairs):.4g} | {statistics.median(a for _, a in pairs):.4g} | "
              f"{statistics.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
