#!/usr/bin/env python3
"""Reads a run's TensorBoard files with TensorBoard's own reader (the `tensorboard`
package's EventAccumulator) and checks them against the run's metrics.jsonl: every
number of every train and eval line is the scalar "<train|eval>/<key>" at that line's
step (to float32 rounding), each step once per tag, in order, and nothing else is
there. Exit 0 when they agree, 1 with the first difference otherwise.

    tensorboard_check.py RUN_DIR
"""
import json
import math
import sys
from pathlib import Path

from tensorboard.backend.event_processing import event_accumulator


def main() -> int:
    run = Path(sys.argv[1])
    want = {}  # tag -> [(step, value)]
    for text in (run / "metrics.jsonl").read_text().splitlines():
        line = json.loads(text)
        if "step" not in line:
            continue
        group = "eval" if line.get("eval") else "train"
        for key, value in line.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            want.setdefault(f"{group}/{key}", []).append((line["step"], float(value)))

    acc = event_accumulator.EventAccumulator(
        str(run / "tensorboard"), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    if tags != set(want):
        print(f"tags differ: only in TensorBoard {sorted(tags - set(want))}, "
              f"only in metrics.jsonl {sorted(set(want) - tags)}")
        return 1
    for tag, expected in sorted(want.items()):
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        if [s for s, _ in got] != [s for s, _ in expected]:
            print(f"{tag}: steps {[s for s, _ in got]}, metrics.jsonl has {[s for s, _ in expected]}")
            return 1
        for (step, value), (_, v) in zip(got, expected):
            if not math.isclose(value, v, rel_tol=1e-6, abs_tol=1e-30):
                print(f"{tag} at step {step}: {value} in TensorBoard, {v} in metrics.jsonl")
                return 1
    steps = sum(len(v) for v in want.values())
    print(f"tensorboard_check: {len(want)} tags, {steps} scalars agree with metrics.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
