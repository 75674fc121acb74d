"""The dataset names ``load_dataset`` knows (``ssdmpi/data/datasets.py`` reads them), kept in a
module that imports nothing, so that ``ssdmpi train --help`` can list them without NumPy.

Classification datasets (images or feature vectors with class labels) load as a ``Dataset``,
text datasets (byte-level token streams for a language model) as a ``TextDataset``."""

CLASSIFICATION_DATASETS = ("digits", "fashion-mnist", "mnist", "cifar10", "hdf5", "synthetic")
TEXT_DATASETS = ("devils-dictionary", "kjv", "text")
DATASETS = CLASSIFICATION_DATASETS + TEXT_DATASETS
