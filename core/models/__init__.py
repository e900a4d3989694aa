"""Model families behind one protocol.

- base.py: the protocol (`ModelFamily`), `Components` (a loaded model) and `NoiseSample`.
- registry.py: finds a family's module by name without importing torch.
- sd15.py, sd2.py, sdxl.py (UNet) and sd3.py, flux.py, chroma.py (on flow.py's
  `FlowFamily`): what
  differs per family; each exposes `FAMILY`.
- loading.py: where a model comes from (folder, single file, hub id) and loading it with
  errors that name the path; fingerprints; dtypes.
- objectives.py: DDPM and flow-matching noise, targets and loss weights.
- lora_files.py: LoRA files for diffusers, kohya and ComfyUI.
- modules.py: freezing loaded modules, unwrapping training wrappers, VAE latents.
- tiny/: the tiny random models of every family, built offline (`tiny:<family>`).
"""
