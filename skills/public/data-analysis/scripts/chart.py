#!/usr/bin/env python3
"""Draw a clean SVG chart from a table file with the standard library only.

For when matplotlib is not installed. SVG opens in any browser and scales without blur.

    python3 chart.py bar  sales.csv --x region --y revenue --agg sum --out by_region.svg
    python3 chart.py hbar sales.csv --x product --agg count --top 15 --out top_products.svg
    python3 chart.py line sales.csv --x date --y revenue --y cost --out trend.svg --title "Monthly revenue"
    python3 chart.py hist sales.csv --x order_value --bins 20 --out dist.svg
    python3 chart.py scatter sales.csv --x units --y revenue --out units_vs_revenue.svg

bar/hbar/line group rows by --x and aggregate each --y (sum by default; count needs no --y).
It prints the plotted numbers as a Markdown table, so the answer can quote exactly what is shown.
Reads the same formats as profile_table.py (CSV/TSV/JSON/JSONL/XLSX).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from datetime import datetime
from html import escape
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_table import TableError, load_table, parse_date, parse_number

W, H = 860, 500
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
"""Okabe–Ito: distinguishable with the common forms of colour blindness."""
AGGREGATES = {
    "sum": sum,
    "mean": statistics.fmean,
    "median": statistics.median,
    "min": min,
    "max": max,
    "count": len,
}


def nice_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 × 10^k) covering [lo, hi]."""
    if hi == lo:
        hi, lo = (hi + 1, lo - 1) if hi == 0 else (hi + abs(hi) * 0.1, lo - abs(lo) * 0.1)
    raw = (hi - lo) / max(1, count - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = [round(start, 10)]
    while ticks[-1] < hi - step * 1e-9:
        ticks.append(round(start + len(ticks) * step, 10))
    return ticks


def fmt(value: float) -> str:
    """Compact tick/label text: 1.2k, 3.4M, 0.25."""
    if math.isnan(value):
        return ""
    a = abs(value)
    for limit, unit, suffix in ((1e12, 1e12, "T"), (1e9, 1e9, "B"), (1e6, 1e6, "M"), (1e4, 1e3, "k")):
        if a >= limit:
            return f"{value / unit:.3g}{suffix}"
    if value == int(value):
        return str(int(value))
    return f"{value:.4g}"


def exact(value: float) -> str:
    """Table text: the value rounded to 4 decimals, no exponent (the answer may quote it)."""
    if math.isnan(value):
        return ""
    text = f"{round(value, 4):f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


class Svg:
    def __init__(self, title: str, width: int = W, height: int = H) -> None:
        self.width, self.height = width, height
        self.parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">',
            f'<rect width="{width}" height="{height}" fill="white"/>',
        ]
        if title:
            self.text(width / 2, 26, title, size=16, anchor="middle", weight="bold")

    def text(
        self,
        x: float,
        y: float,
        s: str,
        *,
        size: int = 12,
        anchor: str = "start",
        weight: str = "normal",
        rotate: float = 0,
        fill: str = "#333",
    ) -> None:
        transform = f' transform="rotate({rotate} {x:.1f} {y:.1f})"' if rotate else ""
        self.parts.append(
            f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'font-weight="{weight}" fill="{fill}"{transform}>{escape(s)}</text>'
        )

    def line(self, x1: float, y1: float, x2: float, y2: float, color: str = "#ddd", width: float = 1) -> None:
        self.parts.append(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
            f'stroke="{color}" stroke-width="{width}"/>'
        )

    def rect(self, x: float, y: float, w: float, h: float, color: str, tip: str = "") -> None:
        title = f"<title>{escape(tip)}</title>" if tip else ""
        self.parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{max(h, 0):.1f}" '
            f'fill="{color}">{title}</rect>'
        )

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join([*self.parts, "</svg>"]) + "\n", encoding="utf-8")


def short(label: str, limit: int = 22) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


# ---- data ----------------------------------------------------------------------------------------


def column(header: list[str], name: str) -> int:
    if name in header:
        return header.index(name)
    lowered = [h.lower() for h in header]
    if name.lower() in lowered:
        return lowered.index(name.lower())
    raise TableError(f"no column {name!r}; columns: {', '.join(header)}")


def sort_key(label: str) -> tuple[int, float | str]:
    """Dates, then numbers in order; text keeps its own order via the caller."""
    date = parse_date(label)
    if date is not None:
        return 0, date[0].replace(tzinfo=None).timestamp()
    number = parse_number(label)
    if number is not None:
        return 1, number
    return 2, label


def grouped(rows: list[list[str]], x: int, ys: list[int], agg: str) -> tuple[list[str], list[list[float]]]:
    """Labels in first-seen order and, per y column, the aggregate of its numeric values."""
    groups: dict[str, list[list[float]]] = defaultdict(lambda: [[] for _ in ys or [0]])
    for row in rows:
        label = row[x].strip()
        if not label:
            continue
        bucket = groups[label]
        if not ys:
            bucket[0].append(1.0)
            continue
        for j, y in enumerate(ys):
            value = parse_number(row[y])
            if value is not None:
                bucket[j].append(value)
    labels = list(groups)
    func = AGGREGATES[agg]
    series = [
        [float(func(groups[lab][j])) if groups[lab][j] else math.nan for lab in labels]
        for j in range(len(ys or [0]))
    ]
    return labels, series


# ---- charts --------------------------------------------------------------------------------------


def plot_area(
    svg: Svg, left: int, right: int, top: int = 50, bottom: int = 80
) -> tuple[float, float, float, float]:
    return left, top, svg.width - right, svg.height - bottom


def y_axis(
    svg: Svg, box: tuple[float, float, float, float], lo: float, hi: float, label: str
) -> tuple[float, float]:
    x0, y0, x1, y1 = box
    ticks = nice_ticks(lo, hi)
    lo, hi = min(ticks[0], lo), max(ticks[-1], hi)
    for t in ticks:
        y = y1 - (t - lo) / (hi - lo) * (y1 - y0)
        svg.line(x0, y, x1, y)
        svg.text(x0 - 8, y + 4, fmt(t), anchor="end")
    if label:
        svg.text(16, (y0 + y1) / 2, label, anchor="middle", rotate=-90)
    return lo, hi


def bar(svg: Svg, labels: list[str], series: list[list[float]], names: list[str], ylabel: str) -> None:
    box = plot_area(svg, 80, 170 if len(series) > 1 else 30, bottom=110 if len(labels) > 8 else 70)
    x0, y0, x1, y1 = box
    values = [v for s in series for v in s if not math.isnan(v)]
    lo, hi = y_axis(svg, box, min(0.0, *values), max(0.0, *values), ylabel)
    scale = (y1 - y0) / (hi - lo)
    zero = y1 - (0 - lo) * scale
    slot = (x1 - x0) / len(labels)
    width = slot * 0.8 / len(series)
    for i, label in enumerate(labels):
        for j, s in enumerate(series):
            v = s[i]
            if math.isnan(v):
                continue
            x = x0 + i * slot + slot * 0.1 + j * width
            top = zero - v * scale if v >= 0 else zero
            svg.rect(x, top, width, abs(v) * scale, PALETTE[j % len(PALETTE)], f"{label}: {fmt(v)}")
        cx = x0 + (i + 0.5) * slot
        if len(labels) > 8:
            svg.text(cx, y1 + 14, short(label), anchor="end", rotate=-40)
        else:
            svg.text(cx, y1 + 18, short(label, 16), anchor="middle")
    svg.line(x0, zero, x1, zero, "#333")
    legend(svg, names)


def hbar(svg: Svg, labels: list[str], series: list[list[float]], names: list[str], xlabel: str) -> None:
    svg.height = max(H, 70 + 26 * len(labels) * max(1, len(series)))
    left = 20 + 7 * max(len(short(label, 28)) for label in labels)
    x0, y0, x1, y1 = plot_area(svg, left, 170 if len(series) > 1 else 40, bottom=50)
    values = [v for s in series for v in s if not math.isnan(v)]
    ticks = nice_ticks(min(0.0, *values), max(0.0, *values))
    lo, hi = ticks[0], ticks[-1]
    scale = (x1 - x0) / (hi - lo)
    zero = x0 + (0 - lo) * scale
    for t in ticks:
        x = x0 + (t - lo) * scale
        svg.line(x, y0, x, y1)
        svg.text(x, y1 + 16, fmt(t), anchor="middle")
    if xlabel:
        svg.text((x0 + x1) / 2, y1 + 36, xlabel, anchor="middle")
    slot = (y1 - y0) / len(labels)
    height = slot * 0.8 / len(series)
    for i, label in enumerate(labels):
        for j, s in enumerate(series):
            v = s[i]
            if math.isnan(v):
                continue
            y = y0 + i * slot + slot * 0.1 + j * height
            left_x = zero if v >= 0 else zero + v * scale
            svg.rect(left_x, y, abs(v) * scale, height, PALETTE[j % len(PALETTE)], f"{label}: {fmt(v)}")
        svg.text(x0 - 8, y0 + (i + 0.5) * slot + 4, short(label, 28), anchor="end")
    svg.line(zero, y0, zero, y1, "#333")
    legend(svg, names)


def xy(
    svg: Svg,
    points: list[list[tuple[float, float]]],
    names: list[str],
    xlabel: str,
    ylabel: str,
    *,
    dates: bool,
    connect: bool,
) -> None:
    box = plot_area(svg, 80, 170 if len(points) > 1 else 30, bottom=70)
    x0, y0, x1, y1 = box
    xs = [p[0] for s in points for p in s]
    ys = [p[1] for s in points for p in s]
    lo_y, hi_y = y_axis(svg, box, min(ys), max(ys), ylabel)
    lo_x, hi_x = min(xs), max(xs)
    if hi_x == lo_x:
        lo_x, hi_x = lo_x - 1, hi_x + 1
    if dates:
        xticks = [lo_x + (hi_x - lo_x) * k / 5 for k in range(6)]
    else:
        xticks = nice_ticks(lo_x, hi_x)
        lo_x, hi_x = min(xticks[0], lo_x), max(xticks[-1], hi_x)

    def px(v: float) -> float:
        return x0 + (v - lo_x) / (hi_x - lo_x) * (x1 - x0)

    def py(v: float) -> float:
        return y1 - (v - lo_y) / (hi_y - lo_y) * (y1 - y0)

    for t in xticks:
        svg.line(px(t), y0, px(t), y1, "#eee")
        text = datetime.fromtimestamp(t).strftime("%Y-%m-%d") if dates else fmt(t)
        svg.text(px(t), y1 + 18, text, anchor="middle")
    svg.line(x0, y1, x1, y1, "#333")
    if xlabel:
        svg.text((x0 + x1) / 2, y1 + 44, xlabel, anchor="middle")
    for j, s in enumerate(points):
        color = PALETTE[j % len(PALETTE)]
        if connect and len(s) > 1:
            path = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in s)
            svg.parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        radius = 2.5 if connect and len(s) > 60 else 3.5
        for a, b in s:
            svg.parts.append(
                f'<circle cx="{px(a):.1f}" cy="{py(b):.1f}" r="{radius}" fill="{color}" fill-opacity="0.8"/>'
            )
    legend(svg, names)


def legend(svg: Svg, names: list[str]) -> None:
    if len(names) < 2:
        return
    x = svg.width - 155
    for j, name in enumerate(names):
        y = 60 + j * 20
        svg.rect(x, y - 10, 12, 12, PALETTE[j % len(PALETTE)])
        svg.text(x + 18, y, short(name, 20))


# ---- command line --------------------------------------------------------------------------------


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> str:
    header, rows, _info = load_table(args.file, sheet=args.sheet, delimiter=args.delimiter)
    if not rows:
        raise TableError("the table has no data rows")
    x = column(header, args.x)
    ys = [column(header, y) for y in args.y or []]
    xname = header[x]
    title = args.title or ""
    svg = Svg(title)
    out = Path(args.out)

    if args.kind in ("bar", "hbar", "line"):
        agg = args.agg or ("sum" if ys else "count")
        if agg != "count" and not ys:
            raise TableError(f"--agg {agg} needs at least one --y column")
        if agg == "count":
            ys = []
        labels, series = grouped(rows, x, ys, agg)
        if not labels:
            raise TableError(f"column {xname!r} has no values")
        names = [f"{agg}({header[y]})" for y in ys] or ["count"]
        keys = [sort_key(label) for label in labels]
        ordered = all(k[0] == keys[0][0] for k in keys) and keys[0][0] < 2
        if args.kind == "line" or (ordered and args.sort == "auto"):
            order = sorted(range(len(labels)), key=lambda i: keys[i]) if ordered else range(len(labels))
        elif args.sort in ("auto", "value"):
            order = sorted(
                range(len(labels)),
                key=lambda i: -(series[0][i] if not math.isnan(series[0][i]) else -math.inf),
            )
        else:
            order = range(len(labels))
        order = list(order)
        if args.top and args.kind != "line" and len(order) > args.top:
            order = order[: args.top]
        labels = [labels[i] for i in order]
        series = [[s[i] for i in order] for s in series]
        if all(math.isnan(v) for s in series for v in s):
            raise TableError("no numeric values to plot in the --y column(s)")
        ylabel = names[0] if len(names) == 1 else ""
        if args.kind == "bar":
            bar(svg, labels, series, names, ylabel)
        elif args.kind == "hbar":
            hbar(svg, labels, series, names, ylabel)
        else:
            dates = ordered and keys[0][0] == 0
            pts = [
                [
                    (sort_key(lab)[1] if ordered else float(i), v)
                    for i, (lab, v) in enumerate(zip(labels, s, strict=True))
                    if not math.isnan(v)
                ]
                for s in series
            ]
            xy(svg, pts, names, xname, ylabel, dates=dates, connect=True)  # type: ignore[arg-type]
        table = markdown_table(
            [xname, *names], [[lab, *(exact(s[i]) for s in series)] for i, lab in enumerate(labels)]
        )
    elif args.kind == "hist":
        values = [v for v in (parse_number(r[x]) for r in rows) if v is not None]
        if not values:
            raise TableError(f"column {xname!r} has no numeric values")
        lo, hi = min(values), max(values)
        bins = max(1, args.bins)
        width = (hi - lo) / bins or 1.0
        counts = [0] * bins
        for v in values:
            counts[min(bins - 1, int((v - lo) / width))] += 1
        labels = [f"{fmt(lo + i * width)}–{fmt(lo + (i + 1) * width)}" for i in range(bins)]
        bar(svg, labels, [[float(c) for c in counts]], ["count"], "count")
        table = markdown_table(
            [f"{xname} range", "count"], [[lab, str(c)] for lab, c in zip(labels, counts, strict=True)]
        )
    else:  # scatter
        if len(ys) != 1:
            raise TableError("scatter needs exactly one --y column")
        pts = [(parse_number(r[x]), parse_number(r[ys[0]])) for r in rows]
        clean = [(a, b) for a, b in pts if a is not None and b is not None]
        if not clean:
            raise TableError("no rows with numbers in both columns")
        xy(svg, [clean], [header[ys[0]]], xname, header[ys[0]], dates=False, connect=False)
        table = f"{len(clean)} points plotted ({len(rows) - len(clean)} rows skipped: missing or non-numeric)"
    svg.save(out)
    return f"Wrote {out}\n\n{table}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Draw an SVG chart from a table (stdlib only).")
    parser.add_argument("kind", choices=["bar", "hbar", "line", "hist", "scatter"])
    parser.add_argument("file")
    parser.add_argument("--x", required=True, help="category/x column")
    parser.add_argument("--y", action="append", help="value column (repeat for several series)")
    parser.add_argument("--agg", choices=sorted(AGGREGATES), help="how to combine rows with the same x")
    parser.add_argument("--top", type=int, default=0, help="bar/hbar: keep the N largest")
    parser.add_argument(
        "--sort",
        choices=["auto", "value", "none"],
        default="auto",
        help="bar/hbar order: auto (dates/numbers in order, else by value), value, none (file order)",
    )
    parser.add_argument("--bins", type=int, default=20, help="hist: number of bins")
    parser.add_argument("--title", help="chart title")
    parser.add_argument("--out", default="/mnt/user-data/outputs/chart.svg", help="output .svg path")
    parser.add_argument("--sheet", help="xlsx: sheet name")
    parser.add_argument("--delimiter", help="CSV delimiter (default: detected)")
    args = parser.parse_args(argv)
    try:
        print(run(args))
    except (TableError, OSError) as exc:
        print(f"chart.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
