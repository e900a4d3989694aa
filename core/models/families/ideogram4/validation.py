"""Ideogram4Pipeline as validation (and --stage merge) use it. Imported by family.py's
`validation_pipeline` only: it imports diffusers at the top."""

from __future__ import annotations

from typing import Any

from diffusers import Ideogram4Pipeline


class Ideogram4Validation(Ideogram4Pipeline):
    """Ideogram4Pipeline called with `prompt_embeds` (the cached text, [1, L, D]) in place
    of a prompt: `encode_prompt` packs those embeddings (text.py `layout`, the pipeline's
    `_prepare_ids`) instead of running the text encoder, so the sampling loop, the
    resolution-aware schedule and the guidance blend are the pipeline's own. The
    unconditional transformer (family.py `Companion`) is registered for the call only and
    joins the denoiser's device while it runs. --stage merge saves it as the plain
    Ideogram4Pipeline (core/merge.py as_diffusers_pipeline), its unconditional
    transformer copied from the base folder."""

    companion: Any = None
    _embeds: Any = None

    def encode_prompt(self, prompt: Any, grid_h: int, grid_w: int, max_sequence_length: int,
                      device: Any) -> tuple[Any, Any, Any, Any]:
        if self._embeds is None:
            return super().encode_prompt(prompt, grid_h, grid_w, max_sequence_length, device)
        import torch

        from core.models.families.ideogram4.text import layout

        embeds = self._embeds.to(device)
        mask = torch.ones(embeds.shape[:2], dtype=torch.bool, device=device)
        p = layout(embeds, mask, grid_h, grid_w)
        return p["encoder_hidden_states"], p["position_ids"], p["segment_ids"], p["indicator"]

    def __call__(self, *args: Any, prompt_embeds: Any = None,
                 negative_prompt_embeds: Any = None, **kwargs: Any) -> Any:
        """No negative prompt: the unconditional transformer takes no text. A constant
        guidance_scale replaces the pipeline's default per-step schedule."""
        if kwargs.get("guidance_scale") is not None:
            kwargs.setdefault("guidance_schedule", None)
        if prompt_embeds is not None:
            kwargs["prompt"] = [""] * prompt_embeds.shape[0]
            kwargs["max_sequence_length"] = prompt_embeds.shape[1]
        unconditional = self.companion.get(self.transformer)
        home = next(unconditional.parameters()).device
        self.register_modules(unconditional_transformer=unconditional.to(
            self.transformer.device))
        self._embeds = None if prompt_embeds is None else prompt_embeds.float()
        try:
            return super().__call__(*args, **kwargs)
        finally:
            self._embeds = None
            self.register_modules(unconditional_transformer=None)
            unconditional.to(home)
