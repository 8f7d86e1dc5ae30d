#!/usr/bin/python3
"""The Wan VAE decode's memory against the clip's frame count (issue 27's
performance goal: flat beyond the first chunk).

Writes the full-size Wan 2.1 VAE (tests/fixtures/qwen_image_vae.spec: the same
weights as wan_2.1_vae.safetensors) and Wan 2.2's (tests/fixtures/wan22_vae.spec:
wan2.2_vae.safetensors, TI2V-5B's) as sparse files (a header, no data: kiln
plan reads no weights), pairs each with a tiny Wan DiT of its latent's width
(tests/golden/pipeline/wan_tiny: wan_dit, wan_dit_ti2v) and the tiny umT5, and
runs `kiln plan -M vid_gen` at 832x480 for 1 to 81 frames. Each plan's VAE figure is the compute buffer ggml-alloc
plans for the decode's hungriest graph (a latent frame with the history the
one before left), which is what the run allocates; the whole clip in one
graph, as a decoder without chunks would build it, grows with the frames.
Writes:
  docs/wan_vae_memory.png   the decode's compute memory vs frames
  docs/wan_vae_memory.json  every plan's figures

    /usr/bin/python3 bench/wan_vae_memory.py

Needs build/bin/kiln (scripts/build.sh) and Debian's python3-matplotlib.
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KILN = os.path.join(ROOT, "build", "bin", "kiln")
GOLDEN = os.path.join(ROOT, "tests", "golden")
# (label, VAE spec, the tiny DiT on its latent)
VAES = [("Wan 2.1 VAE", os.path.join(ROOT, "tests", "fixtures", "qwen_image_vae.spec"), "wan_dit.safetensors"),
        ("Wan 2.2 VAE (TI2V-5B)", os.path.join(ROOT, "tests", "fixtures", "wan22_vae.spec"),
         "wan_dit_ti2v.safetensors")]
FRAMES = [1, 5, 9, 17, 33, 49, 65, 81]
WIDTH, HEIGHT = 832, 480
DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def write_sparse_safetensors(spec, out):
    """A safetensors file whose header lists the spec's tensors and whose data is a hole."""
    header, offset = {}, 0
    with open(spec) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            name, dtype, *dims = line.split()
            size = DTYPE_BYTES[dtype]
            for d in dims:
                size *= int(d)
            header[name] = {"dtype": dtype, "shape": [int(d) for d in dims], "data_offsets": [offset, offset + size]}
            offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.truncate(8 + len(text) + offset)


def vae_compute(plan_text):
    m = re.search(r"^  vae on \S+: .*?compute ([0-9.]+) (B|KiB|MiB|GiB) whole", plan_text, re.M)
    if not m:
        sys.exit("wan_vae_memory: no VAE line in kiln plan's output:\n" + plan_text)
    return float(m.group(1)) * UNITS[m.group(2)]


def main():
    if not os.path.exists(KILN):
        sys.exit("wan_vae_memory: %s is missing: run scripts/build.sh" % KILN)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, spec, dit in VAES:
            vae = os.path.join(tmp, os.path.basename(spec) + ".safetensors")
            write_sparse_safetensors(spec, vae)
            rows = []
            for frames in FRAMES:
                cmd = [KILN, "plan", "-M", "vid_gen", "--diffusion-model",
                       os.path.join(GOLDEN, "pipeline", "wan_tiny", dit), "--t5xxl",
                       os.path.join(GOLDEN, "pipeline", "wan_tiny", "umt5.safetensors"), "--tokenizer",
                       "t5xxl=" + os.path.join(GOLDEN, "text", "umt5_like_spiece.model"), "--vae", vae, "-W",
                       str(WIDTH), "-H", str(HEIGHT), "--video-frames", str(frames), "-p", "a cat"]
                out = subprocess.run(cmd, capture_output=True, text=True)
                # Exit 1 is a plan that does not fit this machine: its figures are still the graphs'.
                if out.returncode not in (0, 1) or "modules:" not in out.stdout:
                    sys.exit("wan_vae_memory: kiln plan failed at %d frames:\n%s%s" % (frames, out.stdout, out.stderr))
                rows.append({"frames": frames, "vae_compute_bytes": vae_compute(out.stdout)})
                print("%s, %3d frames: decode compute %.1f MiB" % (label, frames,
                                                                    rows[-1]["vae_compute_bytes"] / (1 << 20)))
            series.append({"vae": label + " (full size)", "plans": rows})

    docs = os.path.join(ROOT, "docs")
    with open(os.path.join(docs, "wan_vae_memory.json"), "w") as f:
        json.dump({"width": WIDTH, "height": HEIGHT, "series": series}, f, indent=1)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for s in series:
        rows = s["plans"]
        ax.plot([r["frames"] for r in rows], [r["vae_compute_bytes"] / (1 << 30) for r in rows], "o-",
                label=s["vae"] + ": a latent frame at a time")
    ax.set_xlabel("frames (%dx%d)" % (WIDTH, HEIGHT))
    ax.set_ylabel("decode compute memory (GiB)")
    ax.set_ylim(bottom=0)
    ax.set_title("Wan VAE decode: compute memory vs clip length")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(docs, "wan_vae_memory.png"), dpi=100)
    print("wrote docs/wan_vae_memory.png and docs/wan_vae_memory.json")


if __name__ == "__main__":
    main()
