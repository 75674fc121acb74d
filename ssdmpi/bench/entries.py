"""The entries of ``ssdmpi bench report`` (``docs/results/*.json``, the format in ``ssdmpi/bench/report.py``'s
docstring): each loaded with the result files it names, the rows a table or a claim selects from them,
and a claim's value. Every error is one line naming the entry.
"""

from __future__ import annotations

import json
from pathlib import Path

from ssdmpi.bench.result import FORMAT
from ssdmpi.errors import UserError

# ----------------------------------------------------------------------------- loading

def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object")
    return data


class Entry:
    """One section of the page: its entry file and the result files it names (loaded)."""

    def __init__(self, path: Path):
        self.path = path
        self.spec = _read_json(path)
        if not isinstance(self.spec.get("title"), str):
            raise UserError(f"{path}: an entry needs a \"title\" (see ssdmpi/bench/report.py)")
        self.results, self.result_paths = {}, {}
        for label, rel in self.spec.get("results", {}).items():
            target = (path.parent / rel).resolve()
            result = _read_json(target)
            if result.get("format") != FORMAT:
                raise UserError(f"{target}: not a result file (\"format\" is not {FORMAT!r}; ssdmpi/bench/result.py)")
            self.results[label], self.result_paths[label] = result, target

    @property
    def title(self) -> str:
        return self.spec["title"]

    def where(self) -> str:
        """The entry, for error messages."""
        return f"{self.path.name} ({self.title!r})"

    def result(self, label: str) -> dict:
        if label not in self.results:
            raise UserError(f"{self.where()}: no result labelled {label!r} in its \"results\"")
        return self.results[label]


def load_entries(results_dir: Path) -> list:
    """The entries of ``results_dir`` (``*.json``), sorted by ``order`` then file name."""
    entries = [Entry(p) for p in sorted(results_dir.glob("*.json"))]
    return sorted(entries, key=lambda e: (e.spec.get("order", 0), e.path.name))


# ----------------------------------------------------------------------------- rows and values

def _matches(row: dict, where: dict) -> bool:
    return all(row.get(key) in (want if isinstance(want, list) else [want]) for key, want in where.items())


def select_rows(entry: Entry, source: dict) -> list:
    """The rows of ``source`` (``result``, ``path``, ``where``, ``add``; module docstring)."""
    data = entry.result(source["result"])
    for part in (p for p in source.get("path", "rows").split(".") if p):     # "": the result object itself
        if not isinstance(data, dict) or part not in data:
            raise UserError(f"{entry.where()}: result {source['result']!r} has no {source.get('path', 'rows')!r}")
        data = data[part]
    rows = [data] if isinstance(data, dict) else data
    return [{**row, **source.get("add", {})} for row in rows if _matches(row, source.get("where", {}))]


def claim_value(entry: Entry, spec: dict) -> float:
    """The number a claim value ``spec`` names (module docstring)."""
    if "ratio" in spec or "difference" in spec:
        a, b = (claim_value(entry, s) for s in spec.get("ratio") or spec["difference"])
        return a / b if "ratio" in spec else a - b
    if "mean of" in spec:
        values = [claim_value(entry, s) for s in spec["mean of"]]
        if not values:
            raise UserError(f"{entry.where()}: \"mean of\" needs at least one value")
        return sum(values) / len(values)
    rows = select_rows(entry, spec)
    values = []
    for row in rows:        # a list of numbers in one cell (one per run) counts as that many values
        cell = row.get(spec["field"])
        values += cell if isinstance(cell, list) else [cell]
    if any(not isinstance(v, (int, float)) or isinstance(v, bool) for v in values) or not values:
        raise UserError(f"{entry.where()}: {spec['field']!r} where {spec.get('where', {})} in result "
                        f"{spec['result']!r}: {len(values)} row(s), values {values}; expected numbers")
    agg = spec.get("agg", "one")
    if agg == "one" and len(values) != 1:
        raise UserError(f"{entry.where()}: {spec.get('where', {})} matches {len(values)} rows of result "
                        f"{spec['result']!r}; narrow it or give \"agg\"")
    if agg not in ("one", "min", "max", "maxabs", "mean"):
        raise UserError(f"{entry.where()}: \"agg\": {agg!r}; use min, max, maxabs or mean")
    return {"one": values[0], "min": min(values), "max": max(values), "maxabs": max(abs(v) for v in values),
            "mean": sum(values) / len(values)}[agg]


def fmt(value, template: str = "{}", scale: float = 1) -> str:
    """``value`` (times ``scale`` if a number) through ``template``: blank for None, a list's items
    joined with commas, a value the template does not fit as it is."""
    if value is None or value == "":
        return ""
    if isinstance(value, list):
        return ", ".join(fmt(v, template, scale) for v in value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = value * scale if scale != 1 else value
    try:
        return template.format(value)
    except (ValueError, TypeError):
        return str(value)
