"""The Wan validation pipelines: WanPipeline (text-to-video) or WanImageToVideoPipeline
(image-to-video, i2v.py) whose output reads like an image pipeline's, with the two-expert
LoRA loading and fusing of Wan 2.2 (built on first use, so importing this module needs no
diffusers)."""

from __future__ import annotations

import functools
from typing import Any

from core.models.families.wan.i2v import I2V_PIPELINE, synthetic_image


@functools.cache
def validation_pipeline_class(base_name: str = "WanPipeline") -> Any:
    """A subclass of diffusers' `base_name` (WanPipeline or WanImageToVideoPipeline)."""
    from types import SimpleNamespace

    import diffusers
    from PIL import Image

    from core.models.families.wan.expert_files import expert_files

    base = getattr(diffusers, base_name)
    needs_image = base_name == I2V_PIPELINE

    class WanValidationPipeline(base):  # type: ignore[misc, valid-type]
        """Returns `.images` (the first frame of each video, what the gallery and the grid
        show) and `.frames` (each video's frames as PIL images, for the .mp4). With two
        experts, a LoRA file this family saved loads into the expert it was trained for
        (and a run folder's files into both): `--stage merge` fuses a run's LoRA so.
        Image-to-video without an `image` starts from i2v.synthetic_image: the config
        names no conditioning image per validation prompt."""

        def __call__(self, *args: Any, num_frames: int = 1, **kwargs: Any) -> Any:
            kwargs["output_type"] = "np"
            if needs_image and not args and kwargs.get("image") is None:
                kwargs["image"] = synthetic_image(int(kwargs.get("width") or 832),
                                                  int(kwargs.get("height") or 480))
            videos = super().__call__(*args, num_frames=num_frames, **kwargs).frames
            frames = [[Image.fromarray((f * 255).round().clip(0, 255).astype("uint8"))
                       for f in video] for video in videos]
            return SimpleNamespace(images=[v[0] for v in frames], frames=frames)

        def load_lora_weights(self, source: Any, adapter_name: str | None = None,
                              **kwargs: Any) -> None:
            """diffusers' loading, except that with two experts a file recording its
            expert goes into it (expert_files.expert_files says which files, where)."""
            plan = None
            if self.transformer_2 is not None and "load_into_transformer_2" not in kwargs:
                plan = expert_files(source, kwargs.get("weight_name"))
            if plan is None:
                return super().load_lora_weights(source, adapter_name=adapter_name, **kwargs)
            for file, low in plan:
                super().load_lora_weights(str(file.parent), adapter_name=adapter_name,
                                          **{**kwargs, "weight_name": file.name,
                                             "load_into_transformer_2": low})
            return None

        def fuse_lora(self, components: list[str] | None = None, **kwargs: Any) -> None:
            """Every expert holding a LoRA (diffusers' Wan default fuses `transformer`
            alone, and would leave transformer_2's LoRA out of a merge)."""
            if components is None:
                components = [n for n in ("transformer", "transformer_2")
                              if getattr(getattr(self, n), "peft_config", None)]
            super().fuse_lora(components=components or ["transformer"], **kwargs)

        def save_pretrained(self, save_directory: Any, **kwargs: Any) -> None:
            """Saved as a plain `base_name` (a full fine-tune's model/): model_index.json
            then names a class DiffusionPipeline.from_pretrained finds."""
            base(**self.components).save_pretrained(save_directory, **kwargs)

        @property
        def components(self) -> dict[str, Any]:
            """The modules and the pipeline's own settings (boundary_ratio,
            expand_timesteps), so a pipeline built from them (save_pretrained's, merge's
            diffusers copy) keeps the experts' split."""
            return {**super().components,
                    **{k: self.config[k] for k in ("boundary_ratio", "expand_timesteps")
                       if k in self.config}}

    return WanValidationPipeline
