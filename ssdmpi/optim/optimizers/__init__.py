"""The inner optimizers, one file each with its ``SPEC`` (``ssdmpi.spec.OptimizerSpec``): the registry
finds every module here (``ssdmpi/optim/part.py`` says what an optimizer is)."""
