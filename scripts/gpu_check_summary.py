#!/usr/bin/env python3
"""The summary of scripts/gpu-check.sh: reads what its steps wrote into OUT and prints and writes (OUT/gpu-check.json)
every ratio the GPU targets are read from.

  gpu_check_summary.py OUT

Inputs (each optional: a step that failed leaves its file out, and its rows say n/a):
  mixtrain.jsonl, torch.jsonl       the loss-scaling step (unscale + check + scale update) of mixtrain and PyTorch
  bench-gemm-gpu.json               `mixtrain bench gemm --device cuda --json`
  torch-gemm.jsonl                  bench/peer_torch.py matmul --device cuda
  doctor.json                       `mixtrain doctor --json`
  step-CASE-POLICY.json             `mixtrain bench step --device cuda --json`, CASE mlp|cnn|transformer (bench
                                    step's shapes) or mlp_large|transformer_large (the shapes sized for a GPU)
  torch-steps.jsonl                 bench/peer_torch.py step --device cuda (variant float32|autocast_float16|...);
                                    a step is set beside PyTorch's record of its model, policy, batch and weights
  train-cpu.json, train-cuda.json   `mixtrain train --json` on each device
  *-tests.json                      GoogleTest's --gtest_output=json of the GPU test steps
  machine.txt                       the machine: "key: value" lines (date, gpu, nvcc, c++, cmake, os, cpus)
gemm_fallback: the products that ran on the backend's fallback kernel at the benchmark shapes (bench gemm's and bench
step's gemm_fallback_products, summed and named) and the plans cuBLASLt declined; gpu-check.sh fails on any product.
Ratios: GEMM vs torch = mixtrain GFLOP/s / PyTorch's (target at 8192, 16-bit: >= 0.80); a step's vs torch =
PyTorch's ms / mixtrain's (target >= 1.0), vs float32 = mixtrain's float32 ms / its mixed ms (target >= 3), step
peak vs float32 = the step's peak memory beyond what stays resident over the float32 step's (target for the mixed
transformer <= 0.6).
"""
import json, sys, os
if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
    sys.exit("usage: gpu_check_summary.py OUT (the directory scripts/gpu-check.sh wrote)")
out = sys.argv[1]
def lines(name):
    # The JSON objects of a file, one per line (a line that is not one, e.g. of a step cut short, is left out).
    p = os.path.join(out, name)
    records = []
    for l in (open(p) if os.path.exists(p) else []):
        try:
            r = json.loads(l)
        except ValueError:
            continue
        if isinstance(r, dict):
            records.append(r)
    return records
mx = {(r["dtype"], r["n"]): r for r in lines("mixtrain.jsonl") if r["what"] == "mixtrain_unscale_step"}
checks = [r for r in lines("mixtrain.jsonl") if r["what"] == "mixtrain_unscale_check"]
pt = {(r["dtype"], r["n"]): r for r in lines("torch.jsonl")
      if r["what"] == "torch_unscale_step" and isinstance(r.get("us_per_step"), (int, float))}
rows = []
print("loss-scaling step (unscale + check + scale update), us per step; speedup = PyTorch / mixtrain")
for key in sorted(mx):
    m, p = mx[key], pt.get(key)
    ratio = p["us_per_step"] / m["us_per_step"] if p else None
    rows.append({"dtype": key[0], "n": key[1], "mixtrain_us": m["us_per_step"],
                 "torch_us": p["us_per_step"] if p else None, "speedup_vs_torch": ratio})
    print(f"{key[0]:>9} n={key[1]:>10}  mixtrain {m['us_per_step']:9.1f}  torch "
          f"{(p['us_per_step'] if p else float('nan')):9.1f}  {('%.2fx' % ratio) if ratio else 'n/a'}")
def load(name):
    p = os.path.join(out, name)
    try:
        return json.load(open(p)) if os.path.exists(p) else None
    except ValueError:
        return None
gemm = load("bench-gemm-gpu.json")
doctor = load("doctor.json")
gpu_gemm = gemm["gemm"] if gemm else None
torch_gemm = {(r["dtype"], r["n"]): r for r in lines("torch-gemm.jsonl")
              if r["what"] == "peer_torch_matmul" and r["supported"]}
if gpu_gemm:
    print("GEMM n x n x n on the GPU, GFLOP/s; vs torch = mixtrain / PyTorch matmul (target at 8192, 16-bit: >= 0.80)")
    for row in gpu_gemm:
        t = torch_gemm.get((row["dtype"], row["n"]))
        row["torch_gflops"] = t["gflops"] if t else None
        row["vs_torch"] = row["gflops"] / t["gflops"] if t and row["gflops"] else None
        print(f"{row['n']:>6} {row['dtype']:>9}  mixtrain {(row['gflops'] or float('nan')):10.1f}  torch "
              f"{(row['torch_gflops'] or float('nan')):10.1f}  "
              f"{('%.2f' % row['vs_torch']) if row['vs_torch'] else 'n/a'}")
gpu_doctor = None
if doctor:
    gpu_doctor = {"gpus": [dict(d.get("gemm", {}), name=d["name"]) for d in doctor["gpus"]["devices"]],
                  "verdicts": [v for v in doctor["verdicts"] if v["device"] != "cpu"]}
    for v in gpu_doctor["verdicts"]:
        print(f"doctor {v['device']} {v['policy']}: {v['verdict']}")
policy_of = {"float32": "float32", "autocast_float16": "mixed_float16", "autocast_bfloat16": "mixed_bfloat16"}
torch_steps = [r for r in lines("torch-steps.jsonl") if r["what"] == "peer_torch_step"]
# The shape fields both sides write: a step and PyTorch's record of another shape are never compared (a record of
# an older mixtrain without them pairs by model and policy alone).
shape_fields = ("batch_size", "weights", "vocabulary", "context", "width", "layers", "heads")
def torch_records(model, policy):
    return [r for r in torch_steps if r.get("model") == model and policy_of.get(r.get("variant")) == policy]
def same_shape(m, r):
    return all(m[k] == r[k] for k in shape_fields if k in m and k in r)
train_steps = []
print("training steps on the GPU, ms per step (bench step's shapes, then those sized for a GPU); "
      "vs torch = PyTorch / mixtrain, vs float32 = mixtrain float32 / mixtrain")
for case in ("mlp", "cnn", "transformer", "mlp_large", "transformer_large"):
    model = case.split("_")[0]
    f32 = load(f"step-{case}-float32.json")
    for policy in ("float32", "mixed_float16", "mixed_bfloat16"):
        m = load(f"step-{case}-{policy}.json")
        if not m:
            continue
        records = torch_records(model, policy)
        same = [r for r in records if same_shape(m, r)]
        t = same[-1] if same else None
        row = {"model": case, "policy": policy, "batch_size": m.get("batch_size"), "weights": m.get("weights"),
               "mixtrain_ms": m["ms_per_step"],
               "mixtrain_step_peak_bytes": m.get("step_peak_memory_bytes"),
               "torch_ms": t["ms_per_step"] if t else None,
               "torch_step_peak_bytes": t["step_peak_memory_bytes"] if t else None,
               "speedup_vs_torch": t["ms_per_step"] / m["ms_per_step"] if t else None,
               "speedup_vs_float32": f32["ms_per_step"] / m["ms_per_step"] if f32 else None,
               # The step's peak beyond what stays resident, over the float32 step's (target for the mixed
               # transformer: at most 0.6).
               "step_peak_vs_float32": (m["step_peak_memory_bytes"] / f32["step_peak_memory_bytes"]
                                        if f32 and f32.get("step_peak_memory_bytes") else None),
               # Plans cuBLASLt declined (a scratch pass) and products it had no algorithm for (the slow fallback
               # kernel).
               "gemm_declined_plans": m.get("gemm_declined_plans"),
               "gemm_fallback_products": m.get("gemm_fallback_products"),
               # How PyTorch ran (its fused optimizer, its fused attention) and the steps GradScaler skipped.
               "torch_optimizer": t.get("optimizer_impl") if t else None,
               "torch_attention": t.get("attention") if t else None,
               "torch_skipped_steps": t.get("skipped_steps") if t else None}
        train_steps.append(row)
        print(f"{case:>17} {policy:>14}  mixtrain {row['mixtrain_ms']:8.2f}  torch "
              f"{(row['torch_ms'] or float('nan')):8.2f}  vs torch "
              f"{('%.2fx' % row['speedup_vs_torch']) if row['speedup_vs_torch'] else 'n/a'}  vs float32 "
              f"{('%.2fx' % row['speedup_vs_float32']) if row['speedup_vs_float32'] else 'n/a'}  step peak vs float32 "
              f"{('%.2f' % row['step_peak_vs_float32']) if row['step_peak_vs_float32'] else 'n/a'}")
        if records and not same:
            print(f"{'':>17} {'':>14}  PyTorch's {model} {policy} records are of other shapes (batch, weights or the "
                  "transformer's sizes): not compared")
        if row["gemm_fallback_products"]:
            print(f"{'':>17} {'':>14}  {row['gemm_fallback_products']} GEMM products ran on the fallback kernel "
                  "(cuBLASLt had no algorithm for them)")
# Products that ran on the backend's fallback kernel at the benchmark shapes (bench gemm's rows, bench step's steps):
# any fails the check (scripts/gpu-check.sh), each named here.
fallback_cases = [f"bench gemm n={r['n']} {r['dtype']}" for r in (gpu_gemm or []) if r.get("gemm_fallback_products")]
fallback_cases += [f"bench step {r['model']} {r['policy']}" for r in train_steps if r["gemm_fallback_products"]]
gemm_fallback = {"products": sum(r.get("gemm_fallback_products") or 0 for r in (gpu_gemm or []))
                 + sum(r["gemm_fallback_products"] or 0 for r in train_steps),
                 "declined_plans": sum(r.get("gemm_declined_plans") or 0 for r in (gpu_gemm or []))
                 + sum(r["gemm_declined_plans"] or 0 for r in train_steps),
                 "cases": fallback_cases}
if gpu_gemm or train_steps:
    print(f"GEMM fallback at the benchmark shapes: {gemm_fallback['products']} products"
          + (" (" + ", ".join(fallback_cases) + ")" if fallback_cases else "")
          + f", {gemm_fallback['declined_plans']} plans declined by cuBLASLt")
train_cli = {}
for device in ("cpu", "cuda"):
    r = load(f"train-{device}.json")
    if r:
        losses = r.get("step_loss") or [None]
        train_cli[device] = {"test": r.get("test", {}), "first_step_loss": losses[0], "last_step_loss": losses[-1],
                             "peak_memory_bytes": r.get("peak_memory_bytes")}
def figure(v):
    # A number as the summary prints it; `train` writes a non-finite one as null.
    return f"{v:.6f}" if isinstance(v, (int, float)) else "non-finite"
if len(train_cli) == 2:
    accuracy = {d: train_cli[d]["test"].get("accuracy") for d in ("cpu", "cuda")}
    if all(isinstance(v, (int, float)) for v in accuracy.values()):
        train_cli["accuracy_gap"] = abs(accuracy["cpu"] - accuracy["cuda"])
    print(f"train --device cuda vs cpu: test accuracy {figure(accuracy['cuda'])} vs {figure(accuracy['cpu'])}, "
          f"first step loss {figure(train_cli['cuda']['first_step_loss'])} vs {figure(train_cli['cpu']['first_step_loss'])}")
# The GPU tests' outcome per step: how many ran, were skipped and failed, and the failed ones' names.
tests = {}
for name in ("gpu-tests", "gpu-training-tests", "nccl-tests", "doctor-tests"):
    r = load(f"{name}.json")
    if not r:
        continue
    cases = [t for suite in r.get("testsuites", []) for t in suite.get("testsuite", [])]
    failed = [f"{t.get('classname')}.{t.get('name')}" for t in cases if t.get("failures")]
    skipped = sum(1 for t in cases if t.get("result") == "SKIPPED")
    tests[name] = {"tests": len(cases), "skipped": skipped, "failed": failed}
    print(f"{name}: {len(cases)} tests, {skipped} skipped, {len(failed)} failed"
          + (": " + ", ".join(failed) if failed else ""))
machine = {}
if os.path.exists(os.path.join(out, "machine.txt")):
    for l in open(os.path.join(out, "machine.txt")):
        key, sep, value = l.partition(":")
        if sep:
            machine[key.strip()] = value.strip()
summary = {"machine": machine, "checks": checks, "steps": rows, "gemm": gpu_gemm, "doctor": gpu_doctor, "train_steps": train_steps,
           "gemm_fallback": gemm_fallback, "train_cli": train_cli, "tests": tests}
json.dump(summary, open(os.path.join(out, "gpu-check.json"), "w"), indent=1)
print("bit-identical to the CPU:", all(c["bit_identical"] for c in checks) if checks else "not run")
