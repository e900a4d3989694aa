"""LTX-2's audio stream: a waveform as the audio VAE's latents, packed and normalised as
LTX2Pipeline unpacks and un-normalises what it samples, and the audio half of the
training objective.

Waveform -> log-mel: the spectrogram LTX-2's audio VAE was trained on (Lightricks'
ltx-core AudioProcessor): stereo at the VAE's `sample_rate` (16 kHz), an STFT of 1024
samples (Hann window, centred, reflect-padded) every `mel_hop_length` (160) samples,
magnitudes through a Slaney mel filterbank of `mel_bins` (64) bands from 0 Hz to
Nyquist, then log(max(x, 1e-5)), laid out [B, 2, frames, mel_bins]. A mono track is
used on both channels.

Latents: AutoencoderKLLTX2Audio.encode's posterior mean (or a sample), [B, C, L, M/4],
packed to [B, L, C * M/4] (LTX2Pipeline._pack_audio_latents) and normalised there with
the VAE's latents_mean/std (its _normalize_audio_latents works on the packed tensor). L
is what the pipeline samples for the clip's duration: round(frames / fps * sample_rate /
hop / 4) (`audio_length`); the encoding is cut or zero-padded to it.
"""

from __future__ import annotations

import functools
from typing import Any

from core.models.capabilities import AudioSpec

N_FFT = 1024
LOG_FLOOR = 1e-5
FRAME_RATE = 24.0  # LTX2Pipeline's frame_rate: the video positions and the audio length


def pack_audio(latents: Any) -> Any:
    """[B, C, L, M] -> [B, L, C * M], LTX2Pipeline._pack_audio_latents without patches."""
    return latents.transpose(1, 2).flatten(2, 3)


def audio_length(config: Any, frames: int, fps: float = FRAME_RATE) -> int:
    """Audio latents LTX2Pipeline samples beside `frames` video frames at `fps`."""
    per_second = float(config["sample_rate"]) / float(config["mel_hop_length"]) / 4.0
    return round(frames / fps * per_second)


@functools.cache
def _mel_basis(sample_rate: int, mel_bins: int) -> Any:
    """[mel_bins, N_FFT // 2 + 1] Slaney filterbank (torchaudio's mel_scale="slaney",
    norm="slaney", which ltx-core uses), from transformers' audio utilities."""
    import torch
    from transformers.audio_utils import mel_filter_bank

    bank = mel_filter_bank(num_frequency_bins=N_FFT // 2 + 1, num_mel_filters=mel_bins,
                           min_frequency=0.0, max_frequency=sample_rate / 2.0,
                           sampling_rate=sample_rate, norm="slaney", mel_scale="slaney")
    return torch.as_tensor(bank, dtype=torch.float32).T.contiguous()


def log_mel(waveform: Any, config: Any) -> Any:
    """Waveform [B, channels, samples] at the VAE's rate -> [B, 2, frames, mel_bins]."""
    import torch

    if waveform.shape[1] == 1:
        waveform = waveform.expand(-1, 2, -1)
    b, ch, n = waveform.shape
    flat = waveform[:, :2].reshape(-1, n).float()
    spec = torch.stft(flat, n_fft=N_FFT, hop_length=int(config["mel_hop_length"]),
                      win_length=N_FFT, window=torch.hann_window(N_FFT, device=flat.device),
                      center=True, pad_mode="reflect", return_complex=True).abs()
    basis = _mel_basis(int(config["sample_rate"]), int(config["mel_bins"])).to(flat.device)
    mel = torch.log(torch.clamp(basis @ spec, min=LOG_FLOOR))  # [B * 2, mel, frames]
    return mel.view(b, 2, mel.shape[1], mel.shape[2]).transpose(2, 3)


def encode_waveform(audio_vae: Any, waveform: Any, length: int, generator: Any = None) -> Any:
    """Normalised, packed audio latents [B, length, C * M/4] of `waveform` [B, channels,
    samples] at the VAE's sample rate: the posterior mean, or a sample with `generator`."""
    import torch

    params = next(audio_vae.parameters())
    mel = log_mel(waveform.to(params.device), audio_vae.config).to(params.dtype)
    with torch.no_grad():
        dist = audio_vae.encode(mel).latent_dist
        latents = dist.mode() if generator is None else dist.sample(generator)
    packed = pack_audio(latents.float())[:, :length]
    if packed.shape[1] < length:  # a track a few samples short of the clip
        packed = torch.nn.functional.pad(packed, (0, 0, 0, length - packed.shape[1]))
    mean = audio_vae.latents_mean.to(packed.device, packed.dtype)
    std = audio_vae.latents_std.to(packed.device, packed.dtype)
    return (packed - mean) / std


def sample_rate(c: Any) -> int:
    """The rate the loaded audio VAE takes, which the cache reads a clip's track at."""
    return int(c.audio_vae.config.sample_rate)


def encode_audio(c: Any, waveform: Any, frames: int, fps: float, generator: Any = None) -> Any:
    """Audio latents [B, L, D] of `waveform` [B, channels, samples] at the audio VAE's
    sample rate, cut to what the pipeline samples beside `frames` frames at `fps`; the
    VAE comes to the video VAE's device for it from host memory, and goes back."""
    vae = c.audio_vae
    home = next(vae.parameters()).device
    vae.to(c.vae.device)
    try:
        return encode_waveform(vae, waveform, audio_length(vae.config, frames, fps),
                               generator)
    finally:
        vae.to(home)


AUDIO = AudioSpec(sample_rate=sample_rate, encode=encode_audio)
