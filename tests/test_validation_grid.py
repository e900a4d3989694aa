"""validation/grid.png: prompts by rounds, the first round beside the last."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from core.runs.folder import RunFolder
from core.train.grid import LABEL_HEIGHT, LABEL_WIDTH, grid_steps, write_validation_grid


def test_grid_steps_keep_the_first_and_the_last_round():
    assert grid_steps([0, 200, 400]) == [0, 200, 400]
    many = list(range(0, 2100, 100))
    picked = grid_steps(many, max_columns=6)
    assert len(picked) == 6 and picked[0] == 0 and picked[-1] == 2000
    assert picked == sorted(set(picked))


def _round(run: Path, step: int, colours: list[tuple[int, int, int]]) -> None:
    folder = RunFolder(run).validation_step(step)
    folder.mkdir(parents=True)
    for i, colour in enumerate(colours):
        Image.new("RGB", (32, 32), colour).save(folder / f"{i:02d}.png")


def test_grid_sets_each_prompts_images_in_its_row_by_round(tmp_path: Path):
    _round(tmp_path, 0, [(255, 0, 0), (0, 255, 0)])
    assert write_validation_grid(tmp_path, ["a", "b"]) is None, "one round: nothing to compare"
    _round(tmp_path, 400, [(0, 0, 255), (255, 255, 0)])
    path = write_validation_grid(tmp_path, ["a red circle", "a green square"])
    assert path == RunFolder(tmp_path).validation_grid
    grid = Image.open(path).convert("RGB")
    assert grid.size == (LABEL_WIDTH + 2 * 32, LABEL_HEIGHT + 2 * 32)

    def cell(row: int, col: int) -> tuple[int, int, int]:
        return grid.getpixel((LABEL_WIDTH + col * 32 + 16, LABEL_HEIGHT + row * 32 + 16))

    assert cell(0, 0) == (255, 0, 0) and cell(0, 1) == (0, 0, 255)
    assert cell(1, 0) == (0, 255, 0) and cell(1, 1) == (255, 255, 0)
