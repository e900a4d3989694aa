"""The defaults of a family's optional members (`FamilyDefaults`), which
StableDiffusionFamily and FlowFamily inherit; the protocol is core/models/base.py."""

from __future__ import annotations

from typing import Any

from core.models.capabilities import (
    AudioSpec,
    EditSpec,
    ExpertSpec,
    FirstImageSpec,
    MemorySpec,
    RandomSpec,
    SingleFileSpec,
    ValidationSpec,
)
from core.models.components import Components
from core.models.geometry import STILLS, Geometry
from core.models.routing import RoutingSpec


class FamilyDefaults:
    """The defaults of the optional family members shared code reads (core/config,
    core/train, full_size, memory, loading): StableDiffusionFamily and FlowFamily inherit
    them, and a family sets only those that differ. Shared code reads these members and
    never a family's name, so a new family folder needs no change outside it."""

    name: str = ""
    prediction: str = ""  # each family's base class sets it; "" for an unknown name
    # Capabilities (core/models/capabilities.py): None where the family has none; the
    # always-present ones have empty defaults.
    audio: AudioSpec | None = None
    edit: EditSpec | None = None
    first_image: FirstImageSpec | None = None
    experts: ExpertSpec | None = None
    single_file: SingleFileSpec = SingleFileSpec()
    random: RandomSpec = RandomSpec()
    memory: MemorySpec = MemorySpec()
    validation: ValidationSpec = ValidationSpec()
    # What the VAE and denoiser do to a sample's shape (core/models/geometry.py): stills
    # by default; a video family (Wan) declares its frame rule and compression.
    geometry: Geometry = STILLS

    @property
    def video(self) -> bool:
        """A video family: its datasets may hold clips (datasets.N.frames), its latents
        keep a frame axis, and validation samples validation.frames frames."""
        return self.geometry.video
    # flux/flux2: guidance value a guidance-distilled model gets in training (None: the
    # family has no guidance-distilled models, and train.guidance is refused at check).
    train_guidance: float | None = None
    # Text tokens the prompt is padded to (T5/Qwen); None where the tokenizer decides.
    max_sequence_length: int | None = None
    # Text-encoder modules train.text_encoder_lora adapts; None: not supported.
    text_encoder_lora_targets: list[str] | None = None
    # Whether diffusers' load_lora_weights of this pipeline loads LoKr (core/models/adapters.py).
    diffusers_lokr: bool = False

    # model_index.json `_class_name` prefix of its diffusers pipelines ("" : none).
    pipeline_prefix: str = ""

    # Trained tiny models (`tiny:<name>`): (name, module whose build() loads its weights).
    trained_tiny: tuple[tuple[str, str], ...] = ()


    # The denoiser's repeated blocks, its nn.ModuleLists' names in forward order (Flux: double,
    # then single): what model.blocks_to_swap streams from host memory (block_swap.py) and the
    # estimate sizes (a dotted name reaches into a submodule: FLUX.3's "mode_blocks.image");
    # none: a UNet (the check refuses it). A model with several denoisers
    # gives one stack per denoiser (`experts.stacks`, core/models/blocks.py reads both).
    # `routing`: see core/models/routing.py.
    block_lists: tuple[str, ...] = ()
    routing: RoutingSpec | None = None

    def config_problems(self, cfg: Any) -> list[Any]:
        """This family's own checks of a Config at --stage check (Problems)."""
        return []

    def configure_run(self, c: Components, cfg: Any) -> None:
        """The run's settings a family reads from the Config onto its loaded model, before
        the trainer adds what it trains (Wan 2.2: model.experts, which expert trains):
        `load` gets no Config. Raises ValueError, naming the key, for a setting the loaded
        model cannot take."""
