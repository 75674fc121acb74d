"""The update rules of ``--comm period``, one file each (``ssdmpi/algos/period.py`` says what a rule
is; ``ssdmpi/algos/registry.py`` finds every module here that declares a ``SPEC``)."""
