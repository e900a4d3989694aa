"""The flux_kontext family (FLUX.1 Kontext, an edit model): family.py (FAMILY), tiny.py
(tiny:flux_kontext)."""

ORDER = 55  # place in the family lists (registry.list_families)
