"""``ssdmpi bench accuracy``: final test accuracy (a language model's: validation loss) of ``W`` per algorithm,
schedule, local update and k.

The table that chose the defaults of ``--local-update``, ``--period-rule`` and ``--comm``
(docs/ACCURACY.md). Every configuration runs in the reference simulator
(``ssdmpi/verify/reference.py``: ``N`` workers in one process, pure NumPy, no MPI), so the
numbers depend only on the algorithm, not on the network or the number of cores.

One configuration = (model, lr, N, variant, k, seed). Each runs ``epochs * steps_per_epoch``
iterations (an epoch is ``floor(n_train / (N * B))`` iterations, the sharded loader's
policy, so every variant of a row sees the same samples in the same order), then
``Simulation.finalize()`` (the end-of-training flush: what is in flight is applied to
``W``; ``delta-merge`` and ``delta-own`` fold the progress not yet posted in), then the accuracy of ``W`` on the whole
test set. Model initialisation and data order use the seed, identical for every variant.
At a high learning rate that one figure is a noisy sample: the test accuracy of ``W`` moves
by points from one evaluation to the next. ``--tail E`` adds a steadier figure: the mean test
accuracy over ``E`` evaluations spread evenly over the second half of training (iterations
``steps/2 + i*(steps - steps/2)/E``, ``i = 1..E``, the last one the end), each of the model
``finalize()`` would give at that iteration (``Simulation.finalized_W``), as ``acc_W_tail``
and a second table.
``--lr`` and ``--seed`` take lists: one command runs the whole grid. ``--warmup-steps`` is iterations
(``200``) or a percentage of each run's (``25%``: the same share of the run at every ``N``).

A language model (``--models gpt``, its sizes by ``--gpt NAME=INT,...``, ``configs.GPT_SIZES``) trains
on a text ``--dataset`` (``devils-dictionary``, built in, or ``kjv``), each worker's loader the one ``ssdmpi
train`` gives a rank (windows of ``context`` tokens, ``--batch-size`` of them per worker), and is scored on the
validation windows (``--val-windows N``: ``N`` of them, evenly spread; default all): its figure is the
validation loss of ``W`` after finalize, ``val_loss`` in nats per token (lower is better), compared with ssgd's
relative to it, ``100 * (loss - ssgd's) / ssgd's`` in percent; each row also has the perplexity ``val_ppl``
(``exp(val_loss)``) and the next-token accuracy as ``acc_W``. A command's models all take one kind of data.

Variants (``--variants``, comma separated; every algorithm's and period rule's named
configurations, ``ssdmpi/algos/registry.py``; ``k`` applies to those whose algorithm takes
``--delay``)::

    ssgd                    synchronous SGD (the reference of each row; no k)
    step/global-momentum    ssd --comm step --local-update global-momentum
    step/glu-paper          ssd --comm step --local-update glu-paper (local lr N * lr)
    step/sgd                ssd --comm step --local-update sgd       (local lr N * lr)
    period/delta-own        ssd --comm period --period-rule delta-own
    period/delta-merge      ssd --comm period --period-rule delta-merge (its default merge delay);
                            period/delta-merge:d=D with --merge-delay D (skipped where D > k: a
                            rule's setting by its bench tag, where the run takes it)
    period/replay           ssd --comm period --period-rule replay --local-update global-momentum
    period/eager            ssd --comm period --period-rule eager
    odsgd                   ssd --comm step with k = 1 (no k)
    localsgd                blocking periodic averaging, local momentum
    asgd                    --algo asgd --servers 1 --asgd-order round-robin (no k): N workers
                            plus one parameter server, the server applying the N pushes of
                            an iteration in worker order (``ASGDSimulation``); like ssgd it
                            has no k, so it has one column per row

Outputs: Markdown tables on stdout, one per k (rows model x lr x N; columns the variants;
a cell is ``accuracy% [difference to ssgd of the row, points]`` (a language model's ``loss [difference,
%]``), with several seeds the mean over the seeds, the difference paired by seed and averaged, and the
range over the seeds: ``mean [mean difference] (min..max)``); with ``--out DIR`` also
``DIR/results.csv`` (one row per configuration, appended as each finishes, so an
interrupted sweep keeps what it did; ``--resume`` skips configurations already there)
and ``DIR/results.md`` (the table) and ``DIR/result.json`` (every row, the command line and the
machine: ``ssdmpi/bench/result.py``), both rewritten after each configuration. ``--resume
--no-run`` rewrites these two from the rows already there and runs nothing (a cell with fewer
seeds than the sweep's says so).

Modules: ``configs.py`` (the variants and the fields of a result), ``simulate.py`` (one configuration
in the reference simulator), ``tables.py`` (the Markdown tables and the report), ``command.py`` (the
flags, the grid, the sweep and its files).
"""

from ssdmpi.bench.accuracy.command import add_arguments, run
from ssdmpi.bench.accuracy.configs import VARIANTS

__all__ = ["VARIANTS", "add_arguments", "run"]
