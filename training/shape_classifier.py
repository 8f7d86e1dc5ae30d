"""The pixel-statistics shape classifier of tests/unit/shape_classifier.cpp in
numpy, so that a PyTorch sample is judged by the rule kiln's semantic tests use.

Background: the per-channel median of the border ring, nearest of the
training set's backgrounds. Foreground: pixels at least 60 away (RGB
distance) from it, kept to the largest 4-connected blob. Colour: mean of the
blob's pixels more than 100 away from the background, nearest palette colour.
Shape: solidity (area / convex hull of the pixels' corner points) < 0.8 is a
star; else filled corner patches (a fifth of each side of the bounding box;
mean > 0.5 and top > 0.3) a square; else fill of the bounding box > 0.64 a
circle; else a triangle.
"""

import numpy as np

import shapes_dataset as ds


def _nearest(table, rgb):
    return min(table, key=lambda k: float(np.sum((np.array(table[k], np.float64) - rgb) ** 2)))


def _largest_blob(mask):
    h, w = mask.shape
    label = np.full(mask.shape, -1, np.int64)
    best, best_size = -1, 0
    for start in zip(*np.nonzero(mask)):
        if label[start] >= 0:
            continue
        ident = start[0] * w + start[1]
        label[start] = ident
        stack, size = [start], 0
        while stack:
            y, x = stack.pop()
            size += 1
            for ny, nx in ((y, x - 1), (y, x + 1), (y - 1, x), (y + 1, x)):
                if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and label[ny, nx] < 0:
                    label[ny, nx] = ident
                    stack.append((ny, nx))
        if size > best_size:
            best, best_size = ident, size
    return label == best, best_size


def _hull_area(points):
    pts = sorted(set(points))
    if len(pts) < 3:
        return 0.0

    def cross(o, a, b):
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    lower, upper = [], []
    for p in pts:
        while len(lower) >= 2 and cross(lower[-2], lower[-1], p) <= 0:
            lower.pop()
        lower.append(p)
    for p in reversed(pts):
        while len(upper) >= 2 and cross(upper[-2], upper[-1], p) <= 0:
            upper.pop()
        upper.append(p)
    hull = lower[:-1] + upper[:-1]
    area = sum(a[0] * b[1] - b[0] * a[1] for a, b in zip(hull, hull[1:] + hull[:1]))
    return abs(area) / 2


def classify(img):
    """(shape, colour, background) of a uint8 HWC image; shape and colour None
    when nothing stands out from the background."""
    x = img.astype(np.float64)
    border = np.concatenate([x[0], x[-1], x[:, 0], x[:, -1]])
    bg_rgb = np.array([np.sort(border[:, c])[len(border) // 2] for c in range(3)])
    background = _nearest(ds.BACKGROUNDS, bg_rgb)
    dist = np.sqrt(((x - bg_rgb) ** 2).sum(-1))
    blob, size = _largest_blob(dist >= 60)
    if size < 16:
        return None, None, background
    core = blob & (dist > 100)
    if not core.any():
        return None, None, background
    colour = _nearest(ds.COLOURS, x[core].mean(axis=0))
    ys, xs = np.nonzero(blob)
    y0, y1, x0, x1 = ys.min(), ys.max(), xs.min(), xs.max()
    area = float(size)
    fill = area / ((x1 - x0 + 1) * (y1 - y0 + 1))
    corners = [(int(px) + dx, int(py) + dy) for py, px in zip(ys, xs) for dx in (0, 1) for dy in (0, 1)]
    solidity = area / max(1.0, _hull_area(corners))
    cw, ch = max(1, (x1 - x0 + 1) // 5), max(1, (y1 - y0 + 1) // 5)

    def patch(px, py):
        return blob[py:py + ch, px:px + cw].mean()

    top = (patch(x0, y0) + patch(x1 - cw + 1, y0)) / 2
    bottom = (patch(x0, y1 - ch + 1) + patch(x1 - cw + 1, y1 - ch + 1)) / 2
    if solidity < 0.8:
        shape = "star"
    elif (top + bottom) / 2 > 0.5 and top > 0.3:
        shape = "square"
    elif fill > 0.64:
        shape = "circle"
    else:
        shape = "triangle"
    return shape, colour, background
