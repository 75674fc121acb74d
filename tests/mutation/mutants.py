"""The one-line bugs ``tests/mutation/run.py`` plants, one at a time, and the tests that must catch each.

Each ``Mutant``: ``name``; ``file`` (relative to the repository root); ``original``, an exact snippet
that must occur exactly once in that file (else the mutant is reported "snippet not found" or
"snippet ambiguous", and the run fails: update the snippet when the code it points at moves);
``replacement``; ``serial``, the pytest arguments of the serial run (test files, ``-k``); ``mpi``,
those of the run under ``mpiexec -n RANKS``; ``ranks``, the rank counts that run (2 unless a bug
can only show with more ranks: ``why`` says why). Keep each run short: name only the tests that
matter.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    original: str
    replacement: str
    serial: tuple
    mpi: tuple
    ranks: tuple = (2,)
    why: str = ""


STORE, SHARDED, WRITER = "ssdmpi/checkpoint/store.py", "ssdmpi/checkpoint/sharded.py", "ssdmpi/checkpoint/writer.py"
RESIZE, ASGD, AUTO = "ssdmpi/algos/resize.py", "ssdmpi/algos/asgd.py", "ssdmpi/algos/auto_delay.py"
DELTA_MERGE = "ssdmpi/algos/rules/delta_merge.py"
SGD = "ssdmpi/optim/optimizers/sgd.py"          # delta-merge's momentum merge (SGD's merge_mean_step)

UNIT_CKPT = "tests/unit/test_checkpoint.py"
MPI_WRITER = "tests/mpi/test_checkpoint_writer.py"
MPI_RESIZE = "tests/mpi/test_resize.py"
MPI_ASGD = "tests/mpi/test_asgd.py"
MPI_AUTO = "tests/mpi/test_auto_delay.py"
ASGD_SERIAL = ("tests/unit/test_asgd_reference.py", "tests/unit/test_asgd_cli.py")   # shard(), the 3-rank job
ALGOS_DELTA_MERGE = ("tests/mpi/test_algos.py", "-k", "delta-merge")      # serially: a world of one rank
NEEDS_WORKERS = "with 2 ranks asgd has one worker, whose pushes are never stale: the rate is eta at every push"
NEEDS_BOTH_WORLDS = "asgd needs a server and a worker in the old world and in the new one: a resize in one job, 4 ranks"
NEEDS_SERVERS = "with 2 ranks asgd has one server, whose shard is the whole model: uneven shards need 2 servers"

MUTANTS = [
    # --- checkpoint/store.py: the commit over a checkpoint of the same step, retention -------------------
    Mutant("store: the old checkpoint deleted before the new one is renamed into place", STORE,
           "        os.rename(final, old)\n", "        _remove(final)\n",
           (UNIT_CKPT,), (MPI_WRITER, "-k", "same_step")),
    Mutant("store: the old checkpoint not renamed back when the rename into place fails", STORE,
           "            os.rename(old, final)\n            raise\n", "            raise\n",
           (UNIT_CKPT,), (MPI_WRITER, "-k", "same_step")),
    Mutant("store: the exchange of the two names replaced by deleting the old one, then renaming", STORE,
           "    if _exchange(partial, final):\n        old = partial\n",
           "    if _remove(final) or not os.rename(partial, final):\n        old = partial\n",
           (UNIT_CKPT,), (MPI_WRITER, "-k", "same_step")),
    Mutant("store: retention deletes the checkpoint best points to", STORE,
           "(link_target(directory, LAST), link_target(directory, BEST))", "(link_target(directory, LAST),)",
           (UNIT_CKPT,), (MPI_WRITER, "-k", "retention")),
    # --- checkpoint/sharded.py: pieces of the shared arrays ------------------------------------------------
    Mutant("sharded: a piece's checksum not checked when the whole array is read", SHARDED,
           "read_piece(directory, name, rank, sums.get(f\"/shared/{name}\"))", "read_piece(directory, name, rank)",
           (UNIT_CKPT,), (MPI_WRITER, "-k", "piece")),
    Mutant("sharded: the pieces joined in reverse rank order", SHARDED,
           "        out[piece(out.size, rank, n)] = read_piece(",
           "        out[piece(out.size, n - 1 - rank, n)] = read_piece(",
           (UNIT_CKPT,), (MPI_WRITER, "-k", "piece")),
    # --- checkpoint/writer.py: the commit's manifest, the background flag ------------------------------------
    Mutant("writer: the manifest pairs each rank file with another rank's report", WRITER,
           "for r, rep in enumerate(reports)}", "for r, rep in enumerate(reports[::-1])}",
           ("tests/unit/test_resize.py", "-k", "ssgd and 2to4"), (MPI_WRITER,)),
    Mutant("writer: the background flag inverted (a background save commits at once, a final one does not)", WRITER,
           "        if not background:\n            records += self.complete(comm, since=t0)",
           "        if background:\n            records += self.complete(comm, since=t0)",
           (UNIT_CKPT,), (MPI_WRITER,)),
    # --- algos/resize.py: resuming on another number of ranks ------------------------------------------------
    Mutant("resize: the update counter s not advanced for the held sum merged at a resize", RESIZE,
           "        state[\"s\"] = int(state[\"s\"]) + int(k)\n", "        state[\"s\"] = int(state[\"s\"])\n",
           ("tests/unit/test_resize.py", "-k", "ssd-period-mid-delay and 4to2"), (MPI_RESIZE, "-k", "mid-delay")),
    Mutant("resize: a server's old rank counted with the new number of workers (asgd)", RESIZE,
           "        old = old_workers + algo.j", "        old = algo.K + algo.j",
           ("tests/unit/test_resize.py", "-k", "asgd and 4to2"), (MPI_RESIZE, "-k", "asgd"), ranks=(4,),
           why=NEEDS_BOTH_WORLDS),
    Mutant("resize: the per-rank arrays taken from old rank 0 instead of averaged", RESIZE,
           "            state[key] = ctx.mean(f\"algo/{key}\")",
           "            state[key] = ctx.of_rank(0, f\"algo/{key}\")",
           ("tests/unit/test_resize.py", "-k", "ssd-step and 4to2"), (MPI_RESIZE, "-k", "ssd-step")),
    # --- algos/asgd.py: the staleness-aware rate, the shards ------------------------------------------------
    Mutant("asgd: the staleness-aware rate divides by the staleness alone, at least 1", ASGD,
           "return eta / (1 + staleness) if staleness_rate else eta",
           "return eta / max(1, staleness) if staleness_rate else eta",
           ASGD_SERIAL, (MPI_ASGD, "-k", "reference"), ranks=(4,), why=NEEDS_WORKERS),
    Mutant("asgd: a push's staleness counted from the update before its worker's pull", ASGD,
           "        self.version[w] = self.s\n", "        self.version[w] = self.s - 1\n",
           ASGD_SERIAL, (MPI_ASGD, "-k", "reference")),
    Mutant("asgd: the shards leave out the remainder of an uneven split", ASGD,
           "    return slice(start, start + base + (1 if j < extra else 0))", "    return slice(start, start + base)",
           ASGD_SERIAL, (MPI_ASGD, "-k", "reference"), ranks=(4,), why=NEEDS_SERVERS),
    Mutant("asgd: the shards leave out the last parameter (split n - 1 elements)", ASGD,
           "    base, extra = divmod(int(num_params), int(servers))",
           "    base, extra = divmod(int(num_params) - 1, int(servers))",
           ASGD_SERIAL, (MPI_ASGD, "-k", "reference")),
    # --- algos/auto_delay.py: --delay auto's choice --------------------------------------------------------
    Mutant("auto_delay: the stability test accepts a pair stable at any one lr x curvature", AUTO,
           "return bool((stability.spectral_radius(T) <= 1 + stability.TOL).all())",
           "return bool((stability.spectral_radius(T) <= 1 + stability.TOL).any())",
           ("tests/unit/test_auto_delay.py",), (MPI_AUTO, "-k", "delay_max")),
    Mutant("auto_delay: k = hi (--delay-max) never tried", AUTO,
           "        for k in range(max(amortising(dd), dd), hi + 1):",
           "        for k in range(max(amortising(dd), dd), hi):",
           ("tests/unit/test_auto_delay.py",), (MPI_AUTO, "-k", "delay_max")),
    # --- algos/rules/delta_merge.py and its optimizer: the merge, the momentum merge, the post ---------
    Mutant("delta_merge: the first merge (at m = k - 1 + d) skipped", DELTA_MERGE,
           "if since_post >= st.k and since_post % st.k == 0:", "if since_post > st.k and since_post % st.k == 0:",
           ALGOS_DELTA_MERGE, ALGOS_DELTA_MERGE),
    Mutant("delta_merge: the momentum merge adds the mean displacement, not the mean step", SGD,
           "            velocity += mean * (share / k)", "            velocity += mean * share",
           ALGOS_DELTA_MERGE, ALGOS_DELTA_MERGE),
    Mutant("delta_merge: the momentum merge keeps the share a of the own velocity instead of 1 - a", SGD,
           "multiply(velocity, 1.0 - share, out=velocity)", "multiply(velocity, share, out=velocity)",
           ALGOS_DELTA_MERGE, ALGOS_DELTA_MERGE),
    Mutant("delta_merge: the period's sum posted one iteration early", DELTA_MERGE,
           "        if (m + 1) % st.k == 0:\n            D = self._acc",
           "        if m % st.k == 0:\n            D = self._acc",
           ALGOS_DELTA_MERGE, ALGOS_DELTA_MERGE),
]
