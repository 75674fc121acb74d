"""The Python API: ``ssdmpi.train(config, model=None, dataset=None)``, from a script under ``mpiexec``.

A thin layer over ``ssdmpi train``: the settings become the same ``TrainConfig`` (defaults <
preset < file < these settings), the run goes through the same ``run_job`` (loop,
checkpoints, metrics, signals, exit codes), and its run directory is the same. The contract is
``train``'s docstring (what ``help(ssdmpi.train)`` shows); examples in docs/API.md.
"""

from __future__ import annotations

import dataclasses
import json
import os

from ssdmpi import config as configuration
from ssdmpi.comm import world
from ssdmpi.data import datasets
from ssdmpi.errors import UserError
from ssdmpi.nn.models import model_label
from ssdmpi.run.trainer import run_job


@dataclasses.dataclass
class Result:
    """What ``train`` returns on every rank.

    ``exit_code``: as ``ssdmpi train`` (0 done, 3 diverged, 85/130 checkpointed after a signal);
    ``run_dir``; ``summary``: ``summary.json``'s content after a finished run (rank 0 writes it;
    every rank gets it), else {}; ``model``: the trained ``Model`` with the global weights ``W``
    in its parameters after a finished run; ``config``: the resolved ``TrainConfig``.
    """

    exit_code: int
    run_dir: str
    summary: dict
    model: object
    config: object


def train(config=None, model=None, dataset=None) -> Result:
    """Train a model data-parallel, as ``ssdmpi train`` does, from a script run under ``mpiexec``.

    Every rank calls it with the same arguments (as every rank runs ``ssdmpi train``).

    ``config``: a mapping of settings with the keys of a YAML config file (``{"algo": "ssd",
    "epochs": 3, "run_dir": "runs/mine"}``; ``ssdmpi train --help`` lists them); they override the
    preset as flags do. Extra keys: ``preset`` (as ``--preset``), ``resume`` (``"auto"`` or a path,
    as ``--resume``), ``config`` (a YAML file under these settings). Or a ``TrainConfig``, the path
    of a YAML file, or None.

    ``model``: None (the ``model`` setting names it), a name (built in, registered, or
    ``"package.module:factory"``), a factory ``factory(input_shape, num_classes, *, xp, dtype, seed,
    **options) -> ssdmpi.nn.Model`` (the keywords it does not declare are not passed), or a built
    ``Model`` (on the run's array module and dtype). A factory is recorded as ``module:qualname``,
    which ``ssdmpi eval``, ``--resume`` and ``ssdmpi.load_model`` import again (not from a
    script's ``__main__``).

    ``dataset``: None (the ``dataset``/``data_path`` settings name it), an ``ssdmpi.data.Dataset``,
    arrays ``(train_x, train_y, test_x, test_y)``, or a mapping with those keys and optionally
    ``num_classes`` and ``name``: (N, D) feature vectors or (N, [C,] H, W) images, normalised as
    every dataset is (``ssdmpi.data.from_arrays``). The run does not keep the arrays.

    Returns a ``Result`` on every rank: ``exit_code`` (0 done, 3 diverged, 85/130 checkpointed
    after a signal), ``run_dir``, ``summary`` (``summary.json`` of a finished run), ``model`` (the
    trained ``Model``, the global weights ``W`` in its parameters), ``config`` (the resolved
    ``TrainConfig``). Bad input raises ``ssdmpi.errors.UserError`` (one line) on every rank.
    See docs/API.md.
    """
    request = _request(config)
    model_spec, flags = None, dict(request.flags)
    if model is not None:
        if isinstance(model, str):
            flags["model"] = model
        else:
            model_spec, flags["model"] = model, model_label(model)
    data = None if dataset is None else _dataset(dataset)
    if data is not None:
        flags["dataset"], flags["data_path"] = data.name, None
    request = dataclasses.replace(request, flags={k: v for k, v in flags.items() if v is not None})
    code, job = run_job(request, model=model_spec, dataset=data)
    summary = {}
    if code == 0:
        job.model.params[...] = job.algo.global_weights()   # training is over: W is the model
        summary = _summary(job.cfg.run_dir)
    return Result(exit_code=code, run_dir=job.cfg.run_dir, summary=summary, model=job.model, config=job.cfg)


def _request(config) -> configuration.Request:
    """The ``Request`` ``config`` stands for: its settings as if given on the command line."""
    if config is None:
        return configuration.Request()
    if isinstance(config, (str, os.PathLike)):
        return configuration.Request(config_file=os.fspath(config))
    if isinstance(config, configuration.TrainConfig):
        settings = {k: v for k, v in config.to_dict().items() if v is not None}
    elif isinstance(config, dict):
        settings = dict(config)
    else:
        raise UserError(f"ssdmpi.train: config must be a mapping of settings, a TrainConfig or a YAML path; "
                        f"got {type(config).__name__}")
    extra = {key: settings.pop(key) for key in ("preset", "resume", "config") if key in settings}
    flags = configuration.normalise(settings, "ssdmpi.train config")
    return configuration.Request(flags=flags, config_file=extra.get("config"), preset=extra.get("preset"),
                                 resume=extra.get("resume"))


def _dataset(dataset):
    """A ``Dataset`` from what ``train`` accepts as ``dataset``."""
    if isinstance(dataset, datasets.Dataset):
        return dataset
    if isinstance(dataset, dict):
        keys = ("train_x", "train_y", "test_x", "test_y")
        missing = [k for k in keys if k not in dataset]
        extra = sorted(set(dataset) - set(keys) - {"num_classes", "name"})
        if missing or extra:
            raise UserError(f"ssdmpi.train: a dataset mapping needs {', '.join(keys)} (and optionally num_classes, "
                            f"name); {'missing ' + ', '.join(missing) if missing else 'unknown ' + ', '.join(extra)}")
        return datasets.from_arrays(*(dataset[k] for k in keys), num_classes=dataset.get("num_classes"),
                                    name=dataset.get("name", "arrays"))
    if isinstance(dataset, (tuple, list)) and len(dataset) == 4:
        return datasets.from_arrays(*dataset)
    raise UserError("ssdmpi.train: dataset must be an ssdmpi.data.Dataset, (train_x, train_y, test_x, test_y) "
                    f"or a mapping with those keys; got {type(dataset).__name__}")


def _summary(run_dir: str) -> dict:
    """``summary.json`` as rank 0 wrote it, on every rank."""
    def read():
        with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as f:
            return json.load(f)

    return world.on_root(read)
