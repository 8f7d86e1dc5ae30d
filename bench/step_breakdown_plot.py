#!/usr/bin/python3
"""Bars of kiln-bench runs side by side: the UNet step (the median of steps 2
to N of every run: step 1 also reads the weights) and the VAE decode of each
report. For before/after series of a change, each
run of the series measured in one sitting on one machine.

    /usr/bin/python3 bench/step_breakdown_plot.py --title "full-size SD1.5, 512x512" \\
        --out docs/cpu_speedups_sd15.png before=/tmp/before.json after=/tmp/after.json

Each LABEL=PATH names a kiln-bench --json file; bars are drawn in the order
given. --series FILE:KEY takes the runs instead from FILE's object KEY, which
maps labels to kiln-bench reports (docs/cpu_changes_sd15.json):

    /usr/bin/python3 bench/step_breakdown_plot.py --title "..." --out docs/cpu_changes_sd15_256.png \
        --series docs/cpu_changes_sd15.json:sd15_256x256_steps_8

Needs Debian's python3-matplotlib.
"""
import argparse
import json
import sys


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"step_breakdown_plot: {path}: {e}")


def load(argument):
    label, sep, path = argument.partition("=")
    if not sep or not label or not path:
        sys.exit(f"step_breakdown_plot: '{argument}': expected LABEL=PATH")
    return summarize(label, path, read_json(path))


def load_series(argument):
    path, sep, key = argument.rpartition(":")
    if not sep or not path or not key:
        sys.exit(f"step_breakdown_plot: --series '{argument}': expected FILE:KEY")
    series = read_json(path).get(key)
    if not isinstance(series, dict) or not series:
        sys.exit(f"step_breakdown_plot: {path}: no series '{key}' (an object of label: kiln-bench report)")
    return [summarize(label, f"{path}:{key}:{label}", report) for label, report in series.items()]


def summarize(label, where, report):
    try:
        steps = sorted(s for run in report["runs"] for s in run["step_s"][1:])
        vae = report["median"]["vae_decode_s"]
    except (KeyError, TypeError):
        sys.exit(f"step_breakdown_plot: {where}: not a kiln-bench report (no step and VAE times)")
    if not steps:
        sys.exit(f"step_breakdown_plot: {where}: needs runs of at least 2 steps")
    return label, steps[len(steps) // 2], vae


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--title", required=True)
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--series", metavar="FILE:KEY", help="runs from FILE's object KEY instead of LABEL=PATH")
    parser.add_argument("runs", nargs="*", metavar="LABEL=PATH")
    args = parser.parse_args()
    runs = load_series(args.series) if args.series else [load(r) for r in args.runs]
    if not runs:
        parser.error("give LABEL=PATH reports or --series FILE:KEY")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (steps, vae) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = [r[0] for r in runs]
    positions = range(len(runs))
    for axis, values, name in ((steps, [r[1] for r in runs], "UNet step"), (vae, [r[2] for r in runs], "VAE decode")):
        bars = axis.bar(positions, values, color="#4c72b0")
        unit, scale = ("ms", 1e3) if max(values) < 1 else ("s", 1)
        for bar, value in zip(bars, values):
            axis.annotate(f"{value * scale:.3g} {unit}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                          ha="center", va="bottom", fontsize=8)
        axis.axhline(values[0], color="grey", linestyle="--", linewidth=1)
        axis.set_xticks(list(positions))
        axis.set_xticklabels(labels, rotation=25, ha="right", fontsize=8)
        axis.set_ylabel("seconds")
        axis.set_title(name)
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
