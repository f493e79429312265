#!/usr/bin/env python3
"""Side-by-side tables of one NCCL's runs: ours (`bench`), nccl-tests (`*_perf`) and torch
(`torch_bench.py`), as ratios per row.

    python3 bench/compare.py DIR [--label 'NCCL 2.30.7'] [--bw-from 128M] [--lat-to 1M]

DIR holds the outputs, named by what made them:
    ours*.txt            bench ... -R 0,1,2,pool     (several files: all rows are read)
    nt-<coll>-R<r>*.txt  nccl-tests' <coll>_perf ... -R <r> (0 plain, 1 registered, 2 window)
    torch*.txt           torch_bench.py ... -R 0,1,2

For each collective it prints bus bandwidth (GB/s, out of place) from --bw-from up and
time (us) up to --lat-to, one row per size: every side's figure per memory mode, then
ours / nccl-tests and ours / torch in the same mode, and the pool (`Communicator::buffer`,
the default) against torch's NCCL memory pool (-R 1) and against the best peer of any mode.
Sizes are nccl-tests' (bytes of the whole buffer). A figure a side did not measure is '-'.
"""
import argparse
import glob
import os
import re
import sys

COLLS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "sendrecv"]
# nccl-tests' binary names
NT_NAMES = {"alltoall": "all_to_all"}


def size_arg(s):
    mul = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1].upper(), 1)
    return int(s[:-1] if mul > 1 else s) * mul


def num(s):
    try:
        return float(s)
    except ValueError:
        return None


def read_table(path, fixed_coll=None, fixed_mode=None):
    """(coll, bytes, mode) -> [(us, busbw)] of out-of-place figures in one output.
    Our rows: size count type redop root | time algbw busbw #wrong | (in place) [mode ...];
    torch's: size count type | time algbw busbw [mode ...]; nccl-tests': as ours without
    the mode. The collective comes from the '# <coll>: N ranks' header or the file name."""
    out = {}
    coll = fixed_coll
    for line in open(path, errors="replace"):
        m = re.match(r"# (\w+): (\d+) ranks", line)
        if m and m.group(1) in COLLS:
            coll = m.group(1)
            continue
        if not line.startswith(" ") or coll is None:
            continue
        f = line.split()
        if not f or not f[0].isdigit():
            continue
        if len(f) >= 13 and f[2] in ("float", "half", "bfloat16", "double", "int32", "int8", "uint8") \
                and num(f[5]) is not None and num(f[4]) is not None:
            us, bw = num(f[5]), num(f[7])              # ours / nccl-tests
            mode = f[13] if len(f) == 18 else (fixed_mode or "0")
        elif len(f) in (6, 9):
            us, bw = num(f[3]), num(f[5])              # torch
            mode = f[6] if len(f) == 9 else (fixed_mode or "0")
        else:
            continue
        if us is None or bw is None:
            continue
        out.setdefault((coll, int(f[0]), mode), []).append((us, bw))
    return out


def best(samples):
    """The fastest of repeated measurements of one row (several runs of one size)."""
    return min(samples, key=lambda s: s[0]) if samples else None


def gather(d):
    sides = {"ours": {}, "nt": {}, "torch": {}}
    for p in sorted(glob.glob(os.path.join(d, "ours*.txt"))):
        for k, v in read_table(p).items():
            sides["ours"].setdefault(k, []).extend(v)
    for p in sorted(glob.glob(os.path.join(d, "nt-*.txt"))):
        m = re.match(r"nt-(\w+?)-R(\d)", os.path.basename(p))
        if not m:
            continue
        coll = NT_NAMES.get(m.group(1), m.group(1))
        for k, v in read_table(p, fixed_coll=coll, fixed_mode=m.group(2)).items():
            sides["nt"].setdefault(k, []).extend(v)
    for p in sorted(glob.glob(os.path.join(d, "torch*.txt"))):
        for k, v in read_table(p).items():
            sides["torch"].setdefault(k, []).extend(v)
    return {s: {k: best(v) for k, v in t.items()} for s, t in sides.items()}


def human(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return f"{b} B"


def ratio(a, b):
    return f"{a / b:.3f}" if a is not None and b else "-"


def fig(x):
    return "-" if x is None else f"{x:.2f}"


def tables(sides, label, bw_from, lat_to, out=sys.stdout):
    ours, nt, torch = sides["ours"], sides["nt"], sides["torch"]
    for what, idx, keep, better in (("bus bandwidth (GB/s)", 1, lambda b: b >= bw_from, max),
                                    ("time (us)", 0, lambda b: b <= lat_to, min)):
        for coll in COLLS:
            sizes = sorted({b for s in sides.values() for (c, b, _) in s if c == coll and keep(b)})
            if not sizes:
                continue
            print(f"\n#### {coll}, {what}, {label}\n", file=out)
            head = ["size"] + [f"{s} R{m}" for m in "012" for s in ("ours", "nt", "torch")] + \
                   ["ours pool"] + [f"ours/nt R{m}" for m in "012"] + [f"ours/torch R{m}" for m in "012"] + \
                   ["pool/torch R1", "pool/best peer"]
            print("| " + " | ".join(head) + " |", file=out)
            print("|" + " ---: |" * len(head), file=out)
            for b in sizes:
                get = lambda side, m: (side.get((coll, b, m)) or (None, None))[idx]
                row = [human(b)]
                for m in "012":
                    row += [fig(get(ours, m)), fig(get(nt, m)), fig(get(torch, m))]
                pool = get(ours, "pool")
                row.append(fig(pool))
                # time ratios are inverted so that > 1 always means ours is better
                r = (lambda a, b: ratio(a, b)) if idx == 1 else (lambda a, b: ratio(b, a) if a else "-")
                row += [r(get(ours, m), get(nt, m)) for m in "012"]
                row += [r(get(ours, m), get(torch, m)) for m in "012"]
                peers = [x for m in "012" for x in (get(nt, m), get(torch, m)) if x is not None]
                row.append(r(pool, get(torch, "1")))
                row.append(r(pool, better(peers)) if peers else "-")
                print("| " + " | ".join(row) + " |", file=out)
    print("\n(ratios: > 1 means ours is faster; time ratios are peer time / our time)", file=out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--label", default="")
    ap.add_argument("--bw-from", type=size_arg, default=size_arg("128M"))
    ap.add_argument("--lat-to", type=size_arg, default=size_arg("1M"))
    a = ap.parse_args()
    sides = gather(a.dir)
    if not any(sides.values()):
        sys.exit(f"compare.py: no ours*.txt, nt-*.txt or torch*.txt with rows in {a.dir}")
    tables(sides, a.label or os.path.basename(os.path.normpath(a.dir)), a.bw_from, a.lat_to)


if __name__ == "__main__":
    main()
