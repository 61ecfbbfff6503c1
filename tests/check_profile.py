"""Checks what `mpirun -np 2 fashion_mnist_mlp --epochs 1 --profile DIR` wrote and printed.

usage: check_profile.py DIR OUTPUT_FILE MIN_ACCOUNTED_PERCENT

- DIR/trace.json is JSON that json.load reads, with both ranks (pid 0 and 1), and on each rank
  events naming the modules ("0: Linear" with kind Linear, "1: BatchNorm1d", "3: Linear"; the
  ReLU, module 2, runs inside the BatchNorm and has none), the optimizer, the gradient reduction
  and the data loading;
- the printed table names the same rows, and on every rank the events inside the steps account
  for at least MIN_ACCOUNTED_PERCENT of the steps' time (their self times add up to the step).
"""
import json
import re
import sys


def main() -> int:
    folder, output_file, min_accounted = sys.argv[1], sys.argv[2], float(sys.argv[3])
    with open(f"{folder}/trace.json") as f:
        trace = json.load(f)
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    failures = []
    for pid in (0, 1):
        mine = [e for e in events if e["pid"] == pid]
        names = {e["name"] for e in mine}
        cats = {e["cat"] for e in mine}
        for module, kind in (("0", "Linear"), ("1", "BatchNorm1d"), ("3", "Linear")):
            found = [e for e in mine if e["name"] == f"{module}: {kind}" and e["args"].get("kind") == kind]
            if not {e["cat"] for e in found} >= {"forward", "backward"}:
                failures.append(f"rank {pid}: no forward and backward event of module {module} ({kind})")
        # Module 2, the ReLU, runs inside the BatchNorm before it (fused): its time is that row's.
        if any(e["name"] == "2: ReLU" for e in mine):
            failures.append(f"rank {pid}: the ReLU after BatchNorm1d ran as a layer of its own (not fused)")
        for cat, name in (("optimizer", "Adam"), ("data", "data"), ("reduction", None), ("step", None)):
            if cat not in cats or (name and name not in names):
                failures.append(f"rank {pid}: no {cat} event" + (f" named {name}" if name else ""))
        print(f"rank {pid}: {len(mine)} events, categories {sorted(cats)}")
    with open(output_file) as f:
        output = f.read()
    for row in ("0: Linear forward", "1: BatchNorm1d backward", "Adam step", "zero_grad", "data", "gradient allreduce"):
        if row not in output:
            failures.append(f"the table has no row '{row}'")
    accounted = [float(a) for a in re.findall(r"in steps \(([0-9.]+)% accounted\)", output)]
    print(f"accounted for: {accounted} % of the step time (rank 0, rank 1)")
    if len(accounted) != 2:
        failures.append("the table does not say how much of the step time each rank's events account for")
    for rank, a in enumerate(accounted):
        if a < min_accounted:
            failures.append(f"rank {rank}: the events account for {a}% of the step time, below {min_accounted}%")
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print("profile trace and table: OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
