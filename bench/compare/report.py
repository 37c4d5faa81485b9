#!/usr/bin/env python3
"""Summarize a bench/compare/run.sh result directory: medians, ratios, one CSV, a plot.

    report.py DIR [--inplace | --out-of-place] [--title TEXT] [--no-plot]

DIR holds the benches' CSVs named LABEL-REP.csv (LABEL = braid-auto, mpi, gloo-ring, ...)
and optionally line_rate.txt (one GB/s figure per line, raw TCP between two hosts).
Writes DIR/results.csv (every run, long form), DIR/medians.csv (median per label and
size), DIR/busbw.png (busbw vs size, log-x, one line per label; needs matplotlib), and
prints the table of ratios: braid / MPI, braid / best Gloo algorithm, braid / line rate,
by busbw (>1: braid faster) and by time (<1: braid faster).
"""
import argparse
import csv
import glob
import os
import re
import statistics
import sys


def fmt_size(b):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div}{unit}"
    return str(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--inplace", dest="inplace", action="store_true", default=True)
    mode.add_argument("--out-of-place", dest="inplace", action="store_false")
    ap.add_argument("--title", default="")
    ap.add_argument("--no-plot", action="store_true")
    a = ap.parse_args()

    tcol, bcol = ("inplace_time_us", "inplace_busbw_GBps") if a.inplace else ("time_us", "busbw_GBps")
    runs = []  # (label, rep, size, time_us, busbw, wrong)
    for path in sorted(glob.glob(os.path.join(a.dir, "*.csv"))):
        m = re.match(r"(.+)-(\d+)\.csv$", os.path.basename(path))
        if not m or m.group(1) in ("results", "medians"):
            continue
        with open(path) as f:
            for row in csv.DictReader(f):
                wrong = int(row["inplace_wrong" if a.inplace else "wrong"])
                runs.append((m.group(1), int(m.group(2)), int(row["size"]), float(row[tcol]), float(row[bcol]), wrong))
    if not runs:
        sys.exit(f"report: no LABEL-REP.csv files in {a.dir}")

    line_rate = None
    lr_path = os.path.join(a.dir, "line_rate.txt")
    if os.path.exists(lr_path):
        vals = [float(x) for x in open(lr_path).read().split() if x.strip()]
        if vals:
            line_rate = statistics.median(vals)

    with open(os.path.join(a.dir, "results.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["label", "rep", "size", "time_us", "busbw_GBps", "wrong", "mode"])
        for r in runs:
            w.writerow(list(r) + ["inplace" if a.inplace else "out-of-place"])

    labels = sorted({r[0] for r in runs}, key=lambda s: (not s.startswith("braid"), s != "mpi", s))
    sizes = sorted({r[2] for r in runs})
    med = {}  # (label, size) -> (time, busbw, n)
    for lab in labels:
        for s in sizes:
            rs = [r for r in runs if r[0] == lab and r[2] == s]
            if rs:
                med[lab, s] = (statistics.median(r[3] for r in rs), statistics.median(r[4] for r in rs), len(rs))
    wrong = sum(r[5] for r in runs if r[5] > 0)
    with open(os.path.join(a.dir, "medians.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["label", "size", "median_time_us", "median_busbw_GBps", "runs"])
        for (lab, s), (t, b, n) in sorted(med.items(), key=lambda kv: (labels.index(kv[0][0]), kv[0][1])):
            w.writerow([lab, s, f"{t:.2f}", f"{b:.5f}", n])

    braids = [l for l in labels if l.startswith("braid")]
    glooes = [l for l in labels if l.startswith("gloo")]
    head = "braid-auto" if "braid-auto" in braids else (braids[0] if braids else None)
    reps = max(r[1] for r in runs)
    mode = "in-place" if a.inplace else "out-of-place"
    print(f"# {a.title + ': ' if a.title else ''}medians of {reps} runs, {mode}, busbw in GB/s, time in us"
          + (f"; line rate {line_rate:.4f} GB/s (raw TCP, median)" if line_rate else ""))
    cols = [f"{'size':>6}"] + [f"{l:>18}" for l in labels]
    if head:
        cols += [f"{'best gloo':>22}", f"{'braid/mpi':>9}", f"{'braid/gloo':>10}"]
        if line_rate:
            cols.append(f"{'braid/line':>10}")
        cols += [f"{'t braid/mpi':>11}", f"{'t braid/gloo':>12}"]
    print(" ".join(cols))
    for s in sizes:
        row = [f"{fmt_size(s):>6}"]
        for l in labels:
            t, b, _ = med.get((l, s), (0, 0, 0))
            row.append(f"{b:>8.4f} {t:>9.1f}")
        if head and (head, s) in med:
            ht, hb, _ = med[head, s]
            bg = max(glooes, key=lambda g: med.get((g, s), (0, 0, 0))[1], default=None)
            gt, gb, _ = med.get((bg, s), (0, 0, 0)) if bg else (0, 0, 0)
            mt, mb, _ = med.get(("mpi", s), (0, 0, 0))
            row.append(f"{(bg or '-') + f' {gb:.4f}':>22}")
            row.append(f"{(hb / mb if mb else float('nan')):>9.3f}")
            row.append(f"{(hb / gb if gb else float('nan')):>10.3f}")
            if line_rate:
                row.append(f"{hb / line_rate:>10.3f}")
            row.append(f"{(ht / mt if mt else float('nan')):>11.3f}")
            row.append(f"{(ht / gt if gt else float('nan')):>12.3f}")
        print(" ".join(row))
    print("# per system: busbw time; ratios use " + (head or "-") + "; busbw ratio >1 and time ratio <1 mean braid is faster;"
          " 'best gloo' is the Gloo algorithm with the highest busbw at that size")
    if wrong:
        print(f"# WARNING: {wrong} wrong elements reported by the benches (see the logs)")

    if a.no_plot:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# no plot: matplotlib is missing (apt-get install python3-matplotlib)", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    for l in labels:
        xs = [s for s in sizes if (l, s) in med]
        style = "-" if l.startswith("braid") else ("--" if l == "mpi" else ":")
        ax.plot(xs, [med[l, s][1] for s in xs], style, marker="o", markersize=3,
                linewidth=2.2 if l == head else 1.3, label=l)
    if line_rate:
        ax.axhline(line_rate, color="gray", linewidth=0.8, linestyle="-.", label=f"TCP line rate {line_rate:.3f}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([fmt_size(s) for s in sizes], rotation=45)
    ax.set_xlabel("message size (bytes, f32 sum)")
    ax.set_ylabel(f"busbw (GB/s, {mode}, median of {reps})")
    ax.set_title(a.title or "all-reduce busbw")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = os.path.join(a.dir, "busbw.png")
    fig.savefig(out, dpi=110)
    print(f"# plot: {out}")


if __name__ == "__main__":
    main()
