#!/usr/bin/python3
"""Writes tests/golden/sampling/step_caches.txt: the step caches' formulas
(reference/step_caches.py, from the papers and sd-cli's docs) on toy inputs,
for tests/unit/step_cache_formulas_test.cpp.

Run with Debian's python3-numpy, from anywhere:
    /usr/bin/python3 training/make_step_cache_fixtures.py

Format: as tests/golden/sampling (one record per line, <name> <count> <values...>).
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import step_caches as ref  # noqa: E402

F = 8  # features per toy output


def toy_output(n):
    """A smooth trajectory with some curvature, as denoised outputs have."""
    k = np.arange(F)
    return np.sin(0.21 * n + 0.7 * k) + 0.05 * n + 0.01 * (n ** 2) * np.cos(k)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out_dir = os.path.join(root, "tests", "golden", "sampling")
    os.makedirs(out_dir, exist_ok=True)
    lines = ["# written by training/make_step_cache_fixtures.py"]

    def put(name, values):
        values = np.asarray(values, dtype=np.float64).ravel()
        lines.append(f"{name} {len(values)} " + " ".join(f"{v:.12g}" for v in values))

    # TaylorSeer: features at uneven computed steps, forecasts of orders 1 and 2.
    rng = np.random.default_rng(7)
    steps = [0, 2, 3, 6]
    feats = [rng.standard_normal(F) for _ in steps]
    put("taylor_steps", steps)
    for i, f in enumerate(feats):
        put(f"taylor_feature_{i}", f)
    for order in (1, 2):
        for at in (7, 9):
            put(f"taylor_order{order}_at{at}", ref.taylor_forecast(steps, feats, order, at))

    # Spectrum: the ridge weights' effect (a forecast) and a whole run at the defaults and another setting.
    times = [-1.0, -0.8, -0.5, -0.3, 0.0, 0.2]
    hist = [toy_output(n) for n in range(len(times))]
    put("ridge_times", times)
    put("ridge_fit_m3_lam1_at_0.4", ref.chebyshev_ridge(times, hist, 0.4, 3, 1.0))
    put("ridge_fit_m2_lam0.1_at_0.3", ref.chebyshev_ridge(times, hist, 0.3, 2, 0.1))
    for name, kw in (("spectrum_default", {}), ("spectrum_w0.7_window3", {"w": 0.7, "window": 3, "warmup": 2})):
        outs, forecast = ref.spectrum_run(toy_output, 20, **kw)
        put(name + "_forecast", [1.0 if f else 0.0 for f in forecast])
        put(name + "_outputs", np.stack(outs))

    # DBCache: the criterion and a decision run (front residuals drifting by steps of varying size).
    a, b = rng.standard_normal(F), rng.standard_normal(F)
    put("l1_a", a)
    put("l1_b", b)
    put("l1_value", [ref.relative_l1(a, b)])
    base = rng.standard_normal(F)
    drift = [0.3, 0.02, 0.03, 0.01, 0.2, 0.02, 0.05, 0.01, 0.01, 0.3, 0.02, 0.01]
    fronts, cur = [], base.copy()
    for d in drift:
        cur = cur + d * np.abs(cur).mean() * rng.standard_normal(F)
        fronts.append(cur.copy())
    put("db_fronts", np.stack(fronts))
    put("db_skips_t0.08_w2", ref.dbcache_run(fronts, 0.08, 2))
    mask = [1, 1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 1]
    put("db_mask", mask)
    put("db_skips_t0.08_w2_dynamic", ref.dbcache_run(fronts, 0.08, 2, mask, True))
    put("db_skips_t0.08_w2_static", ref.dbcache_run(fronts, 0.08, 2, mask, False))

    # EasyCache and UCache on a toy network: inputs along a smooth path, output = tanh(W x) + x.
    W = 0.6 * rng.standard_normal((F, F))
    inputs = [np.cos(0.15 * n + np.arange(F)) * (1.0 - 0.03 * n) for n in range(24)]
    outputs_fn = lambda n: np.tanh(W @ inputs[n]) + inputs[n]
    put("cond_inputs", np.stack(inputs))
    active = [3 <= n < 22 for n in range(24)]
    put("cond_active", [1.0 if a else 0.0 for a in active])
    runs = (("easycache_t0.2", "easycache", 0.2, {}), ("easycache_t0.5", "easycache", 0.5, {}),
            ("ucache_t1", "ucache", 1.0, {}), ("ucache_t3_decay0.8_noreset", "ucache", 3.0, {"decay": 0.8, "reset": False}),
            ("ucache_t0.5_absolute", "ucache", 0.5, {"relative": False}))
    for name, mode, t, kw in runs:
        outs, reused = ref.condition_run(mode, inputs, outputs_fn, t, active, **kw)
        put(name + "_reused", [1.0 if r else 0.0 for r in reused])
        put(name + "_outputs", np.stack(outs))

    with open(os.path.join(out_dir, "step_caches.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote", os.path.join(out_dir, "step_caches.txt"))


if __name__ == "__main__":
    main()
