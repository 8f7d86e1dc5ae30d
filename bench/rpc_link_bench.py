#!/usr/bin/python3
"""What a network link costs a denoising step on a borrowed device.

kiln runs in one network namespace and `kiln rpc-server` in another, joined by
a veth pair shaped with tc's token bucket to each rate below (as
tests/net/multi_host.sh builds its cluster). The job is the full-width Flux
DiT of the memory tests (tests/fixtures/flux_medium.spec: 3072 wide, 2 double
and 4 single blocks, 3.3 GB as F16) computing on the remote device at 256x256,
cfg 1, its text encoders and VAE on the client's CPU, in two placements:
  resident: the DiT's weights live on the remote device (sent once per job);
  streamed: they live in the client's RAM (--params-backend diffusion=cpu)
            under a 1.5 GiB budget on the device (--max-vram RPC0=1.5G), so
            the DiT runs in segments and its weights cross the link at every
            step (with room for them all, the device would keep the copies
            it made and the link would carry them once, as for resident).
Each is run with 1 and 3 steps; the difference, halved, is one step: its
time (kiln -v's "N steps in S s") and the bytes that crossed the client's
veth both ways. Writes docs/rpc_link_bench.{json,png}.

    sudo /usr/bin/python3 bench/rpc_link_bench.py      # root: it makes namespaces

Needs build/bin/kiln and build/tests/kiln_write_spec_model (scripts/build.sh
with tests), iproute2, Debian's python3-matplotlib. Takes about 10 minutes.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KILN = os.path.join(ROOT, "build", "bin", "kiln")
WRITER = os.path.join(ROOT, "build", "tests", "kiln_write_spec_model")
RATES = ["1gbit", "10gbit"]
TAG = "kb%d" % os.getpid()
CLIENT, HOST = TAG + "c", TAG + "h"
HOST_ADDR, PORT = "198.18.3.2", 50052


def sh(*args, **kw):
    return subprocess.run(list(args), check=True, capture_output=True, text=True, **kw)


def tx_rx(dev):
    base = "/sys/class/net/%s/statistics/" % dev
    return sum(int(sh("ip", "netns", "exec", CLIENT, "cat", base + f).stdout) for f in ("tx_bytes", "rx_bytes"))


def run_job(model, flags, steps):
    """Seconds of sampling and bytes across the link for one job."""
    before = tx_rx(TAG + "c0")
    out = sh("ip", "netns", "exec", CLIENT, KILN, "-m", model, "--tokenizer",
             "clip_l=%s/tests/fixtures/tiny_tokenizer,t5xxl=%s/tests/golden/pipeline/flux_tiny/tokenizer_2" % (ROOT, ROOT),
             "--rpc-servers", "%s:%d" % (HOST_ADDR, PORT), "-p", "a red circle", "-W", "256", "-H", "256",
             "--cfg-scale", "1", "--steps", str(steps), "-t", "2", "-v", "-o", os.devnull + ".png", *flags)
    text = out.stdout + out.stderr
    m = re.search(r"(\d+) steps in ([0-9.]+) s", text)
    if not m:
        sys.exit("no step timing in kiln's output:\n" + text)
    return float(m.group(2)), tx_rx(TAG + "c0") - before


def main():
    if os.getuid() != 0:
        sys.exit("needs root (network namespaces)")
    work = tempfile.mkdtemp(prefix="kiln-link-")
    model = os.path.join(work, "flux_medium.safetensors")
    server = None
    try:
        sh(WRITER, os.path.join(ROOT, "tests", "fixtures", "flux_medium.spec"), model)
        for ns in (CLIENT, HOST):
            sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", TAG + "c0", "netns", CLIENT, "type", "veth", "peer", "name", TAG + "h0", "netns", HOST)
        sh("ip", "-n", CLIENT, "addr", "add", "198.18.3.1/30", "dev", TAG + "c0")
        sh("ip", "-n", HOST, "addr", "add", HOST_ADDR + "/30", "dev", TAG + "h0")
        for ns, dev in ((CLIENT, TAG + "c0"), (HOST, TAG + "h0")):
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        server = subprocess.Popen(["ip", "netns", "exec", HOST, KILN, "rpc-server", "--host", HOST_ADDR, "--port",
                                   str(PORT), "-t", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2)
        placements = {
            "resident": ["--backend", "diffusion=RPC0,te=CPU,vae=CPU"],
            "streamed": ["--backend", "diffusion=RPC0,te=CPU,vae=CPU", "--params-backend", "diffusion=cpu",
                         "--max-vram", "RPC0=1.5G"],
        }
        rows = []
        for rate in RATES:
            for ns, dev in ((CLIENT, TAG + "c0"), (HOST, TAG + "h0")):
                sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                   "burst", "4mb", "latency", "100ms")
            for name, flags in placements.items():
                one = run_job(model, flags, 1)
                three = run_job(model, flags, 3)
                row = {"rate": rate, "placement": name, "step_s": (three[0] - one[0]) / 2,
                       "bytes_per_step": (three[1] - one[1]) / 2, "job_bytes_1_step": one[1]}
                print(row, flush=True)
                rows.append(row)
    finally:
        if server:
            server.kill()
        for ns in (CLIENT, HOST):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["rm", "-rf", work])
    with open(os.path.join(ROOT, "docs", "rpc_link_bench.json"), "w") as f:
        json.dump(rows, f, indent=1)
    plot(rows)


def plot(rows):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for name in ("resident", "streamed"):
        pts = [r for r in rows if r["placement"] == name]
        xs = [float(r["rate"].replace("gbit", "")) for r in pts]
        label = "weights on the device" if name == "resident" else "weights in RAM, 1.5 GiB budget"
        ax.plot(xs, [r["step_s"] for r in pts], marker="o", label=label)
        for x, r in zip(xs, pts):
            ax.annotate("%.0f MB/step" % (r["bytes_per_step"] / 1e6), (x, r["step_s"]), textcoords="offset points",
                        xytext=(4, 6), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("link rate (Gbit/s, tc tbf)")
    ax.set_ylabel("seconds per step")
    ax.set_title("Flux DiT (3072 wide, 6 blocks) on a device across a link, 256x256")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, "docs", "rpc_link_bench.png"), dpi=100)


if __name__ == "__main__":
    main()
