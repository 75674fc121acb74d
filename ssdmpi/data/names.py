"""The dataset names ``load_dataset`` knows (``ssdmpi/data/datasets.py`` reads them), kept in a
module that imports nothing, so that ``ssdmpi train --help`` can list them without NumPy."""

DATASETS = ("digits", "fashion-mnist", "mnist", "cifar10", "hdf5", "synthetic")
