#!/usr/bin/python3
"""Cross-checks kiln's Flux.1 pipeline goldens with a second, independent reference.

training/reference/flux_bfl.py is a transcription of Black Forest Labs' original
Flux code (github.com/black-forest-labs/flux: src/flux/model.py,
src/flux/modules/layers.py, src/flux/math.py, src/flux/sampling.py); kiln's
goldens were computed with training/reference/flux.py, written alongside kiln's
C++. This script reruns the job of training/make_flux_pipeline_fixtures.py with
BFL's code (no other reference module is imported) and compares:

  * velocity0  the DiT's output at the first evaluation
  * latent     the final latent after BFL's Euler loop (denoise) over the stored sigmas
  * sigmas     the stored schedule against the formula the job documents (sd-cli's
               "discrete" flow table with BFL's time_shift and get_lin_function), and,
               reported only, against BFL's own get_schedule(4, 64, shift=True)

and writes tests/golden/pipeline/flux_tiny_second_step.safetensors (F32):
  x1         [1, 16, 16, 16]  the latent after the first Euler step (unpacked, as `latent`)
  t1         [1]              the second sigma
  velocity1  [1, 16, 16, 16]  the DiT's output at the second evaluation (unpacked)
computed by the BFL transcription only (tests/unit/flux_second_step_test.cpp).

Run with Debian's python3-torch:
    /usr/bin/python3 training/check_flux_bfl_reference.py

Exits non-zero when a comparison differs by more than 1e-4 of the reference
tensor's largest magnitude.
"""

import math
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from reference import flux_bfl  # noqa: E402
from reference import safetensors_io  # noqa: E402

ROOT = os.path.dirname(HERE)
PIPELINE = os.path.join(ROOT, "tests", "golden", "pipeline")
DIT_PATH = os.path.join(PIPELINE, "flux_tiny", "flux_dit.safetensors")
JOB_PATH = os.path.join(PIPELINE, "flux_tiny_txt2img.safetensors")
OUT_PATH = os.path.join(PIPELINE, "flux_tiny_second_step.safetensors")

TOLERANCE = 1e-4
GUIDANCE = 3.5  # the job's distilled guidance
STEPS = 4
THETA = 10_000  # BFL's configs for flux-dev and flux-schnell


def params_from_weights(sd, metadata):
    """FluxParams read off a BFL-named state dict; axes_dim from kiln's metadata key."""
    axes_dim = [int(a) for a in metadata["kiln.flux.axes_dim"].split(",")]
    hidden = sd["img_in.weight"].shape[0]
    head_dim = sd["double_blocks.0.img_attn.norm.query_norm.scale"].shape[0]
    mlp_hidden = sd["double_blocks.0.img_mlp.0.weight"].shape[0]

    def count(prefix):
        return len({k.split(".")[1] for k in sd if k.startswith(prefix + ".")})

    params = flux_bfl.FluxParams(
        in_channels=sd["img_in.weight"].shape[1],
        out_channels=sd["final_layer.linear.weight"].shape[0],  # patch_size 1 in LastLayer
        vec_in_dim=sd["vector_in.in_layer.weight"].shape[1],
        context_in_dim=sd["txt_in.weight"].shape[1],
        hidden_size=hidden,
        mlp_ratio=mlp_hidden / hidden,
        num_heads=hidden // head_dim,
        depth=count("double_blocks"),
        depth_single_blocks=count("single_blocks"),
        axes_dim=axes_dim,
        theta=THETA,
        qkv_bias="double_blocks.0.img_attn.qkv.bias" in sd,
        guidance_embed="guidance_in.in_layer.weight" in sd,
    )
    assert int(hidden * params.mlp_ratio) == mlp_hidden
    assert sum(axes_dim) == head_dim, (axes_dim, head_dim)
    return params


def load_model():
    sd, metadata = safetensors_io.load_file(DIT_PATH)
    params = params_from_weights(sd, metadata)
    model = flux_bfl.Flux(params)
    model.load_state_dict(sd, strict=True)  # F16 values copied into the float32 parameters ...
    return model.double().eval(), params  # ... and widened to float64 (exact)


def relative(actual, expected):
    diff = (actual.double() - expected.double()).abs().max().item()
    scale = max(expected.double().abs().max().item(), 1e-6)
    return diff, diff / scale


def main():
    torch.set_grad_enabled(False)
    model, params = load_model()
    print("BFL Flux params from %s: %s" % (os.path.relpath(DIT_PATH, ROOT), params))

    job, job_meta = safetensors_io.load_file(JOB_PATH)
    txt = job["t5.hidden"].double()  # HFEmbedder(t5)'s last_hidden_state
    vec = job["clip.pooled"].double()  # HFEmbedder(clip)'s pooler_output
    noise = job["noise"].double()
    sigmas = job["sigmas"].tolist()  # float32 values as Python floats
    _, _, lat_h, lat_w = noise.shape
    # BFL's unpack takes the image size in pixels of its 8x autoencoder.
    bfl_height, bfl_width = 8 * lat_h, 8 * lat_w
    image_seq_len = (lat_h // 2) * (lat_w // 2)

    failures = []

    def check(name, actual, expected):
        diff, rel = relative(actual, expected)
        ok = rel <= TOLERANCE
        print("%-10s max |diff| %.3e  relative to max |ref| %.3e  %s" % (name, diff, rel, "ok" if ok else "FAIL"))
        if not ok:
            failures.append(name)

    # --- the schedule -------------------------------------------------------
    mu = flux_bfl.get_lin_function()(image_seq_len)
    print("mu for %d image tokens: %r (job metadata: %s)" % (image_seq_len, mu, job_meta.get("mu")))
    # The job's documented schedule: t = linspace(999, 0, steps), sigma = time_shift(mu, 1, (t + 1) / 1000)
    # in float32, then 0 (sd-cli's "discrete" on the flow table).
    documented = [float(np.float32(flux_bfl.time_shift(mu, 1.0, (t + 1) / 1000)))
                  for t in np.linspace(999, 0, STEPS)] + [0.0]
    check("sigmas", torch.tensor(sigmas, dtype=torch.float64), torch.tensor(documented, dtype=torch.float64))
    bfl_schedule = flux_bfl.get_schedule(num_steps=STEPS, image_seq_len=image_seq_len, shift=True)
    same = len(bfl_schedule) == len(sigmas) and all(abs(a - b) <= 1e-6 for a, b in zip(bfl_schedule, sigmas))
    print("BFL get_schedule(num_steps=%d, image_seq_len=%d, shift=True):" % (STEPS, image_seq_len))
    print("  BFL    %s" % ["%.7f" % s for s in bfl_schedule])
    print("  stored %s" % ["%.7f" % s for s in sigmas])
    print("  diff   %s" % ["%+.7f" % (a - b) for a, b in zip(sigmas, bfl_schedule)])
    print("  %s (reported, not failed: the job documents sd-cli's discrete flow table, not get_schedule)"
          % ("equal" if same else "DIFFERENT"))

    # --- BFL's denoise over the stored sigmas ---------------------------------
    inp = flux_bfl.prepare(txt, vec, noise)
    assert sigmas[0] == 1.0, "BFL's denoise starts from the noise itself (sigma 1)"
    record = {}

    def callback(i, t_curr, img, pred):
        record[i] = (t_curr, img.clone(), pred.clone())

    final = flux_bfl.denoise(model, inp["img"], inp["img_ids"], inp["txt"], inp["txt_ids"], inp["vec"],
                             timesteps=sigmas, guidance=GUIDANCE, callback=callback)

    def unpack(x):
        return flux_bfl.unpack(x, bfl_height, bfl_width)

    velocity0 = unpack(record[0][2])
    latent = unpack(final)
    check("velocity0", velocity0, job["velocity0"])
    check("latent", latent, job["latent"])

    # The same first evaluation with BFL's float32 timestep-embedding arguments (its code's
    # dtype), to show how much that rounding alone moves the velocity.
    model.bfl_float32_timesteps = True
    v0_f32 = unpack(model(img=inp["img"], img_ids=inp["img_ids"], txt=inp["txt"], txt_ids=inp["txt_ids"],
                          timesteps=torch.tensor([sigmas[0]], dtype=torch.float64), y=inp["vec"],
                          guidance=torch.tensor([GUIDANCE], dtype=torch.float64)))
    model.bfl_float32_timesteps = False
    diff, rel = relative(v0_f32, velocity0)
    print("velocity0 with float32 timestep-embedding arguments (as BFL's code): max |diff| %.3e, relative %.3e"
          % (diff, rel))

    # --- the second evaluation -------------------------------------------------
    t1, x1_packed, pred1 = record[1]
    assert t1 == sigmas[1]
    x1 = unpack(x1_packed)
    velocity1 = unpack(pred1)
    # The C++ test evaluates at x1 rounded to float32: the same evaluation on that input.
    x1_f32 = x1.float().double()
    v1_rounded = unpack(model(img=flux_bfl.pack(x1_f32), img_ids=inp["img_ids"], txt=inp["txt"],
                              txt_ids=inp["txt_ids"], timesteps=torch.tensor([t1], dtype=torch.float64),
                              y=inp["vec"], guidance=torch.tensor([GUIDANCE], dtype=torch.float64)))
    diff, rel = relative(v1_rounded, velocity1)
    print("velocity1 at x1 rounded to float32: max |diff| %.3e, relative %.3e" % (diff, rel))
    print("velocity1 max |v| %.4f, x1 max |x| %.4f, t1 %r" % (velocity1.abs().max().item(), x1.abs().max().item(), t1))

    out = {
        "x1": x1.float().contiguous(),
        "t1": torch.tensor([t1], dtype=torch.float32),
        "velocity1": velocity1.float().contiguous(),
    }
    meta = {
        "source": "training/check_flux_bfl_reference.py with training/reference/flux_bfl.py, a transcription of "
                  "black-forest-labs/flux (src/flux/model.py, modules/layers.py, math.py, sampling.py); "
                  "float64 on tests/golden/pipeline/flux_tiny/flux_dit.safetensors",
        "job": "tests/golden/pipeline/flux_tiny_txt2img.safetensors",
        "guidance": str(GUIDANCE),
        "step": "second evaluation of BFL's denoise over the job's sigmas",
    }
    if failures:
        print("FAILED: %s (no golden written)" % ", ".join(failures))
        return 1
    safetensors_io.save_file(out, OUT_PATH, metadata=meta)
    print("wrote %s (%d bytes)" % (os.path.relpath(OUT_PATH, ROOT), os.path.getsize(OUT_PATH)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
