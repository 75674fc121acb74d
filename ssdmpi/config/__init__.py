"""A run's configuration: every setting declared once, resolved once, frozen.

- ``settings``: the table of a run's settings (``SETTINGS``) and ``TrainConfig``, one resolved run;
- ``files``: presets and YAML config files; ``flags``: the ``ssdmpi train`` flags and their help;
- ``resolve``: ``Request`` (what a start asks for) -> ``resolve_request`` (defaults < preset < file <
  flags, the one resolution of the algorithm's settings) -> ``Resolved`` (the frozen config, where
  each value came from, the notes); ``algo_config``: the same settings in steps, for the algorithm;
- ``resume``: what a checkpoint's config means today and what a resumed run may not change;
- ``printing``: ``--print-config``.

Imported when the command-line parser is built: no NumPy here.
"""

from ssdmpi.config.files import list_presets, load_file, load_preset, normalise
from ssdmpi.config.flags import add_arguments, default_help, from_flags
from ssdmpi.config.printing import annotated_yaml
from ssdmpi.config.resolve import (
                                   Request,
                                   Resolved,
                                   algo_config,
                                   as_request,
                                   communicator_options,
                                   default_run_dir,
                                   merge,
                                   recorded,
                                   resolve,
                                   resolve_request,
                                   resolve_values,
)
from ssdmpi.config.resume import changed_settings, check_resume, checkpoint_settings
from ssdmpi.config.settings import (
                                   ALTERNATIVES,
                                   FIELD_NAMES,
                                   INVOCATION,
                                   LENGTH_SCHEDULES,
                                   RUN_LENGTH,
                                   SETTINGS,
                                   STRUCTURAL,
                                   UNSET,
                                   WARMUP,
                                   TrainConfig,
                                   first_set,
)

__all__ = ["ALTERNATIVES", "FIELD_NAMES", "INVOCATION", "LENGTH_SCHEDULES", "RUN_LENGTH", "SETTINGS", "STRUCTURAL",
           "UNSET", "WARMUP", "Request", "Resolved", "TrainConfig", "add_arguments", "algo_config", "annotated_yaml",
           "as_request",
           "changed_settings", "check_resume", "checkpoint_settings", "communicator_options", "default_help",
           "default_run_dir", "first_set", "from_flags", "list_presets", "load_file", "load_preset", "merge",
           "normalise", "recorded", "resolve", "resolve_request", "resolve_values"]
