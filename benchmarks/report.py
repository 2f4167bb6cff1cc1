"""What the benchmarks' reports share: progress lines, Markdown tables, median rounds."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

Row = dict[str, Any]


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 1) -> str:
    """A Markdown table: its first ``left`` columns aligned left, the others right."""
    align = "|" + "|".join("---" if i < left else "---:" for i in range(len(header))) + "|"
    return "\n".join([row(header), align, *(row(r) for r in rows)])


def row(cells: Sequence[Any]) -> str:
    """A Markdown table's row (an empty cell as ``| |``)."""
    return "|" + "|".join(f" {c} " if str(c) else " " for c in cells) + "|"


def median_rounds(rows: list[Row], group: Callable[[Row], Hashable],
                  value: Callable[[Row], float]) -> list[Row]:
    """A row a group: its round with the median ``value`` (the lower middle of an even
    count), with every round's value in ``rounds``."""
    groups: dict[Hashable, list[Row]] = {}
    for row in rows:
        groups.setdefault(group(row), []).append(row)
    return [{**sorted(runs, key=value)[(len(runs) - 1) // 2], "rounds": [value(r) for r in runs]}
            for runs in groups.values()]
