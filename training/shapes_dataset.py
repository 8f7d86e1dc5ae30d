"""Procedural coloured-shape images and their captions (kiln-tiny's data set).

Every image is 64x64 RGB: one shape (circle, square, triangle, star) in one
colour (red, green, blue, yellow, purple, orange) on a plain background
(white, black, gray), at a random size (40-70% of the image side) and position
(the shape always lies fully inside). Edges are antialiased from an exact
signed distance (coverage = clamp(0.5 - distance, 0, 1) per pixel).

Captions follow "a red circle on a white background"; a share of the captions
(VARIANT_SHORT) is the short form "a red circle" (background unconstrained).

Everything is seeded: ``sample(rng)`` draws one example from a
``numpy.random.Generator``; ``batch(seed, n)`` is a pure function of its
arguments, so runs are reproducible and resumable.
"""

import math

import numpy as np

SIZE = 64
SHAPES = ("circle", "square", "triangle", "star")
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 70, 225),
    "yellow": (245, 220, 30),
    "purple": (140, 45, 185),
    "orange": (250, 135, 20),
}
BACKGROUNDS = {
    "white": (255, 255, 255),
    "black": (0, 0, 0),
    "gray": (128, 128, 128),
}
COLOUR_NAMES = tuple(COLOURS)
BACKGROUND_NAMES = tuple(BACKGROUNDS)
VARIANT_SHORT = 0.15  # share of captions without the background phrase

MIN_FRAC, MAX_FRAC = 0.40, 0.70


def caption(shape, colour, background, short=False):
    if short:
        return "a %s %s" % (colour, shape)
    return "a %s %s on a %s background" % (colour, shape, background)


def all_words():
    """Every word any caption uses (the tokenizer's vocabulary words)."""
    words = ["a", "on", "background"]
    words += list(COLOUR_NAMES) + list(SHAPES) + list(BACKGROUND_NAMES)
    return words


# ---------------------------------------------------------------- geometry

_ys, _xs = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64) + 0.5  # pixel centres


def _polygon_sdf(vertices):
    """Signed distance (pixels, negative inside) from every pixel centre to a
    closed polygon given as an (n, 2) array of (x, y)."""
    px, py = _xs[..., None], _ys[..., None]
    a = vertices
    b = np.roll(vertices, -1, axis=0)
    ex, ey = b[:, 0] - a[:, 0], b[:, 1] - a[:, 1]
    wx, wy = px - a[:, 0], py - a[:, 1]
    t = np.clip((wx * ex + wy * ey) / (ex * ex + ey * ey), 0.0, 1.0)
    dx, dy = wx - ex * t, wy - ey * t
    dist = np.sqrt((dx * dx + dy * dy).min(axis=-1))
    # even-odd crossing test
    cond = (a[:, 1] > py) != (b[:, 1] > py)
    xint = a[:, 0] + (py - a[:, 1]) * ex / np.where(ey == 0, 1e-12, ey)
    inside = (cond & (px < xint)).sum(axis=-1) % 2 == 1
    return np.where(inside, -dist, dist)


def _regular(cx, cy, radii, n_points, start_deg=-90.0):
    """Vertices alternating over `radii` (a star when two radii)."""
    k = n_points * len(radii)
    ang = np.deg2rad(start_deg) + np.arange(k) * 2 * math.pi / k
    r = np.array([radii[i % len(radii)] for i in range(k)])
    return np.stack([cx + r * np.cos(ang), cy + r * np.sin(ang)], axis=1)


STAR_INNER = 0.45


def shape_extent(shape, s):
    """(half-width, top, bottom) of the shape's bounding box around its centre
    for the size parameter s (the bounding width in pixels)."""
    if shape in ("circle", "square"):
        return s / 2, s / 2, s / 2
    if shape == "triangle":
        r = s / math.sqrt(3.0)  # circumradius: width = r * sqrt(3)
        return s / 2, r, r / 2
    r = s / 2 / math.cos(math.radians(18))  # star: width = 2 r cos 18
    return s / 2, r, r * math.cos(math.radians(36))


def shape_sdf(shape, cx, cy, s):
    if shape == "circle":
        return np.sqrt((_xs - cx) ** 2 + (_ys - cy) ** 2) - s / 2
    if shape == "square":
        h = s / 2
        qx, qy = np.abs(_xs - cx) - h, np.abs(_ys - cy) - h
        out = np.sqrt(np.maximum(qx, 0) ** 2 + np.maximum(qy, 0) ** 2)
        return out + np.minimum(np.maximum(qx, qy), 0)
    if shape == "triangle":
        return _polygon_sdf(_regular(cx, cy, [s / math.sqrt(3.0)], 3))
    if shape == "star":
        r = s / 2 / math.cos(math.radians(18))
        return _polygon_sdf(_regular(cx, cy, [r, r * STAR_INNER], 5))
    raise ValueError("unknown shape %r" % shape)


def draw(shape, colour, background, frac, u, v):
    """uint8 [64, 64, 3] image. frac: bounding width / image side; u, v in
    [0, 1]: the position of the shape's box within the room left for it."""
    s = frac * SIZE
    hw, top, bottom = shape_extent(shape, s)
    margin = 1.0
    cx = margin + hw + u * (SIZE - 2 * margin - 2 * hw)
    cy = margin + top + v * (SIZE - 2 * margin - top - bottom)
    cov = np.clip(0.5 - shape_sdf(shape, cx, cy, s), 0.0, 1.0)[..., None]
    fg = np.array(COLOURS[colour], dtype=np.float64)
    bg = np.array(BACKGROUNDS[background], dtype=np.float64)
    img = bg * (1 - cov) + fg * cov
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def sample(rng, drawn=None):
    """One random example: (uint8 image [64, 64, 3], caption, labels dict).
    drawn: optional {captioned shape: shape drawn instead} (a LoRA's altered
    data set, e.g. {"circle": "square"}); the draws from rng are the same."""
    shape = SHAPES[rng.integers(len(SHAPES))]
    colour = COLOUR_NAMES[rng.integers(len(COLOUR_NAMES))]
    background = BACKGROUND_NAMES[rng.integers(len(BACKGROUND_NAMES))]
    frac = rng.uniform(MIN_FRAC, MAX_FRAC)
    u, v = rng.uniform(), rng.uniform()
    short = rng.uniform() < VARIANT_SHORT
    img = draw((drawn or {}).get(shape, shape), colour, background, frac, u, v)
    labels = dict(shape=shape, colour=colour, background=background, frac=frac, short=short)
    return img, caption(shape, colour, background, short), labels


def batch(seed, n, drawn=None):
    """n examples from a generator seeded with `seed` (an int or a sequence):
    float32 [n, 3, 64, 64] in [-1, 1], captions, labels (see sample for drawn)."""
    rng = np.random.default_rng(seed)
    imgs, caps, labels = [], [], []
    for _ in range(n):
        img, cap, lab = sample(rng, drawn)
        imgs.append(img)
        caps.append(cap)
        labels.append(lab)
    x = np.stack(imgs).astype(np.float32).transpose(0, 3, 1, 2) / 127.5 - 1.0
    return x, caps, labels


def to_uint8(x):
    """float [3, H, W] or [N, 3, H, W] in [-1, 1] -> uint8 HWC / NHWC."""
    x = np.asarray(x, dtype=np.float32)
    x = np.clip((x + 1.0) * 127.5, 0, 255).round().astype(np.uint8)
    return np.moveaxis(x, -3, -1)


if __name__ == "__main__":
    import time

    t0 = time.time()
    x, caps, _ = batch(0, 64)
    print("64 images in %.3f s; %s; first: %s" % (time.time() - t0, x.shape, caps[0]))
