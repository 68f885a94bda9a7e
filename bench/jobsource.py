"""How long the directory job source (``serve --jobs-dir``) takes where tests/unit/server/test_jobsource.py only
asserts what it does:

1. the first load of a directory of files it must refuse — one over the size limit, a YAML alias
   bomb, JSON nested 200 deep, a fifo — beside one good job (the webhook is not ready before it
   ends); target under 1 s;
2. a lookup of a known job while a 2,000-job file (240 KB, about half a second to parse) is re-read:
   the first lookup, which starts the re-read, and every one after it until the re-read ends, all
   answered from the old table; target under 0.1 s each.

    python bench/jobsource.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from tests.helpers.jobs import alias_bomb_yaml, jobs_yaml, loaded, many_jobs_yaml, minimal_job  # noqa: E402
from volcano_job_webhook.server.jobs import DirectoryJobSource  # noqa: E402

LOAD_TARGET, LOOKUP_TARGET = 1.0, 0.1


async def load_hostile_directory(directory: Path) -> float:
    (directory / "good.yaml").write_text(jobs_yaml(minimal_job("good")))
    (directory / "big.yaml").write_text(jobs_yaml(minimal_job("big")) + "#" * 5000)
    (directory / "bomb.yaml").write_text(alias_bomb_yaml())
    (directory / "deep.json").write_text('{"kind": "Job", "metadata": {"name": "deep"}, "spec": ' + "[" * 200 + "]" * 200 + "}")
    os.mkfifo(directory / "fifo.yaml")
    source = DirectoryJobSource(directory, interval=0, max_file_bytes=4096)
    started = time.monotonic()
    source.start()
    await loaded(source)
    took = time.monotonic() - started
    assert len(source) == 1, "only the good job is taken"
    source.stop()
    return took


async def lookups_during_a_re_read(directory: Path) -> list[float]:
    (directory / "a.yaml").write_text(jobs_yaml(minimal_job("a")))
    source = DirectoryJobSource(directory, interval=0)
    source.start()
    await loaded(source)
    (directory / "bulk.yaml").write_text(many_jobs_yaml(2000))
    took = []
    while True:
        started = time.monotonic()
        found = await source.get("default", "a")
        took.append(time.monotonic() - started)
        assert found is not None
        if source._look is None or source._look.done():
            break
        await asyncio.sleep(0.01)
    await loaded(source)
    source.stop()
    return took


async def run(rounds: int) -> bool:
    loads, lookups = [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            loads.append(await load_hostile_directory(Path(a)))
            lookups += await lookups_during_a_re_read(Path(b))
    rows = [
        ("first load of the refused files and one good job", loads, LOAD_TARGET),
        (f"a lookup while 2,000 jobs are re-read ({len(lookups)} lookups)", lookups, LOOKUP_TARGET),
    ]
    print("| measure | median | max | target | |\n|---|---|---|---|---|")
    met_all = True
    for name, values, target in rows:
        met = max(values) < target
        met_all &= met
        print(f"| {name} | {statistics.median(values) * 1000:.1f} ms | {max(values) * 1000:.1f} ms | "
              f"< {target * 1000:g} ms | {'met' if met else 'MISSED'} |")
    return met_all


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    sys.exit(0 if asyncio.run(run(parser.parse_args().rounds)) else 1)


if __name__ == "__main__":
    main()
