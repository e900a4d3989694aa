"""The trainer's refusal, below setup and the cross-machine agreement, which both raise
it (it lived in setup.py, and agreement.py importing it from there made an import
circle: setup -> agreement -> setup)."""

from __future__ import annotations


class TrainingError(Exception):
    """A problem the user can act on; the message says what to do."""

