"""The per-GPU memory estimate `--stage check` and the Training tab print, and what it
reads (docs/memory.md).

estimate.py assembles it from the model's sizes (model_counts.py: meta-device components
from their configs, kept on disk by sizes_cache.py), the activation formulas
(activations.py), the largest step (step.py), the swapped blocks (swap.py) and the host
memory (host.py); report.py holds its parts and `memory:` lines, fit.py the settings that
make it fit its card, gpu_probe.py the machine's GPU. advice.py words the settings that
need less memory, for the estimate and for the trainer's and the cache job's refusal when
the GPU runs out, so it sits lower than the rest (tests/test_layering.py).

Nothing is imported here: `core.memory.advice` is read by the cache job and the trainer
without the estimate.
"""
