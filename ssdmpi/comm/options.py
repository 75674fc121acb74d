"""Command-line flags for the comm layer, shared by ``train`` and the benchmarks.

``add_arguments(parser)`` adds ``--progress``, ``--transport``, ``--bucket-size`` and
``--stall-timeout``; ``communicator_from_args(args)`` builds the Communicator they describe
(collective). Light imports only: ``ssdmpi --help`` must not initialise MPI.
"""

from __future__ import annotations

from ssdmpi.comm.progress import DEFAULTS, PROGRESS
from ssdmpi.comm.transport import TRANSPORTS
from ssdmpi.errors import UserError

SIZE_SUFFIXES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``"4M"`` -> 4194304 bytes (K, M, G are powers of 1024; a plain number is bytes)."""
    t = str(text).strip().upper().removesuffix("B")
    scale = SIZE_SUFFIXES.get(t[-1:], 1)
    number = t[:-1] if t[-1:] in SIZE_SUFFIXES else t
    try:
        value = int(float(number) * scale)
    except ValueError:
        raise UserError(f"cannot read size {text!r}; write e.g. 64K, 4M or a number of bytes") from None
    if value < 0:
        raise UserError(f"size {text!r} is negative")
    return value


def add_arguments(parser) -> None:
    """Add the communication flags to ``parser`` (an argparse parser or group)."""
    group = parser.add_argument_group("communication")
    group.add_argument("--progress", choices=PROGRESS, default="auto",
                       help="who drives nonblocking allreduces: test (the trainer's progress calls), thread "
                            "(a communication thread), blocking; auto = "
                            + ", ".join(f"{k}: {v}" for k, v in DEFAULTS.items()) + " (default: auto)")
    group.add_argument("--transport", choices=TRANSPORTS, default="auto",
                       help="how GPU buffers reach MPI: host (staged through pinned memory), cuda-aware "
                            "(device buffers passed to MPI); auto = host unless SSDMPI_TRANSPORT says otherwise")
    group.add_argument("--bucket-size", default="0", metavar="SIZE",
                       help="split each allreduce into fixed buckets of SIZE (e.g. 4M); 0 = one fused buffer "
                            "(default)")
    group.add_argument("--stall-timeout", type=float, default=300.0, metavar="SECONDS",
                       help="abort the job, naming the operation and the missing ranks, when one wait lasts "
                            "longer than this; 0 disables (default: 300)")


def communicator_from_args(args, comm=None):
    """Collective: the Communicator the flags describe (over ``comm``, default COMM_WORLD)."""
    from ssdmpi.comm.communicator import Communicator

    if args.stall_timeout < 0:
        raise UserError("--stall-timeout must be >= 0 (0 disables the watchdog)")
    bucket = parse_size(args.bucket_size)
    return Communicator(comm, progress=args.progress, transport=args.transport,
                        bucket_bytes=bucket or None, stall_timeout=args.stall_timeout or None)
