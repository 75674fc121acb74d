"""Datasets, the sharded resumable loader, augmentation.

Public API (imported lazily, so ``ssdmpi --help`` does not pay for NumPy or h5py)::

    load_dataset(name, path=None, **options) -> Dataset      # ssdmpi.data.datasets
    Dataset(name, train_x, train_y, test_x, test_y, input_shape, num_classes, ...)
    ShardedLoader(x, y, batch_size, rank, world_size, seed, augment=None, prefetch=False)
    evaluation_shard(n, rank, world_size) -> slice            # ssdmpi.data.loader
    Augment(pad=4, flip=True, seed=None), parse_augment(spec) # ssdmpi.data.augment
    DATASETS                                                  # the dataset names
    clear_cache()                                             # drop the in-memory dataset cache

See ``ssdmpi/data/datasets.py`` for the normalisation and where each dataset is
looked for, ``ssdmpi/data/hdf5.py`` for the HDF5 layout, and
``ssdmpi/data/loader.py`` for the sharding and remainder policy.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Dataset": "ssdmpi.data.datasets",
    "DATASETS": "ssdmpi.data.names",
    "clear_cache": "ssdmpi.data.datasets",
    "RawSplits": "ssdmpi.data.datasets",
    "load_dataset": "ssdmpi.data.datasets",
    "from_arrays": "ssdmpi.data.datasets",
    "load_raw": "ssdmpi.data.datasets",
    "search_paths": "ssdmpi.data.datasets",
    "ShardedLoader": "ssdmpi.data.loader",
    "evaluation_shard": "ssdmpi.data.loader",
    "Augment": "ssdmpi.data.augment",
    "parse_augment": "ssdmpi.data.augment",
    "write_hdf5": "ssdmpi.data.hdf5",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'ssdmpi.data' has no attribute {name!r}")
