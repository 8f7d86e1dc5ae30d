#!/usr/bin/python3
"""Time per denoising step against the --max-vram budget (issue 6, part 4), and
CFG as one batch of two against two passes (part 3).

Starts `kiln rpc-server` on 127.0.0.1 as the GPU-type device, runs kiln-bench
with the UNet and text encoder on it (weights in RAM, so budgets below their
size stream them) from unconstrained down to the smallest budget that runs,
and writes, for a model named NAME:
  docs/speed_vs_memory_NAME.png   time per step (% of unconstrained) vs budget
  docs/speed_vs_memory_NAME.json  every run's figures

    /usr/bin/python3 bench/speed_vs_memory.py                     # the default model
    /usr/bin/python3 bench/speed_vs_memory.py --name sd15 -m /tmp/sd15-random.safetensors \\
        --tokenizer tests/fixtures/tiny_tokenizer -W 256 -H 256 --steps 2

Needs build/bin/kiln and build/bin/kiln-bench (scripts/build.sh) and Debian's
python3-matplotlib. Timings want a quiet machine (bench/README.md).
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "bin")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.05)
    return False


def bench(args, endpoint, budget_mib=None, batch_cfg=True):
    """One kiln-bench run; its JSON, or None when the job does not fit."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [os.path.join(BIN, "kiln-bench"), "--rpc-servers", endpoint, "--backend", "diffusion=rpc0,te=rpc0,vae=cpu",
           "--params-backend", "diffusion=cpu,te=cpu", "--runs", str(args.runs), "--no-limit", "--json", out,
           "-t", str(args.threads), "--steps", str(args.steps)]
    if args.model:
        cmd += ["-m", args.model]
    if args.tokenizer:
        cmd += ["--tokenizer", args.tokenizer]
    if args.width:
        cmd += ["-W", str(args.width), "-H", str(args.height)]
    if budget_mib is not None:
        cmd += ["--max-vram", "rpc0=%.4fM" % budget_mib]
    if not batch_cfg:
        cmd.append("--no-cfg-batch")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print("  budget %s: %s" % (budget_mib, (r.stderr.strip().splitlines() or ["failed"])[-1]), file=sys.stderr)
        return None
    with open(out) as f:
        result = json.load(f)
    os.unlink(out)
    return result


def rpc_peak(result):
    for d in result["memory"]["devices"]:
        if d["device"] == "RPC0":
            return d["peak_managed_bytes"]
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="default", help="name of the model in the output files")
    ap.add_argument("-m", "--model", help="model file (default: kiln's default model)")
    ap.add_argument("--tokenizer")
    ap.add_argument("-W", "--width", type=int, default=0)
    ap.add_argument("-H", "--height", type=int, default=0)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--factor", type=float, default=0.8, help="each budget is this share of the previous one")
    args = ap.parse_args()

    port = free_port()
    server = subprocess.Popen([os.path.join(BIN, "kiln"), "rpc-server", "--port", str(port), "-t",
                               str(args.threads)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not wait_listening(port):
            sys.exit("kiln rpc-server did not start")
        endpoint = "127.0.0.1:%d" % port
        runs = []
        whole = bench(args, endpoint)
        if whole is None:
            sys.exit("the unconstrained run failed")
        peak_mib = rpc_peak(whole) / 2 ** 20
        print("unconstrained: %.3f s/step, RPC0 peak %.2f MiB" % (whole["median"]["step_median_s"], peak_mib))
        runs.append({"budget_mib": None, "result": whole})
        budget = peak_mib * 0.95
        while budget > 0.05:
            r = bench(args, endpoint, budget)
            if r is None:
                break
            print("budget %.2f MiB: %.3f s/step, %d segments, CFG %s" % (
                budget, r["median"]["step_median_s"], r["unet"]["segments"],
                "batched" if r["unet"]["cfg_batched"] else "apart"))
            runs.append({"budget_mib": budget, "result": r})
            budget *= args.factor
        # CFG batch of two against two passes: unconstrained and segmented.
        segmented = next((x for x in runs if x["result"]["unet"]["segments"] > 1 and x["result"]["unet"]["cfg_batched"]),
                         None)
        cfg = []
        for entry in [runs[0]] + ([segmented] if segmented else []):
            apart = bench(args, endpoint, entry["budget_mib"], batch_cfg=False)
            if apart:
                cfg.append({"budget_mib": entry["budget_mib"],
                            "batched_step_s": entry["result"]["median"]["step_median_s"],
                            "apart_step_s": apart["median"]["step_median_s"],
                            "batched_segments": entry["result"]["unet"]["segments"],
                            "apart_segments": apart["unet"]["segments"]})
                print("CFG at budget %s: batched %.3f s/step, apart %.3f s/step" % (
                    entry["budget_mib"], cfg[-1]["batched_step_s"], cfg[-1]["apart_step_s"]))
    finally:
        server.terminate()
        server.wait()

    out_json = os.path.join(ROOT, "docs", "speed_vs_memory_%s.json" % args.name)
    with open(out_json, "w") as f:
        json.dump({"model": args.model or "models/kiln-tiny.gguf", "runs": runs, "cfg": cfg}, f, indent=1)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = whole["median"]["step_median_s"]
    points = [(x["budget_mib"], x["result"]) for x in runs[1:]]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.axhline(100, color="grey", linestyle="--", label="unconstrained (%.3g s/step, %.3g MiB)" % (base, peak_mib))
    for batched, marker, label in ((True, "o", "CFG batch of two"), (False, "s", "CFG passes apart (batch did not fit)")):
        xs = [b for b, r in points if r["unet"]["cfg_batched"] == batched]
        ys = [100 * r["median"]["step_median_s"] / base for b, r in points if r["unet"]["cfg_batched"] == batched]
        if xs:
            ax.plot(xs, ys, marker=marker, label=label)
            for b, r in points:
                if r["unet"]["cfg_batched"] == batched:
                    ax.annotate("%d" % r["unet"]["segments"], (b, 100 * r["median"]["step_median_s"] / base),
                                textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    ax.set_xlabel("--max-vram budget on RPC0 (MiB); labels: UNet segments")
    ax.set_ylabel("time per step (% of unconstrained)")
    ax.set_title("%s: time per step vs memory budget" % args.name)
    ax.invert_xaxis()
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out_png = os.path.join(ROOT, "docs", "speed_vs_memory_%s.png" % args.name)
    fig.savefig(out_png, dpi=120)
    print("wrote %s and %s" % (out_png, out_json))


if __name__ == "__main__":
    main()
