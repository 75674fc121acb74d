"""What tests, checks and benchmarks use and training does not (nothing here is imported by a run).

- ``gradcheck.py``: finite-difference gradient checks of layers and models (float64).
- ``torch_ref.py``: PyTorch twins of the registry's models: the engine's oracle in the tests and
  its peer in ``ssdmpi bench engine`` and the GPU check (PyTorch is imported inside its functions).
- ``torch_gpt.py``: the ``gpt`` model's twin, a plain nanoGPT module with nanoGPT's ``state_dict`` names.
- ``fused_bench.py``: the optimizer updates as written before ``ssdmpi/optim/fused.py`` (the tests'
  bitwise oracle) and ``python -m ssdmpi.verify.fused_bench``, which times the two.
"""
