"""One `[[datasets]]` entry: its folders, captions, buckets and, for a video family, how
clips become samples, for an edit family its control images (core/config/schema.py holds
the other sections)."""

from __future__ import annotations

from dataclasses import dataclass

from core.data.video import CLIP_MODES as CLIP_CHOICES  # datasets.N.clips (video families)
from core.fields import _f
from core.models.registry import frame_rates, frame_rules, names_where

AUDIO_CHOICES = ("auto", "on", "off")  # datasets.N.audio (families with audio)

CAPTION_STRATEGIES = ("textfile", "filename", "jsonl", "instance_prompt")
PRESERVE_CHOICES = ("", "base")  # datasets.N.preserve: off, or the frozen base's output



@dataclass
class DatasetConfig:
    id: str = _f("data", label="Dataset id", help="A short unique name.")
    images: str = _f("", label="Images folder", kind="path")
    vae_cache: str = _f("", label="VAE latent cache folder", kind="path",
                        help="Must not be the images folder or inside it; one per dataset.")
    caption: str = _f("textfile", label="Captions", choices=CAPTION_STRATEGIES,
                      help="textfile: sidecar .txt; filename: the file name; "
                           "jsonl: metadata.jsonl (file_name, text); instance_prompt: one prompt.")
    instance_prompt: str = _f("", label="Instance prompt")
    resolution: int = _f(512, label="Resolution", min=64, max=4096,
                         help="Target side in pixels; buckets keep about resolution² pixels.")
    bucketing: bool = _f(True, label="Aspect buckets")
    crop: str = _f("center", label="Crop", choices=("center", "random", "none"))
    repeats: int = _f(1, label="Repeats", min=1, max=10000,
                      help="Times each image is used per epoch: sets this dataset's share "
                           "of training (the mix).")
    probability: float = _f(1.0, label="Sampling weight", min=0.0, max=1e6,
                            help="Order within an epoch, not the mix: every dataset is used "
                                 "up each epoch (images x repeats); this weights which one the "
                                 "next batch comes from while several have batches left, so a "
                                 "higher weight uses its batches earlier. 0 leaves the dataset "
                                 "out. Change the mix with repeats.")
    shuffle_tags: bool = _f(False, label="Shuffle tags",
                            help="Captions are comma-separated tags, shuffled for every "
                                 "sample; these captions are encoded at train time (the "
                                 "text encoder stays loaded) instead of from the text cache.")
    keep_tokens: int = _f(0, label="Keep first tags", min=0, max=1000,
                          help="With tag shuffling: how many leading tags stay in place "
                               "(a trigger word first, say).")
    # Trainer depth (issue 26): loss masks and regularization images.
    masks: str = _f("", label="Loss masks folder", kind="path", advanced=True,
                    help="Grayscale masks matched to images by relative path and file "
                         "stem (photo.jpg -> photo.png): white is learned, black ignored, "
                         "grey in between. Cached at latent resolution beside the "
                         "latents. An image without a mask trains unmasked (the check "
                         "names it). Must not be or lie inside an images or cache folder.")
    # Video families (issue 23): how clips become training samples.
    frames: int = _f(17, label="Frames per sample", min=1, max=1025, video=True,
                     help="Frames each clip sample holds, as the family's VAE takes them "
                          f"({frame_rules()}). Clips with fewer (after fps) are "
                          "skipped; images in the folder train as one frame.")
    fps: float = _f(0.0, label="Frames per second", min=0.0, max=240.0, video=True,
                    help="Resample clips to this rate before taking frames; 0: the "
                         f"family's own rate ({frame_rates()}).")
    clips: str = _f("start", label="Clips per video", choices=CLIP_CHOICES, video=True,
                    help="start (or head): one sample from the beginning of each video; "
                         "chunk: one after another from the beginning, without overlap; "
                         "slide: one starting every clip_stride frames; uniform: "
                         "clip_count samples spread evenly over it.")
    clip_count: int = _f(1, label="Clips (uniform)", min=1, max=1000, video=True,
                         help="With clips = uniform: samples per video, evenly spaced; a "
                              "video too short for that many distinct ones gives fewer.")
    clip_stride: int = _f(8, label="Clip stride (slide)", min=1, max=10_000, video=True,
                          help="With clips = slide: frames (after fps) from one clip's "
                               "start to the next one's.")
    audio: str = _f("auto", label="Audio track", choices=AUDIO_CHOICES, video=True, audio=True,
                    help="Families that train sound with the video ("
                         f"{names_where(lambda f: f.audio)}): "
                         "auto and on "
                         "train each clip's audio track beside its frames (a clip without "
                         "one trains video-only); off trains video only. Other families "
                         "ignore it (the check warns when it is set).")
    # Edit families (issue 24): the control (source) image of each target.
    control: str = _f("", label="Control images folder", kind="path", edit=True,
                      help="Edit models: the source image of each target, matched by "
                           "relative path and file stem (photo.jpg -> photo.png), resized "
                           "to its target's bucket. A target without one is left out. "
                           "Optional for "
                           f"{names_where(lambda f: f.edit and f.edit.optional)}: "
                           "empty trains text-to-image.")
    control_2: str = _f("", label="Second control folder", kind="path", edit=True,
                        advanced=True,
                        help="Multi-reference edit models ("
                             f"{names_where(lambda f: f.edit and f.edit.references > 1)}): "
                             "a second reference per target, matched as control is.")
    control_3: str = _f("", label="Third control folder", kind="path", edit=True,
                        advanced=True, help="A third reference per target (needs control_2).")
    # Augmentation and bucket limits (issue 40 item 18).
    flip: bool = _f(False, label="Horizontal flip", advanced=True,
                    help="Train on each image or its mirror image, half the time each (drawn "
                         "from train.seed per sample). The cache then holds both latents "
                         "(built once; turning flip on rebuilds the dataset's entries). "
                         "Not for text, logos or captions that say left or right (the check "
                         "warns), nor edit pairs (refused).")
    bucket_min_side: int = _f(0, label="Bucket min side", min=0, max=16384, advanced=True,
                              help="With aspect buckets: no bucket side below this many "
                                   "pixels (0: no limit), which leaves out the thinnest "
                                   "buckets; images go to the nearest bucket left.")
    bucket_max_side: int = _f(0, label="Bucket max side", min=0, max=16384, advanced=True,
                              help="With aspect buckets: no bucket side above this many "
                                   "pixels (0: no limit).")
    regularization: bool = _f(False, label="Regularization images", advanced=True,
                              help="Class images for prior preservation (DreamBooth): "
                                   "sampled alongside the other datasets, their loss "
                                   "weighted by train.prior_loss_weight.")
    # Output preservation (issue 52 item 4): the target is the frozen base's prediction.
    preserve: str = _f("", label="Preserve the base's output", choices=PRESERVE_CHOICES,
                       advanced=True,
                       help="base: this dataset's target is the frozen base model's own "
                            "prediction on the same noisy input (the LoRA switched off for "
                            "it), so the LoRA learns to leave these prompts (say, class "
                            "images captioned without the trigger word) as the base made "
                            "them: kohya's diff_output_preservation, ai-toolkit's DOP. One "
                            "extra no-grad forward per such sample. LoRA runs only.")
    preserve_weight: float = _f(1.0, label="Preservation weight", min=0.0, max=1000.0,
                                min_exclusive=True, advanced=True,
                                help="With preserve = base: the weight of this dataset's "
                                     "loss (> 0).")
