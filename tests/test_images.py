"""Image reading: every bad-file rule gives a message naming the file; odd modes become RGB."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from core.data.images import (
    MAX_PIXELS,
    BadImage,
    load_rgb,
    read_header,
    to_rgb,
    verify_image,
)

RED = (255, 0, 0)


def _encoded(im: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kwargs)
    return buf.getvalue()


def _noise(size: tuple[int, int] = (64, 48)) -> Image.Image:
    return Image.effect_noise(size, 60).convert("RGB")


def _close(pixel: tuple[int, ...], expected: tuple[int, ...], tol: int = 12) -> bool:
    return all(abs(a - b) <= tol for a, b in zip(pixel, expected, strict=True))


# ---------------------------------------------------------------- bad files


def test_zero_byte_file_is_bad(tmp_path: Path):
    path = tmp_path / "photos" / "empty.jpg"
    path.parent.mkdir()
    path.write_bytes(b"")
    with pytest.raises(BadImage) as info:
        read_header(path)
    assert "empty.jpg" in str(info.value) and "empty file (0 bytes)" in str(info.value)
    problem = verify_image(path)
    assert problem is not None and problem.level == "warning"
    assert problem.where.endswith("photos/empty.jpg") and problem.message.endswith("skipped")


def test_text_file_named_jpg_is_not_an_image(tmp_path: Path):
    path = tmp_path / "notes.jpg"
    path.write_text("shopping list: eggs, milk\n")
    with pytest.raises(BadImage) as info:
        read_header(path)
    assert str(info.value).startswith(str(path))
    assert "not an image file" in info.value.reason
    assert "convert it to PNG, JPEG, WEBP or BMP or remove it" in info.value.reason


@pytest.mark.parametrize("fmt,name", [("JPEG", "cat.jpg"), ("PNG", "cat.png")])
def test_truncated_file_passes_header_but_fails_decode(tmp_path: Path, fmt: str, name: str):
    data = _encoded(_noise(), fmt)
    path = tmp_path / name
    path.write_bytes(data[: len(data) // 2])
    assert read_header(path).width == 64  # the header alone is intact
    with pytest.raises(BadImage) as info:
        load_rgb(path)
    assert info.value.reason == "truncated image file (re-export it or remove it)"
    problem = verify_image(path)
    assert problem is not None
    assert str(problem) == (f"warning: {path}: truncated image file (re-export it or remove "
                            "it); skipped")


def test_jpeg_cut_inside_its_header_is_reported_as_truncated(tmp_path: Path):
    path = tmp_path / "cut.jpg"
    path.write_bytes(_encoded(_noise(), "JPEG")[:600])
    with pytest.raises(BadImage) as info:
        read_header(path)
    assert str(info.value) == f"{path}: truncated image file (re-export it or remove it)"


def _png_with_size(small_png: bytes, width: int, height: int) -> bytes:
    """Rewrite the IHDR of a real PNG so it claims another size (a decompression bomb)."""
    assert small_png[12:16] == b"IHDR"
    body = struct.pack(">II", width, height) + small_png[24:29]
    crc = struct.pack(">I", zlib.crc32(b"IHDR" + body) & 0xFFFFFFFF)
    return small_png[:16] + body + crc + small_png[33:]


def test_decompression_bomb_header_is_refused_without_decoding(tmp_path: Path):
    path = tmp_path / "bomb.png"
    small = _encoded(Image.new("1", (8, 8)), "PNG")
    path.write_bytes(_png_with_size(small, 20_000, 20_000))  # 400 MP in a ~100-byte file
    assert path.stat().st_size < 200
    for call in (read_header, load_rgb):
        with pytest.raises(BadImage) as info:
            call(path)
        assert "bomb.png" in str(info.value)
        assert "possible decompression bomb" in info.value.reason
        assert f"{MAX_PIXELS / 1e6:.0f}-megapixel" in info.value.reason


def test_pixel_limit_is_a_parameter_and_the_message_gives_the_size(tmp_path: Path):
    path = tmp_path / "big.png"
    _noise((100, 80)).save(path)
    assert read_header(path).width == 100
    with pytest.raises(BadImage) as info:
        read_header(path, max_pixels=5000)
    assert "100x80 pixels is over" in info.value.reason


def test_unsupported_mode_is_refused(tmp_path: Path):
    # A LAB TIFF renamed to .png: PIL would "convert" it by copying channels (wrong colours).
    path = tmp_path / "scan.png"
    Image.new("LAB", (16, 16), (50, 0, 0)).save(path, "TIFF")
    with pytest.raises(BadImage) as info:
        read_header(path)
    assert "scan.png" in str(info.value)
    assert "unsupported colour mode LAB (TIFF)" in info.value.reason


def test_good_image_verifies(tmp_path: Path):
    path = tmp_path / "ok.webp"
    _noise().save(path)
    assert verify_image(path) is None
    header = read_header(path)
    assert (header.path, header.width, header.height) == (path, 64, 48)


# ---------------------------------------------------------------- odd but valid files


def test_cmyk_jpeg_becomes_rgb(tmp_path: Path):
    path = tmp_path / "print.jpg"
    Image.new("CMYK", (40, 30), (0, 255, 255, 0)).save(path, quality=95)
    assert Image.open(path).mode == "CMYK"
    im = load_rgb(path)
    assert im.mode == "RGB" and im.size == (40, 30)
    assert _close(im.getpixel((20, 15)), RED, tol=20)


def test_16_bit_png_is_scaled_not_clipped(tmp_path: Path):
    path = tmp_path / "depth.png"
    Image.fromarray(np.full((30, 40), 32896, dtype=np.uint16)).save(path)  # mid grey
    assert Image.open(path).mode == "I;16"
    im = load_rgb(path)
    assert im.mode == "RGB" and im.size == (40, 30)
    assert _close(im.getpixel((0, 0)), (128, 128, 128), tol=1)  # PIL's own convert gives 255


def test_float_and_int_grey_are_scaled_by_range():
    f = Image.fromarray(np.full((4, 4), 0.5, dtype=np.float32))
    assert f.mode == "F"
    assert _close(to_rgb(f).getpixel((0, 0)), (128, 128, 128), tol=1)
    i8 = Image.fromarray(np.full((4, 4), 200, dtype=np.int32))
    assert i8.mode == "I"
    assert to_rgb(i8).getpixel((0, 0)) == (200, 200, 200)


def test_rgba_is_composited_onto_white(tmp_path: Path):
    path = tmp_path / "sticker.png"
    im = Image.new("RGBA", (40, 30), (255, 0, 0, 0))  # fully transparent red
    im.paste((0, 0, 0, 128), (0, 0, 20, 30))  # left half: half-transparent black
    im.save(path)
    out = load_rgb(path)
    assert out.mode == "RGB" and out.size == (40, 30)
    assert out.getpixel((30, 15)) == (255, 255, 255)
    assert _close(out.getpixel((5, 15)), (127, 127, 127), tol=2)


def test_palette_with_transparency_and_grey_alpha(tmp_path: Path):
    pal = tmp_path / "icon.png"
    im = Image.new("P", (20, 10), 0)
    im.putpalette([0, 0, 255, 255, 0, 0] + [0] * 762)
    im.paste(1, (10, 0, 20, 10))
    im.save(pal, transparency=0)
    out = load_rgb(pal)
    assert out.mode == "RGB" and out.size == (20, 10)
    assert out.getpixel((2, 5)) == (255, 255, 255)  # transparent index -> white
    assert out.getpixel((15, 5)) == RED
    la = tmp_path / "la.png"
    Image.new("LA", (8, 8), (0, 0)).save(la)
    assert load_rgb(la).getpixel((0, 0)) == (255, 255, 255)


def test_one_bit_bmp_and_grey_become_rgb(tmp_path: Path):
    path = tmp_path / "lineart.bmp"
    Image.new("1", (33, 17), 1).save(path)
    out = load_rgb(path)
    assert out.mode == "RGB" and out.size == (33, 17) and out.getpixel((0, 0)) == (255,) * 3


@pytest.mark.parametrize("orientation,size", [(6, (20, 40)), (8, (20, 40)), (3, (40, 20))])
def test_exif_orientation_applies_to_header_and_pixels(
    tmp_path: Path, orientation: int, size: tuple[int, int]
):
    path = tmp_path / f"phone_{orientation}.jpg"
    stored = Image.new("RGB", (40, 20), (0, 0, 255))
    stored.paste(RED, (0, 0, 10, 20))  # red band on the stored left edge
    exif = Image.Exif()
    exif[0x0112] = orientation
    stored.save(path, exif=exif, quality=95)
    assert Image.open(path).size == (40, 20)
    header = read_header(path)
    assert (header.width, header.height) == size
    out = load_rgb(path)
    assert out.size == size
    # Orientation 6 turns the stored left edge to the top, 8 to the bottom, 3 to the right.
    where = {6: (10, 2), 8: (10, 37), 3: (37, 10)}[orientation]
    assert _close(out.getpixel(where), RED, tol=40)


def test_exif_orientation_in_png_and_webp(tmp_path: Path):
    exif = Image.Exif()
    exif[0x0112] = 6
    for name in ("rot.png", "rot.webp"):
        path = tmp_path / name
        Image.new("RGB", (40, 20)).save(path, exif=exif)
        header = read_header(path)
        assert (header.width, header.height) == (20, 40), name
        assert load_rgb(path).size == (20, 40), name
