#!/usr/bin/python3
"""The golden results of an image-edit job under the first Qwen-Image-Edit release's own pipeline (diffusers'
QwenImageEditPipeline, pipelines/qwenimage/pipeline_qwenimage_edit.py; Qwen/Qwen-Image-Edit, August 2025), on the
tiny parts make_qwen_image_edit_fixtures.py wrote: the end-to-end truth for kiln's "Qwen-Image-Edit" family.

Run with Debian's python3-torch, after make_qwen_image_edit_fixtures.py:
    /usr/bin/python3 training/make_qwen_image_edit_first_fixtures.py

The first release's weights have 2509's shapes; its pipeline differs from QwenImageEditPlusPipeline's in three
places, each read from pipeline_qwenimage_edit.py:
  - the prompt: prompt_template_encode puts "<|vision_start|><|image_pad|><|vision_end|>" straight after the
    system turn's "<|im_start|>user\\n", without 2509's "Picture 1: " (the same system turn, the same 64 tokens
    dropped);
  - the vision image: the input resized to calculate_dimensions(1024 * 1024, w / h) (LANCZOS), the size the
    pipeline also gives the VAE, then the Qwen2-VL processor's smart_resize (BICUBIC): 2509 uses 384 * 384;
  - one input image (the template has one image slot).
Everything else (the tower, M-RoPE, the LLM, the sampling, sd-cli's rule for the VAE reference's size) is the
2509 job's, by the functions of make_qwen_image_edit_fixtures.py given the first release's template and area.

Reads: tests/golden/pipeline/qwen_image_edit_tiny/{qwen_2.5_vl,qwen_2.5_vl_vision}.safetensors (checked equal to
the parts rebuilt from their seeds), ref.png, and the text-to-image fixture's DiT and VAE.
Writes tests/golden/pipeline/qwen_image_edit_tiny/qwen_image_edit_first_job.safetensors (F32 but the I32 ids
and positions): vl.size I32 [2] (1176, 896), vl.rows [1344, 48], llm.tokens I32 [1, n], llm.positions I32
[3, n], llm.dropped [1], velocity0 [1, 16, 6, 8], latent [1, 16, 6, 8], image [1, 3, 48, 64] (in [-1, 1]).
The job: make_qwen_image_edit_fixtures.py's (prompt "make the cat blue", negative "", ref.png, 64 x 48, seed 11,
--rng cuda, 3 steps, euler, cfg 2.5, --flow-shift 3).

Self-checks: the VL sizes worked out by hand; the ids equal the parts' ids one after the other, with no
"Picture"; the tower's rows equal an explicit same-window mask formulation; the context differs from 2509's;
two builds write byte-identical files.
"""

import os
import sys
import tempfile

import numpy as np
import torch
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import make_model_fixtures as mmf  # noqa: E402
import make_qwen25_vl_vision_fixtures as mvl  # noqa: E402
import make_qwen_image_edit_fixtures as plus  # noqa: E402
import make_qwen_image_pipeline_fixtures as qp  # noqa: E402
from reference import qwen25_vl as vl  # noqa: E402
from reference import safetensors_io  # noqa: E402
from reference import wan_vae as wan  # noqa: E402
from reference.sampling import PhiloxGenerator  # noqa: E402

JOB = "qwen_image_edit_first_job.safetensors"
# QwenImageEditPipeline.prompt_template_encode's image part, and the area of its calculate_dimensions.
IMAGE_PROMPT = "<|vision_start|><|image_pad|><|vision_end|>"
VISION_AREA = 1024 * 1024
MAX_BYTES = 400 * 1000


def log(msg):
    print(msg, flush=True)


def check_sizes():
    """calculate_dimensions(1024 * 1024, 64 / 48): width sqrt(1048576 * 4 / 3) = 1182.40, / 32 = 36.95 -> 1184;
    height 1182.40 / (4 / 3) = 886.80, / 32 = 27.71 -> 896. smart_resize: 896 / 28 = 32 -> 896, 1184 / 28 =
    42.29 -> 1176; 1176 * 896 is inside [3136, 12845056]. 42 x 32 merged tokens."""
    (cw, ch), (w, h), n = plus.vl_size(plus.WIDTH, plus.HEIGHT, VISION_AREA)
    assert (cw, ch, w, h, n) == (1184, 896, 1176, 896, 1344), (cw, ch, w, h, n)
    # A square and a 16:9 image, for the docs: 1024 x 1024 -> 1036 x 1036; 1376 x 768 -> 1372 x 756.
    assert plus.vl_size(100, 100, VISION_AREA)[:2] == ((1024, 1024), (1036, 1036))
    assert plus.vl_size(1600, 900, VISION_AREA)[:2] == ((1376, 768), (1372, 756))


def same_tensors(built, path):
    stored, _ = safetensors_io.load_file(path)
    assert sorted(stored) == sorted(built), path
    assert all(torch.equal(stored[k], built[k]) for k in built), path


def build():
    tok = plus.EditTokenizer(qp.read_tokenizer(plus.TOKENIZER_SOURCE))
    llm, llm_stored, _ = plus.make_llm(tok)
    tower, vis_stored = plus.make_vision()
    same_tensors(llm_stored, os.path.join(plus.PARTS, plus.LLM_FILE))
    same_tensors(vis_stored, os.path.join(plus.PARTS, plus.VISION_FILE))
    image = Image.open(os.path.join(plus.PARTS, plus.REF_PNG))
    image.load()
    assert image.mode == "RGB" and image.size == (plus.WIDTH, plus.HEIGHT)

    io = {}
    # The vision image at about 1024 x 1024 pixels, and the tower.
    u8, vl_pixels = plus.vl_preprocess(image, VISION_AREA)
    h, w = u8.shape[:2]
    pixel_values, grid_thw = vl.image_to_pixel_values(vl_pixels.double(), plus.VISION.patch_size,
                                                      plus.VISION.temporal_patch_size, plus.VISION.spatial_merge_size)
    rows = tower(pixel_values, grid_thw)
    assert torch.allclose(mvl.masked_reference(tower, pixel_values, grid_thw), rows, rtol=0, atol=1e-12)
    n_pads = (h // plus.VL_FACTOR) * (w // plus.VL_FACTOR)
    assert rows.shape == (n_pads, plus.LLM_WIDTH)
    io["vl.size"] = torch.tensor([w, h], dtype=torch.int32)
    io["vl.rows"] = mmf.f32(rows)

    # The prompt under the first release's template, and the negative prompt with the same image.
    dropped = plus.check_template(tok, n_pads, IMAGE_PROMPT)
    rows32, grid = io["vl.rows"].double(), grid_thw.tolist()
    tokens, positions, hidden = plus.encode_prompt(llm, tok, plus.PROMPT, rows32, dropped, grid, IMAGE_PROMPT)
    _, _, uhidden = plus.encode_prompt(llm, tok, plus.NEGATIVE, rows32, dropped, grid, IMAGE_PROMPT)
    assert tokens[0, dropped].item() == tok.ids["<|vision_start|>"]  # no "Picture 1: "
    io["llm.tokens"], io["llm.positions"] = tokens, positions
    io["llm.dropped"] = torch.tensor([dropped], dtype=torch.int32)

    # Sampling with sd-cli's reference latent (the image at its own size), as the 2509 job.
    vae = plus.load_vae()
    pixels = torch.from_numpy(np.asarray(image).astype(np.float64)).permute(2, 0, 1)[None, :, None]
    mu, _ = wan.encode_normalized(vae, pixels / 127.5 - 1)
    ref_latent = mmf.f32(mu[:, :, 0]).double()
    sigmas = qp.flow_sigmas()
    lh, lw = plus.HEIGHT // 8, plus.WIDTH // 8
    noise = torch.tensor(PhiloxGenerator(plus.NOISE_SEED).randn(plus.LATENT_CHANNELS * lh * lw), dtype=torch.float32)
    noise = noise.reshape(1, plus.LATENT_CHANNELS, lh, lw).double()
    v0, x, img = plus.sample(plus.load_dit(False), vae, noise, sigmas, mmf.f32(hidden).double(),
                             mmf.f32(uhidden).double(), ref_latent)
    io["velocity0"], io["latent"], io["image"] = mmf.f32(v0), mmf.f32(x), mmf.f32(img)

    # Not 2509's job: its context and image differ.
    two509, _ = safetensors_io.load_file(os.path.join(plus.PARTS, plus.JOB))
    image_change = float((io["image"] - two509["image"]).abs().max())
    assert image_change > 1e-2, image_change
    meta = {"prompt": plus.PROMPT, "negative_prompt": plus.NEGATIVE, "seed": str(plus.NOISE_SEED),
            "steps": str(plus.STEPS), "width": str(plus.WIDTH), "height": str(plus.HEIGHT),
            "pipeline": "QwenImageEditPipeline (the first Qwen-Image-Edit release)",
            "generator": "training/make_qwen_image_edit_first_fixtures.py"}
    nums = dict(vl_size=(w, h), n_pads=n_pads, n=tokens.shape[1], dropped=dropped, image_change=image_change)
    return io, meta, nums


def main():
    torch.set_num_threads(1)  # reductions in one fixed order: reproducible bytes
    check_sizes()
    with torch.no_grad():
        io, meta, nums = build()
        io2, meta2, _ = build()
    path = os.path.join(plus.PARTS, JOB)
    with tempfile.TemporaryDirectory() as tmp:
        safetensors_io.save_file(io2, os.path.join(tmp, JOB), meta2)
        with open(os.path.join(tmp, JOB), "rb") as f:
            first = f.read()
    safetensors_io.save_file(io, path, meta)
    with open(path, "rb") as f:
        second = f.read()
    assert first == second
    log("self-check: two builds from the seed give byte-identical files")
    log("VL image %d x %d, %d image pads; prompt n = %d tokens, %d dropped; the image differs from 2509's job by "
        "up to %.4f" % (nums["vl_size"][0], nums["vl_size"][1], nums["n_pads"], nums["n"], nums["dropped"],
                        nums["image_change"]))
    for k, v in io.items():
        if v.is_floating_point():
            log("  %-16s %-18s mean %+.4f std %.4f" % (k, mmf.shape_str(v), v.double().mean(), v.double().std()))
        else:
            log("  %-16s %-18s %s" % (k, mmf.shape_str(v), str(v.dtype).replace("torch.", "")))
    log("wrote %s (%d bytes)" % (os.path.relpath(path, plus.ROOT), len(second)))
    assert len(second) < MAX_BYTES, len(second)


if __name__ == "__main__":
    main()
