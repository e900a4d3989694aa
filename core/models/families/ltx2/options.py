"""LTX-2's own config keys, merged into the schema by core/config/family_options.py: the
form shows them for model.family = "ltx2" only, and the check refuses them set on another
family. Data only (no torch): the schema imports this while core.config is built.

Why a key and not the model folder: LTX-2 ships one transformer for both modes
(diffusers' LTX2Pipeline and LTX2ImageToVideoPipeline load the same components), so the
folder cannot say which one a run trains."""

from __future__ import annotations

from dataclasses import dataclass

from core.fields import _f

TEXT_TO_VIDEO = "text_to_video"
IMAGE_TO_VIDEO = "image_to_video"
MODE_CHOICES = (TEXT_TO_VIDEO, IMAGE_TO_VIDEO)


@dataclass
class LTX2ModelOptions:
    ltx2_mode: str = _f(TEXT_TO_VIDEO, label="LTX-2 mode", choices=MODE_CHOICES,
                        help="text_to_video trains as LTX2Pipeline samples (every latent "
                             "frame noised). image_to_video trains as "
                             "LTX2ImageToVideoPipeline samples: each clip's first latent "
                             "frame stays clean at timestep 0 as the condition and takes no "
                             "loss, and validation starts each prompt from its "
                             "validation.control_images entry (a synthetic image without "
                             "one). One checkpoint does both; the cache is the same.")


OPTIONS = {"model": LTX2ModelOptions}
