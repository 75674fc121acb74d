"""The check script's records: each part's checks as it goes, and the report of the whole run.

A part (one subprocess) writes its checks through ``PartLog``: the part's JSON file is rewritten
after every check, atomically, so a part killed at its time budget still leaves what it found.
The runner gathers the parts into a ``Report``, rewritten (``report.json`` and ``report.md``
in the output folder) after every part, so a run killed from outside leaves the parts so far.

A check is ``{"name", "ok", "value", "goal", "detail"}``: ``ok`` True (holds), False (does
not) or None (skipped: not applicable here, with the reason in ``detail``). A part's
``status``: ``fail`` if a check failed or the part crashed or ran out of time, ``skip`` if every
check was skipped, else ``pass``. The run passes when no part failed.
"""

from __future__ import annotations

import json
import os
import time


def write_atomically(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (no half-written file)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class PartLog:
    """The checks of one part, saved to ``path`` (JSON) after each one. ``path=None``: not saved."""

    def __init__(self, path: str | None, part: str):
        self.path, self.data = path, {"part": part, "checks": [], "notes": [], "started": time.time()}
        self._save()

    def check(self, name: str, ok, value=None, goal=None, detail: str = "") -> bool:
        """Record one check (``ok``: True, False, or None for skipped); returns ``bool(ok)``."""
        self.data["checks"].append({"name": name, "ok": None if ok is None else bool(ok), "value": _plain(value),
                                    "goal": goal, "detail": detail})
        self._save()
        return bool(ok)

    def skip(self, name: str, why: str) -> None:
        """Record a check that does not apply here, and why."""
        self.check(name, None, detail=why)

    def note(self, text: str) -> None:
        """Record a fact worth reporting that is not a check (versions, which transport, ...)."""
        self.data["notes"].append(text)
        self._save()

    def _save(self) -> None:
        if self.path is not None:
            write_atomically(self.path, json.dumps(self.data, indent=1))


def _plain(value):
    """``value`` as JSON can hold it (NumPy scalars to Python numbers; dicts and lists kept)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    return value


def part_status(part: dict) -> str:
    """``pass``, ``fail`` or ``skip`` of one part's record (see the module docstring)."""
    checks = part.get("checks", [])
    if part.get("error") or any(c["ok"] is False for c in checks):
        return "fail"
    if checks and all(c["ok"] is None for c in checks):
        return "skip"
    return "pass" if checks else "fail"   # a part that checked nothing did not run


class Report:
    """The whole run: ``header`` facts, then one record per part; ``save()`` writes both files.
    ``verdict``: a summary that replaces the counts (the run could not start: "no GPU: ...")."""

    def __init__(self, out_dir: str, header: dict, verdict: str | None = None):
        os.makedirs(out_dir, exist_ok=True)
        self.out_dir, self.header, self.parts, self.verdict = out_dir, dict(header), [], verdict

    def add(self, part: dict) -> None:
        """Add a part's record (``PartLog.data`` plus ``seconds``, ``budget_s``, ``error``), and save."""
        part = dict(part)
        part["status"] = part_status(part)
        self.parts.append(part)
        self.save()

    @property
    def passed(self) -> bool:
        """True when parts ran and none failed."""
        return self.verdict is None and bool(self.parts) and all(p["status"] != "fail" for p in self.parts)

    def summary(self) -> str:
        """One line: the verdict and the parts' counts."""
        if self.verdict is not None:
            return self.verdict
        counts = {s: sum(p["status"] == s for p in self.parts) for s in ("pass", "fail", "skip")}
        verdict = "PASS" if self.passed else "FAIL"
        return f"{verdict}: {counts['pass']} parts passed, {counts['fail']} failed, {counts['skip']} skipped"

    def save(self) -> None:
        data = {**self.header, "summary": self.summary(), "passed": self.passed, "parts": self.parts}
        write_atomically(os.path.join(self.out_dir, "report.json"), json.dumps(data, indent=1))
        write_atomically(os.path.join(self.out_dir, "report.md"), self.markdown())

    def markdown(self) -> str:
        """The report for people: header, summary, then a table of checks per part."""
        lines = ["# ssdmpi GPU check", ""]
        lines += [f"- {k}: {v}" for k, v in self.header.items()]
        lines += ["", f"**{self.summary()}**", ""]
        for p in self.parts:
            lines += [f"## {p['part']}: {p['status']} ({p.get('seconds', 0):.0f} s of {p.get('budget_s', '?')} s)", ""]
            if p.get("error"):
                lines += [f"Error: `{p['error']}`", ""]
            lines += [f"- {n}" for n in p.get("notes", [])]
            if p.get("notes"):
                lines.append("")
            if p.get("checks"):
                lines += ["| check | result | value | goal | detail |", "|---|---|---|---|---|"]
                for c in p["checks"]:
                    result = {True: "ok", False: "**FAIL**", None: "skipped"}[c["ok"]]
                    lines.append(f"| {_cell(c['name'])} | {result} | {_cell(c['value'])} | {_cell(c['goal'])} "
                                 f"| {_cell(c['detail'])} |")
                lines.append("")
        return "\n".join(lines) + "\n"


def _cell(value) -> str:
    """A table cell: numbers to 4 significant digits, nothing for None, no pipes or newlines."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        value = ", ".join(f"{k}={_cell(v)}" for k, v in value.items())
    return str(value).replace("|", "/").replace("\n", " ")
