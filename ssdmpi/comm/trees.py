"""State trees on the wire: a pickled skeleton, then each array as one raw buffer.

A *state tree* is what ``state_dict()`` methods return: nested dicts (and lists) whose
leaves are arrays (NumPy, or device arrays, copied to the host) and plain values (numbers,
strings, None). ``split(tree, arrays)`` replaces every array by a placeholder naming its
index, dtype and shape and appends the array to ``arrays`` (depth-first, in insertion
order); ``join(skeleton, arrays)`` puts them back. ``send_tree``/``recv_tree`` move one tree
point to point: the skeleton pickled (small), the array data as raw bytes (never pickled).
The Communicator's ``gather_trees``/``scatter_trees`` are the interface; these helpers are
the mechanism and take a raw mpi4py communicator.
"""

from __future__ import annotations

import numpy as np


def is_array(v) -> bool:
    """A NumPy array or a device array (anything exposing ``__cuda_array_interface__``)."""
    return isinstance(v, np.ndarray) or hasattr(v, "__cuda_array_interface__")


def _host(a) -> np.ndarray:
    from ssdmpi.backend import to_host

    return np.ascontiguousarray(to_host(a))


def _is_placeholder(node) -> bool:
    return isinstance(node, dict) and "__array__" in node and set(node) == {"__array__", "dtype", "shape"}


def split(tree, arrays: list):
    """``tree`` with each array replaced by a placeholder; the (host) arrays appended to ``arrays``."""
    if isinstance(tree, dict):
        return {k: split(v, arrays) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)) and any(is_array(x) or isinstance(x, (dict, list, tuple)) for x in tree):
        return {"__list__": [split(v, arrays) for v in tree]}
    if is_array(tree):
        a = _host(tree)
        arrays.append(a)
        return {"__array__": len(arrays) - 1, "dtype": a.dtype.str, "shape": list(a.shape)}
    return tree


def join(skeleton, arrays: list):
    """The tree ``split`` took apart, with ``arrays`` back in their places."""
    if isinstance(skeleton, dict):
        if _is_placeholder(skeleton):
            return arrays[skeleton["__array__"]]
        if set(skeleton) == {"__list__"}:
            return [join(v, arrays) for v in skeleton["__list__"]]
        return {k: join(v, arrays) for k, v in skeleton.items()}
    return skeleton


def placeholders(skeleton) -> list:
    """The array placeholders of ``skeleton`` in the order ``split`` appended the arrays."""
    found: list = []

    def visit(node):
        if _is_placeholder(node):
            found.append(node)
        elif isinstance(node, dict):
            for v in (node["__list__"] if set(node) == {"__list__"} else node.values()):
                visit(v)
        elif isinstance(node, list):
            for v in node:
                visit(v)

    visit(skeleton)
    return found


def send_tree(comm, tree, dest: int, tag: int) -> None:
    """Send ``tree`` to ``dest`` over the mpi4py communicator ``comm`` (blocking)."""
    arrays: list = []
    comm.send(split(tree, arrays), dest=dest, tag=tag)
    for a in arrays:
        if a.size:
            comm.Send(a.reshape(-1).view(np.uint8), dest=dest, tag=tag)


def recv_tree(comm, source: int, tag: int):
    """Receive the tree ``send_tree`` sent from ``source``; its arrays are new NumPy arrays."""
    skeleton = comm.recv(source=source, tag=tag)
    arrays = []
    for node in placeholders(skeleton):
        a = np.empty(node["shape"], dtype=np.dtype(node["dtype"]))
        if a.size:
            comm.Recv(a.reshape(-1).view(np.uint8), source=source, tag=tag)
        arrays.append(a)
    return join(skeleton, arrays)
