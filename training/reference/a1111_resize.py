"""A1111's img2img resize modes, written from resize_image() in
AUTOMATIC1111/stable-diffusion-webui modules/images.py (no upscaler set, so
every resize is PIL's LANCZOS; mode 2's edge fills use Image.resize's
default filter, BICUBIC), and the golden images kiln's server is
checked against (tests/golden/a1111_resize/, tools/server/a1111_resize.cpp):

    /usr/bin/python3 training/reference/a1111_resize.py

Needs Debian's python3-pil and python3-numpy. The input is a seeded 45x28
image of smooth gradients and hard-edged blocks, so both Lanczos ringing and
the integer arithmetic of odd sizes show.
"""

import os

import numpy as np
from PIL import Image

LANCZOS = Image.LANCZOS
OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "golden", "a1111_resize")

# (mode, width, height): crop sides, crop top and bottom, fill top and
# bottom, fill left and right, and a plain stretch.
CASES = [(1, 32, 32), (1, 24, 40), (1, 64, 24), (2, 32, 32), (2, 64, 24), (0, 32, 32)]


def resize_image(resize_mode, im, width, height):
    def resize(im, w, h):
        return im.resize((w, h), resample=LANCZOS)

    if resize_mode == 0:
        res = resize(im, width, height)
    elif resize_mode == 1:
        ratio = width / height
        src_ratio = im.width / im.height
        src_w = width if ratio > src_ratio else im.width * height // im.height
        src_h = height if ratio <= src_ratio else im.height * width // im.width
        resized = resize(im, src_w, src_h)
        res = Image.new("RGB", (width, height))
        res.paste(resized, box=(width // 2 - src_w // 2, height // 2 - src_h // 2))
    else:
        ratio = width / height
        src_ratio = im.width / im.height
        src_w = width if ratio < src_ratio else im.width * height // im.height
        src_h = height if ratio >= src_ratio else im.height * width // im.width
        resized = resize(im, src_w, src_h)
        res = Image.new("RGB", (width, height))
        res.paste(resized, box=(width // 2 - src_w // 2, height // 2 - src_h // 2))
        if ratio < src_ratio:
            fill_height = height // 2 - src_h // 2
            if fill_height > 0:
                res.paste(resized.resize((width, fill_height), box=(0, 0, width, 0)), box=(0, 0))
                res.paste(resized.resize((width, fill_height), box=(0, resized.height, width, resized.height)),
                          box=(0, fill_height + src_h))
        elif ratio > src_ratio:
            fill_width = width // 2 - src_w // 2
            if fill_width > 0:
                res.paste(resized.resize((fill_width, height), box=(0, 0, 0, height)), box=(0, 0))
                res.paste(resized.resize((fill_width, height), box=(resized.width, 0, resized.width, height)),
                          box=(fill_width + src_w, 0))
    return res


def source_image():
    rng = np.random.default_rng(11)
    h, w = 28, 45
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.stack([x / (w - 1) * 255, y / (h - 1) * 255, (x + y) / (w + h - 2) * 255], axis=-1)
    for _ in range(6):  # hard-edged blocks
        x0, y0 = rng.integers(0, w - 6), rng.integers(0, h - 6)
        img[y0:y0 + rng.integers(3, 8), x0:x0 + rng.integers(3, 10)] = rng.integers(0, 256, 3)
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def rgba_image(source):
    """The source with a seeded alpha: opaque, transparent and partial regions."""
    rng = np.random.default_rng(12)
    alpha = np.full((source.height, source.width), 255, np.uint8)
    alpha[:, : source.width // 3] = 0
    alpha[source.height // 2 :, :] = rng.integers(0, 256, (source.height - source.height // 2, source.width))
    return Image.fromarray(np.dstack([np.array(source), alpha]), "RGBA")


def main():
    os.makedirs(OUT, exist_ok=True)
    source = source_image()
    source.save(os.path.join(OUT, "input.png"))
    for mode, width, height in CASES:
        resize_image(mode, source, width, height).save(os.path.join(OUT, f"mode{mode}_{width}x{height}.png"))
    # PIL's resize itself, which kiln's resize_image reproduces: each
    # filter, shrinking one side while growing the other, grey and RGBA
    # (PIL resizes RGBA through premultiplied RGBa).
    rgba = rgba_image(source)
    rgba.save(os.path.join(OUT, "input_rgba.png"))
    source.resize((17, 50), resample=LANCZOS).save(os.path.join(OUT, "pil_lanczos_17x50.png"))
    source.resize((100, 9), resample=Image.BILINEAR).save(os.path.join(OUT, "pil_bilinear_100x9.png"))
    # The Qwen2-VL image processor's filter (Qwen-Image-Edit's prompt images).
    source.resize((41, 23), resample=Image.BICUBIC).save(os.path.join(OUT, "pil_bicubic_41x23.png"))
    source.convert("L").resize((7, 5), resample=LANCZOS).save(os.path.join(OUT, "pil_grey_lanczos_7x5.png"))
    rgba.resize((30, 61), resample=LANCZOS).save(os.path.join(OUT, "pil_rgba_lanczos_30x61.png"))


if __name__ == "__main__":
    main()
