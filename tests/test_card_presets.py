"""The presets for the cards people own (presets/*-24gb.toml, *-16gb.toml, written by
tools/card_presets.py): each passes the check on its model's real sizes and its estimate
is at least 1 GiB under its card, with the swapped blocks' pinned host memory shown, and
the file is what the tool writes today."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from conftest import REPO, write_shapes

sys.path.insert(0, str(REPO / "tools"))
from card_presets import PRESETS  # noqa: E402

GIB = 1024 ** 3


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cards")
    write_shapes(folder / "data/mydata", 2)
    for side in ("edited", "source"):  # the edit presets' pairs (same names)
        write_shapes(folder / f"data/pairs/{side}", 2)
    shutil.copy(folder / "data/pairs/source/img_000.png", folder / "data/pairs/source/example.png")
    return folder


@pytest.mark.parametrize("preset", PRESETS, ids=[p.name for p in PRESETS])
def test_a_card_preset_checks_clean_and_fits_its_card(workspace: Path, preset) -> None:
    from core.check import run_check
    from core.config import apply_overrides, load_config
    from core.presets import preset_path

    cfg = apply_overrides(load_config(preset_path(preset.name)), [
        f"model.path={preset.sizes}", f"launch.gpu_memory_gib={preset.card}"])
    report = run_check(cfg, workspace)
    assert [p for p in report.problems if p.level == "error"] == []
    memory = report.memory
    assert memory is not None and memory.unknown is None
    assert memory.total_bytes <= (preset.card - 1) * GIB, memory.lines()
    assert memory.swap_fit is None  # nothing left to advise
    if cfg.model.blocks_to_swap:
        assert any(line.startswith("  host memory: ") for line in memory.lines())
    # The file is what tools/card_presets.py writes today: a change to the estimate that
    # moves a preset's fit fails here (rerun the tool and review the diff).
    from card_presets import render

    assert preset_path(preset.name).read_text(encoding="utf-8") == render(preset, workspace)


def test_random_variants_read_their_own_configs_and_an_unknown_one_is_named() -> None:
    """random:<family>:<variant> (the 14B and A14B Wans, FLUX.2-dev) read the configs
    shipped beside the family's own; an unknown variant is refused naming those."""
    from core.models.full_size.meta import parameter_counts
    from core.models.full_size.spec import check_random_source

    assert check_random_source("random:wan:14b", "wan") == []
    assert check_random_source("random:flux2:dev", "flux2") == []
    wan = parameter_counts("wan:a14b")
    assert 14.0e9 < wan["transformer"] == wan["transformer_2"] < 14.5e9
    assert 32.0e9 < parameter_counts("flux2:dev")["transformer"] < 32.5e9
    [problem] = check_random_source("random:wan:nope", "wan")
    assert problem.where == "model.path" and "random:wan:14b" in problem.message
    [other] = check_random_source("random:wan:14b", "flux")
    assert "model.family is flux" in other.message
