"""The wan family (Wan 2.1 / 2.2 text-to-video): family.py (FAMILY), tiny.py (tiny:wan),
full_size/ (random:wan); Wan 2.2's two experts: experts.py (the routing denoiser),
expert_files.py (a LoRA file per expert), expert_checks.py (model.experts), tiny22/
(tiny:wan22); image-to-video: i2v.py (the first-frame condition), tiny_i2v/
(tiny:wan_i2v); Wan 2.2 TI2V-5B: ti2v.py (per-token timesteps), tiny_ti2v/
(tiny:wan_ti2v); pipelines.py (the validation pipelines)."""

from typing import Any

ORDER = 100  # place in the family lists (registry.list_families)


def __getattr__(attr: str) -> Any:
    # FAMILY imports family.py on first use: listing the families stays import-free.
    if attr == "FAMILY":
        from core.models.families.wan.family import FAMILY
        return FAMILY
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
