"""The trainer: ``ssdmpi train`` and ``ssdmpi.train(...)``. Its modules import only downward:

    api        ssdmpi.train(config, model, dataset) -> Result
    trainer    run_job: configure, set up, loop, finish (and ``ssdmpi train``'s ``run``)
    loop       the training loop and its synchronisation points
    report     rank 0's files and display (config.yaml, metrics.jsonl, loggers, progress)
    setup      from flags to a resolved run and its run directory; the Job built, resumed
    state      TrainingState: the counters a checkpoint holds
    evaluation evaluate, Evaluator: the test split, sharded across ranks
    job        Job, Stop: what the floors above share

``command`` (the flags and help of ``ssdmpi train``) stands beside them and imports none of them:
the command-line parser is built without NumPy.
"""
