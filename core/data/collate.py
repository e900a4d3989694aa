"""Stack cached items into one training batch, with errors that name the files.

An item (one image, from the latent and text caches) is a dict:
  "latents" [C, H, W], "prompt_embeds" [L, D], "prompt_mask" [L] bool (True = real token),
  optional "pooled_prompt_embeds" [P], optional "original_size" / "crop_top_left" /
  "target_size" (two ints each, SDXL's size conditioning), "path" (the image file) and
  "caption". Any other key is passed through as a list.

The batch: "latents" [B, C, H, W]; "prompt_embeds" [B, Lmax, D] right-padded with zeros and
"prompt_mask" [B, Lmax] False in the padding; "pooled_prompt_embeds" [B, P] when every item
has it; the size ids as LongTensor [B, 2]; "paths" and "captions" as lists.

Most families encode at one fixed length, padded as their pipelines pad at inference
(sd15/sd2/sdxl: CLIP's 77; sd3: 77 + T5's 256; flux, chroma: T5's 512), so their items
never need padding here and the denoiser sees the padding tokens it sees at inference.
Z-Image encodes each prompt at its own length: collate pads, and its `predict` gives the
transformer only the rows the mask marks, as ZImagePipeline passes them. Chroma gives its
transformer the mask (the tokens it attends to, see families/chroma/family.py). (The UNet
accepts an encoder_attention_mask, but masking what the pipelines leave unmasked would
change what training fits; SD3's and Flux's transformers take no text mask.) The mask
marks the real tokens for whoever needs them.

A batch holds one bucket (the sampler guarantees it), so differing latent shapes mean a
stale or foreign cache: CollateError names the files and shapes instead of torch.stack's
bare "stack expects each tensor to be equal size".
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

SIZE_KEYS = ("original_size", "crop_top_left", "target_size")
_KNOWN = {"latents", "prompt_embeds", "prompt_mask", "pooled_prompt_embeds", "path",
          "caption", "loss_mask", *SIZE_KEYS}
_MAX_NAMED = 4  # files named per group in a message; the rest are counted


class CollateError(ValueError):
    """Items that cannot form one batch; the message names the files involved."""

    def __init__(self, message: str, paths: list[str]):
        super().__init__(message)
        self.paths = paths


def _names(paths: list[str]) -> str:
    shown = ", ".join(paths[:_MAX_NAMED])
    more = len(paths) - _MAX_NAMED
    return shown + (f" (+{more} more)" if more > 0 else "")


def _require_same(paths: list[str], values: list[Any], what: str, hint: str) -> None:
    """Raise CollateError when `values` differ, grouping the files by value."""
    groups: dict[Any, list[str]] = defaultdict(list)
    for path, value in zip(paths, values, strict=True):
        groups[value].append(path)
    if len(groups) > 1:
        parts = "; ".join(f"{_fmt(v)}: {_names(p)}" for v, p in groups.items())
        raise CollateError(f"{what} differ within one batch ({parts}). {hint}", paths)


def _fmt(value: Any) -> str:
    return "[" + ", ".join(str(v) for v in value) + "]" if isinstance(value, tuple) else str(value)


def _tensor(item: dict[str, Any], key: str, path: str, dims: int | tuple[int, ...]
            ) -> torch.Tensor:
    value = item.get(key)
    allowed = (dims,) if isinstance(dims, int) else dims
    if not isinstance(value, torch.Tensor) or value.dim() not in allowed:
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        want = " or ".join(str(d) for d in allowed)
        raise CollateError(f"{path}: {key!r} must be a {want}-d tensor, got {got}; "
                           "the cache entry is damaged, delete it to rebuild", [path])
    return value


def _stack(tensors: list[torch.Tensor]) -> torch.Tensor:
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return torch.stack([t.to(dtype) for t in tensors])


def _collate_text(items: list[dict[str, Any]], paths: list[str]) -> dict[str, torch.Tensor]:
    embeds = [_tensor(it, "prompt_embeds", p, 2) for it, p in zip(items, paths, strict=True)]
    _require_same(paths, [e.shape[1] for e in embeds], "text-embedding hidden sizes",
                  "The text cache was probably built by another model; rebuild it.")
    masks = []
    for it, p, e in zip(items, paths, embeds, strict=True):
        mask = it.get("prompt_mask")
        if mask is None:
            mask = torch.ones(e.shape[0], dtype=torch.bool)
        elif not isinstance(mask, torch.Tensor) or tuple(mask.shape) != (e.shape[0],):
            got = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise CollateError(f"{p}: prompt_mask has shape {got} but prompt_embeds has "
                               f"{e.shape[0]} tokens; the text cache entry is damaged", [p])
        masks.append(mask.bool())
    longest = max(e.shape[0] for e in embeds)
    padded = [torch.nn.functional.pad(e, (0, 0, 0, longest - e.shape[0])) for e in embeds]
    mask_out = torch.zeros(len(items), longest, dtype=torch.bool)
    for row, m in enumerate(masks):
        mask_out[row, : m.shape[0]] = m
    return {"prompt_embeds": _stack(padded), "prompt_mask": mask_out}


def _all_or_none(items: list[dict[str, Any]], paths: list[str], key: str) -> bool:
    """True if every item has `key`, False if none has; mixed raises naming both sides."""
    have = [p for it, p in zip(items, paths, strict=True) if it.get(key) is not None]
    if not have:
        return False
    if len(have) < len(items):
        lack = [p for p in paths if p not in have]
        raise CollateError(f"{key!r} is present for {_names(have)} but missing for "
                           f"{_names(lack)}; the caches come from different models, "
                           "rebuild them", paths)
    return True


def _size_ids(items: list[dict[str, Any]], paths: list[str], key: str) -> torch.Tensor:
    rows = []
    for it, p in zip(items, paths, strict=True):
        value = it[key]
        value = value.tolist() if isinstance(value, torch.Tensor) else value
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise CollateError(f"{p}: {key!r} must be two integers, got {value!r}", [p])
        rows.append([int(v) for v in value])
    return torch.tensor(rows, dtype=torch.long)


def _loss_mask(items: list[dict[str, Any]], paths: list[str],
               latents: torch.Tensor) -> torch.Tensor | None:
    """[B, 1, H, W] loss weights when some item has a "loss_mask" (datasets.N.masks);
    an item without one is all ones (trains unmasked). None when no item has one."""
    if all(it.get("loss_mask") is None for it in items):
        return None
    rows = []
    for it, p in zip(items, paths, strict=True):
        mask = it.get("loss_mask")
        if mask is None:
            mask = torch.ones(1, *latents.shape[-2:])
        elif tuple(mask.shape) != (1, *latents.shape[-2:]):
            raise CollateError(f"{p}: its loss mask is {tuple(mask.shape)} but its latents "
                               f"are {tuple(latents.shape[1:])}; the mask cache entry is "
                               "stale, delete it to rebuild", [p])
        rows.append(mask.float())
    return torch.stack(rows)


def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    """One batch from cached items (see the module doc for shapes and errors)."""
    if not items:
        raise CollateError("cannot collate an empty batch", [])
    paths = [str(it.get("path", f"<item {i}>")) for i, it in enumerate(items)]
    # [C, h, w], or [C, frames, h, w] for a video family's images and clips
    latents = [_tensor(it, "latents", p, (3, 4)) for it, p in zip(items, paths, strict=True)]
    _require_same(paths, [tuple(t.shape) for t in latents], "latent shapes",
                  "A batch holds one bucket; the VAE cache is stale or was built at "
                  "another resolution: delete it to rebuild.")
    batch: dict[str, Any] = {"latents": _stack(latents)}
    batch.update(_collate_text(items, paths))
    if _all_or_none(items, paths, "pooled_prompt_embeds"):
        pooled = [_tensor(it, "pooled_prompt_embeds", p, 1)
                  for it, p in zip(items, paths, strict=True)]
        _require_same(paths, [t.shape[0] for t in pooled], "pooled text-embedding sizes",
                      "The text cache was probably built by another model; rebuild it.")
        batch["pooled_prompt_embeds"] = _stack(pooled)
    for key in SIZE_KEYS:
        if _all_or_none(items, paths, key):
            batch[key] = _size_ids(items, paths, key)
    mask = _loss_mask(items, paths, batch["latents"])
    if mask is not None:
        batch["loss_mask"] = mask
    batch["paths"] = paths
    batch["captions"] = [str(it.get("caption", "")) for it in items]
    for key in sorted({k for it in items for k in it} - _KNOWN - set(batch)):
        batch[key] = [it.get(key) for it in items]
    return batch
