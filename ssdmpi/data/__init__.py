"""Datasets, the sharded resumable loader, augmentation."""
