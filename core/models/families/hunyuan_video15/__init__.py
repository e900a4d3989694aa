"""The hunyuan_video15 family (HunyuanVideo 1.5, 480p and 720p text-to-video and
image-to-video): family.py (FAMILY), text.py (the two text encoders' output packed into
one cached tensor), pipelines.py (the validation pipelines: unpack it, take
validation.guidance_scale, load LoRA files), i2v.py (the first-frame condition of
image-to-video), tiny.py (tiny:hunyuan_video15), tiny_i2v/ (tiny:hunyuan_video15_i2v),
full_size/ (random:hunyuan_video15)."""

ORDER = 110  # place in the family lists (registry.list_families), after wan
