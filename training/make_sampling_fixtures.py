#!/usr/bin/python3
"""Writes the golden fixtures for kiln's sampling layer (src/pipeline/).

Run with Debian's python3-torch (not a pyenv python), from anywhere:
    /usr/bin/python3 training/make_sampling_fixtures.py

Writes, relative to the repository root, tests/golden/sampling/:
  rng_cpu.txt     torch.randn(n, generator=torch.Generator().manual_seed(seed)) on the CPU, float32, for a few
                  seeds and a sequence of calls on one generator (sizes below and above 16), in two builds:
                  "avx2" (ATEN_CPU_CAPABILITY=avx2: normal_fill_16_AVX2, what x86-64 torch runs) and "portable"
                  (ATEN_CPU_CAPABILITY=default: libm normal_fill_16). A 4x64x64 draw is kept as its first and
                  last 32 values plus an FNV-1a hash of all its float32 bytes.
  rng_cuda.txt    the same for stable-diffusion-webui's Philox emulation of CUDA randn (reference/sampling.py).
  rng_std_default.txt  the same for sd-cli's --rng std_default (reference/sampling.py's StdDefaultGenerator,
                  written from libstdc++'s <random>), one generator across calls.
  denoiser.txt    SD's alphas_cumprod and sigma table, t_to_sigma / sigma_to_t samples, eps and v scalings.
  schedules.txt   every scheduler's sigmas for a few step counts.
  flow.txt        Flux's rectified flow: BFL's get_schedule (dev: resolution-dependent shift, schnell: none) for
                  a few step counts and token counts; BFL's Euler loop, ComfyUI's euler_ancestral_RF and LCM with
                  CONST noise scaling on the toy denoiser (as an x0 estimate) from noise at sigma 1.
  samplers.txt    every sampler's final x for the toy denoiser of reference/sampling.py, from a fixed initial x
                  over three sigma schedules, with ancestral noise taken in order from one stored stream; also
                  the number of denoiser calls and noise draws.

Format: '#' starts a comment line; every other line is one record
    <name> <count> <value> ... <value>
with float32 values printed with 9 significant digits (exact round trip) and float64 results with 12.
The C++ tests (tests/unit/{rng,schedulers,samplers}_test.cpp) read these files; CI needs no Python.
"""

import os
import subprocess
import sys
import types

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import sampling as ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "golden", "sampling")

CPU_SEEDS = [0, 42, 2 ** 32 + 7]  # the last one checks that only the low 32 bits seed mt19937
CPU_CALLS = [7, 16, 100, 5, 1, 33, 3]  # one generator, in this order: both paths and the cached normal
PHILOX_SEEDS = [0, 42, 2 ** 33 + 5]  # the last one has a non-zero high key word
PHILOX_CALLS = [12, 7, 100, 16, 1]
BIG = 4 * 64 * 64
EDGE = 32  # values kept at each end of a BIG draw

SCHEDULE_STEPS = [1, 2, 3, 10, 20, 30]
SAMPLER_SIZE = 32
SAMPLER_SCHEDULES = {"karras10": ("karras", 10), "discrete10": ("discrete", 10), "discrete16": ("discrete", 16)}
SAMPLER_CASES = [  # (sampler, eta)
    ("euler", 1.0), ("euler_a", 1.0), ("euler_a", 0.5), ("heun", 1.0), ("dpm2", 1.0),
    ("dpm++2s_a", 1.0), ("dpm++2s_a", 0.5), ("dpm++2m", 1.0), ("dpm++2mv2", 1.0), ("ipndm", 1.0),
    ("lcm", 1.0), ("ddim_trailing", 0.0), ("ddim_trailing", 1.0), ("tcd", 0.0), ("tcd", 0.3),
]


def fnv1a32(values):
    h = 0x811C9DC5
    for b in np.asarray(values, dtype="<f4").tobytes():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def f32(values):
    return " ".join("%.9g" % v for v in np.asarray(values, dtype=np.float32).tolist())


def f64(values):
    return " ".join("%.12g" % float(v) for v in values)


def record(name, values, fmt=f32):
    values = list(values) if not isinstance(values, np.ndarray) else values
    return "%s %d %s" % (name, len(values), fmt(values))


def big_records(prefix, values):
    return [
        record(prefix + "/head", values[:EDGE]),
        record(prefix + "/tail", values[-EDGE:]),
        record(prefix + "/fnv1a", [fnv1a32(values)], fmt=lambda v: "%d" % v[0]),
    ]


def torch_cpu_records(variant):
    """Runs in a child process whose ATEN_CPU_CAPABILITY selects the build of normal_fill_16."""
    lines = []
    for seed in CPU_SEEDS:
        for k, values in enumerate(ref.torch_cpu_randn_calls(seed, CPU_CALLS)):
            lines.append(record("cpu/%s/seed=%d/call=%d/n=%d" % (variant, seed, k, len(values)), values))
        lines += big_records("cpu/%s/seed=%d/n=%d" % (variant, seed, BIG), ref.torch_cpu_randn_calls(seed, [BIG])[0])
    return lines


def write(name, header, lines):
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, name)
    with open(path, "w") as f:
        f.write("# %s\n# Written by training/make_sampling_fixtures.py; records: <name> <count> <values...>\n" % header)
        for line in lines:
            f.write(line + "\n")
    print("wrote %s (%d bytes)" % (os.path.relpath(path, ROOT), os.path.getsize(path)))


def make_rng_cpu():
    lines = []
    outputs = {}
    for variant, capability in (("avx2", "avx2"), ("portable", "default")):
        env = dict(os.environ, ATEN_CPU_CAPABILITY=capability)
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--torch-cpu-worker", variant], env=env,
                             check=True, capture_output=True, text=True).stdout
        outputs[variant] = [l for l in out.splitlines() if l]
        lines += outputs[variant]
    # On a CPU without AVX2 torch would silently fall back and both files would hold the portable values.
    big_hash = [l for l in outputs["avx2"] if "/n=%d/fnv1a" % BIG in l]
    assert big_hash != [l.replace("portable", "avx2") for l in outputs["portable"] if "/n=%d/fnv1a" % BIG in l], \
        "the avx2 and portable draws are identical: is this CPU without AVX2?"
    write("rng_cpu.txt", "torch %s CPU randn, float32 (avx2 and portable builds of normal_fill_16)" % torch.__version__,
          lines)


def generator_records(prefix, seeds, calls, make):
    """One generator per seed drawing `calls` in order, then a fresh one's BIG draw."""
    lines = []
    for seed in seeds:
        g = make(seed)
        for k, n in enumerate(calls):
            lines.append(record("%s/seed=%d/call=%d/n=%d" % (prefix, seed, k, n), g.randn(n)))
        lines += big_records("%s/seed=%d/n=%d" % (prefix, seed, BIG), make(seed).randn(BIG))
    return lines


def make_rng_cuda():
    write("rng_cuda.txt", "webui rng_philox.py (numpy %s) randn, float32" % np.__version__,
          generator_records("cuda", PHILOX_SEEDS, PHILOX_CALLS, ref.PhiloxGenerator))


def make_rng_std_default():
    write("rng_std_default.txt", "sd-cli std_default randn (libstdc++ minstd_rand0 + polar method), float32",
          generator_records("std_default", CPU_SEEDS, CPU_CALLS, ref.StdDefaultGenerator))


def make_denoiser(schedule):
    lines = [record("alphas_cumprod", schedule.alphas_cumprod.numpy()), record("sigmas", schedule.sigmas.numpy())]
    ts = [0.0, 0.5, 1.0, 1.25, 10.7, 250.5, 500.0, 998.9, 999.0]
    lines.append(record("t_to_sigma/t", ts))
    lines.append(record("t_to_sigma/sigma", [schedule.t_to_sigma(t) for t in ts], fmt=f64))
    sigmas = [0.01, float(schedule.sigmas[0]), 0.1, 1.0, 3.7, 14.6, float(schedule.sigmas[-1]), 20.0]
    lines.append(record("sigma_to_t/sigma", sigmas))
    lines.append(record("sigma_to_t/t", [schedule.sigma_to_t(float(np.float32(s))) for s in sigmas], fmt=f64))
    scal_sigmas = [0.03, 0.5, 1.0, 2.0, 14.6]
    lines.append(record("scalings/sigma", scal_sigmas))
    for prediction in ("eps", "v"):
        flat = []
        for s in scal_sigmas:
            flat += list(ref.get_scalings(prediction, float(np.float32(s))))
        lines.append(record("scalings/" + prediction, flat, fmt=f64))
    write("denoiser.txt", "SD scaled-linear discrete schedule (ldm betas, k-diffusion sigmas)", lines)


def make_schedules(schedule):
    lines = []
    for name in ref.SCHEDULERS:
        for n in SCHEDULE_STEPS:
            lines.append(record("sigmas/%s/steps=%d" % (name, n), ref.get_sigmas(name, n, schedule), fmt=f64))
    write("schedules.txt", "scheduler sigmas for the SD schedule", lines)


def make_samplers(schedule):
    g = torch.Generator().manual_seed(1234)
    base = torch.randn(SAMPLER_SIZE, generator=g)
    stream = torch.randn(SAMPLER_SIZE * 20, generator=g)
    lines = [
        "# toy denoiser: D(x, sigma) = x * %g / (%g + sigma^2) + %g * tanh(x)"
        % (ref.TOY_SIGMA_DATA2, ref.TOY_SIGMA_DATA2, ref.TOY_TANH_WEIGHT),
        record("noise", stream.numpy()),
    ]
    for sched_name, (kind, steps) in SAMPLER_SCHEDULES.items():
        sigmas32 = np.asarray(ref.get_sigmas(kind, steps, schedule), dtype=np.float32)
        x_init = (base * float(sigmas32[0])).numpy().astype(np.float32)
        lines.append(record("schedule/" + sched_name, sigmas32))
        lines.append(record("x_init/" + sched_name, x_init))
        sigmas = [float(s) for s in sigmas32]
        for sampler, eta in SAMPLER_CASES:
            eta = float(np.float32(eta))
            calls = [0]
            draws = [0]

            def model(x, sigma):
                calls[0] += 1
                return ref.toy_denoiser(x, float(sigma))

            def noise():
                k = draws[0]
                draws[0] += 1
                chunk = stream[k * SAMPLER_SIZE:(k + 1) * SAMPLER_SIZE]
                assert chunk.numel() == SAMPLER_SIZE, "noise stream too short"
                return chunk.double()

            x = torch.tensor(x_init, dtype=torch.float64)
            out = ref.SAMPLERS[sampler](model, x, sigmas, eta=eta, noise=noise,
                                        alphas_cumprod=schedule.alphas_cumprod)
            key = "%s/%s/%g" % (sched_name, sampler, eta)
            lines.append(record("final/" + key, out.numpy(), fmt=f64))
            lines.append(record("nfe/" + key, [calls[0]], fmt=lambda v: "%d" % v[0]))
            lines.append(record("draws/" + key, [draws[0]], fmt=lambda v: "%d" % v[0]))
    write("samplers.txt", "sampler results for the toy denoiser (float64 reference)", lines)


FLOW_STEPS = [1, 4, 20, 28]
FLOW_TOKENS = [256, 1024, 4096]


def make_flow():
    lines = []
    for n in FLOW_STEPS:
        for tokens in FLOW_TOKENS:
            mu = ref.bfl_lin_function()(tokens)
            lines.append(record("mu/tokens=%d" % tokens, [mu], fmt=f64))
            lines.append(record("bfl/dev/steps=%d/tokens=%d" % (n, tokens), ref.bfl_get_schedule(n, tokens), fmt=f64))
            # ComfyUI's ModelSamplingFlux table (sigma(t) = time_shift(mu, t / 1000), t = 1..1000, in float32)
            # walked by its simple_scheduler: BFL's schedule when 1000 / n is whole, else rounded to the table.
            table = types.SimpleNamespace(sigmas=torch.tensor(
                [ref.bfl_time_shift(mu, 1.0, t / 1000) for t in range(1, 1001)], dtype=torch.float32))
            lines.append(record("comfy_simple/steps=%d/tokens=%d" % (n, tokens), ref.get_sigmas("simple", n, table),
                                fmt=f64))
        lines.append(record("bfl/schnell/steps=%d" % n, ref.bfl_get_schedule(n, 4096, shift=False), fmt=f64))
    g = torch.Generator().manual_seed(4321)
    x_init = torch.randn(SAMPLER_SIZE, generator=g)  # noise at sigma 1: x = noise
    stream = torch.randn(SAMPLER_SIZE * 40, generator=g)
    lines.append(record("x_init", x_init.numpy()))
    lines.append(record("noise", stream.numpy()))
    for n in (4, 10):
        sigmas32 = np.asarray(ref.bfl_get_schedule(n, 1024), dtype=np.float32)
        sigmas = [float(s) for s in sigmas32]
        lines.append(record("schedule/steps=%d" % n, sigmas32))

        def velocity(x, sigma):
            return (x - ref.toy_denoiser(x, float(sigma))) / sigma

        x = x_init.double()
        lines.append(record("final/steps=%d/euler" % n, ref.bfl_denoise(velocity, x, sigmas).numpy(), fmt=f64))
        for name, fn in (("euler_a", ref.sample_euler_ancestral_rf), ("lcm", ref.sample_lcm_flow)):
            draws = [0]

            def noise():
                k = draws[0]
                draws[0] += 1
                return stream[k * SAMPLER_SIZE:(k + 1) * SAMPLER_SIZE].double()

            out = fn(lambda v, s: ref.toy_denoiser(v, float(s)), x_init.double(), sigmas, eta=1.0, noise=noise)
            lines.append(record("final/steps=%d/%s" % (n, name), out.numpy(), fmt=f64))
            lines.append(record("draws/steps=%d/%s" % (n, name), [draws[0]], fmt=lambda v: "%d" % v[0]))
    write("flow.txt", "rectified flow: BFL schedules and flow samplers on the toy denoiser (float64)", lines)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--torch-cpu-worker":
        print("\n".join(torch_cpu_records(sys.argv[2])))
        return
    torch.set_default_dtype(torch.float32)
    schedule = ref.DiscreteSchedule(ref.scaled_linear_alphas_cumprod())
    make_rng_cpu()
    make_rng_cuda()
    make_rng_std_default()
    make_denoiser(schedule)
    make_schedules(schedule)
    make_samplers(schedule)
    make_flow()


if __name__ == "__main__":
    main()
