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
