"""The usage page's charts, computed on the server and drawn as inline SVG by the template: bars whose
sizes are SVG attributes (no script, no inline style, so the Content-Security-Policy holds)."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass

BAR_MAX = 400
"""Pixels of the longest horizontal bar."""
COLUMN_MAX = 120
"""Pixels of the tallest day's column."""
BARS = 20
"""Users or models shown per chart (the largest)."""


@dataclass(frozen=True, slots=True)
class Bar:
    label: str
    tokens: int
    cost_micros: int
    size: int
    """Pixels: the bar's length (or a column's height), scaled to the chart's largest."""

    @property
    def cost(self) -> str:
        return f"${self.cost_micros / 1_000_000:.4f}" if self.cost_micros else "—"


def _bars(totals: dict[str, list[int]], largest: int, scale: int) -> list[Bar]:
    return [
        Bar(label, tokens, cost, max(1, round(scale * tokens / largest)) if tokens else 0)
        for label, (tokens, cost) in totals.items()
    ]


def usage_charts(
    rows: list[tuple[str, str, str, int, int]], today: dt.date, days: int
) -> dict[str, list[Bar]]:
    """Per day (the last ``days``, empty days included), per user and per model: tokens and cost."""
    by_day: dict[str, list[int]] = {(today - dt.timedelta(days=n)).isoformat(): [0, 0] for n in range(days)}
    by_user: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    by_model: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for day, user, model, tokens, cost in rows:
        for table, key in ((by_day, day), (by_user, user), (by_model, model)):
            if table is by_day and key not in by_day:
                continue
            table[key][0] += tokens
            table[key][1] += cost
    ordered_days = dict(sorted(by_day.items()))
    top_users = dict(sorted(by_user.items(), key=lambda kv: -kv[1][0])[:BARS])
    top_models = dict(sorted(by_model.items(), key=lambda kv: -kv[1][0])[:BARS])

    def peak(table: dict[str, list[int]]) -> int:
        return max((v[0] for v in table.values()), default=0) or 1

    return {
        "days": _bars(ordered_days, peak(ordered_days), COLUMN_MAX),
        "users": _bars(top_users, peak(top_users), BAR_MAX),
        "models": _bars(top_models, peak(top_models), BAR_MAX),
    }
