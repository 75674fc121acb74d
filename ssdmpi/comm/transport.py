"""How GPU buffers reach MPI: staged through pinned host memory, or passed as device buffers."""

from __future__ import annotations

import os
import shutil
import subprocess

TRANSPORTS = ("auto", "cuda-aware", "host")


def _open_mpi_built_with_cuda() -> bool | None:
    """Open MPI's own answer (``ompi_info``), or None when it cannot be asked."""
    tool = shutil.which("ompi_info")
    if tool is None:
        return None
    try:
        out = subprocess.run([tool, "--parsable", "--all"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        if "mpi_built_with_cuda_support:value" in line:
            return line.strip().endswith("true")
    return None


def cuda_aware_verdict(transport: str = "auto") -> str:
    """One line: whether device buffers go to MPI directly, and on whose word.

    An explicit ``--transport`` or ``SSDMPI_TRANSPORT`` decides. ``auto`` is conservative:
    Open MPI documents ``Iallreduce`` on GPU buffers as unsupported even when built with
    CUDA, so ``auto`` stages through pinned host memory unless told otherwise.
    """
    explicit = transport if transport != "auto" else os.environ.get("SSDMPI_TRANSPORT", "auto")
    if explicit == "cuda-aware":
        return "yes (explicit setting: cuda-aware; device buffers are passed to MPI)"
    if explicit == "host":
        return "no (explicit setting: host; staged through pinned host memory)"
    built = _open_mpi_built_with_cuda()
    if built is None:
        return "unknown — host staging will be used"
    return (f"Open MPI built with CUDA support: {'yes' if built else 'no'} — host staging will be used "
            "(auto is conservative; pass --transport cuda-aware to use device buffers)")
