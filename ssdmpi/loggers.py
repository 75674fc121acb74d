"""The loggers beside ``metrics.jsonl`` (rank 0): CSV tables (``--csv``) and TensorBoard
event files (``--tensorboard``). ``metrics.jsonl`` stays the record of a run; these are views
of its ``step`` and ``eval`` records (fields: ssdmpi/metrics.py) for other tools.

``--csv``: ``RUN/steps.csv`` (one row per ``step`` record) and ``RUN/evals.csv`` (one row per
``eval`` record), so each file has one kind of row and a spreadsheet reads it as one table.
Columns: ``step, epoch, stage, time, train_s``, then the record's other fields in the order
they first appear; ``kind`` is left out. The header is stable: a field that appears later in
a run (``test_acc_local`` once the delay stage starts) widens the file once (it is rewritten
through a temporary file, the earlier rows left blank in that column). Cells: numbers as
Python writes them (floats round-trip exactly, as in the JSON), a missing value or
NaN/inf as an empty cell, text as is. On every start the tables are rebuilt from
``metrics.jsonl`` (which resume has already trimmed to the checkpoint's step), so a resumed
run has one header, no duplicate and no lost row, even if earlier parts ran without
``--csv``. ``metrics.jsonl`` is read by ``ssdmpi/rundir.py`` (its rule for a line cut short).

``--tensorboard``: event files in ``RUN/tensorboard/`` (``tensorboard --logdir RUN``), written
by tensorboardX (``pip install 'ssdmpi[tensorboard]'``; no PyTorch needed): every number of a
step record as the scalar ``train/<field>``, of an eval record as ``eval/<field>``, at the
record's step, and the resolved configuration as the text ``config``. Each start writes a
new event file that begins with a restart marker at (resumed step + 1), so TensorBoard
hides the events an earlier attempt logged past the checkpoint it resumed from.

``check_available(cfg)`` raises the ``UserError`` for a missing tensorboardX before a run
starts; ``open_loggers`` builds the loggers a config asks for.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os

from ssdmpi import rundir
from ssdmpi.errors import UserError

# The trainer (``ssdmpi/run/``) reads the records through these names: ``ssdmpi/rundir.py``'s reader.
record_lines, read_records = rundir.record_lines, rundir.read_records

CSV_FILES = {"step": "steps.csv", "eval": "evals.csv"}
LEAD_COLUMNS = ("step", "epoch", "stage", "time", "train_s")
TENSORBOARD_DIR = "tensorboard"
TENSORBOARD_PREFIX = {"step": "train", "eval": "eval"}
PIP_TENSORBOARD = "pip install 'ssdmpi[tensorboard]'"


def check_available(cfg) -> None:
    """Raise ``UserError`` (one line, naming the pip command) when ``cfg`` asks for a logger
    whose package is not installed."""
    if getattr(cfg, "tensorboard", False):
        try:
            import tensorboardX  # noqa: F401
        except ImportError:
            raise UserError(f"--tensorboard needs tensorboardX, which is not installed: {PIP_TENSORBOARD} "
                            "(or pip install tensorboardX)") from None


def open_loggers(cfg, resume_step: int | None) -> list:
    """The loggers ``cfg`` asks for, opened in ``cfg.run_dir`` (rank 0, after ``metrics.jsonl``
    was trimmed to ``resume_step``; None: a fresh run)."""
    loggers = []
    if getattr(cfg, "csv", False):
        loggers.append(CsvLog(cfg.run_dir))
    if getattr(cfg, "tensorboard", False):
        loggers.append(TensorBoardLog(cfg.run_dir, resume_step or 0, cfg.to_yaml()))
    return loggers


# ------------------------------------------------------------------------------------ CSV

def cell(value) -> str:
    """One CSV cell: '' for missing or non-finite, repr for floats (round-trips), JSON for lists."""
    from ssdmpi.metrics import _clean

    value = _clean(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ""
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def columns_for(rows: list[dict], start: tuple = ()) -> list[str]:
    """The header for ``rows``: ``start`` (an existing header) or ``LEAD_COLUMNS``, then every other
    field in the order it first appears; ``kind`` left out."""
    columns = list(start) or [c for c in LEAD_COLUMNS if any(c in r for r in rows)]
    for row in rows:
        columns += [k for k in row if k != "kind" and k not in columns]
    return columns


class CsvTable:
    """One CSV file of one record kind: a stable header, rows appended and flushed."""

    def __init__(self, path: str, rows: list[dict]):
        self.path, self._f, self.columns = path, None, []
        if rows:
            self._rewrite(columns_for(rows), rows)
        elif os.path.exists(path):
            os.unlink(path)     # a table of records metrics.jsonl no longer holds

    def write(self, record: dict) -> None:
        if self._f is None or any(k != "kind" and k not in self.columns for k in record):
            self._rewrite(columns_for([record], self.columns), self._read() + [record])
            return
        self._f.write(self._line(record))
        self._f.flush()

    def _line(self, record: dict) -> str:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow([cell(record.get(c)) for c in self.columns])
        return buf.getvalue()

    def _read(self) -> list[dict]:
        """The rows written so far, as dicts of strings ('' cells dropped)."""
        if self._f is None:
            return []
        with open(self.path, newline="", encoding="utf-8") as f:
            return [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(f)]

    def _rewrite(self, columns: list[str], rows: list[dict]) -> None:
        """The whole file, header first, through a temporary file and a rename."""
        from ssdmpi.metrics import atomic_write

        self.close()
        self.columns = columns
        header = io.StringIO()
        csv.writer(header, lineterminator="\n").writerow(columns)
        atomic_write(self.path, header.getvalue() + "".join(self._line(r) for r in rows))
        self._f = open(self.path, "a", encoding="utf-8", newline="")

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class CsvLog:
    """``steps.csv`` and ``evals.csv`` in ``run_dir``, rebuilt from its ``metrics.jsonl``."""

    def __init__(self, run_dir: str):
        past = {kind: [] for kind in CSV_FILES}
        for record in rundir.read_records(rundir.metrics_path(run_dir)):
            if record.get("kind") in past:
                past[record["kind"]].append(record)
        self.tables = {kind: CsvTable(os.path.join(run_dir, name), past[kind]) for kind, name in CSV_FILES.items()}

    def write(self, record: dict) -> None:
        table = self.tables.get(record.get("kind"))
        if table is not None:
            table.write(record)

    def close(self) -> None:
        for table in self.tables.values():
            table.close()


# ---------------------------------------------------------------------------- TensorBoard

def scalars(record: dict) -> dict:
    """``{tag: value}`` of a step or eval record's finite numbers (``train/loss``, ``eval/test_acc``)."""
    prefix = TENSORBOARD_PREFIX.get(record.get("kind"))
    if prefix is None:
        return {}
    out = {}
    for key, value in record.items():
        if key in ("kind", "step") or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[f"{prefix}/{key}"] = float(value)
    return out


class TensorBoardLog:
    """Event files in ``run_dir/tensorboard`` through tensorboardX, flushed after every record."""

    def __init__(self, run_dir: str, resume_step: int, config_yaml: str):
        from tensorboardX import SummaryWriter

        # purge_step: TensorBoard drops earlier files' events at steps >= it (a crashed
        # attempt's records past the checkpoint this run resumed from).
        self.writer = SummaryWriter(logdir=os.path.join(run_dir, TENSORBOARD_DIR), purge_step=resume_step + 1)
        self.writer.add_text("config", "```\n" + config_yaml + "```", global_step=resume_step)
        self.writer.flush()

    def write(self, record: dict) -> None:
        values = scalars(record)
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, global_step=int(record["step"]))
        if values:
            self.writer.flush()

    def close(self) -> None:
        self.writer.close()
