"""Where the form's fields sit on the page: the real Blocks, built without serving."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest

from core.config.schema import ModelConfig


def _descendants(block: object) -> Iterator[object]:
    for child in getattr(block, "children", None) or []:
        yield child
        yield from _descendants(child)


def _ids(block: object) -> list[str]:
    return [c.elem_id for c in _descendants(block) if getattr(c, "elem_id", None)]


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from ui.app import build_app
    from ui.context import AppContext

    ctx = AppContext(Path(tmp_path_factory.mktemp("ui-layout")))
    try:
        yield build_app(ctx)
    finally:
        ctx.close()


def test_model_config_sits_beside_model_path_in_the_training_tab(page) -> None:
    import gradio as gr

    train = next(b for b in _descendants(page) if isinstance(b, gr.Tab) and b.label == "Training")
    row = next(b for b in _descendants(train)
               if isinstance(b, gr.Row) and "f-model-path" in _ids(b))
    ids = [i for i in _ids(row) if i.startswith("f-model-")]
    assert ids[ids.index("f-model-path") + 1] == "f-model-config", ids
    config = next(c for c in _descendants(row) if getattr(c, "elem_id", "") == "f-model-config")
    assert "single" in config.label.lower() and "from_single_file" in config.info
    advanced = next(b for b in _descendants(train) if getattr(b, "elem_id", "") == "advanced")
    assert "f-model-prediction_type" in _ids(advanced)
    shown = set(_ids(train))
    assert {f"f-model-{f.name}" for f in fields(ModelConfig)} <= shown, "every model key"


def test_the_optimizer_and_flow_objective_keys_sit_in_advanced_settings(page) -> None:
    """Issue 26 items 1-2: each new train key is a field of the advanced accordion, and
    the optimizer dropdown offers every optimizer."""
    import gradio as gr

    from core.config.optimizers import OPTIMIZER_NAMES

    advanced = next(b for b in _descendants(page) if getattr(b, "elem_id", "") == "advanced")
    keys = ("optimizer", "optimizer_beta1", "optimizer_beta2", "optimizer_eps",
            "prodigy_d_coef", "prodigy_safeguard_warmup", "timestep_sampling", "logit_mean",
            "logit_std", "mode_scale", "flow_shift", "loss_weighting", "guidance")
    assert {f"f-train-{k}" for k in keys} <= set(_ids(advanced))
    dropdown = next(c for c in _descendants(advanced)
                    if getattr(c, "elem_id", "") == "f-train-optimizer")
    assert isinstance(dropdown, gr.Dropdown)
    assert [c[0] for c in dropdown.choices] == list(OPTIMIZER_NAMES)
