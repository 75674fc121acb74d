"""Compressed transport of a sum (``--comm-dtype``): bfloat16, float16 or int8 on the wire, the sum
accumulated in float32, the same bits on every rank, with error feedback.

Contract:

- ``DTYPES``: the choices; ``float32`` is no compression (the plain ``Iallreduce`` of
  ``ssdmpi/comm/gradients.py``).
- ``Compressor(dtype, n, size, rank, xp)``: one stream of sums of ``n``-element float32 buffers (a
  period rule's posts, one after another), made by ``Communicator.compressor(dtype, like)``. It holds
  the stream's error feedback: ``residual`` (``n`` floats, this rank's, on the buffers' device) and
  ``shard_residual`` (``S`` floats, host: the debt of this rank's shard of the sum). ``state_dict()``,
  ``load_state_dict(d)``, ``reset()``; ``wire_bytes``: what one sum sends from this rank.
- ``allreduce_start(buf, average, compressor=c)`` (the gradient channel) posts a ``Chain``: one sum in
  flight, nonblocking end to end, moved along by the progress strategy like an ``Iallreduce``.

One sum, on ``N`` ranks (``Q`` the codec's encoding, ``D`` its decoding, both elementwise or per
block; the buffer is padded with zeros to ``N`` shards of ``S`` elements, ``S`` a whole number of
blocks)::

    1. at the post (the caller's thread):  x = buf + residual;  c = Q(x);  residual = x - D(c)
    2. Ialltoall: rank j receives piece j (elements j*S .. j*S + S - 1) of every rank's c
    3. rank j, its shard:   s = D(piece from rank 0) + D(piece from rank 1) + ... (float32, in rank order)
                            y = s + shard_residual;  c_j = Q(y);  shard_residual = y - D(c_j)
    4. Iallgather of the shards' codes c_j
    5. at the wait:         buf = D(c_0 c_1 ... c_{N-1}) (first n elements);  / N for a mean

Step 3 runs where the strategy moves the chain: on the communication thread (``thread``), inside
``test()``/``progress()``/``wait()`` (``test``, ``poll``), or inside the start (``blocking``); it posts
step 4 as soon as step 2 completed. Every rank decodes the same codes, so the result is bitwise the
same everywhere, and each element's sum is added by one rank in rank order: it does not depend on
MPI's reduction order (the reference simulator, ``ssdmpi/verify/quantize.py``, matches it bitwise at
any rank count). The second collective runs on a communicator of its own: a rank may see the first
complete later than another, and a plain ``Iallreduce`` posted meanwhile must not change the order
of the collectives on either communicator (each has its posts in posting order on every rank).

Why this pattern (per rank, for ``n`` elements of ``c`` bytes on the wire; float32 ``c = 4``):

=============================================  ==========================  ==========================
pattern                                        bytes sent                  collectives in sequence
=============================================  ==========================  ==========================
float32 ``Iallreduce`` (ring / reduce-scatter  ``2 (N-1)/N * 4 n``         1 (``2 (N-1)`` steps)
+ allgather, MPI's choice for large buffers)
this: ``Ialltoall`` + ``Iallgather``, codes    ``2 (N-1)/N * c n``         2 (``(N-1)`` steps each)
the same with a float32 ``Iallgather``         ``(N-1)/N * (c + 4) n``     2
``Iallgather`` of every rank's whole code      ``(N-1) * c n``             1
=============================================  ==========================  ==========================

A period's sum is the model's size, so bandwidth rules and latency (two collectives instead of one)
is a few microseconds per period. Re-encoding the summed shard keeps the saving: an int8 code with a
float32 allgather would send 0.63 of float32's bytes, not 0.25. The allgather of the whole code sends
as much at ``N = 2`` and ``(N-1)/2`` times more beyond, and decodes ``N`` times more per rank.

Codecs (``c``: bytes per element): ``bfloat16`` (2): float32 rounded to nearest, ties to even, to its
top 16 bits, in integer arithmetic (NumPy has no bfloat16; a NaN stays a quiet NaN); ``float16`` (2):
IEEE half by NumPy's (CuPy's) cast, rounded to nearest even, after clipping to +-65504 (saturating:
what exceeds it is owed by the residual instead of becoming inf); ``int8`` (1 + 4/256): blocks of
``INT8_BLOCK = 256`` elements, each with a float32 scale ``max|x| / 127`` (a block of zeros: scale 0,
codes 0), codes ``rint(x / scale)`` (round half to even, symmetric) clipped to +-127, decoded as
``code * scale``. 256: the scales cost 4/256 = 1.6% (0.254 of float32's bytes; 1024 would give 0.251)
while the step ``max|x|/127`` is set by 256 neighbours, not 1024: displacements differ by orders of
magnitude between layers, and one large element coarsens fewer others. The shards are padded to whole
blocks (under ``N * 256`` elements in all).

Error feedback: what a rank meant to send and did not (``residual``) is added to its next post, and
each shard's owner does the same for the re-encoded sum (``shard_residual``), so over ``P`` sums the
total delivered differs from the total meant by the last residuals only (at most half a code step
per element per rank and per shard), not by ``P`` rounding errors. Both are the algorithm's state
(checkpointed, resumed bitwise); on another rank count the shards are others, and both restart at zero.

GPU buffers: steps 1 and 5 run on the device (``xp`` code, the caller's stream); the codes (a quarter or
a half of the bytes) are staged through pinned host memory whatever ``--transport`` says, step 3 runs on
the host, and step 5 copies the gathered codes back and decodes them there.

NumPy is imported inside the functions: the command-line parser reads ``DTYPES``.
"""

from __future__ import annotations

DTYPES = ("float32", "bfloat16", "float16", "int8")
INT8_BLOCK = 256
CHUNK = 1 << 15          # elements per pass of a codec on the host (a multiple of every block): in cache
FLOAT16_MAX = 65504.0


class Int8Blocks:
    """``int8``: per-block float32 scales (module docstring). Parts of a code: ``(codes, scales)``."""

    name, block, part_dtypes = "int8", INT8_BLOCK, ("int8", "float32")

    def part_bytes(self, S: int) -> tuple:
        return S, 4 * (S // self.block)

    def encode(self, xp, x) -> tuple:
        """``x``: float32, a whole number of blocks."""
        blocks = x.reshape(-1, self.block)
        scale = xp.abs(blocks).max(axis=1) / xp.float32(127)
        safe = xp.where(scale > 0, scale, xp.float32(1))
        # |x| <= max|x| = 127 scale (1 + d), |d| <= 2**-24: |x / scale| rounds below 127.5, so rint is
        # within +-127 without a clip
        q = xp.rint(blocks / safe[:, None])
        return q.astype(xp.int8).reshape(-1), scale

    def decode(self, xp, parts):
        q, scale = parts
        return (q.reshape(-1, self.block).astype(xp.float32) * scale[:, None]).reshape(-1)


class BFloat16:
    """``bfloat16``: the top half of float32, rounded to nearest even in integer arithmetic."""

    name, block, part_dtypes = "bfloat16", 1, ("uint16",)

    def part_bytes(self, S: int) -> tuple:
        return (2 * S,)

    def encode(self, xp, x) -> tuple:
        u = x.view(xp.uint32)
        t = u >> 16                   # t = (u + 0x7FFF + (bit 16 of u)) >> 16, in place
        t &= 1
        t += 0x7FFF
        t += u
        t >>= 16
        nan = xp.isnan(x)             # a NaN keeps its sign and top payload, made quiet
        if xp.__name__ != "numpy" or nan.any():
            t = xp.where(nan, (u >> 16) | 0x0040, t)
        return (t.astype(xp.uint16),)

    def decode(self, xp, parts):
        return (parts[0].astype(xp.uint32) << 16).view(xp.float32)


class Float16:
    """``float16``: IEEE half, saturating at +-65504."""

    name, block, part_dtypes = "float16", 1, ("uint16",)

    def part_bytes(self, S: int) -> tuple:
        return (2 * S,)

    def encode(self, xp, x) -> tuple:
        return (xp.clip(x, -FLOAT16_MAX, FLOAT16_MAX).astype(xp.float16).view(xp.uint16),)

    def decode(self, xp, parts):
        return parts[0].view(xp.float16).astype(xp.float32)


CODECS = {c.name: c for c in (BFloat16(), Float16(), Int8Blocks())}


def shard_length(n: int, size: int, block: int) -> int:
    """``S``: the elements of each rank's shard, ``ceil(n / size)`` rounded up to whole blocks."""
    per = -(-int(n) // int(size))
    return max(1, -(-per // block)) * block


class Compressor:
    """One stream of compressed sums and its error feedback (the module contract).

    Args: ``dtype`` one of ``CODECS``; ``n`` the buffers' elements; ``size``, ``rank`` the
    communicator's; ``xp`` the buffers' array module (``residual`` lives there)."""

    def __init__(self, dtype: str, n: int, size: int, rank: int, xp):
        import numpy as np

        if dtype not in CODECS:
            raise ValueError(f"no compressed transport {dtype!r}; choose one of {', '.join(CODECS)}")
        self.codec = CODECS[dtype]
        self.dtype, self.n, self.size, self.rank, self.xp = dtype, int(n), int(size), int(rank), xp
        self.S = shard_length(self.n, self.size, self.codec.block)
        self.widths = self.codec.part_bytes(self.S)
        self.piece = sum(self.widths)        # bytes of one shard's code
        self.residual = xp.zeros(self.n, dtype=xp.float32)
        self.shard_residual = np.zeros(self.S, dtype=np.float32)
        self._free: list = []

    @property
    def wire_bytes(self) -> int:
        """Bytes this rank sends per sum: ``N - 1`` pieces in the alltoall, its shard to ``N - 1`` ranks."""
        return 2 * (self.size - 1) * self.piece

    def state_dict(self) -> dict:
        """``residual`` and ``shard_residual``: the live arrays (the caller copies)."""
        return {"residual": self.residual, "shard_residual": self.shard_residual}

    def load_state_dict(self, d: dict) -> None:
        from ssdmpi import backend

        residual, shard = backend.to_host(d["residual"]), backend.to_host(d["shard_residual"])
        if residual.shape != (self.n,) or shard.shape != (self.S,):
            raise ValueError(f"error-feedback state of shapes {residual.shape}, {shard.shape} does not fit a "
                             f"{self.dtype} stream of {self.n} elements on {self.size} ranks")
        self.residual[...] = self.xp.asarray(residual)
        self.shard_residual[...] = shard

    def reset(self) -> None:
        """Nothing owed."""
        self.residual[...] = 0
        self.shard_residual[...] = 0

    # -- the steps of one sum (``Chain`` calls them) ------------------------------------------------
    def _take(self):
        ws = self._free.pop() if self._free else _Workspace(self)
        if ws.event is not None:        # the copy back of the last sum that used it has read ``gathered``
            ws.event.synchronize()
            ws.event = None
        return ws

    def _give(self, ws) -> None:
        self._free.append(ws)

    def _spans(self, xp, start: int, stop: int):
        """``(a, b)`` chunks of ``[start, stop)`` (whole blocks): on the host ``CHUNK`` elements, so that
        each pass of the codec runs in cache; on a device the whole range (one launch per step)."""
        step = stop - start if xp.__name__ != "numpy" else CHUNK
        for a in range(start, stop, step):
            yield a, min(a + step, stop)

    def _put(self, xp, parts, dest, r: int, offset: int) -> None:
        """The code ``parts`` of elements ``offset ..`` of shard ``r`` into ``dest`` (bytes: ``piece`` per
        shard, each part's bytes in turn)."""
        col = r * self.piece
        for part, at, width in zip(parts, self.codec.part_bytes(offset), self.widths):
            view = part.view(xp.uint8)
            dest[col + at:col + at + view.size] = view
            col += width

    def _get(self, xp, src, r: int, offset: int, m: int):
        """Elements ``offset .. offset + m`` of shard ``r``'s code in ``src``, decoded: float32."""
        parts, col = [], r * self.piece
        for dtype, at, length, width in zip(self.codec.part_dtypes, self.codec.part_bytes(offset),
                                            self.codec.part_bytes(m), self.widths):
            parts.append(src[col + at:col + at + length].view(dtype))
            col += width
        return self.codec.decode(xp, parts)

    def encode_own(self, buf, ws) -> None:
        """Step 1: ``x = buf + residual``, its code into ``ws.send``, ``residual = x - D(code)``."""
        xp, n, S, codec = self.xp, self.n, self.S, self.codec
        flat, residual = buf.reshape(-1), self.residual
        for r in range(self.size):
            for a, b in self._spans(xp, r * S, (r + 1) * S):
                x, hi = ws.padded[a:b], min(b, n)
                if hi > a:
                    xp.add(flat[a:hi], residual[a:hi], out=x[:hi - a])
                parts = codec.encode(xp, x)
                self._put(xp, parts, ws.send, r, a - r * S)
                if hi > a:
                    xp.subtract(x[:hi - a], codec.decode(xp, parts)[:hi - a], out=residual[a:hi])

    def reduce_shard(self, ws) -> None:
        """Step 3 (host): this rank's shard summed in rank order, plus its residual, re-encoded."""
        import numpy as np

        codec, owed = self.codec, self.shard_residual
        for a, b in self._spans(np, 0, self.S):
            acc = ws.acc[a:b]
            acc[...] = self._get(np, ws.recv, 0, a, b - a)
            for r in range(1, self.size):
                acc += self._get(np, ws.recv, r, a, b - a)
            acc += owed[a:b]
            parts = codec.encode(np, acc)
            self._put(np, parts, ws.gsend, 0, a)
            np.subtract(acc, codec.decode(np, parts), out=owed[a:b])

    def decode_into(self, buf, ws, streams) -> None:
        """Step 5: every shard's code decoded into ``buf`` (a device buffer: copied back first, decoded
        on the caller's stream after the copy)."""
        import numpy as np

        if ws.device_gathered is not None:
            copy = streams.copy_stream()
            ws.device_gathered.set(ws.gathered, stream=copy)
            ws.event = copy.record(streams.new_event())
            streams.current_stream().wait_event(ws.event)
            xp, src = self.xp, ws.device_gathered
        else:
            xp, src = np, ws.gathered
        flat, S, n = buf.reshape(-1), self.S, self.n
        for r in range(self.size):
            for a, b in self._spans(xp, r * S, min((r + 1) * S, -(-n // self.codec.block) * self.codec.block)):
                hi = min(b, n)
                flat[a:hi] = self._get(xp, src, r, a - r * S, b - a)[:hi - a]


class _Workspace:
    """The buffers of one sum in flight: ``padded`` (``N S`` float32, zeros past ``n``) and ``send`` (the
    codes) where the buffers live; ``recv``, ``gsend``, ``gathered`` (host: MPI's), ``acc`` (the shard's
    sum); on a GPU ``device_gathered`` and ``event`` (the copy back's, waited before reuse)."""

    def __init__(self, c: Compressor):
        import numpy as np

        from ssdmpi import backend

        xp, N = c.xp, c.size
        self.padded = xp.zeros(N * c.S, dtype=xp.float32)
        self.send = xp.zeros(N * c.piece, dtype=xp.uint8)
        device = xp is not np
        self.recv = np.zeros(N * c.piece, dtype=np.uint8)
        self.gsend = np.zeros(c.piece, dtype=np.uint8)
        self.gathered = backend.pinned_empty((N * c.piece,), np.uint8) if device else np.zeros(N * c.piece, np.uint8)
        self.device_gathered = xp.zeros(N * c.piece, dtype=xp.uint8) if device else None
        self.acc = np.zeros(c.S, dtype=np.float32)
        self.event = None


class Chain:
    """One compressed sum in flight on ``buf`` (the module's steps 1-5); the gradient channel drives it.

    Made at the post (step 1 runs here); ``staged``: the codes on their way to MPI (a ``Staged``);
    ``post_scatter(comm)`` / ``post_gather(comm)`` post steps 2 and 4 (requests), ``reduce_shard()``
    is step 3, ``run(comm, gather_comm)`` steps 2-4 blocking, ``finish(buf, streams)`` step 5.
    ``gathering``: step 4 has been posted (or run)."""

    __slots__ = ("compressor", "ws", "staged", "gathering", "_MPI")

    def __init__(self, compressor: Compressor, buf, staging):
        from ssdmpi.comm.mpi_env import load_mpi
        from ssdmpi.comm.transport import Staged

        self._MPI = load_mpi()
        self.compressor, self.gathering = compressor, False
        self.ws = ws = compressor._take()
        compressor.encode_own(buf, ws)
        self.staged = staging.stage(ws.send) if ws.device_gathered is not None else Staged(ws.send, ws.send)

    def __str__(self) -> str:
        return f"Ialltoall+Iallgather of {self.compressor.dtype} codes"

    def _scatter_args(self) -> tuple:
        BYTE = self._MPI.BYTE
        return [self.staged.work, BYTE], [self.ws.recv, BYTE]

    def _gather_args(self) -> tuple:
        BYTE = self._MPI.BYTE
        return [self.ws.gsend, BYTE], [self.ws.gathered, BYTE]

    def post_scatter(self, comm):
        return comm.Ialltoall(*self._scatter_args())

    def reduce_shard(self) -> None:
        self.compressor.reduce_shard(self.ws)

    def post_gather(self, comm):
        self.gathering = True
        return comm.Iallgather(*self._gather_args())

    def run(self, comm, gather_comm) -> None:
        comm.Alltoall(*self._scatter_args())
        self.reduce_shard()
        self.gathering = True
        gather_comm.Allgather(*self._gather_args())

    def finish(self, buf, streams) -> None:
        self.compressor.decode_into(buf, self.ws, streams)
        self.compressor._give(self.ws)
        self.ws = None
