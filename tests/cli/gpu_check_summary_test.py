#!/usr/bin/env python3
"""scripts/gpu_check_summary.py on the files a GPU check writes, with figures chosen here so every ratio it must
give is known: the GEMM against PyTorch, each training step against PyTorch AMP and against mixtrain's float32,
the step's peak memory against float32, the loss-scaling step, the doctor's GPU verdicts and the CLI's accuracy
gap. Then the same with most files missing, as when steps failed: it must still write its summary.

  gpu_check_summary_test.py SUMMARY_SCRIPT
"""
import json
import os
import subprocess
import sys
import tempfile

script = sys.argv[1]
failures = []


def check(what, got, want, tol=1e-9):
    ok = (got is None and want is None) or (got is not None and want is not None and abs(got - want) <= tol * max(1, abs(want)))
    if not ok:
        failures.append(f"{what}: got {got}, want {want}")


def write(d, name, obj):
    with open(os.path.join(d, name), "w") as f:
        if isinstance(obj, list):
            # A str item is written as it is: a line that is not a JSON object (a step cut short).
            f.write("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in obj))
        else:
            json.dump(obj, f)


def run(d):
    r = subprocess.run([sys.executable, script, d], capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f"exit {r.returncode}: {r.stderr.strip()[-500:]}")
        return None, r.stdout
    with open(os.path.join(d, "gpu-check.json")) as f:
        return json.load(f), r.stdout


with tempfile.TemporaryDirectory() as d:
    write(d, "mixtrain.jsonl", [
        {"what": "mixtrain_unscale_check", "dtype": "float16", "n": 1024, "bit_identical": True},
        {"what": "mixtrain_unscale_step", "dtype": "float16", "n": 1024, "us_per_step": 20.0},
        {"what": "mixtrain_unscale_step", "dtype": "bfloat16", "n": 1024, "us_per_step": 10.0}])
    write(d, "torch.jsonl", [
        {"what": "torch", "version": "2.11.0", "gpu": "NVIDIA H200"},
        {"what": "torch_unscale_step", "dtype": "float16", "n": 1024, "us_per_step": 30.0}])
    write(d, "bench-gemm-gpu.json", {"device": "cuda:0", "gpu": "NVIDIA H200", "gemm": [
        {"n": 8192, "dtype": "float32", "gflops": 50000.0, "ratio_vs_float32": 1.0, "method": "cublaslt"},
        {"n": 8192, "dtype": "bfloat16", "gflops": 720000.0, "ratio_vs_float32": 14.4, "method": "cublaslt",
         "gemm_declined_plans": 1, "gemm_fallback_products": 5},
        {"n": 8192, "dtype": "float16", "gflops": None, "ratio_vs_float32": None, "method": "unavailable: x"}]})
    write(d, "torch-gemm.jsonl", [
        {"what": "peer_torch_info", "version": "2.11.0", "device": "cuda:0"},
        {"what": "peer_torch_matmul", "n": 8192, "dtype": "float32", "supported": True, "gflops": 40000.0},
        {"what": "peer_torch_matmul", "n": 8192, "dtype": "bfloat16", "supported": True, "gflops": 800000.0},
        {"what": "peer_torch_matmul", "n": 8192, "dtype": "float16", "supported": True, "gflops": 790000.0},
        '{"what": "peer_torch_matmul", "n": 1024, "dty', '"a JSON string, not an object"'])
    write(d, "doctor.json", {"gpus": {"devices": [{"name": "NVIDIA H200", "gemm": {"device": "cuda:0"}}]},
                             "verdicts": [{"device": "cpu", "policy": "float32", "verdict": "baseline"},
                                          {"device": "cuda:0", "policy": "mixed_bfloat16", "verdict": "recommended"}]})
    ms = {("mlp", "float32"): 3.0, ("mlp", "mixed_float16"): 1.0, ("mlp", "mixed_bfloat16"): 1.5,
          ("transformer", "float32"): 8.0, ("transformer", "mixed_bfloat16"): 2.0}
    peak = {("mlp", "float32"): 1000, ("mlp", "mixed_float16"): 500, ("mlp", "mixed_bfloat16"): 600,
            ("transformer", "float32"): 4000, ("transformer", "mixed_bfloat16"): 2000}
    for (model, policy), v in ms.items():
        record = {"ms_per_step": v, "step_peak_memory_bytes": peak[(model, policy)]}
        if model == "transformer":  # bench step's GEMM counters on a GPU (absent from older records)
            record.update({"gemm_declined_plans": 3, "gemm_fallback_products": 12 if policy == "float32" else 0})
        write(d, f"step-{model}-{policy}.json", record)
    write(d, "torch-steps.jsonl", [
        {"what": "peer_torch_info", "version": "2.11.0"},
        {"what": "peer_torch_step", "model": "mlp", "variant": "float32", "ms_per_step": 6.0, "step_peak_memory_bytes": 9},
        {"what": "peer_torch_step", "model": "mlp", "variant": "autocast_float16", "ms_per_step": 1.5,
         "step_peak_memory_bytes": 9},
        {"what": "peer_torch_step", "model": "transformer", "variant": "autocast_bfloat16", "ms_per_step": 1.0,
         "step_peak_memory_bytes": 9, "optimizer_impl": "fused", "attention": "sdpa", "skipped_steps": 0}])
    for device, acc, first in (("cpu", 0.90, 1.5), ("cuda", 0.88, 1.25)):
        write(d, f"train-{device}.json", {"test": {"loss": 0.3, "accuracy": acc}, "step_loss": [first, 0.5],
                                          "peak_memory_bytes": 100})
    summary, printed = run(d)
    if summary:
        gemm = {(r["dtype"], r["n"]): r for r in summary["gemm"]}
        check("GEMM float32 vs torch", gemm[("float32", 8192)]["vs_torch"], 50000.0 / 40000.0)
        check("GEMM bfloat16 vs torch", gemm[("bfloat16", 8192)]["vs_torch"], 0.9)
        check("GEMM float16 (unavailable) vs torch", gemm[("float16", 8192)]["vs_torch"], None)
        steps = {(r["model"], r["policy"]): r for r in summary["train_steps"]}
        check("mlp float32 vs torch", steps[("mlp", "float32")]["speedup_vs_torch"], 2.0)
        check("mlp float16 vs torch", steps[("mlp", "mixed_float16")]["speedup_vs_torch"], 1.5)
        check("mlp float16 vs float32", steps[("mlp", "mixed_float16")]["speedup_vs_float32"], 3.0)
        check("mlp bfloat16 vs torch (no torch record)", steps[("mlp", "mixed_bfloat16")]["speedup_vs_torch"], None)
        check("mlp bfloat16 vs float32", steps[("mlp", "mixed_bfloat16")]["speedup_vs_float32"], 2.0)
        check("transformer bfloat16 vs torch", steps[("transformer", "mixed_bfloat16")]["speedup_vs_torch"], 0.5)
        check("transformer bfloat16 vs float32", steps[("transformer", "mixed_bfloat16")]["speedup_vs_float32"], 4.0)
        check("transformer bfloat16 peak vs float32", steps[("transformer", "mixed_bfloat16")]["step_peak_vs_float32"],
              0.5)
        check("steps without a file", float(("cnn", "float32") in steps), 0.0)
        check("transformer float32 fallback products", steps[("transformer", "float32")]["gemm_fallback_products"], 12)
        check("transformer bfloat16 declined plans", steps[("transformer", "mixed_bfloat16")]["gemm_declined_plans"], 3)
        check("mlp without GEMM counters", steps[("mlp", "float32")]["gemm_fallback_products"], None)
        check("torch skipped steps", steps[("transformer", "mixed_bfloat16")]["torch_skipped_steps"], 0)
        check("torch fused optimizer", float(steps[("transformer", "mixed_bfloat16")]["torch_optimizer"] == "fused"), 1.0)
        check("torch sdpa", float(steps[("transformer", "mixed_bfloat16")]["torch_attention"] == "sdpa"), 1.0)
        check("torch without the fields", steps[("mlp", "float32")]["torch_optimizer"], None)
        check("fallback line", float("12 GEMM products ran on the fallback kernel" in printed), 1.0)
        check("no fallback line without products", float(printed.count("on the fallback kernel")), 1.0)
        # Every fallback product at the benchmark shapes, summed and named: bench gemm's row and bench step's step.
        check("fallback products in all", float(summary["gemm_fallback"]["products"]), 17.0)
        check("declined plans in all", float(summary["gemm_fallback"]["declined_plans"]), 7.0)
        check("fallback cases named", float(summary["gemm_fallback"]["cases"] == [
            "bench gemm n=8192 bfloat16", "bench step transformer float32"]), 1.0)
        check("fallback summary line", float("GEMM fallback at the benchmark shapes: 17 products (bench gemm n=8192 "
                                             "bfloat16, bench step transformer float32)" in printed), 1.0)
        unscale = {(r["dtype"], r["n"]): r for r in summary["steps"]}
        check("unscale float16 vs torch", unscale[("float16", 1024)]["speedup_vs_torch"], 1.5)
        check("unscale bfloat16 vs torch (no torch record)", unscale[("bfloat16", 1024)]["speedup_vs_torch"], None)
        check("doctor GPU verdicts", float(len(summary["doctor"]["verdicts"])), 1.0)
        check("CLI accuracy gap", summary["train_cli"]["accuracy_gap"], 0.02, 1e-6)
        check("bit-identical line", float("bit-identical to the CPU: True" in printed), 1.0)

with tempfile.TemporaryDirectory() as d:  # every step failed but the CPU training
    write(d, "train-cpu.json", {"test": {"loss": 0.3, "accuracy": 0.9}, "step_loss": [1.0], "peak_memory_bytes": 1})
    summary, printed = run(d)
    if summary:
        check("no GEMM file", summary["gemm"], None)
        check("no fallback without figures", float(summary["gemm_fallback"]["products"]), 0.0)
        check("no steps", float(len(summary["train_steps"])), 0.0)
        check("one device trained", float("accuracy_gap" in summary["train_cli"]), 0.0)
        check("not run line", float("bit-identical to the CPU: not run" in printed), 1.0)

with tempfile.TemporaryDirectory() as d:  # a GPU run that diverged (train writes non-finite numbers as null), and
    # PyTorch without a bfloat16 unscale kernel (its record carries no time)
    write(d, "train-cpu.json", {"test": {"loss": 0.3, "accuracy": 0.9}, "step_loss": [1.0, 0.5], "peak_memory_bytes": 1})
    write(d, "train-cuda.json", {"test": {"loss": None, "accuracy": None}, "step_loss": [None, None],
                                 "peak_memory_bytes": 1})
    write(d, "mixtrain.jsonl", [{"what": "mixtrain_unscale_step", "dtype": "bfloat16", "n": 1024, "us_per_step": 10.0}])
    write(d, "torch.jsonl", [{"what": "torch_unscale_unsupported", "dtype": "bfloat16", "n": 1024, "reason": "x"},
                             {"what": "torch_unscale_step", "dtype": "bfloat16", "n": 2048}])
    summary, printed = run(d)
    if summary:
        check("no gap with a non-finite accuracy", float("accuracy_gap" in summary["train_cli"]), 0.0)
        check("non-finite said", float("non-finite" in printed), 1.0)
        check("unscale without a PyTorch time", summary["steps"][0]["speedup_vs_torch"], None)

with tempfile.TemporaryDirectory() as d:  # the shapes sized for a GPU beside bench step's: PyTorch's records of both
    # shapes in one file, each step set beside the record of its own batch and weights, never another shape's
    for case, model, batch, weights, f32_ms, bf16_ms in (("mlp", "mlp", 256, 100, 3.0, 2.0),
                                                         ("mlp_large", "mlp", 4096, 100, 40.0, 8.0),
                                                         ("transformer_large", "transformer", 16, 700, 30.0, 6.0)):
        for policy, ms in (("float32", f32_ms), ("mixed_bfloat16", bf16_ms)):
            record = {"ms_per_step": ms, "step_peak_memory_bytes": 10, "model": model, "batch_size": batch,
                      "weights": weights}
            if model == "transformer":
                record.update({"context": 512, "width": 768, "layers": 4, "heads": 12, "vocabulary": 83})
            write(d, f"step-{case}-{policy}.json", record)
    torch_record = lambda model, variant, batch, ms, **more: dict(
        {"what": "peer_torch_step", "model": model, "variant": variant, "batch_size": batch, "weights": 100,
         "ms_per_step": ms, "step_peak_memory_bytes": 9}, **more)
    write(d, "torch-steps.jsonl", [
        torch_record("mlp", "autocast_bfloat16", 256, 4.0),
        torch_record("mlp", "autocast_bfloat16", 4096, 12.0),
        torch_record("mlp", "float32", 4096, 50.0, weights=99),  # another MLP: never compared
        # The transformer of the GPU's shapes, then one that differs in its context alone (last: the record a
        # pairing that left the context out would take).
        torch_record("transformer", "autocast_bfloat16", 16, 9.0, weights=700, context=512, width=768, layers=4,
                     heads=12, vocabulary=83),
        torch_record("transformer", "autocast_bfloat16", 16, 1.0, weights=700, context=64, width=768, layers=4,
                     heads=12, vocabulary=83)])
    summary, printed = run(d)
    if summary:
        steps = {(r["model"], r["policy"]): r for r in summary["train_steps"]}
        check("cases", float(len(steps)), 6.0)
        check("mlp bfloat16 vs its own torch shape", steps[("mlp", "mixed_bfloat16")]["speedup_vs_torch"], 2.0)
        check("mlp_large bfloat16 vs torch", steps[("mlp_large", "mixed_bfloat16")]["speedup_vs_torch"], 1.5)
        check("mlp_large bfloat16 vs float32", steps[("mlp_large", "mixed_bfloat16")]["speedup_vs_float32"], 5.0)
        check("mlp_large float32: torch's record of other weights", steps[("mlp_large", "float32")]["torch_ms"], None)
        check("transformer_large vs the torch record of its context",
              steps[("transformer_large", "mixed_bfloat16")]["speedup_vs_torch"], 1.5)
        check("transformer_large batch", float(steps[("transformer_large", "float32")]["batch_size"]), 16.0)
        check("large cases printed", float("mlp_large" in printed and "transformer_large" in printed), 1.0)
        check("other shapes said (mlp and mlp_large float32)", float(printed.count("records are of other shapes")), 2.0)

if subprocess.run([sys.executable, script], capture_output=True).returncode == 0:
    failures.append("no OUT argument: expected a usage error")

for f in failures:
    print("FAIL", f)
print("gpu_check_summary: %s" % ("ok" if not failures else f"{len(failures)} failures"))
sys.exit(1 if failures else 0)
