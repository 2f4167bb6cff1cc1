#!/usr/bin/env python
"""The end-to-end crawl of two trees of this package, interleaved, in one run.

``git worktree add /tmp/before <commit>`` then
``python benchmarks/before_after.py --before /tmp/before`` (``--rounds``,
``--pages``): the batched lock-mode contender of ``benchmarks/run.py``'s
end-to-end crawl (4 workers, the demo site), run by each tree in turn on the
same Redis, with this tree's ``benchmarks/timed.py`` and ``e2e.py`` copied
into the other (so both count their Redis round trips the same way; nothing
else of the other tree changes). Prints pages/s and Redis round trips per
fetched page per run, then the medians.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import statistics
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from scrapy_bloomdupe.testing import RedisServer  # noqa: E402

SETTINGS = {
    "DUPEFILTER_CLASS": "benchmarks.timed.TimedRedisBloomDupeFilter",
    "BLOOMDUPE_LOCK": "True",
    "BLOOMDUPE_BATCH": "True",
    "SPIDER_MIDDLEWARES": '{"scrapy_bloomdupe.middleware.BloomDupeBatchMiddleware": 10}',
}


def load_e2e(root: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"e2e_{abs(hash(root))}",
                                                  root / "benchmarks" / "e2e.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True,
                        help="a checkout of the tree to compare with (git worktree)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pages", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=HERE / "out" / "before_after")
    args = parser.parse_args(argv)
    for name in ("timed.py", "e2e.py"):
        shutil.copy(HERE / name, args.before / "benchmarks" / name)
    trees = {"before": load_e2e(args.before.resolve()), "after": load_e2e(HERE.parent)}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    with RedisServer(persist=True, extra=["--appendfsync", "everysec"]) as server:
        for r in range(args.rounds):
            for name, e2e in trees.items():
                result = e2e.crawl(name, SETTINGS, redis_url=server.url, pages=args.pages,
                                   workers=4, out=args.out / f"round-{r}")
                runs[name].append(result)
                print(f"round {r} {name}: {result['pages_per_second']:.0f} pages/s, "
                      f"{result['round_trips_per_page']:.2f} round trips/page, fetched twice "
                      f"{result['fetched_twice']}, never {result['never_fetched']}", flush=True)
    for name, results in runs.items():
        pages = [r["pages_per_second"] for r in results]
        trips = statistics.median(r["round_trips_per_page"] for r in results)
        print(f"{name}: pages/s median {statistics.median(pages):.0f} "
              f"({', '.join(f'{p:.0f}' for p in pages)}), round trips/page {trips:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
