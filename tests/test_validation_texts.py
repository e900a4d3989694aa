"""The validation prompts are encoded once and kept on the CPU; each validation hands them
to the pipeline on the denoiser's device. Flux's, SD3's and the other pipelines that take
embeddings use them where they are given, so on a GPU a prompt left on the CPU stopped
the run at its first validation (seen on an H200: Flux with an int8 base, "Expected all
tensors to be on the same device"). On this CPU machine the meta device stands for the GPU.
"""

from __future__ import annotations

import pytest
import torch

from core.train.validation import ValidationTexts


def encoded(length: int) -> dict[str, torch.Tensor]:
    return {"prompt_embeds": torch.randn(length, 8),
            "prompt_mask": torch.ones(length, dtype=torch.bool),
            "pooled_prompt_embeds": torch.randn(4)}


@pytest.mark.parametrize("as_list, mask_kwarg", [(False, None), (True, None),
                                                 (False, "prompt_attention_mask")])
def test_every_text_input_reaches_the_pipeline_on_the_denoisers_device(as_list, mask_kwarg):
    texts = ValidationTexts(prompts=[encoded(5), encoded(7)], negative=encoded(3),
                            as_list=as_list, mask_kwarg=mask_kwarg)

    inputs = texts.pipeline_inputs(1, torch.device("meta"))

    expected = {"prompt_embeds", "negative_prompt_embeds", "pooled_prompt_embeds",
                "negative_pooled_prompt_embeds"}
    if mask_kwarg:
        expected |= {mask_kwarg, f"negative_{mask_kwarg}"}
    assert set(inputs) == expected
    for name, value in inputs.items():
        tensors = value if as_list and "mask" not in name else [value]
        assert all(t.device.type == "meta" for t in tensors), name
    embeds = inputs["prompt_embeds"]
    assert (embeds[0].shape if as_list else embeds.shape) == ((7, 8) if as_list else (1, 7, 8))
    assert texts.prompts[1]["prompt_embeds"].device.type == "cpu"  # kept for the next round
