#!/usr/bin/python3
"""Step caches side by side (docs/caching.md): one job per --cache-mode in one
sitting, its sampling time against no cache and its image's PSNR against the
uncached image.

    /usr/bin/python3 bench/step_cache_bench.py --label "SD1.5 512x512, 20 steps" \\
        --modes none,ucache,spectrum --json caching.json -- \\
        -m /tmp/sd15.safetensors --tokenizer tests/fixtures/tiny_tokenizer -W 512 -H 512 --steps 20
    /usr/bin/python3 bench/step_cache_bench.py --plot caching.json --out docs/images/caching.png

Each run is build/bin/kiln with the arguments after "--", the mode and, for
a mode, --cache-option from --options MODE=OPTIONS (repeatable); the
sampling time is kiln -v's "N steps in S s" line, so model
loading and decoding are not in it. Results are appended to --json (one
object per run) and printed as a markdown table. Needs a quiet machine.
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image

RATE = re.compile(r"image 1/1: (\d+) steps in ([0-9.]+) s")
SKIPPED = re.compile(r"step cache .*: skipped (\d+) of (\d+) evaluations")


def psnr(a, b):
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def run(kiln, args, mode, options, out):
    cmd = [kiln] + args + ["-v", "-o", out]
    if mode != "none":
        cmd += ["--cache-mode", mode]
        if options:
            cmd += ["--cache-option", options]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)}\nfailed: {proc.stderr.strip().splitlines()[-1:]}")
    said = proc.stdout + proc.stderr
    rate = RATE.search(said)
    if not rate:
        sys.exit("no 'N steps in S s' line in kiln -v's output")
    skipped = SKIPPED.search(said)
    steps = int(rate.group(1))
    return {"mode": mode, "options": options, "sampling_s": float(rate.group(2)),
            "skipped": int(skipped.group(1)) if skipped else 0,
            "evaluations": int(skipped.group(2)) if skipped else steps}


def measure(a):
    options = dict(o.split("=", 1) for o in a.options)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        images = {}
        for mode in a.modes.split(","):
            out = os.path.join(tmp, mode + ".png")
            r = run(a.kiln, a.kiln_args, mode, options.get(mode, ""), out)
            images[mode] = np.asarray(Image.open(out).convert("RGB"))
            r["label"] = a.label
            results.append(r)
            print(f"{mode}: {r['sampling_s']:.1f} s, skipped {r['skipped']}/{r['evaluations']}", file=sys.stderr)
        base = next(r for r in results if r["mode"] == "none")
        for r in results:
            r["speedup"] = base["sampling_s"] / r["sampling_s"]
            r["psnr"] = psnr(images[r["mode"]], images["none"])
    with open(a.json, "a") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    print(f"\n{a.label}\n")
    print("| mode | options | sampling | speed-up | skipped | PSNR vs none |")
    print("|---|---|---|---|---|---|")
    for r in results:
        p = "identical" if math.isinf(r["psnr"]) else f"{r['psnr']:.1f} dB"
        print(f"| {r['mode']} | {r['options'] or 'defaults'} | {r['sampling_s']:.1f} s | {r['speedup']:.2f}x | "
              f"{r['skipped']}/{r['evaluations']} | {p} |")


def plot(a):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [json.loads(line) for line in open(a.plot) if line.strip()]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label in dict.fromkeys(r["label"] for r in rows):
        pts = [r for r in rows if r["label"] == label and r["mode"] != "none"]
        line = ax.plot([r["psnr"] for r in pts], [r["speedup"] for r in pts], "o", label=label)[0]
        for r in pts:
            ax.annotate(r["mode"], (r["psnr"], r["speedup"]), textcoords="offset points", xytext=(4, 4),
                        fontsize=8, color=line.get_color())
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(1.5, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("PSNR against the uncached image (dB)")
    ax.set_ylabel("sampling speed-up against no cache")
    ax.set_title("kiln step caches on random full-width weights (docs/caching.md)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110, bbox_inches="tight")
    print("wrote", a.out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kiln", default="build/bin/kiln")
    p.add_argument("--label", default="")
    p.add_argument("--modes", default="none,ucache,spectrum")
    p.add_argument("--options", action="append", default=[], help="MODE=OPTIONS, a mode's --cache-option")
    p.add_argument("--json", default="caching.json")
    p.add_argument("--plot", help="draw this results file instead of measuring")
    p.add_argument("--out", default="caching.png")
    p.add_argument("kiln_args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    if a.kiln_args and a.kiln_args[0] == "--":
        a.kiln_args = a.kiln_args[1:]
    if a.plot:
        plot(a)
    else:
        if "none" not in a.modes.split(","):
            sys.exit("--modes must include none (the reference)")
        measure(a)


if __name__ == "__main__":
    main()
