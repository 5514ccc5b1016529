"""Drop-in integrations: each wraps a Profiler and calls it at its framework's hooks.

Import the one you use; each needs its framework, installed by an extra:

- `rankscope.integrations.hf`: `RankscopeCallback` for the Hugging Face Trainer (`rankscope[hf]`).
- `rankscope.integrations.lightning`: `RankscopeCallback` for the Lightning Trainer (`rankscope[lightning]`).
- `rankscope.integrations.ray`: a mixin for Ray actors and a driver-side helper (`rankscope[ray]`).

Integrations add no behaviour of their own beyond calling start, phase, step and stop.
"""
