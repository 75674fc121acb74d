"""Summary statistics shared by the bench modules."""

from __future__ import annotations

import statistics


def median(values):
    """The median of the values that are not None (None when there are none)."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None
