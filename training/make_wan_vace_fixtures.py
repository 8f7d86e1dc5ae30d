#!/usr/bin/python3
"""Writes a tiny random-weight Wan 2.1 VACE DiT and the golden results of a network evaluation and of a whole
VACE job on it (sd-cli's -M vid_gen with a control video and a reference image), computed with the PyTorch
references in training/reference/ (reference/wan_vace.py's VaceWanModel and WanVace context, wan_dit.py,
wan_vae.py, umt5.py; no kiln code): the truth for kiln's Wan VACE.

Run with Debian's python3-torch and python3-sentencepiece (after make_wan_pipeline_fixtures.py, whose
wan_tiny/umt5.safetensors and wan_tiny_t2v.safetensors it checks it agrees with):
    /usr/bin/python3 training/make_wan_vace_fixtures.py

Reuses make_wan_pipeline_fixtures.py (imported, not copied): its tokenizer (tests/golden/text/
umt5_like_spiece.model), its tiny umT5 (rebuilt from the same seed in a temporary folder; the script asserts
the bytes equal wan_tiny/umt5.safetensors), its text encoding, its tiny Wan 2.1 VAE
(tests/golden/models/wan_vae_tiny.safetensors), its flow schedule, Philox noise, image reading and weight
store. Writes, relative to the repository root (in tests/golden/pipeline/):
  wan_tiny/wan_dit_vace.safetensors  a VaceWanModel (t2v main model) in the original names, no prefix, F16,
      metadata kiln.wan.heads "3": wan_dit.safetensors' widths (48 wide, 3 heads of 16, ffn 128, patch 1x2x2,
      16 latent channels in and out, the tiny umT5's width 32 as text_dim) but 4 main blocks, vace_layers
      (0, 2) (two VACE blocks) and vace_in_dim 96: blocks.0-3.*, head.*, patch_embedding.*, text_embedding.*,
      time_embedding.*, time_projection.*, vace_patch_embedding.{weight [48, 96, 1, 2, 2], bias},
      vace_blocks.{0,1}.* (a whole block each), vace_blocks.0.before_proj.{weight,bias} (block 0 only),
      vace_blocks.{0,1}.after_proj.{weight,bias}. Every weight random as make_wan_dit_fixtures.py draws them
      (matrices N(0, 1 / fan_in), biases N(0, 0.05), norm scales 1 + N(0, 0.1), modulations N(0, 1 / dim)),
      before_proj and after_proj included (the original zero-initialises both for training; random here so
      that they matter).
  wan_tiny_vace.safetensors  (F32 but the I32 tokens)
    a) one network evaluation (predict_vace: t = 1000 sigma, the context padded with zero rows to 512):
      dit.x [1, 16, 3, 6, 8] and dit.vace_context [1, 96, 3, 6, 8] (N(0, 1)), dit.sigma [1] (0.75),
      dit.context [1, L, 32] (the T2V job's prompt rows, t5.hidden[:, :L], L = 8: the ids and EOS),
      dit.scale [1] (0.8), dit.out [1, 16, 3, 6, 8] (the velocity), dit.out_scale0 (scale 0: equal, bit for
      bit, to the plain WanModel on the same main weights), dit.hint.{0,1} [1, 36, 48] (after_proj of each
      VACE block), dit.block.{0..3} [1, 36, 48] (the tokens after main block N, its hint added);
    b) the job: t5.tokens, t5.hidden, t5.uncond_tokens, t5.uncond_hidden (as wan_tiny_t2v.safetensors:
      identical), control0..2 [48, 64, 3] and ref_image [48, 64, 3] (the files' 8-bit values as F32),
      vace_context [1, 96, 3, 6, 8], noise [1, 16, 3, 6, 8], sigmas [4], velocity0 [1, 16, 3, 6, 8] (the
      guided velocity of the first step), latent [1, 16, 3, 6, 8] (final, reference frame included), video
      [1, 3, 5, 48, 64] (in [-1, 1], not clamped).

The job (sd-cli's command line): -M vid_gen, -m wan_tiny/wan_dit_vace.safetensors, prompt "a red cat on a
blue square", negative prompt "", 64x48 (the latent 8 wide, 6 high), --video-frames 5, seed 11, --rng cuda,
3 steps, euler, cfg 6, --flow-shift 3, --vace-strength 0.8, -i ref_image.png, --control-video DIR holding the
3 frames control0..2 (in that order).
  - text: exactly the T2V job's (make_wan_pipeline_fixtures.py): umT5 on the ids + EOS padded to 512 with
    the padding masked; the DiT gets the prompt's rows, padded with zero rows to 512 by the model;
  - the clip: 5 frames (--video-frames), control0..2 then 2 grey frames (0 in [-1, 1]); every pixel read as
    v / 127.5 - 1; the mask all ones [1, 5, 48, 64]; the reference image the -i picture, [3, 1, 48, 64];
  - vace_context = WanVace's vace_latent(vace_encode_frames(clip, ref, mask), vace_encode_masks(mask, ref))
    (reference/wan_vace.py's vace_context): with the mask all ones, the inactive clip is all zeros and the
    reactive clip is the clip itself; each is VAE-encoded on its own (the normalised mean: 2 latent frames),
    giving planes 0-15 = encode(zeros), 16-31 = encode(clip) on latent frames 1-2; the reference image's
    own one-frame encode is latent frame 0's planes 0-15, with planes 16-31 zero; the mask planes 32-95
    (8 x 8 pixel-unshuffle of the mask, resized in time to 2 frames with nearest-exact) are 1 on latent
    frames 1-2 and 0 on frame 0 (the reference's): [1, 96, 3, 6, 8];
  - noise: Philox randn (kiln's --rng cuda, webui's) of the whole 16 x 3 x 6 x 8 latent, reference frame
    included (the original's generate draws noise of the frame latent's shape, halved in channels: refs +
    latent frames), in (channel, frame, row, column) order, one draw, seed 11;
  - schedule, guidance, solver exactly as the T2V job: t = linspace(999, 0, 3), s = (t + 1) / 1000, sigma
    = 3 s / (1 + 2 s) rounded to float32, then 0; x = noise * sigma_0; at each step the VaceWanModel at t =
    1000 sigma on the whole 3-frame latent, once with the prompt and once with the negative prompt, BOTH with
    the same vace_context and vace_context_scale 0.8 (--vace-strength; the original's context_scale);
    v = u + 6 (c - u); x <- x + (sigma_next - sigma) v. The reference frame is sampled like the others (it
    is never re-imposed);
  - after sampling the first (reference) latent frame is dropped; the other 2 decode (reference/wan_vae.py's
    causal decode, the VAE's own normalisation) to 5 frames.

Which parts are sd-cli's (and so kiln's) and which are the original's (wan/vace.py, generate.py):
  - the original's: the context's layout (inactive, reactive, mask planes; the reference latent first along
    time with 16 zero planes; zero mask planes for it), the noise over the reference frame too, the same
    context and scale in both CFG passes, the hint arithmetic, and dropping the reference latent frames
    before the decode (WanVace.decode_latent: z[:, len(refs):]);
  - a mask of all ones: sd-cli has no mask input; it is also what the original's prepare_source gives when
    there is no mask video (src_mask = ones_like(src_video));
  - grey fill: sd-cli pads a control video shorter than --video-frames with grey (0) frames; the original's
    VaceVideoProcessor resamples a source video to the frame count at its fps instead (and with no source
    video at all uses all-zero frames with mask ones);
  - -i as the reference image: the original takes reference images from --src_ref_images (one or more;
    fitted into a white canvas with bilinear resizing when their size differs from the video's: here they
    are the same size, so no resize);
  - what kiln's jobs do that the original does not, as in the other Wan jobs: Euler on the flow sigmas in
    place of UniPC, the negative prompt "" as given (the original replaces "" by config.sample_neg_prompt),
    pixels v / 127.5 - 1 in float64 (the original's to_tensor, (v / 255 - 0.5) / 0.5 in float32), Philox
    noise in place of torch.randn, no clamp of the decoded video, and a 64 x 48 job (the original's
    prepare_source only accepts 480 x 832 and 720 x 1280 areas and resizes the source video to them).

Checks before writing (asserts): the tiny umT5 and the prompts' encodings are the T2V job's; the VACE DiT
at scale 0 gives bit for bit the plain WanModel on its main weights; with every after_proj zeroed it gives
the plain model for any scale (0.8 and 1.7); the hints computed all first (the original's forward_vace)
equal bit for bit those computed interleaved (VACE block n right after main block vace_layers[n], block 0's
before_proj reading the patch-embedded x), and so do the outputs; at scale 0.8 the output differs from
the plain model's (the VACE path is live); the mask planes are the 8 x 8 pixel-unshuffle with nearest-exact
in time (latent frame k from pixel frame floor((k + 0.5) T / T')); the job's context has the layout above.

Every stage runs in float64 on the stored weights; deterministic (byte-identical files).
"""

import copy
import filecmp
import math
import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import make_model_fixtures as mmf  # noqa: E402
import make_wan_dit_fixtures as mwd  # noqa: E402
import make_wan_pipeline_fixtures as mwp  # noqa: E402
from reference import safetensors_io  # noqa: E402
from reference import wan_dit as ref  # noqa: E402
from reference import wan_vace as vace  # noqa: E402
from reference import wan_vae as wan  # noqa: E402
from reference.sampling import PhiloxGenerator  # noqa: E402

ROOT = mwp.ROOT
OUT = mwp.OUT
PARTS = mwp.PARTS
JOB = "wan_tiny_vace.safetensors"
DIT = "wan_dit_vace.safetensors"
SEED = mwp.SEED + 9  # make_wan_pipeline_fixtures.py's DiTs use SEED + 2 .. SEED + 8
NUM_LAYERS = 4
VACE_LAYERS = (0, 2)
VACE_STRENGTH = 0.8
CONTROL_FRAMES = 3
REF_FRAMES = 1
LATENT_FRAMES = mwp.LATENT_FRAMES + REF_FRAMES  # the reference's latent frame, then the clip's 2
DIT_SIGMA = 0.75
MAX_FILE_BYTES = 1000 * 1000


def dit_config(text_dim):
    return dict(mwd.TINY, in_dim=mwp.LATENT_CHANNELS, out_dim=mwp.LATENT_CHANNELS, text_dim=text_dim,
                num_layers=NUM_LAYERS, vace_layers=VACE_LAYERS, vace_in_dim=vace.VACE_IN_DIM)


def write_vace_dit(text_dim):
    cfg = dit_config(text_dim)
    return mwp.store(vace.VaceWanModel(**cfg), mwp.dit_init_value, vace.wan_vace_tensor_shapes(cfg), SEED, DIT,
                     mwd.DIT_METADATA)


def plain_model(dit, text_dim):
    """The plain WanModel on the VACE model's main weights."""
    cfg = {k: v for k, v in dit_config(text_dim).items() if k not in ("vace_layers", "vace_in_dim")}
    model = ref.WanModel(**cfg)
    model.load_state_dict({k: v for k, v in dit.state_dict().items() if not k.startswith("vace_")}, strict=True)
    return model.double().eval()


def encode_prompts():
    """The T2V job's text stage: its tokenizer, its umT5 (rebuilt from the same seed in a temporary folder:
    the bytes must equal wan_tiny/umt5.safetensors), its encodings (must equal wan_tiny_t2v.safetensors')."""
    sp = mwp.read_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        parts = mwp.PARTS
        mwp.PARTS = tmp
        try:
            umt5, width = mwp.write_umt5(sp.get_piece_size())
        finally:
            mwp.PARTS = parts
        assert filecmp.cmp(os.path.join(tmp, "umt5.safetensors"), os.path.join(PARTS, "umt5.safetensors"),
                           shallow=False), "wan_tiny/umt5.safetensors is not make_wan_pipeline_fixtures.py's"
    io = {}
    tokens, hidden, real = mwp.encode(umt5, sp, mwp.PROMPT)
    uncond_tokens, uncond_hidden, uncond_real = mwp.encode(umt5, sp, mwp.NEGATIVE)
    assert uncond_real == 1
    io["t5.tokens"] = tokens
    io["t5.hidden"] = mmf.f32(hidden)
    io["t5.uncond_tokens"] = uncond_tokens
    io["t5.uncond_hidden"] = mmf.f32(uncond_hidden)
    t2v_path = os.path.join(OUT, mwp.JOB)
    if os.path.exists(t2v_path):
        stored, _ = safetensors_io.load_file(t2v_path)
        for k, v in io.items():
            assert torch.equal(stored[k], v), "%s differs from %s's" % (k, mwp.JOB)
    return io, width, real


# ------------------------------------------------------------ pictures


def control_frame(k):
    """Control frame k (H, W, 3), 8-bit: a wave drifting left and ramps shifting with k."""
    ys = torch.arange(mwp.HEIGHT, dtype=torch.float64)[:, None]
    xs = torch.arange(mwp.WIDTH, dtype=torch.float64)[None, :]
    r = 128 + 100 * torch.sin((xs + 4 * k) / 8.0) * torch.cos(ys / 12.0)
    g = (50 + 2.5 * xs + 20 * k).expand(mwp.HEIGHT, mwp.WIDTH)
    b = (230 - 3.5 * ys - 10 * k).expand(mwp.HEIGHT, mwp.WIDTH)
    return torch.stack([r, g, b], dim=-1).round().clamp(0, 255)


def reference_image():
    """The -i picture (H, W, 3), 8-bit: other ramps and waves."""
    ys = torch.arange(mwp.HEIGHT, dtype=torch.float64)[:, None]
    xs = torch.arange(mwp.WIDTH, dtype=torch.float64)[None, :]
    r = (200 - 2 * xs).expand(mwp.HEIGHT, mwp.WIDTH)
    g = 128 + 90 * torch.sin(xs / 6.0) * torch.sin(ys / 9.0 + 0.3)
    b = (40 + 4 * ys).expand(mwp.HEIGHT, mwp.WIDTH)
    return torch.stack([r, g, b], dim=-1).round().clamp(0, 255)


# ------------------------------------------------------------ checks and cases


def check_mask_planes():
    """vace_encode_masks: plane 8 i + j at latent (k, y, x) is the pixel (f_k, 8 y + i, 8 x + j) with f_k =
    floor((k + 0.5) T / T'), T' = (T + 3) // 4 (nearest-exact); one zero frame per reference image first."""
    gen = torch.Generator().manual_seed(8)
    for frames in (1, 5, 9):
        mask = torch.rand(1, frames, 16, 32, generator=gen, dtype=torch.float64)
        got = vace.vace_encode_masks(mask)
        depth = (frames + 3) // 4
        src = [math.floor((k + 0.5) * frames / depth) for k in range(depth)]
        want = torch.empty(64, depth, 2, 4, dtype=torch.float64)
        for i in range(8):
            for j in range(8):
                want[8 * i + j] = mask[0, src][:, i::8, j::8]
        assert torch.equal(got, want), frames
        if frames == 5:
            assert src == [1, 3]  # not pixel frame 0 for latent frame 0
        with_ref = vace.vace_encode_masks(mask, ref_images=[None])
        assert torch.equal(with_ref[:, 1:], want) and not with_ref[:, :1].any()


def run_network_case(dit, text, real, text_dim):
    gen = torch.Generator().manual_seed(SEED + 1)
    lh, lw = mwp.HEIGHT // 8, mwp.WIDTH // 8
    io = {
        "dit.x": torch.randn(1, mwp.LATENT_CHANNELS, LATENT_FRAMES, lh, lw, generator=gen),
        "dit.vace_context": torch.randn(1, vace.VACE_IN_DIM, LATENT_FRAMES, lh, lw, generator=gen),
        "dit.sigma": torch.tensor([DIT_SIGMA], dtype=torch.float32),
        "dit.context": text["t5.hidden"][:, :real].contiguous(),
        "dit.scale": torch.tensor([VACE_STRENGTH], dtype=torch.float32),
    }
    x, vc, sigma, ctx = (io[k].double() for k in ("dit.x", "dit.vace_context", "dit.sigma", "dit.context"))
    hints, blocks = [], {}
    out = vace.predict_vace(dit, x, sigma, vc, ctx, scale=VACE_STRENGTH, hints=hints, blocks=blocks)
    out0 = vace.predict_vace(dit, x, sigma, vc, ctx, scale=0.0)
    plain = plain_model(dit, text_dim)
    want0 = ref.predict(plain, x, sigma, ctx)
    assert torch.equal(out0, want0), "scale 0 is not the plain model: %g" % (out0 - want0).abs().max()
    assert (out - want0).abs().max() > 1e-2 * want0.abs().max(), "the VACE path changes nothing"
    # the context padded to 512 zero rows by the caller gives the same numbers
    padded = torch.cat([ctx, ctx.new_zeros(1, ref.TEXT_LEN - real, ctx.shape[-1])], dim=1)
    assert torch.equal(vace.predict_vace(dit, x, sigma, vc, padded, scale=VACE_STRENGTH), out)
    # every after_proj zeroed: the plain model at any scale
    dead = copy.deepcopy(dit)
    for block in dead.vace_blocks:
        block.after_proj.weight.data.zero_()
        block.after_proj.bias.data.zero_()
    for scale in (VACE_STRENGTH, 1.7):
        assert torch.equal(vace.predict_vace(dead, x, sigma, vc, ctx, scale=scale), want0), scale
    # all-first (the original's forward_vace) and interleaved hints agree bit for bit
    hints_i, blocks_i = [], {}
    out_i = vace.predict_vace(dit, x, sigma, vc, ctx, scale=VACE_STRENGTH, hints=hints_i, blocks=blocks_i,
                              order="interleaved")
    assert len(hints) == len(hints_i) == len(VACE_LAYERS)
    assert all(torch.equal(a, b) for a, b in zip(hints, hints_i)), "interleaved hints differ"
    assert all(torch.equal(blocks[k], blocks_i[k]) for k in blocks) and torch.equal(out, out_i)
    io["dit.out"] = mmf.f32(out)
    io["dit.out_scale0"] = mmf.f32(out0)
    for n, h in enumerate(hints):
        io["dit.hint.%d" % n] = mmf.f32(h)
    for i in range(NUM_LAYERS):
        io["dit.block.%d" % i] = mmf.f32(blocks["blocks.%d" % i])
    mmf.log("network case: |out - plain| max %.4f, |out| max %.4f" % ((out - want0).abs().max(), out.abs().max()))
    return io


def run_job(dit, text, real, vae):
    io = dict(text)
    controls = [control_frame(k) for k in range(CONTROL_FRAMES)]
    image = reference_image()
    for k, c in enumerate(controls):
        io["control%d" % k] = c.to(torch.float32)
    io["ref_image"] = image.to(torch.float32)

    clip = torch.zeros(3, mwp.FRAMES, mwp.HEIGHT, mwp.WIDTH, dtype=torch.float64)  # grey beyond the given frames
    for k, c in enumerate(controls):
        clip[:, k] = mwp.image_pixels(c)[0]
    mask = torch.ones(1, mwp.FRAMES, mwp.HEIGHT, mwp.WIDTH, dtype=torch.float64)  # sd-cli: no mask input
    ref_pixels = mwp.image_pixels(image)[0][:, None]  # [3, 1, H, W]
    ctx = vace.vace_context(vae, clip, mask, ref_pixels)
    lh, lw = mwp.HEIGHT // 8, mwp.WIDTH // 8
    assert ctx.shape == (vace.VACE_IN_DIM, LATENT_FRAMES, lh, lw), ctx.shape
    # the layout: [inactive | reactive | mask] planes; the reference frame first
    zeros_latent = wan.encode_normalized(vae, torch.zeros_like(clip)[None])[0][0]
    assert torch.equal(ctx[:16, 1:], zeros_latent)
    assert torch.equal(ctx[16:32, 1:], wan.encode_normalized(vae, clip[None])[0][0])
    assert torch.equal(ctx[:16, :1], wan.encode_normalized(vae, ref_pixels[None])[0][0])
    assert not ctx[16:, 0].any() and bool((ctx[32:, 1:] == 1).all())
    io["vace_context"] = mmf.f32(ctx[None])

    shape = (1, mwp.LATENT_CHANNELS, LATENT_FRAMES, lh, lw)
    noise = torch.tensor(PhiloxGenerator(mwp.NOISE_SEED).randn(math.prod(shape)), dtype=torch.float32)
    io["noise"] = noise.reshape(shape)
    sigmas = mwp.flow_sigmas()
    io["sigmas"] = torch.tensor(sigmas, dtype=torch.float32)

    # the reference sees the stored (F32) context, texts and noise
    vc = io["vace_context"].double()
    cond, uncond = io["t5.hidden"].double(), io["t5.uncond_hidden"].double()
    x = io["noise"].double() * sigmas[0]
    for i in range(mwp.STEPS):
        sigma = torch.tensor([sigmas[i]], dtype=torch.float64)
        c = vace.predict_vace(dit, x, sigma, vc, cond, [real], scale=VACE_STRENGTH)
        u = vace.predict_vace(dit, x, sigma, vc, uncond, [1], scale=VACE_STRENGTH)
        v = u + mwp.CFG * (c - u)
        if i == 0:
            io["velocity0"] = mmf.f32(v)
        x = x + (sigmas[i + 1] - sigmas[i]) * v
    io["latent"] = mmf.f32(x)
    video = wan.decode_normalized(vae, x[:, :, REF_FRAMES:])  # the reference frame dropped
    assert video.shape == (1, 3, mwp.FRAMES, mwp.HEIGHT, mwp.WIDTH), video.shape
    io["video"] = mmf.f32(video)
    return io


def main():
    torch.set_num_threads(1)  # reductions in one fixed order: reproducible bytes
    os.makedirs(PARTS, exist_ok=True)
    check_mask_planes()
    with torch.no_grad():
        text, width, real = encode_prompts()
        dit = write_vace_dit(width)
        vae = mwp.read_vae()
        io = run_network_case(dit, text, real, width)
        io.update(run_job(dit, text, real, vae))
    mwp.save_job(io, JOB, {"model": "wan_tiny/" + DIT, "vace_strength": repr(VACE_STRENGTH),
                           "control_frames": str(CONTROL_FRAMES), "init_image": "ref_image",
                           "vace_layers": ",".join(str(i) for i in VACE_LAYERS),
                           "generator": "training/make_wan_vace_fixtures.py"})
    for path in (os.path.join(PARTS, DIT), os.path.join(OUT, JOB)):
        size = os.path.getsize(path)
        print("wrote %s (%d bytes)" % (os.path.relpath(path, ROOT), size))
        assert size < MAX_FILE_BYTES, (path, size)


if __name__ == "__main__":
    main()
