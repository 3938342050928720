#!/usr/bin/env python3
"""The README's speed table from a `dtrain bench --suite all` JSON (schema dtrain-bench/1):
a Markdown table of the models (step time with its spread, samples/s, tokens/s, MFU, peak
memory beside the estimate), one of the kernels (time, GFLOP/s or GB/s, share of peak)
and one of the collectives of a comm run (median time and bus bandwidth per size, op and
algorithm), headed by the machine and the date. Prints to stdout.

    scripts/bench-table.py bench/results/<date>/bench.json
"""
import json
import sys


def main() -> int:
    doc = json.load(open(sys.argv[1]))
    if doc.get("schema") != "dtrain-bench/1":
        print(f"{sys.argv[1]}: not a dtrain bench file", file=sys.stderr)
        return 2
    m = doc["machine"]
    bf16 = f"{m['bf16_peak_gflops']:.0f} GFLOP/s ({m['bf16_path']})" if m["bf16_path"] else "none"
    comm = [r for r in doc["results"] if r["suite"] == "comm"]
    ranks = f" --nproc {comm[0]['ranks']}" if comm else ""
    print(f"Measured {doc['created'][:10]} by `dtrain bench --suite {doc['suite']}{ranks}` on {m['cpu']} "
          f"({m['threads']} threads; fp32 FMA peak {m['fp32_peak_gflops']:.0f} GFLOP/s "
          f"({m['fp32_path']}), bf16 path {bf16}, triad {m['memory_gbytes_per_s']:.1f} GB/s; "
          f"oneDNN {m['onednn']}).\n")
    models = [r for r in doc["results"] if r["suite"] == "models"]
    if models:
        print("| model | dtype | step (median, p10-p90) | samples/s | tokens/s | MFU "
              "| peak memory | estimate |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in models:
            tokens = f"{r['tokens_per_s']:.0f}" if "tokens_per_s" in r else "-"
            print(f"| {r['name'][6:]} ({r['shape']}) | {r['dtype']} | {r['seconds_median']:.3f} s "
                  f"({r['seconds_p10']:.3f}-{r['seconds_p90']:.3f}) | {r['samples_per_s']:.2f} "
                  f"| {tokens} | {100 * r.get('mfu', 0):.1f}% | {r['peak_bytes'] / 1e9:.2f} GB "
                  f"| {r['estimate_peak_bytes'] / 1e9:.2f} GB |")
        print()
    kernels = [r for r in doc["results"] if r["suite"] == "kernels"]
    if kernels:
        print("| kernel | shape | dtype | time (median) | spread | rate | share of peak |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in kernels:
            if "gflops_per_s" in r:
                rate = f"{r['gflops_per_s']:.1f} GFLOP/s"
                share = f"{100 * r.get('peak_share', 0):.0f}%"
            else:
                rate = f"{r['gbytes_per_s']:.1f} GB/s"
                share = f"{100 * r.get('bandwidth_share', 0):.0f}% of bandwidth"
            print(f"| {r['name']} | {r['shape']} | {r['dtype']} | {1e3 * r['seconds_median']:.2f} ms "
                  f"| {100 * r['spread']:.0f}% | {rate} | {share} |")
    if comm:
        columns = list(dict.fromkeys(f"{r['op']} {r['algorithm']}" for r in comm))
        sizes = list(dict.fromkeys(r["name"].split("/")[2].split(" ")[0] for r in comm))
        cell = {(r["name"].split("/")[2].split(" ")[0], f"{r['op']} {r['algorithm']}"): r
                for r in comm}
        print(f"{comm[0]['ranks']} ranks, {comm[0]['dtype']} on {comm[0]['device']}: median time "
              "(bus bandwidth, GB/s)\n")
        print("| size | " + " | ".join(columns) + " |")
        print("| --- |" + " --- |" * len(columns))

        def fmt(r):
            t = r["seconds_median"]
            time = f"{t * 1e6:.0f} us" if t < 1e-3 else f"{t * 1e3:.2f} ms"
            return f"{time} ({r['busbw_gbytes_per_s']:.2f})"
        for size in sizes:
            print(f"| {size} | " + " | ".join(fmt(cell[(size, c)]) if (size, c) in cell else "-"
                                              for c in columns) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
