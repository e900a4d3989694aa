"""Collate: padded text embeddings with the right mask, and errors that name the files."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from core.data.collate import CollateError, collate


def item(path: str, tokens: int, *, hidden: int = 8, latent: tuple[int, int, int] = (4, 8, 8),
         pooled: int | None = None, sizes: bool = False, **extra: Any) -> dict[str, Any]:
    g = torch.Generator().manual_seed(tokens * 31 + hidden)
    out: dict[str, Any] = {
        "latents": torch.randn(latent, generator=g),
        "prompt_embeds": torch.randn(tokens, hidden, generator=g) + 1.0,  # never exactly 0
        "prompt_mask": torch.ones(tokens, dtype=torch.bool),
        "path": path,
        "caption": f"caption of {path}",
    }
    if pooled is not None:
        out["pooled_prompt_embeds"] = torch.randn(pooled, generator=g)
    if sizes:
        out.update(original_size=(1080, 1920), crop_top_left=(0, 10), target_size=(768, 1344))
    out.update(extra)
    return out


def test_variable_length_embeddings_are_right_padded_with_a_false_mask() -> None:
    items = [item("a.png", 5), item("b.png", 9), item("c.png", 7)]
    items[2]["prompt_mask"][6] = False  # a family may mask its own padding already
    batch = collate(items)
    assert batch["latents"].shape == (3, 4, 8, 8)
    assert batch["prompt_embeds"].shape == (3, 9, 8)
    assert batch["prompt_mask"].dtype == torch.bool
    assert batch["prompt_mask"].sum(dim=1).tolist() == [5, 9, 6]
    assert batch["prompt_mask"][0].tolist() == [True] * 5 + [False] * 4
    assert torch.equal(batch["prompt_embeds"][0, :5], items[0]["prompt_embeds"])
    assert torch.count_nonzero(batch["prompt_embeds"][0, 5:]) == 0  # zeros in the padding
    assert torch.equal(batch["prompt_embeds"][1], items[1]["prompt_embeds"])
    assert batch["paths"] == ["a.png", "b.png", "c.png"]
    assert batch["captions"][1] == "caption of b.png"
    assert "pooled_prompt_embeds" not in batch and "original_size" not in batch


def test_pooled_embeddings_and_size_ids_are_stacked() -> None:
    items = [item("a.png", 3, pooled=6, sizes=True), item("b.png", 4, pooled=6, sizes=True)]
    batch = collate(items)
    assert batch["pooled_prompt_embeds"].shape == (2, 6)
    for key, value in [("original_size", [1080, 1920]), ("crop_top_left", [0, 10]),
                       ("target_size", [768, 1344])]:
        assert batch[key].dtype == torch.long and batch[key].shape == (2, 2)
        assert batch[key][1].tolist() == value


def test_latents_from_two_buckets_name_both_files_and_shapes() -> None:
    items = [item("cats/a.png", 4), item("cats/b.png", 4, latent=(4, 8, 12))]
    with pytest.raises(CollateError) as exc:
        collate(items)
    msg = str(exc.value)
    assert "cats/a.png" in msg and "cats/b.png" in msg
    assert "[4, 8, 8]" in msg and "[4, 8, 12]" in msg
    assert "stack expects" not in msg
    assert exc.value.paths == ["cats/a.png", "cats/b.png"]


def test_hidden_size_mismatch_blames_another_model() -> None:
    with pytest.raises(CollateError, match=r"hidden sizes.*a\.png.*b\.png.*another model"):
        collate([item("a.png", 4, hidden=8), item("b.png", 4, hidden=16)])


def test_pooled_size_mismatch_and_partial_pooled_name_the_files() -> None:
    with pytest.raises(CollateError, match=r"pooled.*6: a\.png; 5: b\.png"):
        collate([item("a.png", 4, pooled=6), item("b.png", 4, pooled=5)])
    with pytest.raises(CollateError, match=r"present for a\.png but missing for b\.png"):
        collate([item("a.png", 4, pooled=6), item("b.png", 4)])


def test_mixed_dtypes_are_promoted_not_crashed() -> None:
    a, b = item("a.png", 3), item("b.png", 3)
    a["latents"] = a["latents"].half()
    assert collate([a, b])["latents"].dtype == torch.float32


def test_damaged_entries_name_the_file() -> None:
    bad = item("x.png", 4)
    bad["prompt_mask"] = torch.ones(3, dtype=torch.bool)
    with pytest.raises(CollateError, match=r"x\.png: prompt_mask has shape \(3,\)"):
        collate([item("a.png", 4), bad])
    bad = item("y.png", 4)
    bad["latents"] = bad["latents"][0]
    with pytest.raises(CollateError, match=r"y\.png: 'latents' must be a 3 or 4-d tensor"):
        collate([bad])
    with pytest.raises(CollateError, match="empty batch"):
        collate([])


def test_many_files_are_summarised_and_extra_keys_pass_through() -> None:
    items = [item(f"{i}.png", 4) for i in range(7)] + [item("odd.png", 4, latent=(4, 8, 16))]
    with pytest.raises(CollateError, match=r"\(\+3 more\).*odd\.png"):
        collate(items)
    batch = collate([item("a.png", 2, dataset_id="x"), item("b.png", 2, dataset_id="y")])
    assert batch["dataset_id"] == ["x", "y"]
