#!/usr/bin/python3
"""A DiT on one borrowed device against the same DiT split across two.

Two `kiln rpc-server` hosts, each in a network namespace joined to kiln's by a
veth pair shaped with tc's token bucket (as tests/net/multi_host.sh builds its
cluster), and, for comparison, the same two servers on kiln's own loopback.
The models are the full-width DiTs of the memory tests with reduced depth:
Flux (tests/fixtures/flux_medium.spec: 3072 wide, 2 double and 4 single
blocks) and Z-Image (z_image_medium.spec: 3840 wide, 2 + 2 refiners and 4
layers), at 128x128, cfg 1, their text encoders and VAE on kiln's CPU:
  one:   --backend diffusion=RPC0, the weights on host A (sent once a job);
  split: --backend "diffusion=RPC0&RPC1", each host holding the copies of
         its range (the weights in kiln's RAM, sent once a job).
Each is run with 1 and 3 steps; the difference, halved, is one step: its time
(kiln -v's "N steps in S s") and the bytes that crossed the client's veths.
For the split, the time spent copying what crosses a range boundary is the
3-step job's last step's (kiln -v's "receiving X a run in Y ms", summed over
the devices). Writes docs/split_bench.{json,png}.

    sudo /usr/bin/python3 bench/split_bench.py      # root: it makes namespaces

Needs build/bin/kiln and build/tests/kiln_write_spec_model (scripts/build.sh
with tests), iproute2, Debian's python3-matplotlib. Takes about 20 minutes on
a 2-core machine (both hosts and kiln share its cores).
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
LINKS = ["loopback", "1gbit", "10gbit"]
TAG = "ks%d" % os.getpid()
CLIENT = TAG + "c"
HOSTS = [(TAG + "a", "198.18.4"), (TAG + "b", "198.18.5")]
PORT = 50052
MODELS = {
    "Flux": ("flux_medium.spec",
             "clip_l=%s/tests/fixtures/tiny_tokenizer,t5xxl=%s/tests/golden/pipeline/flux_tiny/tokenizer_2" % (ROOT, ROOT)),
    "Z-Image": ("z_image_medium.spec", "llm=%s/tests/golden/pipeline/z_image_tiny/tokenizer" % ROOT),
}


def sh(*args, **kw):
    return subprocess.run(list(args), check=True, capture_output=True, text=True, **kw)


def link_bytes():
    total = 0
    for i in range(len(HOSTS)):
        base = "/sys/class/net/%sc%d/statistics/" % (TAG, i)
        total += sum(int(sh("ip", "netns", "exec", CLIENT, "cat", base + f).stdout) for f in ("tx_bytes", "rx_bytes"))
    return total


def run_job(model, tokenizer, endpoints, flags, steps):
    """Seconds of sampling, bytes across the links and seconds of boundary copies for one job."""
    before = link_bytes()
    out = sh("ip", "netns", "exec", CLIENT, KILN, "-m", model, "--tokenizer", tokenizer, "--rpc-servers",
             ",".join(endpoints), "-p", "a red circle", "-W", "128", "-H", "128", "--cfg-scale", "1", "--steps",
             str(steps), "-t", "2", "-v", "-o", os.devnull + ".png", *flags)
    text = out.stdout + out.stderr
    m = re.search(r"(\d+) steps in ([0-9.]+) s", text)
    if not m:
        sys.exit("no step timing in kiln's output:\n" + text)
    # The copies of the last run (one a step at cfg 1), summed over the devices.
    copies = sum(float(ms) for ms in re.findall(r"receiving [^ ]+ [KMG]?i?B a run in ([0-9.]+) ms", text)) / 1000
    return float(m.group(2)), link_bytes() - before, copies


def main():
    if os.getuid() != 0:
        sys.exit("needs root (network namespaces)")
    work = tempfile.mkdtemp(prefix="kiln-split-")
    servers = []
    rows = []
    try:
        sh("ip", "netns", "add", CLIENT)
        sh("ip", "-n", CLIENT, "link", "set", "lo", "up")
        for i, (ns, net) in enumerate(HOSTS):
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", "%sc%d" % (TAG, i), "netns", CLIENT, "type", "veth", "peer", "name",
               "%sh%d" % (TAG, i), "netns", ns)
            sh("ip", "-n", CLIENT, "addr", "add", net + ".1/30", "dev", "%sc%d" % (TAG, i))
            sh("ip", "-n", ns, "addr", "add", net + ".2/30", "dev", "%sh%d" % (TAG, i))
            for side, dev in ((CLIENT, "%sc%d" % (TAG, i)), (ns, "%sh%d" % (TAG, i))):
                sh("ip", "-n", side, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            servers.append(subprocess.Popen(["ip", "netns", "exec", ns, KILN, "rpc-server", "--host", net + ".2",
                                             "--port", str(PORT), "-t", "1"], stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL))
            servers.append(subprocess.Popen(["ip", "netns", "exec", CLIENT, KILN, "rpc-server", "--port",
                                             str(PORT + 1 + i), "-t", "1"], stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL))
        time.sleep(2)
        for name, (spec, tokenizer) in MODELS.items():
            model = os.path.join(work, spec.replace(".spec", ".safetensors"))
            sh(WRITER, os.path.join(ROOT, "tests", "fixtures", spec), model)
            for link in LINKS:
                if link == "loopback":
                    endpoints = ["127.0.0.1:%d" % (PORT + 1), "127.0.0.1:%d" % (PORT + 2)]
                else:
                    endpoints = ["%s.2:%d" % (net, PORT) for _, net in HOSTS]
                    for i, (ns, _) in enumerate(HOSTS):
                        for side, dev in ((CLIENT, "%sc%d" % (TAG, i)), (ns, "%sh%d" % (TAG, i))):
                            sh("ip", "netns", "exec", side, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                               "rate", link, "burst", "4mb", "latency", "100ms")
                placements = {
                    "one": (endpoints[:1], ["--backend", "diffusion=RPC0,te=CPU,vae=CPU"]),
                    "split": (endpoints, ["--backend", "diffusion=RPC0&RPC1,te=CPU,vae=CPU"]),
                }
                for placement, (where, flags) in placements.items():
                    one = run_job(model, tokenizer, where, flags, 1)
                    three = run_job(model, tokenizer, where, flags, 3)
                    step = (three[0] - one[0]) / 2
                    row = {"model": name, "link": link, "placement": placement, "step_s": step,
                           "bytes_per_step": (three[1] - one[1]) / 2 if link != "loopback" else None,
                           "copy_s_per_step": three[2] if placement == "split" else 0.0}
                    print(row, flush=True)
                    rows.append(row)
            os.remove(model)
    finally:
        for server in servers:
            server.kill()
        for ns in [CLIENT] + [ns for ns, _ in HOSTS]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["rm", "-rf", work])
    with open(os.path.join(ROOT, "docs", "split_bench.json"), "w") as f:
        json.dump(rows, f, indent=1)
    plot(rows)


def plot(rows):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(MODELS), figsize=(10, 3.8), sharey=False)
    for ax, name in zip(axes, MODELS):
        for placement, label in (("one", "one device"), ("split", "split over two")):
            pts = [r for r in rows if r["model"] == name and r["placement"] == placement and r["link"] != "loopback"]
            xs = [float(r["link"].replace("gbit", "")) for r in pts]
            line = ax.plot(xs, [r["step_s"] for r in pts], marker="o", label=label)[0]
            for x, r in zip(xs, pts):
                # Each job also carries the weights once (GBs); the tbf's drops
                # and TCP's resends make the difference of two jobs noisy by MBs.
                mb = r["bytes_per_step"] / 1e6
                ax.annotate("%.1f MB/step" % mb if mb > 0 else "~0 MB/step", (x, r["step_s"]),
                            textcoords="offset points", xytext=(-30, 8 if placement == "one" else -14), fontsize=8,
                            color=line.get_color())
            loop = [r for r in rows if r["model"] == name and r["placement"] == placement and r["link"] == "loopback"]
            if loop:
                ax.axhline(loop[0]["step_s"], color=line.get_color(), linestyle=":", linewidth=1,
                           label=label + ", loopback")
        ax.set_xscale("log")
        ax.set_xlabel("link rate (Gbit/s, tc tbf)")
        ax.set_ylabel("seconds per step")
        ax.set_title("%s DiT, 128x128" % name)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, "docs", "split_bench.png"), dpi=100)


if __name__ == "__main__":
    main()
