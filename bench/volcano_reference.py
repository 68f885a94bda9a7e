"""The long differential run against Volcano's own plugin code (vcref).

    VOLCANO_REF=/path/to/vcref python bench/volcano_reference.py --seed 1 --jobs 10000
    python bench/volcano_reference.py --recorded

Generates jobs as ``tests/programs/test_volcano_reference.py`` does (``tests/helpers/volcano_reference.py``), runs
them through vcref in batches (one process per batch) and through our chain, and prints what was
compared, the documented differences met, and every mismatch by kind. With ``--recorded``, replays
Volcano's recorded answers instead (``../shared/volcano-reference/``, or ``VOLCANO_REFERENCE_DATA``;
no vcref needed), as the test suite does on every run. Exit status 1 when anything mismatched.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import volcano_reference as vr  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=500, help="jobs per vcref process")
    parser.add_argument("--workers", type=int, default=1, help="vcref processes at a time")
    parser.add_argument("--show", type=int, default=20, help="mismatches to print in full")
    parser.add_argument("--recorded", action="store_true", help="replay Volcano's recorded answers (no vcref; --seed and --jobs unused)")
    args = parser.parse_args(argv)
    report = vr.Report()
    started = time.perf_counter()
    ours_seconds = 0.0
    if args.recorded:
        path = vr.recorded_path()
        if not path.is_file():
            parser.error(f"no recorded answers at {path} (set {vr.RECORDED_ENV})")
        lines = vr.read_recorded(path)
        for i in range(0, len(lines), args.batch):
            reference = vr.recorded_reference(lines[i : i + args.batch])
            t = time.perf_counter()
            report.add(vr.compare(reference))
            ours_seconds += time.perf_counter() - t
        source = f"recorded {path.name}"
    else:
        vcref = vr.vcref_path()
        if not vcref:
            parser.error(f"set {vr.VOLCANO_REF_ENV} to Volcano's reference binary (vcref), or give --recorded")
        jobs = vr.generate_jobs(args.seed, args.jobs)
        batches = [jobs[i : i + args.batch] for i in range(0, len(jobs), args.batch)]
        with ThreadPoolExecutor(max_workers=args.workers) as pool:
            for reference in pool.map(lambda batch: vr.run_reference(batch, vcref), batches):
                t = time.perf_counter()
                report.add(vr.compare(reference))
                ours_seconds += time.perf_counter() - t
        source = f"seed {args.seed}"
    elapsed = time.perf_counter() - started

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; {source}")
    print()
    print("| jobs | Pods compared | side objects compared | denied by both | Pod errors in both | mismatches | time |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {report.jobs:,} | {report.pods:,} | {report.objects:,} | {report.both_denied:,} | {report.pod_errors:,} "
        f"| {len(report.mismatches):,} | {elapsed:.0f} s ({ours_seconds:.0f} s ours + compare) |"
    )
    print()
    print("| documented difference | met |")
    print("|---|---|")
    for difference in vr.DIFFERENCES:
        print(f"| {difference.key} | {report.documented[difference.key]:,} |")
    print()
    kinds = Counter(m.kind for m in report.mismatches)
    print("| mismatch kind | count |")
    print("|---|---|")
    for kind, count in sorted(kinds.items(), key=lambda item: (-item[1], item[0])) or [("(none)", 0)]:
        print(f"| {kind} | {count:,} |")
    for mismatch in report.mismatches[: args.show]:
        print(mismatch)
    return 1 if report.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
