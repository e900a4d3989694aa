"""The Wan validation pipelines: WanPipeline (text-to-video) or WanImageToVideoPipeline
(image-to-video, i2v.py) with the video families' shared glue (core/models/
video_pipeline.py: the output, the synthetic first image, save_pretrained) and the
two-expert LoRA loading and fusing of Wan 2.2 (built on first use, so importing this
module needs no diffusers)."""

from __future__ import annotations

import functools
from typing import Any

from core.models.families.wan.i2v import I2V_PIPELINE
from core.models.video_pipeline import VideoPipeline


@functools.cache
def validation_pipeline_class(base_name: str = "WanPipeline") -> Any:
    """A subclass of diffusers' `base_name` (WanPipeline or WanImageToVideoPipeline)."""
    import diffusers

    from core.models.families.wan.expert_files import expert_files

    base = getattr(diffusers, base_name)

    class WanValidationPipeline(VideoPipeline, base):  # type: ignore[misc, valid-type]
        """With two experts, a LoRA file this family saved loads into the expert it was
        trained for (and a run folder's files into both): `--stage merge` fuses a run's
        LoRA so."""

        diffusers_class = base
        needs_image = base_name == I2V_PIPELINE
        default_size = (832, 480)

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

        @property
        def components(self) -> dict[str, Any]:
            """The modules and the pipeline's own settings (boundary_ratio,
            expand_timesteps), so a pipeline built from them (save_pretrained's, merge's
            diffusers copy) keeps the experts' split."""
            return {**super().components,
                    **{k: self.config[k] for k in ("boundary_ratio", "expand_timesteps")
                       if k in self.config}}

    return WanValidationPipeline
