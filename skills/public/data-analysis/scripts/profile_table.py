#!/usr/bin/env python3
"""Profile a table file with the Python standard library only (no pandas needed).

Reads CSV/TSV (delimiter and encoding detected), JSON (a list of objects, or an object holding
one), JSON Lines and Excel .xlsx (first sheet, or --sheet). For each column prints the inferred
type, missing values, distinct values and a summary (numbers: min/max/mean/median/stdev; dates:
range; text: most common values), then data-quality warnings.

    python3 profile_table.py /mnt/user-data/uploads/sales.csv
    python3 profile_table.py data.xlsx --sheet Orders --json > profile.json

``load_table`` is importable by other scripts (chart.py uses it).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import statistics
import sys
import zipfile
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

MISSING = frozenset({"", "na", "n/a", "nan", "null", "none", "-", "--", "?", "#n/a"})
DATE_FORMATS = ("%d/%m/%Y", "%m/%d/%Y", "%d.%m.%Y", "%Y/%m/%d", "%d-%m-%Y", "%b %d, %Y", "%d %b %Y")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$")
_CURRENCY = re.compile(r"^[+-]?[$€£¥₹]\s?|\s?[$€£¥₹%]$")
_DISTINCT_CAP = 10_000

csv.field_size_limit(16 * 1024 * 1024)


class TableError(Exception):
    """The file cannot be read as a table; the message says why."""


# ---- loading -------------------------------------------------------------------------------------


def _decode(raw: bytes) -> tuple[str, str]:
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        return raw.decode("utf-16"), "utf-16"
    for encoding in ("utf-8-sig", "cp1252"):
        try:
            return raw.decode(encoding), "utf-8" if encoding == "utf-8-sig" else encoding
        except UnicodeDecodeError:
            continue
    return raw.decode("latin-1"), "latin-1"


def _read_delimited(path: Path, delimiter: str | None) -> tuple[list[str], list[list[str]], dict[str, Any]]:
    text, encoding = _decode(path.read_bytes())
    if delimiter is None:
        try:
            delimiter = csv.Sniffer().sniff(text[:65536], delimiters=",;\t|").delimiter
        except csv.Error:
            delimiter = "\t" if path.suffix.lower() in (".tsv", ".tab") else ","
    rows = list(csv.reader(io.StringIO(text, newline=""), delimiter=delimiter))
    rows = [r for r in rows if any(cell.strip() for cell in r)]
    if not rows:
        raise TableError("the file has no rows")
    info = {"format": "delimited", "encoding": encoding, "delimiter": delimiter}
    return rows[0], rows[1:], info


def _records_to_rows(records: list[Any]) -> tuple[list[str], list[list[str]]]:
    header: list[str] = []
    seen: set[str] = set()
    for rec in records:
        if not isinstance(rec, dict):
            raise TableError("expected a list of JSON objects (one per row)")
        for key in rec:
            if key not in seen:
                seen.add(key)
                header.append(key)

    def cell(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, dict | list):
            return json.dumps(value, ensure_ascii=False)
        return str(value).lower() if isinstance(value, bool) else str(value)

    return header, [[cell(rec.get(k)) for k in header] for rec in records]


def _read_json(path: Path) -> tuple[list[str], list[list[str]], dict[str, Any]]:
    text, encoding = _decode(path.read_bytes())
    info: dict[str, Any] = {"format": "json", "encoding": encoding}
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        records = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise TableError(f"line {number} is not valid JSON: {exc.msg}") from None
        info["format"] = "jsonl"
        header, rows = _records_to_rows(records)
        return header, rows, info
    if isinstance(data, dict):
        lists = [k for k, v in data.items() if isinstance(v, list) and v and isinstance(v[0], dict)]
        if not lists:
            raise TableError("the JSON object holds no list of records")
        info["records_key"] = lists[0]
        data = data[lists[0]]
    if not isinstance(data, list):
        raise TableError("the JSON is neither a list of records nor an object holding one")
    header, rows = _records_to_rows(data)
    return header, rows, info


_NS = {"m": "http://schemas.openxmlformats.org/spreadsheetml/2006/main"}
_REL = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}id"


def _column_index(ref: str) -> int:
    index = 0
    for ch in ref:
        if not ch.isalpha():
            break
        index = index * 26 + (ord(ch.upper()) - 64)
    return index - 1


def _read_xlsx(path: Path, sheet: str | None) -> tuple[list[str], list[list[str]], dict[str, Any]]:
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise TableError(
            "not a valid .xlsx file (old .xls files are not supported: save as .xlsx or CSV)"
        ) from None
    with zf:
        names = set(zf.namelist())
        shared: list[str] = []
        if "xl/sharedStrings.xml" in names:
            root = ElementTree.fromstring(zf.read("xl/sharedStrings.xml"))
            for si in root.findall("m:si", _NS):
                shared.append("".join(t.text or "" for t in si.iter(f"{{{_NS['m']}}}t")))
        book = ElementTree.fromstring(zf.read("xl/workbook.xml"))
        sheets = [(s.get("name", ""), s.get(_REL, "")) for s in book.iterfind("m:sheets/m:sheet", _NS)]
        rels = ElementTree.fromstring(zf.read("xl/_rels/workbook.xml.rels"))
        targets = {r.get("Id"): r.get("Target", "") for r in rels}
        if not sheets:
            raise TableError("the workbook has no sheets")
        chosen = sheets[0] if sheet is None else next((s for s in sheets if s[0] == sheet), None)
        if chosen is None:
            raise TableError(f"no sheet named {sheet!r}; sheets: {', '.join(s[0] for s in sheets)}")
        target = targets.get(chosen[1], "").lstrip("/")
        member = target if target.startswith("xl/") else f"xl/{target}"
        rows: list[list[str]] = []
        for _event, elem in ElementTree.iterparse(zf.open(member)):
            if elem.tag != f"{{{_NS['m']}}}row":
                continue
            row: list[str] = []
            for c in elem.findall("m:c", _NS):
                col = _column_index(c.get("r", "")) if c.get("r") else len(row)
                kind, value = c.get("t"), c.find("m:v", _NS)
                if kind == "s" and value is not None:
                    text = shared[int(value.text or 0)]
                elif kind == "inlineStr":
                    text = "".join(t.text or "" for t in c.iter(f"{{{_NS['m']}}}t"))
                elif kind == "b" and value is not None:
                    text = "true" if value.text == "1" else "false"
                else:
                    text = (value.text or "") if value is not None else ""
                row.extend([""] * (col - len(row)))
                row.append(text)
            elem.clear()
            if any(cell.strip() for cell in row):
                rows.append(row)
    if not rows:
        raise TableError(f"sheet {chosen[0]!r} is empty")
    info = {"format": "xlsx", "sheet": chosen[0], "sheets": [s[0] for s in sheets]}
    return rows[0], rows[1:], info


def load_table(
    path: str | Path, *, sheet: str | None = None, delimiter: str | None = None
) -> tuple[list[str], list[list[str]], dict[str, Any]]:
    """``(header, rows, info)`` with every cell as text; rows are padded/cut to the header width
    (``info['ragged_rows']`` counts the rows that needed it)."""
    path = Path(path)
    if not path.is_file():
        raise TableError(f"no such file: {path}")
    suffix = path.suffix.lower()
    if suffix in (".xlsx", ".xlsm"):
        header, rows, info = _read_xlsx(path, sheet)
    elif suffix in (".json", ".jsonl", ".ndjson"):
        header, rows, info = _read_json(path)
    else:
        header, rows, info = _read_delimited(path, delimiter)
    header = [h.strip() or f"column_{i + 1}" for i, h in enumerate(header)]
    width = len(header)
    ragged = 0
    for i, row in enumerate(rows):
        if len(row) != width:
            ragged += 1
            rows[i] = (row + [""] * width)[:width]
    info["ragged_rows"] = ragged
    return header, rows, info


# ---- profiling -----------------------------------------------------------------------------------


def parse_number(text: str) -> float | None:
    """A float for plain numbers, also '1,234.5', '$12' and '45%' (as 45); else None."""
    s = text.strip()
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    s = _CURRENCY.sub("", s)
    try:
        value = float(s)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_date(text: str) -> tuple[datetime, str] | None:
    s = text.strip()
    if len(s) < 6 or not any(ch.isdigit() for ch in s):
        return None
    try:
        return datetime.fromisoformat(s.replace("Z", "+00:00")), "ISO 8601"
    except ValueError:
        pass
    for fmt in DATE_FORMATS:
        try:
            return datetime.strptime(s, fmt), fmt
        except ValueError:
            continue
    return None


def profile_column(name: str, values: list[str]) -> dict[str, Any]:
    present = [v.strip() for v in values if v.strip().lower() not in MISSING]
    col: dict[str, Any] = {"name": name, "rows": len(values), "missing": len(values) - len(present)}
    counts = Counter(present[: _DISTINCT_CAP * 10])
    col["distinct"] = len(counts) if len(counts) < _DISTINCT_CAP else f">={_DISTINCT_CAP}"
    notes: list[str] = []
    if not present:
        col["type"] = "empty"
        return col
    numbers = [n for n in (parse_number(v) for v in present) if n is not None]
    plain = sum(1 for v in present if _is_plain_number(v))
    lowered = {v.lower() for v in counts}
    if lowered <= {"true", "false", "yes", "no", "0", "1", "y", "n", "t", "f"} and len(lowered) <= 2:
        col["type"] = "boolean"
    elif len(numbers) >= 0.95 * len(present):
        integral = all(n.is_integer() for n in numbers)
        col["type"] = "integer" if integral else "number"
        col.update(_numeric_summary(numbers))
        if plain < len(numbers):
            notes.append("some values carry thousands separators, currency or % signs")
        if len(numbers) < len(present):
            bad = [v for v in present if parse_number(v) is None][:3]
            notes.append(f"{len(present) - len(numbers)} non-numeric values, e.g. {bad}")
    else:
        dates = [d for d in (parse_date(v) for v in present[:5000]) if d is not None]
        if dates and len(dates) >= 0.95 * min(len(present), 5000):
            col["type"] = "date"
            stamps = sorted((d for d, _ in dates), key=lambda d: d.replace(tzinfo=None))
            col["min"], col["max"] = _iso(stamps[0]), _iso(stamps[-1])
            formats = Counter(f for _, f in dates)
            col["date_formats"] = dict(formats)
            if {"%d/%m/%Y", "%m/%d/%Y"} & formats.keys():
                notes.append("day/month order is ambiguous; check a value with a day above 12")
        else:
            col["type"] = "text"
            lengths = [len(v) for v in present]
            col["length"] = {"min": min(lengths), "max": max(lengths)}
            if numbers and len(numbers) >= 0.5 * len(present):
                notes.append(f"mostly numbers but {len(present) - len(numbers)} values are not")
    col["top"] = counts.most_common(5)
    if any(v != v.strip() for v in values[:10000] if v):
        notes.append("some values have leading/trailing spaces")
    if notes:
        col["notes"] = notes
    return col


def _iso(value: datetime) -> str:
    midnight = not (value.hour or value.minute or value.second or value.microsecond or value.tzinfo)
    return value.date().isoformat() if midnight else value.isoformat()


def _is_plain_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _numeric_summary(numbers: list[float]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "min": min(numbers),
        "max": max(numbers),
        "mean": statistics.fmean(numbers),
        "median": statistics.median(numbers),
    }
    if len(numbers) > 1:
        out["stdev"] = statistics.stdev(numbers)
        q = statistics.quantiles(numbers, n=4)
        out["q1"], out["q3"] = q[0], q[2]
        iqr = q[2] - q[0]
        outliers = sum(1 for n in numbers if n < q[0] - 3 * iqr or n > q[2] + 3 * iqr) if iqr else 0
        if outliers:
            out["far_outliers"] = outliers
    return out


def profile(path: str | Path, *, sheet: str | None = None, delimiter: str | None = None) -> dict[str, Any]:
    header, rows, info = load_table(path, sheet=sheet, delimiter=delimiter)
    columns = [profile_column(name, [r[i] for r in rows]) for i, name in enumerate(header)]
    warnings: list[str] = []
    dupes = [h for h, n in Counter(header).items() if n > 1]
    if dupes:
        warnings.append(f"duplicate column names: {dupes}")
    if info.get("ragged_rows"):
        warnings.append(f"{info['ragged_rows']} row(s) have a different number of fields than the header")
    dup_rows = len(rows) - len({tuple(r) for r in rows})
    if dup_rows:
        warnings.append(f"{dup_rows} row(s) are exact duplicates of an earlier row")
    for col in columns:
        if col["type"] == "empty":
            warnings.append(f"column {col['name']!r} is empty")
        for note in col.get("notes", ()):
            warnings.append(f"column {col['name']!r}: {note}")
    if info.get("format") == "xlsx":
        warnings.append("Excel dates may appear as serial numbers (days since 1899-12-30)")
    return {"file": str(path), **info, "rows": len(rows), "columns": columns, "warnings": warnings}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e15 else f"{value:.3e}"
    return str(value)


def render(report: dict[str, Any]) -> str:
    lines = [f"# Profile of {report['file']}", ""]
    meta = {k: report[k] for k in ("format", "encoding", "delimiter", "sheet", "records_key") if k in report}
    lines.append(", ".join(f"{k}: {v!r}" for k, v in meta.items()))
    lines.append(f"rows: {report['rows']}, columns: {len(report['columns'])}")
    if report.get("sheets") and len(report["sheets"]) > 1:
        lines.append(f"other sheets: {', '.join(s for s in report['sheets'] if s != report.get('sheet'))}")
    lines += ["", "| column | type | missing | distinct | summary |", "|---|---|---|---|---|"]
    for col in report["columns"]:
        if col["type"] in ("integer", "number"):
            keys = ("min", "median", "mean", "max", "stdev")
            summary = ", ".join(f"{k} {_fmt(col[k])}" for k in keys if k in col)
        elif col["type"] == "date":
            summary = f"{col['min']} → {col['max']}"
        elif col["type"] in ("text", "boolean"):
            summary = ", ".join(f"{str(v)[:30]} ({n})" for v, n in col["top"][:3])
        else:
            summary = ""
        summary = summary.replace("|", "\\|")
        lines.append(f"| {col['name']} | {col['type']} | {col['missing']} | {col['distinct']} | {summary} |")
    lines += ["", "## Warnings", ""]
    lines += [f"- {w}" for w in report["warnings"]] or ["- none"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Profile a CSV/TSV/JSON/JSONL/XLSX table (stdlib only).")
    parser.add_argument("file")
    parser.add_argument("--sheet", help="xlsx: sheet name (default: the first)")
    parser.add_argument("--delimiter", help="CSV delimiter (default: detected)")
    parser.add_argument("--json", action="store_true", help="print the profile as JSON")
    args = parser.parse_args(argv)
    try:
        report = profile(args.file, sheet=args.sheet, delimiter=args.delimiter)
    except (TableError, OSError, KeyError, ElementTree.ParseError) as exc:
        print(f"profile_table.py: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2, default=str) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
