# Pools the timed runs of several bench-emulated-nodes.sh JSON files (same setup)
# and writes best / median per rate, variant and algorithm with the bounds.
import json, statistics, sys
out, files = sys.argv[1], sys.argv[2:]
docs = [json.load(open(f)) for f in files]
cells = {}
for d in docs:
    for row in d["results"]:
        for algo, a in row["algorithms"].items():
            c = cells.setdefault((row["rate"], row["variant"], algo), {"runs_s": [], "bound_s": a.get("bound_s")})
            c["runs_s"] += a["runs_s"]
res = []
for (rate, variant, algo), c in cells.items():
    r = {"rate": rate, "variant": variant, "algorithm": algo, "n": len(c["runs_s"]),
         "best_s": min(c["runs_s"]), "median_s": statistics.median(c["runs_s"]), "bound_s": c["bound_s"]}
    if c["bound_s"]:
        r["best_over_bound"] = r["best_s"] / c["bound_s"]
    res.append(r)
gains = {}
for rate, variant in {(r["rate"], r["variant"]) for r in res}:
    g = {r["algorithm"]: r for r in res if r["rate"] == rate and r["variant"] == variant}
    gains["%s %s" % (rate, variant)] = {"best": g["ring"]["best_s"] / g["hierarchical"]["best_s"],
                                        "median": g["ring"]["median_s"] / g["hierarchical"]["median_s"],
                                        "bound": g["ring"]["bound_s"] / g["hierarchical"]["bound_s"]}
json.dump({"files": files, "loadavg": [[d["machine"]["loadavg_before"], d["machine"]["loadavg_after"]] for d in docs],
           "results": res, "hierarchical_gain_over_ring": gains}, open(out, "w"), indent=2)
for r in res:
    print("%-6s %-8s %-13s n=%2d best %.3f median %.3f bound %s" % (r["rate"], r["variant"], r["algorithm"], r["n"], r["best_s"], r["median_s"], "%.3f" % r["bound_s"] if r["bound_s"] else "-"))
for k, g in gains.items():
    print(k, "gain best %.2f median %.2f bound %.2f" % (g["best"], g["median"], g["bound"]))
