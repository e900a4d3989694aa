"""`train.noise_offset` reaches the training loop: the same seed with and without an
offset draws different noise from the first step, and the same offset replays exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import step_losses


@pytest.mark.slow
def test_noise_offset_changes_the_noise_the_loop_trains_on(tmp_path: Path,
                                                           tiny_workspace: Path) -> None:
    plain = step_losses(tmp_path / "plain", 3, noise_offset=0.0)
    offset = step_losses(tmp_path / "offset", 3, noise_offset=0.5)
    again = step_losses(tmp_path / "again", 3, noise_offset=0.5)
    assert len(plain) == len(offset) == 3
    assert offset == again  # seeded: a resume or a rerun replays the same draws
    assert plain[0] != offset[0]
