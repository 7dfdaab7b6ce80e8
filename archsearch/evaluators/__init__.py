"""What a shape does on hardware: proxy training, and step and serving times measured on the device
at hand or modelled for GPUs that are not here. The torch-heavy modules live here; the pure ones
say so.

The proxy and its training:
- `model`: the proxy transformer built from an `ArchConfig`, read top to bottom.
- `flop_formulas`: the attention FLOP formulas FlopCounterMode lacks, registered on import.
- `settings`: how a proxy is trained (`TrainSettings`, learning-rate schedules; no torch).
- `data`: where the tokens come from (the bundled byte-level corpus, user text, token files).
- `dataset`: a loaded token dataset, its splits and its batches.
- `trainer`: short proxy training with a width-scaled learning rate.

A training step, measured and modelled:
- `device`: the device at hand, whose fingerprint keys every measurement.
- `step_kernels`: the GEMM / attention / memory-op inventory of one training step (pure).
- `counting`: an eager step counted with the dispatcher (kernels, autograd nodes, bytes).
- `profiler`: times that inventory on the device at hand, with a measurement cache (measured).
- `catalogue`: the published figures of each catalogued accelerator, with sources (pure data).
- `hardware`: predicts the inventory on catalogued GPUs and calibrates to this one (modelled).
- `alignment`: which widths of a shape suit a device's tiles, and nearby sizes that do better.
- `step_record`: real training steps recorded with their kernels, for `fit-device`.
- `step_fit`: the GPU model fitted to those recorded steps.
- `step_time`: one step time of a shape, measured here or modelled (`step_profile`).

Serving:
- `hardware_serving`: prefill and decode time modelled on a device model (pure).
- `serve_profiler`: prefill and decode time measured on the device at hand, with the local model's
  prediction beside it.

Import the submodule you need; this package imports nothing heavy itself.
"""
