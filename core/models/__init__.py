"""Model families behind one protocol (see base.py); registry.py finds them without torch."""
