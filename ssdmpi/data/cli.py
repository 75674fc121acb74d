"""``ssdmpi data``: list the datasets and where they are looked for; convert one to the HDF5 layout.

    ssdmpi data list [--json]
    ssdmpi data convert NAME [--path P] --out FILE.h5 [--force] [--compress] [-o KEY=VALUE ...]

``convert`` writes the un-normalised images (see ``ssdmpi/data/hdf5.py``) to a
temporary file next to FILE.h5 and renames it into place; an existing FILE.h5 is
refused unless ``--force``. ``-o`` passes dataset options (``synthetic`` only, e.g.
``-o num_train=50000 -o input_shape=3,32,32``). No MPI: run it as one
process (under mpiexec, ranks other than 0 do nothing).
"""

from __future__ import annotations

import json
import os

from ssdmpi.errors import UserError


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION")
    sub.required = True
    p = sub.add_parser("list", help="the datasets, where each is looked for, and whether it was found")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of text")
    p = sub.add_parser("convert", help="write a dataset to the HDF5 layout (atomically)")
    p.add_argument("name", help="dataset name (see 'ssdmpi data list')")
    p.add_argument("--path", default=None, help="the dataset's directory or file (default: search the usual places)")
    p.add_argument("--out", required=True, help="the .h5 file to write")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--compress", action="store_true", help="gzip-compress the HDF5 datasets (smaller, slower to load)")
    p.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                   help="dataset option, repeatable (synthetic: num_train, num_test, input_shape, num_classes, "
                        "seed, separation)")


def parse_options(pairs) -> dict:
    """``["k=v", ...]`` -> ``{"k": "v"}``; UserError on an item without '='."""
    options = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UserError(f"dataset option '{pair}' must look like KEY=VALUE")
        options[key.strip().replace("-", "_")] = value.strip()
    return options


def sources() -> list[dict]:
    """For each dataset: name, where it is looked for, where it was found (or None), and a note."""
    from ssdmpi.data import datasets

    out = []
    for name in datasets.DATASETS:
        looked = datasets.search_paths(name)
        if name == "digits":
            found = looked[0] if os.path.isfile(looked[0]) else None
            note = "built in (shipped with ssdmpi, works offline); the default"
        elif name == "synthetic":
            found, note = "generated", "seeded, any shape; options via -o"
        elif name == "hdf5":
            found, note = None, "give the file with --path FILE.h5"
        else:
            found = next((p for p in looked if os.path.isdir(p)), None)
            note = "" if found else "to get it, " + datasets.how_to_get(name)
        out.append({"name": name, "looked_in": looked, "found": found, "note": note})
    return out


def _list(args) -> int:
    rows = sources()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        status = f"found: {row['found']}" if row["found"] else "not found"
        if row["name"] == "hdf5":
            status = "any file in the layout of 'ssdmpi data convert'"
        print(f"{row['name']:<14} {status}")
        if row["looked_in"] and row["name"] != "digits":
            print(f"{'':<14} looked in: {', '.join(row['looked_in'])}")
        if row["note"]:
            print(f"{'':<14} {row['note']}")
    return 0


def _convert(args) -> int:
    from ssdmpi.data.datasets import load_raw
    from ssdmpi.data.hdf5 import write_hdf5

    if os.path.exists(args.out) and not args.force:   # before the (possibly long) read
        raise UserError(f"{args.out} exists; choose another --out or pass --force to replace it")
    raw = load_raw(args.name, args.path, **parse_options(args.option))
    write_hdf5(args.out, raw, force=args.force, compress=args.compress)
    shape = "x".join(str(s) for s in raw.train_images.shape[1:])
    print(f"wrote {args.out}: {raw.name}, {len(raw.train_images)} train / {len(raw.test_images)} test, "
          f"{shape} {raw.train_images.dtype}, {raw.num_classes} classes (from {raw.source})")
    return 0


def run(args) -> int:
    from ssdmpi.comm.abort import launcher_rank

    if launcher_rank() != 0:   # started under mpiexec by mistake: one writer, one report
        return 0
    return _list(args) if args.data_command == "list" else _convert(args)
