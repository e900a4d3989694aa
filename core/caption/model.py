"""Loading a transformers image-to-text model and captioning a batch of images with it.

Loading is generic: `AutoProcessor` plus `AutoModelForImageTextToText` (transformers 5
has no `AutoModelForVision2Seq`; its image-to-text models, BLIP, BLIP-2, GIT, Florence-2
and the chat VLMs, are all in this mapping). Florence-2 is native in transformers 5, so
the transformers-format checkpoints (florence-community/Florence-2-base, -large) load
without remote code; models that need their
own code (`trust_remote_code`, e.g. the original microsoft/Florence-2-* repos) are
refused with a message, because running a repo's code is a decision we do not make for
the user.

On a GPU the model runs in bf16 (fp16 where bf16 is unsupported), on the CPU in fp32
(half precision is slow or unsupported there).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Florence-2 picks its task from a text prompt; the others caption from the image alone.
TASK_PROMPTS = {"florence2": "<DETAILED_CAPTION>"}


class CaptionerLoadError(RuntimeError):
    """The model cannot be loaded as a captioner; the message names captioning.model."""


@dataclass
class Captioner:
    processor: Any
    model: Any
    device: Any
    dtype: Any
    prompt: str | None

    def describe(self) -> str:
        return (f"{type(self.model).__name__} on {self.device} "
                f"({str(self.dtype).replace('torch.', '')})")


def pick_device(cpu: bool) -> tuple[Any, Any]:
    """(device, dtype): the GPU in bf16/fp16 when there is one and `cpu` is off."""
    import torch

    if not cpu and torch.cuda.is_available():
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.device("cuda"), dtype
    return torch.device("cpu"), torch.float32


def load_captioner(source: str, cpu: bool = False) -> Captioner:
    """The processor and model of `source` (a folder or a hub id in the HF cache)."""
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    from core.models.loading import hub_reachable
    from core.models.modules import avoid_cudnn_attention

    avoid_cudnn_attention()  # its text decoder attends with masks too (see there)
    local = Path(source).is_absolute()
    # Offline, never let huggingface_hub retry the network for half a minute.
    only_local = local or not hub_reachable()
    where = f"captioning.model: {source}"
    try:
        config = AutoConfig.from_pretrained(source, local_files_only=only_local)
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise CaptionerLoadError(
                f"{where} needs its own Python code (trust_remote_code), which this tool "
                "does not run; use a transformers-native version of the model (for "
                "Florence-2: florence-community/Florence-2-base or -large)") from None
        raise CaptionerLoadError(f"{where} cannot be read: {exc}") from None
    except OSError as exc:
        raise CaptionerLoadError(f"{where} cannot be loaded ({exc}); give a folder saved "
                                 "with save_pretrained or a hub id in the HF cache") from None
    device, dtype = pick_device(cpu)
    try:
        processor = AutoProcessor.from_pretrained(source, local_files_only=only_local)
        model = AutoModelForImageTextToText.from_pretrained(
            source, local_files_only=only_local, dtype=dtype)
    except ValueError as exc:
        raise CaptionerLoadError(
            f"{where} is a {config.model_type!r} model, which is not an image-to-text "
            "model transformers can load (AutoModelForImageTextToText); use one such as "
            f"BLIP, BLIP-2, GIT or Florence-2 ({exc})") from None
    model.to(device).eval()
    return Captioner(processor, model, device, dtype, TASK_PROMPTS.get(config.model_type))


def _inputs(captioner: Captioner, images: list[Any]) -> dict[str, Any]:
    import torch

    kwargs: dict[str, Any] = {"images": images, "return_tensors": "pt"}
    if captioner.prompt is not None:
        kwargs["text"] = [captioner.prompt] * len(images)
    batch = captioner.processor(**kwargs)
    out = {}
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            value = value.to(captioner.device)
            if value.is_floating_point():
                value = value.to(captioner.dtype)
        out[name] = value
    return out


def generate_captions(captioner: Captioner, images: list[Any], max_new_tokens: int
                      ) -> list[str]:
    """One caption per image (PIL RGB images), greedy, whitespace collapsed."""
    import torch

    inputs = _inputs(captioner, images)
    with torch.inference_mode():
        out = captioner.model.generate(**inputs, max_new_tokens=max_new_tokens)
    prompt = inputs.get("input_ids")
    # Decoder-only models return the prompt before the answer: drop it.
    if prompt is not None and out.shape[1] >= prompt.shape[1] and torch.equal(
            out[:, :prompt.shape[1]], prompt):
        out = out[:, prompt.shape[1]:]
    texts = captioner.processor.batch_decode(out, skip_special_tokens=True)
    return [" ".join(t.split()) for t in texts]
