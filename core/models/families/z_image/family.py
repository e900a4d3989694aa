"""Z-Image (Tongyi-MAI/Z-Image and Z-Image-Turbo): a 6B single-stream DiT
(ZImageTransformer2DModel), a Qwen3 text encoder, FLUX.1's 16-channel VAE, flow matching.

Text, as ZImagePipeline._encode_prompt builds it (`encode_prompt` is called): each prompt
goes through the tokenizer's chat template as one user message (add_generation_prompt,
enable_thinking=True: "<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n"),
is tokenized padded to `max_sequence_length` = 512 (the pipeline default; longer text is
cut there), and the Qwen3 encoder's second-to-last hidden states (`hidden_states[-2]`)
are kept for the real tokens only. So every prompt has its own length L (template
included): `encode_prompts` returns prompt_embeds [L, 2560] with an all-True mask, collate
pads a batch to its longest, and `predict` hands the transformer, per item, exactly the
rows its mask marks, as the list of variable-length tensors the pipeline passes. (The
transformer pads each caption to a multiple of 32 with its learned pad token and masks
the batch padding itself, as in the pipeline.)

Latents: `encode_images` gives (mean - shift_factor) * scaling_factor, [B, 16, h, w]
(0.1159 and 0.3611 in the real VAE config). The transformer patchifies 2x2 itself and
takes a list of [16, 1, h, w] latents (a frame axis), as the pipeline passes them.

Timesteps and the sign of the output: the transformer is given t = 1 - sigma (the pipeline
passes `(1000 - timestep) / 1000`; it multiplies by t_scale = 1000 inside), so t = 1 is
the clean image, and its output is the negated velocity: the pipeline steps with
`-output`. `predict` returns `-output`, so the target stays noise - latents, as in
diffusers' train_dreambooth_lora_z_image.py (`model_pred = -model_pred`).

Sigmas: as that script's default (weighting scheme "none"): uniform, then the scheduler's
static shift (`use_dynamic_shifting` is false in both checkpoints: Z-Image's shift is 6.0,
Turbo's 3.0), which the script applies by indexing the shifted scheduler's timesteps.

Guidance: the transformer has no guidance input. Z-Image base samples with classifier-free
guidance (the model card: guidance 3-5, 28-50 steps); Turbo is distilled (Decoupled-DMD)
to sample in 8-9 steps with guidance_scale 0. Training treats both alike, with the plain
flow-matching loss, as the diffusers script does for either checkpoint; only validation
differs (validation.guidance_scale = 0 and 9 steps for Turbo, as its model card has it).
Fine-tuning Turbo so slowly pulls it away from its few-step distillation: keep Turbo runs
short, or train on the base model (the preset does) and apply the LoRA to either.

LoRA: diffusers' script targets the attention projections (to_q/to_k/to_v/to_out.0) of
every block (main layers and both refiners); "all" adds the SwiGLU feed-forwards. The
files: see flow.py; ComfyUI reads the same "transformer.<module>" names for Z-Image (its
Lumina2 branch of model_lora_keys_unet, through comfy.utils.z_image_to_diffusers, which
also fuses to_q/to_k/to_v into its qkv weight). The tiny model: tiny.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models.base import Components, NoiseSample
from core.models.capabilities import MemorySpec, RandomSpec, SingleFileSpec, ValidationSpec
from core.models.flow import FlowFamily
from core.models.modules import unwrap

# diffusers' train_dreambooth_lora_z_image.py default (its --lora_layers).
LORA_TARGETS = ["attention.to_q", "attention.to_k", "attention.to_v", "attention.to_out.0"]
FEED_FORWARD = ["feed_forward.w1", "feed_forward.w2", "feed_forward.w3"]


def activation_layout(config: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The transformer config as the memory estimate's MMDiT formula reads it
    (core/memory/estimate.py), and its patch size: each main layer counts as one block
    over image and text tokens, and the two refiner stacks (one over the image
    tokens, one over the text) as one such block per refiner layer. Not calibrated
    on a measured Z-Image run: by count its SwiGLU feed-forward (8/3 width, three
    projections) keeps about a tenth more than the MMDiT block the formula assumes."""
    dim, heads = int(config.get("dim", 3840)), int(config.get("n_heads", 30))
    layers = int(config.get("n_layers", 30)) + int(config.get("n_refiner_layers", 2))
    patch = int(list(config.get("all_patch_size", [2]))[0])
    return ({"num_attention_heads": heads, "attention_head_dim": dim // heads,
             "num_layers": layers}, patch)
def random_tokenizer(cls: str, folder: Path, bang_padded: bool) -> Any:
    """random:z_image's Qwen3 tokenizer: the tiny build's."""
    from core.models.tiny.qwen3 import qwen_tokenizer

    return qwen_tokenizer(folder)


class ZImageFamily(FlowFamily):
    name = "z_image"
    block_lists = ("layers",)  # the refiners before them stay on the GPU
    # Original-format single files and diffusers folders (core/models/loading.py).
    # main blocks modulate with adaLN_modulation.0 (Lumina2's, alike otherwise, with .1),
    # in both its original and diffusers layouts
    single_file = SingleFileSpec(markers=("layers.0.adaLN_modulation.0.weight",), rank=50)
    pipeline_prefix = "ZImage"
    diffusers_lokr = True  # its pipeline loads LoKr files (core/models/adapters.py)
    text_encoder_count = 1
    pipeline_class_name = "ZImagePipeline"
    max_sequence_length = 512
    memory = MemorySpec(activation_layout=activation_layout, text_encoder_kind="llm")  # Qwen3
    timestep_sampling = "uniform"
    # ZImagePipeline takes a list of per-prompt [L, D] embeddings, not a padded batch
    # (core/train/validation.py reads this); validation.model on Z-Image-Turbo: 9 steps,
    # no guidance (its model card).
    validation = ValidationSpec(list_prompt_embeds=True, distilled=(9, 0.0))
    random = RandomSpec(tokenizer=random_tokenizer)

    # ------------------------------------------------------------ loading

    # A single .safetensors model.path (ComfyUI's z_image_*.safetensors hold only the
    # diffusion model, in the original layout with fused qkv) gives the transformer
    # (FlowFamily.load_transformer_file), model.config everything else.
    transformer_class_name = "ZImageTransformer2DModel"
    single_file_default_config = "Tongyi-MAI/Z-Image-Turbo"

    # ------------------------------------------------------------ text

    def encode_prompts(self, c: Components, prompts: list[str]) -> list[dict[str, Any]]:
        """Per prompt: prompt_embeds [L, D] (its real tokens only) and an all-True mask."""
        import torch

        pipe = self.validation_pipeline(c)
        with torch.no_grad():
            # A copy: _encode_prompt writes the templated text back into the list.
            embeds, _ = pipe.encode_prompt(
                prompt=list(prompts), device=c.text_encoders[0].device,
                do_classifier_free_guidance=False,
                max_sequence_length=self.sequence_length(c))
        return [{"prompt_embeds": e,
                 "prompt_mask": torch.ones(e.shape[0], dtype=torch.bool, device=e.device)}
                for e in embeds]

    # ------------------------------------------------------------ training

    def predict(self, c: Components, sample: NoiseSample, batch: dict[str, Any]) -> Any:
        """The velocity noise - latents for the batch: the transformer's negated output,
        given t = 1 - sigma, each item's latents as [16, 1, h, w] and its real text tokens
        (the rows its prompt_mask marks), as lists (see the module docstring)."""
        import torch

        model = c.denoiser
        dtype = unwrap(model).dtype
        noisy = sample.noisy.to(dtype)
        b, _, h, w = noisy.shape
        if h % 2 or w % 2:
            raise ValueError(f"z_image latents must have even height and width, got {h}x{w}: "
                             "use image sides that are multiples of 16 pixels")
        device = noisy.device
        embeds = batch["prompt_embeds"].to(device, dtype)
        mask = batch["prompt_mask"].to(device).bool()
        captions = [embeds[i][mask[i]] for i in range(b)]
        if any(len(cap) == 0 for cap in captions):
            raise ValueError("a z_image prompt embedding has no real tokens: the text cache "
                             "is damaged; delete the text cache to rebuild it")
        n_train = float(c.noise_scheduler.config.get("num_train_timesteps", 1000))
        t = (n_train - sample.timesteps.to(device).float()) / n_train
        out = model(list(noisy.unsqueeze(2).unbind(0)), t, captions, return_dict=False)[0]
        return -torch.stack(out, dim=0).squeeze(2)

    def lora_target_modules(self, scope: str = "attention") -> list[str]:
        return LORA_TARGETS + (FEED_FORWARD if scope == "all" else [])

    # ------------------------------------------------------------ validation

    def validation_pipeline(self, c: Components) -> Any:
        """A ZImagePipeline sharing the loaded modules (its own scheduler). Give it
        prompt_embeds as a list of [L, D] tensors (ValidationTexts does)."""
        from diffusers import ZImagePipeline

        pipe = ZImagePipeline(
            transformer=unwrap(c.denoiser), scheduler=self.validation_scheduler(c),
            vae=c.vae, text_encoder=c.text_encoders[0], tokenizer=c.tokenizers[0])
        pipe.set_progress_bar_config(disable=True)
        return pipe


    def config_problems(self, cfg: Any) -> list[Any]:
        """Z-Image-Turbo is distilled to sample in 8-9 steps without classifier-free
        guidance (its model card: guidance_scale 0); the validation default of 5 would
        sample it with guidance, and its images would not show what the LoRA does."""
        from core.problems import Problem

        if "turbo" not in cfg.model.path.lower() or cfg.validation.guidance_scale == 0:
            return []
        return [Problem("warning", "validation.guidance_scale",
                        f"is {cfg.validation.guidance_scale:g} for {cfg.model.path}, a Turbo "
                        "model distilled to sample without guidance: set it to 0 (and "
                        "validation.steps to 9)")]


FAMILY = ZImageFamily()
