"""The hunyuan_video15 family (HunyuanVideo 1.5, 480p and 720p text-to-video): family.py
(FAMILY), text.py (the two text encoders' output packed into one cached tensor),
pipelines.py (the validation pipeline: unpacks it, takes validation.guidance_scale, loads
LoRA files), tiny.py (tiny:hunyuan_video15), full_size/ (random:hunyuan_video15)."""

ORDER = 110  # place in the family lists (registry.list_families), after wan
