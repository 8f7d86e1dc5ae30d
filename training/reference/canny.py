"""sd-cli's --canny preprocessor, written from stable-diffusion.cpp's
preprocessing.hpp (preprocess_canny(img, 0.08, 0.08, 0.8, 1.0, false), as
sd-cli calls it) in numpy float32, and the golden kiln's
src/image/canny.cpp is checked against (tests/golden/canny/):

    /usr/bin/python3 training/reference/canny.py

Needs Debian's python3-numpy and python3-pil (PNG files only). Loops are
written out where sd.cpp's order of float additions decides the bits.
"""

import os

import numpy as np
from PIL import Image

F = np.float32
PI = F(3.14159265358979323846)
OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "golden", "canny")


def convolve(img, kernel, padding):
    """sd.cpp's convolve_tensor: cross-correlation, zero padding, sum over
    kernel rows then columns, in float32."""
    h, w = img.shape
    kh, kw = kernel.shape
    padded = np.zeros((h + 2 * padding, w + 2 * padding), F)
    padded[padding:padding + h, padding:padding + w] = img
    out = np.zeros((h, w), F)
    for ky in range(kh):
        for kx in range(kw):
            # Out-of-image taps are skipped in sd.cpp; adding 0 * k is the same float.
            out = (out + padded[ky:ky + h, kx:kx + w] * kernel[ky, kx]).astype(F)
    return out


def gaussian_kernel(size=5):
    sigma = F(1.4)
    normal = F(1.0) / (F(2.0) * PI * np.power(sigma, F(2.0)))
    mid = size // 2
    k = np.zeros((size, size), F)
    for y in range(size):
        gx = F(-mid + y)
        for x in range(size):
            gy = F(-mid + x)
            k[y, x] = np.exp(-((gx * gx + gy * gy) / (F(2.0) * np.power(sigma, F(2.0))))) * normal
    return k


def canny(rgb_u8, high=F(0.08), low=F(0.08), weak=F(0.8), strong=F(1.0)):
    img = rgb_u8.astype(F) / F(255.0)
    grey = (F(0.2989) * img[..., 0] + F(0.5870) * img[..., 1]).astype(F) + F(0.1140) * img[..., 2]
    grey = grey.astype(F)
    grey = convolve(grey, gaussian_kernel(), 2)
    kx = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], F)
    ky = np.array([[1, 2, 1], [0, 0, 0], [-1, -2, -1]], F)
    ix = convolve(grey, kx, 1)
    iy = convolve(grey, ky, 1)
    g = np.sqrt(ix * ix + iy * iy).astype(F)
    peak = g.max()
    if peak != 0 and np.isfinite(peak):
        g = (g * (F(1.0) / peak)).astype(F)
    theta = np.arctan2(iy, ix).astype(F)

    h, w = g.shape
    nms = np.zeros_like(g)
    for y in range(1, h - 1):
        for x in range(1, w - 1):
            angle = F(theta[y, x] * F(180.0)) / PI
            if angle < 0:
                angle = F(angle + F(180.0))
            q = r = F(1.0)
            if (0 >= angle and angle < 22.5) or (157.5 >= angle and angle <= 180):
                q, r = g[y + 1, x], g[y - 1, x]
            elif 22.5 >= angle and angle < 67.5:
                q, r = g[y - 1, x + 1], g[y + 1, x - 1]
            elif 67.5 >= angle and angle < 112.5:
                q, r = g[y, x + 1], g[y, x - 1]
            elif 112.5 >= angle and angle < 157.5:
                q, r = g[y - 1, x - 1], g[y + 1, x + 1]
            cur = g[y, x]
            nms[y, x] = cur if (cur >= q and cur >= r) else F(0)

    ht = F(nms.max() * high)
    lt = F(ht * low)
    out = nms.copy()
    out[nms >= ht] = strong
    out[(nms < ht) & (nms <= ht) & (nms >= lt)] = weak
    for y in range(h):
        for x in range(w):
            if not (3 <= x <= w - 3 and 3 <= y <= h - 3):
                out[y, x] = 0
    for y in range(1, h - 1):  # in place: promotions are seen by later pixels
        for x in range(1, w - 1):
            if out[y, x] == weak:
                n = (out[y - 1, x + 1], out[y, x + 1], out[y - 1, x], out[y + 1, x], out[y - 1, x - 1], out[y, x - 1])
                out[y, x] = strong if any(v == strong for v in n) else F(0)
    u8 = np.where(out <= 0, 0, np.where(out >= 1, 255, (out * F(255.0) + F(0.5)).astype(np.int32)))
    return np.repeat(u8.astype(np.uint8)[..., None], 3, axis=-1)


def source_image():
    """A 72x56 picture with hard and soft edges in every direction."""
    h, w = 56, 72
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.zeros((h, w, 3))
    img[..., 0] = 40 + 60 * (x / w)
    img[..., 1] = 30 + 50 * (y / h)
    img[..., 2] = 90
    circle = (x - 22) ** 2 + (y - 26) ** 2 < 14 ** 2
    img[circle] = [230, 40, 40]
    img[8:40, 42:64] = [30, 200, 60]
    diamond = np.abs(x - 50) + np.abs(y - 44) < 9
    img[diamond] = [250, 250, 90]
    rng = np.random.default_rng(5)
    img += rng.normal(0, 3, img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def main():
    os.makedirs(OUT, exist_ok=True)
    src = source_image()
    Image.fromarray(src, "RGB").save(os.path.join(OUT, "input.png"))
    Image.fromarray(canny(src), "RGB").save(os.path.join(OUT, "edges.png"))


if __name__ == "__main__":
    main()
