#!/usr/bin/env python3
"""The README's speed table from a `dtrain bench --suite all` JSON (schema dtrain-bench/1):
a Markdown table of the models (step time with its spread, samples/s, tokens/s, MFU, peak
memory beside the estimate) and one of the kernels (time, GFLOP/s or GB/s, share of
peak), headed by the machine and the date. Prints to stdout.

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
    print(f"Measured {doc['created'][:10]} by `dtrain bench --suite all` on {m['cpu']} "
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
