"""What the config is: one dataclass per TOML section, whose field metadata (label, help,
choices, bounds, kind) drives conversion, validation, docs/config.md and the UI form.

A new key is one field here; a new section is one field of `Config` (and its dataclass).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, get_type_hints

from core.config.dataset import DatasetConfig
from core.config.family_options import with_family_options
from core.config.optimizers import (
    DEFAULT_OPTIMIZER,
    OPTIMIZER_NAMES,
    OPTION_FIELDS,
    optimizer_help,
)
from core.config.sections import (
    CaptioningConfig,
    LaunchConfig,
    LoggingConfig,
    OutputConfig,
    TextCacheConfig,
)
from core.fields import _f
from core.models.adapters import LORA_KINDS
from core.models.objectives import LOSS_WEIGHTINGS, MODE_SCALE, TIMESTEP_SAMPLINGS
from core.models.registry import (
    DEFAULT_FAMILY,
    families,
    frame_rates,
    frame_rules,
    names_where,
)
from core.models.registry import FAMILY_NAMES as FAMILIES

CONFIG_VERSION = 1
QUANTIZE_CHOICES = ("none", "int8", "fp8", "nf4")
PREDICTION_TYPES = ("auto", "epsilon", "v_prediction")
COMPILE_CHOICES = ("off", "blocks")  # train.compile (issue 37)
# train.lr_scheduler: diffusers' get_scheduler names (piecewise_constant left out)
LR_SCHEDULES = ("constant", "constant_with_warmup", "linear", "cosine",
                "cosine_with_restarts", "polynomial")


def _auto_sampling() -> str:
    """Each flow family's own timestep sampling, grouped: "logit_normal for sd3, ..."."""
    laws: dict[str, list[str]] = {}
    for f in families():
        if f.prediction == "flow_matching":
            laws.setdefault(f.timestep_sampling, []).append(f.name)  # type: ignore[attr-defined]
    return "; ".join(f"{law} for {', '.join(names)}" for law, names in laws.items())


@dataclass
class SharedModelConfig:
    """[model]: the keys every family reads; ModelConfig adds the families' own."""

    family: str = _f(DEFAULT_FAMILY, label="Model family", choices=FAMILIES,
                     help="Architecture of the base model.")
    path: str = _f(f"tiny:{DEFAULT_FAMILY}", label="Model path", kind="model_path",
                   help="Hub id, local diffusers folder, single-file .safetensors "
                        "(a ComfyUI diffusion-model file in bf16, fp8 or fp8_scaled too: "
                        f"{names_where(lambda f: getattr(f, 'transformer_class_name', ''))}"
                        "; fp8 ones train as model.quantize = fp8), "
                        "tiny:<family> for a tiny offline model, or random:<family> for "
                        "the full-size architecture with random weights (memory and "
                        "speed measurements without downloads).")
    quantize: str = _f("none", label="Quantize frozen base", choices=QUANTIZE_CHOICES,
                       help="Store the frozen denoiser's linear weights in 8 or 4 bits "
                            "(torchao int8/fp8, bitsandbytes nf4) so large models fit; "
                            "LoRA trains on top and saves a normal LoRA. fp8 needs a "
                            "GPU with fp8 (compute capability 8.9+), nf4 bitsandbytes.")
    training_adapter: list[str] = _f(
        [], label="Training adapter", kind="path", advanced=True,
        help="LoRA file(s) fused into the frozen base while training only (a de-distill "
             "adapter for a distilled base, as ai-toolkit's training adapters): never in "
             "the run's LoRA or merged model; validation samples without it unless "
             "validation.with_training_adapter. Its modules must be the base's.")
    config: str = _f("", label="Architecture config (single file)", kind="model_path",
                     help="For a single-file .safetensors: a diffusers folder or hub id of "
                          "the same architecture, whose configs and tokenizers describe the "
                          "file (diffusers' from_single_file(config=...)). Needed offline.")
    prediction_type: str = _f("auto", label="Prediction type", ddpm=True, choices=PREDICTION_TYPES,
                              advanced=True,
                              help="What the denoiser predicts (epsilon/v families): auto "
                                   "reads the scheduler config; set epsilon for the 512 px "
                                   "base files of a v-prediction family ("
                                   f"{names_where(lambda f: f.prediction == 'v_prediction')}"
                                   "), v_prediction for its 768 px files and for v-pred "
                                   "fine-tunes.")
    blocks_to_swap: int = _f(0, label="Blocks to swap", min=0, max=1000, blocks=True,
                             help="Keep this many of the denoiser's transformer blocks in "
                                  "host memory and copy each to the GPU just before it runs "
                                  "(0: off), so a base larger than the card trains; needs "
                                  "gradient checkpointing and a LoRA. The check names the "
                                  "smallest count that fits the card (docs/memory.md).")
    stream_text_encoders: bool = _f(False, label="Stream text encoders", advanced=True,
                                    help="While the text cache is built, keep the text "
                                         "encoders' layers in host memory and copy each to "
                                         "the GPU as it runs: slower caching, for a text "
                                         "encoder larger than the card (a 24B one, or a 7B "
                                         "one on 16 GB).")


ModelConfig = with_family_options("model", SharedModelConfig, "ModelConfig")


@dataclass
class SharedTrainConfig:
    """[train]: the keys every family reads; TrainConfig adds the families' own."""

    method: str = _f("lora", label="Method", choices=("lora", "full"))
    lora_kind: str = _f("lora", label="Adapter kind", lora=True, choices=LORA_KINDS,
                        help="lora: low-rank update B x A (the usual LoRA). "
                             "dora: LoRA plus a learned magnitude per output channel "
                             "(weight-decomposed; often closer to a full fine-tune). "
                             "lokr: LyCORIS LoKr, a Kronecker product of two small "
                             "factors (few parameters). "
                             "loha: LyCORIS LoHa, the elementwise product of two "
                             "low-rank updates (more expressive at the same rank). "
                             "diffusers loads lora and dora (and lokr on "
                             f"{names_where(lambda f: f.diffusers_lokr)}); the others save "
                             "only the kohya/LyCORIS (ComfyUI/A1111) file.")
    lora_rank: int = _f(16, label="LoRA rank", lora=True, min=1, max=1024)
    lora_alpha: float = _f(0.0, label="LoRA alpha", lora=True, min=0.0, max=4096, advanced=True,
                           help="0 means alpha = rank.")
    lora_targets: str = _f("attention", label="LoRA targets", choices=("attention", "all"),
                           lora=True, advanced=True, help="attention: the attention projections "
                           "(diffusers' examples); all: also convolutions and feed-forwards "
                           "(LoCon style, more capacity).")
    max_steps: int = _f(1000, label="Max steps", min=1, max=10_000_000)
    batch_size: int = _f(1, label="Batch size", min=1, max=4096)
    grad_accum: int = _f(1, label="Gradient accumulation", min=1, max=4096)
    learning_rate: float = _f(1e-4, label="Learning rate", min=0.0, max=1.0, min_exclusive=True)
    lr_scheduler: str = _f("constant", label="LR schedule", advanced=True,
                           choices=LR_SCHEDULES,
                           help="diffusers' get_scheduler: constant (no warm-up: use "
                                "constant_with_warmup for one), constant_with_warmup, "
                                "linear (to 0 at max_steps), cosine (to 0), "
                                "cosine_with_restarts (train.lr_cycles hard restarts), "
                                "polynomial (train.lr_power, to 1e-7). Each decaying one "
                                "starts after train.lr_warmup_steps.")
    lr_warmup_steps: int = _f(0, label="Warm-up steps", min=0, max=10_000_000, advanced=True)
    lr_cycles: int = _f(1, label="LR restarts (cycles)", min=1, max=10_000, advanced=True,
                        help="cosine_with_restarts: the number of cosine cycles, each "
                             "starting again from the full rate.")
    lr_power: float = _f(1.0, label="LR polynomial power", min=0.0, max=100.0,
                         min_exclusive=True, advanced=True,
                         help="polynomial: the decay's power (1 is linear, 2 quadratic).")
    optimizer: str = _f(DEFAULT_OPTIMIZER, label="Optimizer", choices=OPTIMIZER_NAMES,
                        advanced=True,
                        help=optimizer_help())
    weight_decay: float = _f(0.01, label="Weight decay", min=0.0, max=10.0, advanced=True)
    max_grad_norm: float = _f(1.0, label="Gradient clip norm", min=0.0, max=1e6, advanced=True,
                              help="0 disables clipping.")
    seed: int = _f(42, label="Seed", min=0, max=2**63 - 1)
    mixed_precision: str = _f("no", label="Mixed precision", choices=("no", "fp16", "bf16"))
    gradient_checkpointing: bool = _f(False, label="Gradient checkpointing", advanced=True)
    compile: str = _f("off", label="Compile blocks", choices=COMPILE_CHOICES, advanced=True,
                      help="blocks: torch.compile each of the denoiser's repeated "
                           "transformer blocks (the ones model.blocks_to_swap streams), "
                           "with dynamic shapes so a new aspect bucket does not compile "
                           "again. The first step takes longer (it compiles; the log "
                           "says how long); bench/peers.py measures what the later "
                           "steps gain on a GPU. Not with model.quantize, "
                           "model.blocks_to_swap or a UNet family.")
    token_routing: float = _f(0.0, label="Token routing", min=0.0, max=1.0, max_exclusive=True,
                              advanced=True, routing=True,
                              help="The share of image/video tokens that skip the "
                                   "denoiser's middle blocks in each training step (TREAD): "
                                   "a random set, drawn every step, goes around the middle "
                                   "half of the blocks and rejoins after them, so those "
                                   "blocks run on fewer tokens and the step is faster "
                                   "(docs/performance.md). 0: off. Eval and validation "
                                   "always see every token. Transformer families that "
                                   "declare it only.")
    min_snr_gamma: float = _f(0.0, label="Min-SNR gamma", min=0.0, max=100.0, advanced=True,
                              ddpm=True,
                              help="0 disables min-SNR weighting (epsilon/v families only).")
    ema: bool = _f(False, label="EMA of weights", advanced=True)
    ema_decay: float = _f(0.999, label="EMA decay", min=0.0, max=1.0, advanced=True)
    checkpoint_every: int = _f(250, label="Checkpoint every (steps)", min=1, max=10_000_000)
    keep_checkpoints: int = _f(3, label="Checkpoints kept", min=1, max=1000,
                               help="The newest N checkpoints are kept; the LoRAs saved "
                                    "beside them (lora/step_NNNNNN/) always are.")
    log_every: int = _f(0, label="Read the loss every (steps)", min=0, max=10_000,
                        advanced=True,
                        help="Steps between reads of the loss from the device, each read "
                             "waiting for the device to finish: the step lines, events and "
                             "loss checks of the steps between come together then. 0: "
                             "every step on the CPU (a read costs nothing there), every 10 "
                             "on a GPU.")
    eval_every: int = _f(50, label="Eval every (steps)", min=1, max=10_000_000, advanced=True)
    eval_images: int = _f(8, label="Eval images", min=1, max=1000, advanced=True)
    eval_before_training: bool = _f(False, label="Eval before training", advanced=True,
                                    help="Also evaluate the untrained base at step 0, so "
                                         "the eval curve starts from the base's loss.")
    caption_dropout: float = _f(0.0, label="Caption dropout", min=0.0, max=1.0, advanced=True,
                                help="Share of samples trained on the empty caption (the "
                                     "model learns the images unconditioned too, which "
                                     "classifier-free guidance uses); 0 disables.")
    guidance_target_scale: float = _f(
        0.0, label="Guidance target scale", min=0.0, max=30.0, advanced=True,
        help="For a CFG-distilled base (one that samples without a negative prompt at "
             "guidance 1): the model's output is read as a prediction guided at this "
             "scale by the base's own unconditional (empty caption) prediction, so a "
             "LoRA keeps the base's distillation (one extra no-grad forward per sample). "
             "0 disables; otherwise above 1.")
    noise_offset: float = _f(0.0, label="Noise offset", ddpm=True, min=0.0, max=1.0, advanced=True,
                             help="Adds offset x N(0, 1) per image and channel to the noise, "
                                  "so the model learns very dark and very bright images "
                                  "(epsilon/v families; 0.05-0.1 is usual); 0 disables.")
    text_encoder_lora: bool = _f(False, label="Train text encoder (LoRA)", lora=True, ddpm=True,
                                 advanced=True,
                                 help=f"{names_where(lambda f: f.text_encoder_lora_targets)}: "
                                      "LoRA on the CLIP text encoder(s) too; "
                                      "captions are then encoded at train time, not from "
                                      "the text cache.")
    text_encoder_lr: float = _f(0.0, label="Text-encoder learning rate", min=0.0, max=1.0,
                                lora=True, ddpm=True, advanced=True,
                                help="0 uses the main learning rate.")
    save_every_epochs: int = _f(0, label="Save LoRA every (epochs)", lora=True, min=0, max=100000,
                                advanced=True,
                                help="Also write lora/step_NNNNNN/ at the end of every N-th "
                                     "epoch (every checkpoint writes one too); 0 disables. "
                                     "LoRA runs only: a full fine-tune writes its model "
                                     "once, at the end.")
    # Trainer depth (issue 26): regularization weight and a LoRA to start from.
    prior_loss_weight: float = _f(1.0, label="Prior loss weight", min=0.0, max=1000.0,
                                  advanced=True,
                                  help="Weight of the loss on regularization datasets "
                                       "(datasets.N.regularization); 1 weighs them like "
                                       "the others, 0 ignores them.")
    init_lora: str = _f("", label="Start from LoRA", lora=True, kind="path", advanced=True,
                        help="A LoRA file (diffusers pytorch_lora_weights.safetensors, or "
                             "the kohya/ComfyUI file this tool writes) loaded into the "
                             "adapter before step 1; its rank and target modules must "
                             "match train.lora_rank and train.lora_targets. Empty starts "
                             "from zero.")
    # -- Optimizer options and the flow-matching objective (issue 26, items 1 and 2).
    # 0 / "auto" keeps the optimizer's or the family's own default, so existing configs
    # train exactly as before. The optimizer options' fields are the catalogue's
    # (core/config/optimizers.py), whose help names the optimizers reading each.
    optimizer_beta1: float = OPTION_FIELDS["optimizer_beta1"]
    optimizer_beta2: float = OPTION_FIELDS["optimizer_beta2"]
    optimizer_eps: float = OPTION_FIELDS["optimizer_eps"]
    prodigy_d_coef: float = OPTION_FIELDS["prodigy_d_coef"]
    prodigy_safeguard_warmup: bool = OPTION_FIELDS["prodigy_safeguard_warmup"]
    timestep_sampling: str = _f("auto", label="Timestep sampling", flow=True,
                                choices=("auto", *TIMESTEP_SAMPLINGS), advanced=True,
                                help="Flow families: how training noise levels are drawn. "
                                     f"auto: the family's own ({_auto_sampling()}); "
                                     "logit_normal (Esser et al. 2024), uniform, mode (their "
                                     "mode sampling, train.mode_scale), sigmoid (kohya's: "
                                     "logit-normal, never shifted).")
    logit_mean: float = _f(0.0, label="Logit-normal mean", flow=True, min=-10.0, max=10.0,
                           advanced=True,
                           help="logit_normal/sigmoid sampling: above 0 trains more at "
                                "high noise.")
    logit_std: float = _f(1.0, label="Logit-normal std", flow=True, min=0.0, max=10.0,
                          min_exclusive=True, advanced=True,
                          help="logit_normal/sigmoid sampling: its spread.")
    mode_scale: float = _f(MODE_SCALE, label="Mode sampling scale", flow=True, min=-1.0, max=1.75,
                           advanced=True,
                           help="mode sampling: above 0 trains more at middle noise, below "
                                "at the ends (Esser et al. 2024; diffusers' default 1.29).")
    flow_shift: float = _f(0.0, label="Flow shift", flow=True, min=0.0, max=100.0, advanced=True,
                           help="Flow families: shift of the training noise levels, "
                                "s*t/(1+(s-1)*t), above 1 for more noise. 0: the family's "
                                "own (its scheduler config's shift; none where that "
                                "scheduler shifts by resolution at inference, "
                                "use_dynamic_shifting).")
    loss_weighting: str = _f("auto", label="Loss weighting", flow=True,
                             choices=("auto", *LOSS_WEIGHTINGS), advanced=True,
                             help="Flow families: per-sample loss weights as diffusers' "
                                  "compute_loss_weighting_for_sd3; auto: the family's "
                                  "own (none).")
    guidance: float = _f(0.0, label="Training guidance", min=0.0, max=100.0, advanced=True,
                         guidance=True,
                         help="Guidance-distilled models of "
                              f"{names_where(lambda f: f.train_guidance is not None)}: the "
                              "guidance value given to the model in training. 0: the "
                              "family's own, 1.0 (diffusers' train_dreambooth_lora_flux.py "
                              "uses 3.5).")


TrainConfig = with_family_options("train", SharedTrainConfig, "TrainConfig")


def _draws_without_negative(family: Any) -> bool:
    return bool(family.validation.negative_prompt_note)


@dataclass
class ValidationConfig:
    prompts: list[str] = _f(["a red circle"], label="Validation prompts",
                            help="One per line. A prompt may end in its own settings, "
                                 "kohya's flags: --n negative prompt, --w width, --h "
                                 "height, --d seed, --l guidance scale, --s steps (e.g. "
                                 "\"a red circle --w 768 --h 512 --d 7\").")
    negative_prompt: str = _f("", label="Negative prompt", advanced=True,
                              help="What classifier-free guidance steers away from (empty: "
                                   "the empty prompt); a prompt's --n replaces it. Families "
                                   "drawn without one ("
                                   f"{names_where(_draws_without_negative)}) warn.")
    model: str = _f("", label="Validation model", kind="model_path", advanced=True,
                    help="Another checkpoint of the same family to draw validation from, "
                         "with the run's current LoRA on it (train on a base, preview on "
                         "its Turbo); empty: the trained base. Loaded for each validation "
                         "round and freed (the estimate's validation phase counts it); "
                         "a distilled one samples with its own steps and guidance while "
                         "validation.steps and guidance_scale are left at their defaults.")
    with_training_adapter: bool = _f(
        False, label="Validate with the training adapter", advanced=True,
        help="Sample validation with model.training_adapter still fused (off: as the LoRA "
             "will be used, on the base without it).")
    every: int = _f(100, label="Validate every (steps)", min=1, max=10_000_000)
    before_training: bool = _f(False, label="Validate before training",
                               help="Also draw the prompts at step 0 with the untrained "
                                    "base, so validation/grid.png sets before beside after.")
    steps: int = _f(20, label="Sampling steps", min=1, max=1000)
    seed: int = _f(0, label="Validation seed", min=0, max=2**63 - 1)
    guidance_scale: float = _f(5.0, label="Guidance scale", min=0.0, max=100.0, advanced=True)
    resolution: int = _f(512, label="Validation resolution", min=64, max=4096, advanced=True)
    width: int = _f(0, label="Validation width", min=0, max=4096, advanced=True,
                    help="0: validation.resolution (a square); else a multiple of 16. A "
                         "prompt's --w replaces it.")
    height: int = _f(0, label="Validation height", min=0, max=4096, advanced=True,
                     help="0: validation.resolution; else a multiple of 16. A prompt's --h "
                          "replaces it.")
    frames: int = _f(1, label="Validation frames", min=1, max=1025, video=True,
                     help=f"Video families: frames per validation video ({frame_rules()}), "
                          "written "
                          "as validation/step_NNNNNN/NN.mp4 beside the first frame's NN.png; "
                          "1 draws stills.")
    fps: float = _f(0.0, label="Validation video fps", min=0.0, max=240.0, video=True,
                    advanced=True, help="Frame rate of the validation .mp4 files; 0: the "
                                        f"family's own ({frame_rates()}).")
    control_images: list[str] = _f([], label="Validation control images", kind="path",
                                   conditioned=True,
                                   help="Edit models: one control image per prompt, in "
                                        "order (a multi-reference model: several per "
                                        "prompt, separated by |; "
                                        f"{names_where(lambda f: f.edit and f.edit.optional)}"
                                        ": an empty entry draws that prompt from text "
                                        "alone). Image-to-video models: "
                                        "each prompt's first image (without one, a "
                                        "synthetic image).")


# ---- issue 26 items 6-7 (merge; launch.distributed is in LaunchConfig)


@dataclass
class MergeConfig:
    lora_scale: float = _f(1.0, label="Merge LoRA scale", min=0.0, max=10.0,
                           help="--stage merge (and the Runs tab's Merge button): the "
                                "weight of the run's final LoRA when it is fused into the "
                                "base (1: as trained, as load_lora_weights applies it).")
# ---- end of the issue 26 items 6-7 block


@dataclass
class Config:
    version: int = CONFIG_VERSION
    model: ModelConfig = field(default_factory=ModelConfig)
    datasets: list[DatasetConfig] = field(default_factory=list)
    text_cache: TextCacheConfig = field(default_factory=TextCacheConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    captioning: CaptioningConfig = field(default_factory=CaptioningConfig)
    merge: MergeConfig = field(default_factory=MergeConfig)


SECTIONS: tuple[str, ...] = tuple(f.name for f in fields(Config) if f.name != "version")
# The single-table sections by name (every section but the `[[datasets]]` list).
SECTION_TYPES: dict[str, type] = {
    name: tp for name, tp in get_type_hints(Config).items() if dataclasses.is_dataclass(tp)
}
