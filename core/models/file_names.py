"""File names the model code and the run folder share (standard library only: the run
manager reads them without torch). The LoRA file name is diffusers' own."""

from __future__ import annotations

LORA_WEIGHTS_NAME = "pytorch_lora_weights.safetensors"  # diffusers' load_lora_weights name
