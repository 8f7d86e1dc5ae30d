"""The step caches' formulas in numpy, written from the papers and sd-cli's
caching docs (its docs/caching.md; kiln's docs/caching.md states each rule),
not from kiln's code. make_step_cache_fixtures.py runs them on toy inputs.

  taylor_forecast   TaylorSeer (Liu et al. 2025, eq. 7-8): finite differences of
                    a feature over its computed steps, each divided by the gap
                    between the last two, forecast as sum_i D_i k^i / i!.
  chebyshev_ridge   Spectrum (tingyu215/Spectrum): ridge regression of the kept
                    outputs on Chebyshev polynomials T_0..T_m of their times,
                    evaluated at the forecast's time.
  spectrum_run      sd-cli's spectrum schedule (warmup, window, flex, stop) and
                    its blend (1 - w) * (h_last + (h_last - h_prev) / 2) + w * fit.
  relative_l1       DBCache's criterion: sum |a - b| / sum |b|.
  dbcache_run       which steps skip the middle blocks: warmup, the steps
                    computation mask, the threshold against the last computed
                    step's front residual.
  condition_run     EasyCache and UCache: which evaluations reuse the kept
                    residual, and the outputs they give.
"""

import math

import numpy as np


def taylor_forecast(steps, features, order, at):
    """The forecast at step `at` from `features` computed at `steps` (increasing)."""
    diffs = None
    last = None
    for n, (s, f) in enumerate(zip(steps, features)):
        f = np.asarray(f, dtype=np.float64)
        new = [f]
        if diffs is not None:
            gap = max(s - last, 1)
            for i in range(min(n, order)):
                new.append((new[i] - diffs[i]) / gap)
        diffs, last = new, s
    k = at - last
    return sum(d * (k ** i) / math.factorial(i) for i, d in enumerate(diffs))


def chebyshev_ridge(times, outputs, tau, m, lam):
    X = np.polynomial.chebyshev.chebvander(np.asarray(times, dtype=np.float64), m)  # K x (m + 1)
    H = np.asarray(outputs, dtype=np.float64)  # K x F
    coef = np.linalg.solve(X.T @ X + lam * np.eye(m + 1), X.T @ H)
    x_star = np.polynomial.chebyshev.chebvander(np.array([tau]), m)[0]
    return x_star @ coef


def spectrum_run(outputs_fn, evaluations, w=0.4, m=3, lam=1.0, window=2, flex=0.5, warmup=4, stop=0.9):
    """Each evaluation's output (computed: outputs_fn(n); else forecast) and whether it was forecast."""
    keep = max(m + 1, 6)
    hist, times = [], []
    win, since = float(window), 0
    out, forecast = [], []
    tau = lambda n: 2.0 * n / evaluations - 1.0
    for n in range(evaluations):
        predict = (n >= warmup and n < int(stop * evaluations) and len(hist) >= 2
                   and (since + 1) % max(1, int(math.floor(win))) != 0)
        if predict:
            fit = chebyshev_ridge(times, hist, tau(n), m, lam)
            taylor = hist[-1] + 0.5 * (hist[-1] - hist[-2])
            out.append((1 - w) * taylor + w * fit)
            since += 1
        else:
            h = np.asarray(outputs_fn(n), dtype=np.float64)
            out.append(h)
            hist.append(h)
            times.append(tau(n))
            if len(hist) > keep:
                hist.pop(0)
                times.pop(0)
            if n >= warmup:
                win += flex
            since = 0
        forecast.append(predict)
    return out, forecast


def relative_l1(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    norm = np.abs(b).sum()
    return float(np.abs(a - b).sum() / norm) if norm > 0 else 1.0


def dbcache_run(front_residuals, threshold, warmup, mask=None, dynamic=True):
    """Per step: whether the middle blocks are skipped (dbcache)."""
    last = None
    skips = []
    for step, r in enumerate(front_residuals):
        skip = False
        if step >= warmup and last is not None:
            check = True
            if mask is not None and mask[step] == 1:
                check, skip = False, False
            elif mask is not None:
                check = dynamic
                skip = not dynamic
            if check:
                skip = relative_l1(r, last) < threshold
        if not skip:
            last = r
        skips.append(skip)
    return skips


def condition_run(mode, inputs, outputs_fn, threshold, active, decay=1.0, relative=True, reset=True):
    """EasyCache or UCache over evaluations with network inputs `inputs`: the
    output of each (outputs_fn(n), or the input plus the kept residual) and
    whether it reused. `active[n]`: evaluation n is inside the window."""
    mad = lambda a, b: float(np.mean(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
    last_in = last_out = residual = None
    rate = 0.0
    scale = 0.0
    change_mean = 0.0
    acc = 0.0
    computed = 0
    in_row = 0
    n_active = len(inputs)
    outs, reused = [], []
    for n, x in enumerate(inputs):
        x = np.asarray(x, np.float64)
        d_in = 0.0
        reuse = False
        if active[n] and last_in is not None and residual is not None:
            d_in = mad(x, last_in)
            if rate > 0 and d_in > 0 and scale > 0:
                est = rate * d_in
                if mode == "ucache":
                    change = est
                    if relative:
                        base = max(scale, 1e-6)
                        dyn = max(change_mean * 1.6, 1e-6) if change_mean > 0 else base
                        change = est / math.sqrt(base * dyn)
                    change *= 1 + 0.5 * in_row
                    acc = acc * decay + change
                    progress = min(max(computed / n_active, 0.0), 1.0)
                    t = threshold * (0.5 if progress < 0.2 else 1.5 if progress > 0.8 else 1.0)
                    if not relative:
                        t *= scale
                else:
                    acc += est / scale
                    t = threshold
                if acc < t:
                    reuse = True
                elif mode != "ucache" or reset:
                    acc = 0.0
        if reuse:
            in_row += 1
            outs.append(x + residual)
        else:
            y = np.asarray(outputs_fn(n), np.float64)
            outs.append(y)
            if active[n]:
                residual = y - x
                computed += 1
                in_row = 0
                d_out = mad(y, last_out) if last_out is not None else 0.0
                if mode == "ucache" and d_out > 0:
                    change_mean = 0.8 * change_mean + 0.2 * d_out if change_mean > 0 else d_out
                if d_in > 0 and d_out > 0:
                    rate = d_out / d_in
                last_in, last_out = x, y
                scale = float(np.mean(np.abs(y)))
                if mode != "ucache":
                    acc = 0.0
        reused.append(reuse)
    return outs, reused
