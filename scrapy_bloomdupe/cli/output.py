"""How the ``bloomdupe`` commands print: tables, aligned fields, sizes, rates, times, JSON."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from ..frontier.busiest import BusySlots


def emit_json(out: TextIO, data: dict[str, Any]) -> None:
    out.write(json.dumps(json_safe(data), indent=2) + "\n")


def json_safe(value: Any) -> Any:
    """JSON has no infinity or NaN: those become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *,
          left: Sequence[int] = (0,), indent: str = "  ") -> list[str]:
    """Columns padded to their widest cell; the ``left`` columns left-aligned, others right."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = [c.ljust(w) if i in left else c.rjust(w)
                 for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return (indent + "  ".join(parts)).rstrip()

    return [line(headers), *(line(r) for r in rows)]


def fields(pairs: Sequence[tuple[str, str]], indent: str = "  ") -> list[str]:
    width = max(len(name) for name, _ in pairs)
    return [f"{indent}{name:<{width}}  {value}" for name, value in pairs]


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def count(n: float) -> str:
    return "full" if math.isinf(n) else f"{n:,.0f}"


def rate(p: float) -> str:
    return f"{p:.2g}"


def percent(x: float) -> str:
    return f"{x:.2%}"


def ago(seconds: float) -> str:
    """``12 s ago``, ``5 min ago``, ``3.2 h ago``, ``2.0 d ago``."""
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.1f} d ago"


def when(timestamp: float | None) -> str:
    if not timestamp:
        return "-"
    moment = datetime.fromtimestamp(timestamp, tz=timezone.utc)
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC ({ago(time.time() - timestamp)})"


def seconds(value: float) -> str:
    """``0.5 s``, ``12 s``, ``-`` for none."""
    if value <= 0:
        return "-"
    return f"{value:.1f} s" if value < 10 else f"{value:,.0f} s"


def busy_slots(busy: BusySlots) -> list[str]:
    """The busiest download slots' block of ``top`` and ``info``, a blank line first."""
    lines = ["", f"Busiest download slots ({busy.in_flight_slots:,} with requests in flight, "
                 f"{busy.ready_slots:,} ready to go now or later)"]
    if not busy.slots:
        return [*lines, "  (none: nothing waits or is in flight)"]
    return lines + table(
        ["slot", "in flight", "limit", "waiting", "delay", "next start in", "backed off for"],
        [[s.slot, f"{s.in_flight:,}", f"{s.concurrency:,}" if s.concurrency else "none",
          f"{s.waiting:,}", f"{s.delay:g} s" if s.delay else "-", seconds(s.next_start),
          seconds(s.backoff)]
         for s in busy.slots])
