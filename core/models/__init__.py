"""Model families behind one protocol.

- base.py: the protocol (`ModelFamily`), `Components` (a loaded model) and `NoiseSample`.
- registry.py: discovers the families (the folders under families/) without importing
  torch.
- families/<name>/: everything one family is (family.py's `FAMILY`, tiny.py, full_size/);
  the UNet ones build on stable_diffusion.py's `StableDiffusionFamily`, the others on
  flow.py's `FlowFamily`. See docs/adding-a-family.md.
- loading.py: where a model comes from (folder, single file, hub id) and loading it with
  errors that name the path; fingerprints; dtypes.
- objectives.py: DDPM and flow-matching noise, targets and loss weights.
- lora_files.py: LoRA files for diffusers, kohya and ComfyUI.
- modules.py: freezing loaded modules, unwrapping training wrappers, VAE latents.
- tiny/: building the tiny random models offline (`tiny:<family>`) and the small text
  encoders, tokenizers and VAEs the families' tiny.py share.
"""
