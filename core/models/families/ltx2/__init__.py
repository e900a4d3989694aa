"""The ltx2 family (Lightricks LTX-2 text-to-video with its audio track): family.py
(FAMILY), text.py (Gemma 3 through the text connectors, cached), audio.py (a clip's audio
as the audio VAE's latents, and the audio half of the objective), pipelines.py (the
validation pipeline), tiny.py (tiny:ltx2), full_size/ (random:ltx2's configs); LTX-2.3
and LTX-2.5: versions.py (which one a model is, 2.3's validation guidance, 2.5's
refusal), tiny23/ (tiny:ltx23), full_size_2.3/ (random:ltx2:2.3)."""

ORDER = 105  # place in the family lists (registry.list_families): after wan
