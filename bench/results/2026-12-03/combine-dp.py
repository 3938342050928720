# Pools the rounds of several bench-dp-overlap.sh JSON files (same setup). The
# per-round ratios are bimodal on this shared 2-core machine: ~1.05 when no other
# job runs, ~2.2 when another job's process takes one rank's core; rounds are
# split at ratio 1.5 and each cluster summarised (median), next to the median of all.
import json, statistics, sys
out, files = sys.argv[1], sys.argv[2:]
med = statistics.median
pool = {}
for f in files:
    d = json.load(open(f))
    for model, r in d["results"].items():
        for rr in r["rounds"]:
            for key in ("overlap_on", "overlap_off"):
                x = rr[key]
                pool.setdefault(model, {}).setdefault(key, []).append(
                    {"file": f, "round": rr["round"], "ratio": x["ratio"],
                     "one_rank_s": rr["one_rank_median_s"], "two_rank_s": x["two_rank_median_s"],
                     "comm_time_s": x["comm_time_s"], "exposed_comm_s": x["exposed_comm_s"]})
res = {}
for model, keys in pool.items():
    for key, rounds in keys.items():
        quiet = [r for r in rounds if r["ratio"] < 1.5]
        busy = [r for r in rounds if r["ratio"] >= 1.5]
        def summ(rs):
            if not rs:
                return None
            return {"rounds": len(rs), "ratio": med([r["ratio"] for r in rs]),
                    "ratio_range": [min(r["ratio"] for r in rs), max(r["ratio"] for r in rs)],
                    "one_rank_s": med([r["one_rank_s"] for r in rs]),
                    "two_rank_s": med([r["two_rank_s"] for r in rs]),
                    "comm_time_s": med([r["comm_time_s"] for r in rs]),
                    "exposed_comm_s": med([r["exposed_comm_s"] for r in rs])}
        res.setdefault(model, {})[key] = {"all": summ(rounds), "uncontended": summ(quiet),
                                          "contended": summ(busy),
                                          "per_round": rounds}
json.dump({"files": files, "split": "uncontended: ratio < 1.5", "results": res}, open(out, "w"), indent=2)
for model, keys in res.items():
    for key, s in keys.items():
        line = "%-9s %-11s all %d rounds ratio %.2f" % (model, key, s["all"]["rounds"], s["all"]["ratio"])
        for c in ("uncontended", "contended"):
            x = s[c]
            if x:
                line += " | %s %d: ratio %.2f [%.2f-%.2f] 1r %.3f 2r %.3f comm %.3f exp %.3f" % (
                    c, x["rounds"], x["ratio"], x["ratio_range"][0], x["ratio_range"][1],
                    x["one_rank_s"], x["two_rank_s"], x["comm_time_s"], x["exposed_comm_s"])
        print(line)
