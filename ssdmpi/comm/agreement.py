"""Helpers for cross-rank agreement: compare gathered signatures, pick the error to report.

Free of MPI so they can be tested serially; the Communicator gathers the inputs on its
control communicator and raises the collective ``UserError`` these helpers describe.
"""

from __future__ import annotations

_MISSING = object()


def _show(value) -> str:
    text = "(missing)" if value is _MISSING else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def signature_mismatch(signatures: list) -> str | None:
    """None when every rank's signature dict equals rank 0's; else one line naming the
    ranks that differ from rank 0 and the differing keys with both values."""
    reference = signatures[0]
    groups: dict = {}                # differing (key, theirs) tuple -> ranks, so equal diffs are told once
    for rank, signature in enumerate(signatures[1:], start=1):
        keys = sorted((k for k in set(reference) | set(signature)
                       if reference.get(k, _MISSING) != signature.get(k, _MISSING)), key=str)
        if keys:
            diff = tuple((k, _show(signature.get(k, _MISSING))) for k in keys)
            groups.setdefault(diff, []).append(rank)
    if not groups:
        return None
    parts = []
    for diff, ranks in list(groups.items())[:3]:
        who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
        keys = "; ".join(f"{k}: rank 0 has {_show(reference.get(k, _MISSING))}, {who} {theirs}"
                         for k, theirs in diff[:4])
        parts.append(f"{who} differ{'s' if len(ranks) == 1 else ''} from rank 0 in {keys}")
    if len(groups) > 3:
        parts.append(f"and {len(groups) - 3} more group(s) of ranks")
    return ("ranks disagree on their setup: " + " | ".join(parts)
            + " — every rank must run the same model, data type and algorithm settings")


def first_error(messages: list) -> str | None:
    """None when no rank reported an error; else the lowest failing rank's message, naming it."""
    failed = [(rank, m) for rank, m in enumerate(messages) if m is not None]
    if not failed:
        return None
    rank, message = failed[0]
    if len(messages) == 1:
        return message
    more = f" (and {len(failed) - 1} other rank(s) failed too)" if len(failed) > 1 else ""
    return f"rank {rank}: {message}{more}"
