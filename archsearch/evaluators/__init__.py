"""The measurements a trial makes: proxy training and kernel profiling (torch-heavy modules).

- `model`: the proxy transformer built from an `ArchConfig`.
- `flop_formulas`: the attention FLOP formulas FlopCounterMode lacks, registered on import.
- `counting`: an eager training step counted with the dispatcher (kernels, autograd nodes, bytes).
- `data`: the bundled byte-level corpus and user token files.
- `trainer`: short proxy training with a width-scaled learning rate.
- `kernels`: the GEMM / attention / memory-op inventory of one training step (pure).
- `profiler`: times that inventory on the device at hand, with a measurement cache.
- `hardware`: predicts it on catalogued GPUs that are not here, and calibrates to this one.

Import the submodule you need; this package imports nothing heavy itself.
"""
