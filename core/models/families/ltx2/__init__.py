"""The ltx2 family (Lightricks LTX-2 text-to-video with its audio track): family.py
(FAMILY), text.py (Gemma 3 through the text connectors, cached), audio.py (a clip's audio
as the audio VAE's latents, and the audio half of the objective), pipelines.py (the
validation pipeline), tiny.py (tiny:ltx2), full_size/ (random:ltx2's configs)."""

ORDER = 105  # place in the family lists (registry.list_families): after wan
