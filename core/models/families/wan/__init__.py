"""The wan family (Wan 2.1 / 2.2 text-to-video): family.py (FAMILY), tiny.py (tiny:wan),
full_size/ (random:wan); Wan 2.2's two experts: experts.py (the routing denoiser),
expert_files.py (a LoRA file per expert), expert_checks.py (model.experts), tiny22/
(tiny:wan22); image-to-video: i2v.py (the first-frame condition), tiny_i2v/
(tiny:wan_i2v); Wan 2.2 TI2V-5B: ti2v.py (per-token timesteps), tiny_ti2v/
(tiny:wan_ti2v); pipelines.py (the validation pipelines)."""

ORDER = 100  # place in the family lists (registry.list_families)
