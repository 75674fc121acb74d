"""``ssdmpi data``: list the datasets and where they are looked for; convert one to the HDF5 layout.

    ssdmpi data list [--json]
    ssdmpi data convert NAME [--data-path P] --out FILE.h5 [--force] [--compress] [-o KEY=VALUE ...]
    ssdmpi data convert text FILE... --out FILE.h5 [--val-fraction F] [--separator S] [--context T]
                                     [--licence L] [--description D] [--force] [--compress]

``convert`` writes the un-normalised images (see ``ssdmpi/data/hdf5.py``), or for a text
dataset its byte-level tokens (``ssdmpi/data/text_hdf5.py``), to a temporary file next to
FILE.h5 and renames it into place; an existing FILE.h5 is refused unless ``--force``. ``-o``
passes dataset options (``synthetic`` only, e.g. ``-o num_train=50000 -o input_shape=3,32,32``).
``convert text`` joins UTF-8 text files (``ssdmpi/data/corpora.py``) with ``--separator``
between consecutive files, keeps the last ``--val-fraction`` of the bytes as the val split,
and refuses a corpus whose train split, or a non-empty val split, is shorter than one window of
``--context`` + 1 tokens. The corpus is named after FILE.h5 (its stem). No MPI: run it as one
process (under mpiexec, ranks other than 0 do nothing).
"""

from __future__ import annotations

import json
import os

from ssdmpi.errors import UserError

VAL_FRACTION = 0.1   # convert text's default (that of the built-in corpora: ssdmpi/data/corpora.py)
MIN_CONTEXT = 256    # convert text's default --context
TEXT_FLAGS = ("val_fraction", "separator", "context", "licence", "description")


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION")
    sub.required = True
    p = sub.add_parser("list", help="the datasets, where each is looked for, and whether it was found")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of text")
    p = sub.add_parser("convert", help="write a dataset to the HDF5 layout (atomically)")
    p.add_argument("name", help="dataset name (see 'ssdmpi data list')")
    p.add_argument("--data-path", metavar="PATH", default=None,
                   help="the dataset's directory or file, as for ssdmpi train (default: search the usual places)")
    p.add_argument("--out", required=True, help="the .h5 file to write")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--compress", action="store_true", help="gzip-compress the HDF5 datasets (smaller, slower to load)")
    p.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                   help="dataset option, repeatable (synthetic: num_train, num_test, input_shape, num_classes, "
                        "seed, separation)")
    p.add_argument("files", nargs="*", metavar="FILE", help="text: the UTF-8 text files, in order, right after 'text'")
    p.add_argument("--val-fraction", type=float, default=None, metavar="F",
                   help=f"text: the last F of the bytes are the val split (default {VAL_FRACTION})")
    p.add_argument("--separator", default=None, metavar="S",
                   help=r"text: put between consecutive files; escapes \n \t \r \\ \xHH (default \n)")
    p.add_argument("--context", type=int, default=None, metavar="T",
                   help=f"text: refuse a corpus too small for one window of T+1 tokens (default {MIN_CONTEXT})")
    p.add_argument("--licence", default=None, help="text: the texts' licence, stored with the corpus")
    p.add_argument("--description", default=None, help="text: what the texts are, stored with the corpus")


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
    from ssdmpi.data import corpora, datasets
    from ssdmpi.data.digits import SPLIT_SEED

    out = []
    for name in datasets.DATASETS:
        looked = datasets.search_paths(name)
        if name == "digits":
            found = looked[0] if os.path.isfile(looked[0]) else None
            note = ("built in (shipped with ssdmpi, works offline); the default. Split: 1,437 train / 360 test, "
                    f"stratified by class, shuffled with the fixed seed {SPLIT_SEED} (the same on every machine; "
                    "the rule: ssdmpi/data/digits.py)")
        elif name == "synthetic":
            found, note = "generated", "seeded, any shape; options via -o"
        elif name == "hdf5":
            found, note = None, "train on a file with --dataset hdf5 --data-path FILE.h5"
        elif name == "devils-dictionary":
            found = looked[0] if os.path.isfile(looked[0]) else None
            note = f"text, built in (shipped with ssdmpi, works offline); licence: {corpora.DEVIL_LICENCE}"
        elif name == "kjv":
            found = next((p for p in looked if os.path.isfile(p)), None)
            note = f"text; licence: {corpora.KJV_LICENCE}"
            if not found:
                note += "; to get it, " + datasets.how_to_get(name)
        elif name == "text":
            found, note = None, ("text; train on a file with --dataset text --data-path FILE.h5 (write one with "
                                 "'ssdmpi data convert text')")
        else:
            found = next((p for p in looked if os.path.isdir(p)), None)
            note = "" if found else "to get it, " + datasets.how_to_get(name)
        out.append({"name": name, "kind": datasets.dataset_kind(name), "looked_in": looked, "found": found,
                    "note": note})
    return out


def _list(args) -> int:
    rows = sources()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        status = f"found: {row['found']}" if row["found"] else "not found"
        if row["name"] in ("hdf5", "text"):
            status = f"any file in the {'text ' if row['name'] == 'text' else ''}layout of 'ssdmpi data convert'"
        print(f"{row['name']:<17} {status}")
        if row["looked_in"] and row["name"] not in ("digits", "devils-dictionary"):
            print(f"{'':<17} looked in: {', '.join(row['looked_in'])}")
        if row["note"]:
            print(f"{'':<17} {row['note']}")
    return 0


def _convert(args) -> int:
    from ssdmpi.data.datasets import canonical_name, dataset_kind, load_raw
    from ssdmpi.data.hdf5 import write_hdf5

    name = canonical_name(args.name)
    if args.files and name != "text":
        raise UserError(f"dataset '{name}' takes no FILE arguments (got {' '.join(args.files)}); "
                        f"use --data-path for its directory or file")
    given = [flag for flag in TEXT_FLAGS if getattr(args, flag) is not None]
    if given and name != "text":
        raise UserError(f"--{given[0].replace('_', '-')} is for 'ssdmpi data convert text FILE...' only")
    if os.path.exists(args.out) and not args.force:   # before the (possibly long) read
        raise UserError(f"{args.out} exists; choose another --out or pass --force to replace it")
    if dataset_kind(name) == "text":
        return _convert_text(args, name)
    raw = load_raw(args.name, args.data_path, **parse_options(args.option))
    write_hdf5(args.out, raw, force=args.force, compress=args.compress)
    shape = "x".join(str(s) for s in raw.train_images.shape[1:])
    print(f"wrote {args.out}: {raw.name}, {len(raw.train_images)} train / {len(raw.test_images)} test, "
          f"{shape} {raw.train_images.dtype}, {raw.num_classes} classes (from {raw.source})")
    return 0


def _convert_text(args, name: str) -> int:
    from ssdmpi.data import corpora
    from ssdmpi.data.datasets import load_dataset, reject_options
    from ssdmpi.data.text import check_context, encode, from_tokens
    from ssdmpi.data.text_hdf5 import write_text_hdf5

    reject_options(name, parse_options(args.option))
    if name != "text":      # a named corpus: its tokens and split as load_dataset gives them
        dataset = load_dataset(name, args.data_path)
        write_text_hdf5(args.out, dataset, force=args.force, compress=args.compress)
        print(f"wrote {args.out}: {dataset.summary()}")
        return 0
    if args.data_path:
        raise UserError("'ssdmpi data convert text' takes the text files as arguments, not --data-path")
    fraction = VAL_FRACTION if args.val_fraction is None else args.val_fraction
    if not 0 <= fraction < 1:
        raise UserError(f"--val-fraction must be in [0, 1), got {fraction}")
    context = check_context(MIN_CONTEXT if args.context is None else args.context)
    separator = corpora.parse_separator("\\n" if args.separator is None else args.separator)
    train, val = corpora.split(encode(corpora.read_text_files(args.files, separator)), fraction)
    window = context + 1
    if len(train) < window:
        raise UserError(f"the corpus gives a train split of {len(train):,} bytes, fewer than one window of {window} "
                        f"(--context {context} + 1); give more text or a smaller --context")
    if fraction > 0 and len(val) < window:
        raise UserError(f"the corpus gives a val split of {len(val):,} bytes (--val-fraction {fraction}), fewer "
                        f"than one window of {window} (--context {context} + 1); give more text, a larger "
                        "--val-fraction, a smaller --context, or --val-fraction 0")
    stem = os.path.splitext(os.path.basename(args.out))[0]
    dataset = from_tokens(stem, train, val, source=", ".join(args.files), licence=args.licence or "",
                          description=args.description or "")
    write_text_hdf5(args.out, dataset, force=args.force, compress=args.compress)
    print(f"wrote {args.out}: {dataset.num_train_tokens:,} train / {dataset.num_val_tokens:,} val byte tokens "
          f"from {len(args.files)} file(s)")
    return 0


def run(args) -> int:
    from ssdmpi.comm.abort import launcher_rank

    if launcher_rank() != 0:   # started under mpiexec by mistake: one writer, one report
        return 0
    return _list(args) if args.data_command == "list" else _convert(args)
