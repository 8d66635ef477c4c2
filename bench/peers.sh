#!/usr/bin/env bash
# Side-by-side benchmark: mixtrain against peers measured in the same run, on the same threads.
#
#   bash bench/peers.sh [--out DIR] [--seconds S] [--steps N] [--threads T] [--rounds R]
#                       [--sections gemm,mlp,cnn,transformer,transformer512]
#
# Runs, one after the other, in each of R rounds (default 3; S seconds per GEMM case, N steps per step case):
#   fma_peak                          this CPU's multiply-add ceiling per dtype (bench/fma_peak.cpp)
#   mixtrain bench gemm               GEMM GFLOP/s per dtype, n = 512, 1024, 2048 (bfloat16 by the method mixtrain
#                                     picks at run time: AMX tiles "amx", vdpbf16ps "dot" or "widen" to float32;
#                                     MIXTRAIN_BF16_GEMM=amx|dot|widen forces one; float16 by the AMX split
#                                     "amx" or "widen", whichever times fastest, or by AVX512-FP16 FMAs with
#                                     MIXTRAIN_F16_GEMM=fp16)
#   peer_dnnl                         oneDNN matmul, same sizes and dtypes (bench/peer_dnnl.cpp)
#   peer_torch.py matmul              PyTorch matmul, same sizes and dtypes
#   mixtrain bench step               MLP 784-4096-4096-10, batch 256, Adam: float32, mixed_float16, mixed_bfloat16
#   peer_torch.py step                the same step in PyTorch: float32 and autocast bfloat16
#   mixtrain bench step --model cnn   the CNN of `--model cnn` (two Conv3x3-BatchNorm-ReLU-MaxPool stages, 32 and 64
#                                     filters, Dense 128, Dropout, Dense 10), 28x28x1 images, batch 256, Adam:
#                                     float32, mixed_float16, mixed_bfloat16
#   peer_torch.py step --model cnn    the same CNN step in PyTorch (channels_last): float32 and autocast bfloat16
#   mixtrain bench step --model transformer
#                                     the decoder-only transformer of `--model transformer` (V 83, T 64, D 128,
#                                     2 layers, 4 heads), batch 32, AdamW with clipping as `train` runs it:
#                                     float32, mixed_float16, mixed_bfloat16
#   peer_torch.py step --model transformer
#                                     the same transformer step in PyTorch: float32 and autocast bfloat16
#   mixtrain bench step --model transformer, context 512
#                                     a subword language model's shape (V 2048, as --tokenizer bpe:2048; T 512,
#                                     D 256, 4 layers, 8 heads), batch 8: mixed_bfloat16 with mixtrain's defaults
#                                     (tiled attention, the head and loss fused over chunks of rows)
#   peer_torch.py step --model transformer, context 512
#                                     the same step in PyTorch under autocast bfloat16
# --sections picks which of these run (default all): gemm (fma_peak, GEMMs), mlp, cnn, transformer,
# transformer512.
# then prints ratios (the result; absolute numbers are notes): mixtrain GEMM vs oneDNN and PyTorch, as a share
# of the measured peak of the fastest multiply-add that can compute its dtype (float32 FMAs for every dtype,
# since 16-bit inputs can be widened; vdpbf16ps for bfloat16 and vfmadd231ph for float16 where the CPU has
# them), MLP, CNN and transformer steps vs PyTorch, mixed vs float32, and each performance target met or not.
#
# Peers: oneDNN from `apt-get install libdnnl-dev`, PyTorch from `apt-get install python3-torch` (Debian 12).
# A peer that is not installed is skipped with a message. PyTorch's float32 matmul goes through the system
# BLAS; Debian's default is the reference BLAS, so when OpenBLAS is installed (libopenblas0-openmp or
# libopenblas0-pthread) PyTorch runs with it (PEER_TORCH_BLAS=auto, the default; =system keeps the system's).
#
# Environment: MIXTRAIN (the CLI, default build/tools/cli/mixtrain), CXX (default g++), PYTHON_TORCH (a Python
# that imports torch; default: the first of python3, /usr/bin/python3 that does).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mixtrain="${MIXTRAIN:-$root/build/tools/cli/mixtrain}"
cxx="${CXX:-g++}"
out=""
seconds=1
steps=10
threads=2
rounds=3
sections="gemm,mlp,cnn,transformer,transformer512"

usage() { sed -n '2,5p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --seconds) seconds="${2:?--seconds needs a number}"; shift 2 ;;
    --steps) steps="${2:?--steps needs a number}"; shift 2 ;;
    --threads) threads="${2:?--threads needs a number}"; shift 2 ;;
    --rounds) rounds="${2:?--rounds needs a number}"; shift 2 ;;
    --sections) sections="${2:?--sections needs a list}"; shift 2 ;;
    -h|--help) usage ;;
    *) echo "peers.sh: unknown argument '$1'" >&2; usage ;;
  esac
done

for v in "$steps" "$threads" "$rounds"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "peers.sh: --steps, --threads and --rounds need positive integers, got '$v'" >&2; exit 2; }
done
[[ "$seconds" =~ ^[0-9]*\.?[0-9]+$ ]] || { echo "peers.sh: --seconds needs a positive number, got '$seconds'" >&2; exit 2; }
IFS=, read -r -a section_list <<<"$sections"
[[ ${#section_list[@]} -gt 0 ]] || {
  echo "peers.sh: --sections needs at least one of gemm, mlp, cnn, transformer, transformer512" >&2; exit 2; }
for s in "${section_list[@]}"; do
  [[ "$s" =~ ^(gemm|mlp|cnn|transformer|transformer512)$ ]] || {
    echo "peers.sh: unknown section '$s' (valid: gemm, mlp, cnn, transformer, transformer512)" >&2; exit 2; }
done
want() { [[ ",$sections," == *",$1,"* ]]; }  # is section $1 asked for?
command -v python3 >/dev/null || { echo "peers.sh: python3 is needed to read the JSON results" >&2; exit 2; }
if [[ ! -x "$mixtrain" ]]; then
  echo "peers.sh: no mixtrain CLI at $mixtrain (build it: ninja -C build mixtrain_cli, or set MIXTRAIN=...)" >&2
  exit 2
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS="$threads"   # mixtrain, oneDNN and PyTorch all run OpenMP threads

echo "== machine"
model="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2-) "
present="" absent=""
for f in avx2 fma f16c avx512f avx512bw avx512vl avx512_bf16 avx512_fp16 amx_bf16 amx_fp16; do
  if [[ "$cpu_flags" == *" $f "* ]]; then present+="$f "; else absent+="$f "; fi
done
echo "cpu: $model; $(getconf _NPROCESSORS_ONLN) logical CPUs; threads used: $threads"
absent="${absent% }"
echo "flags present: ${present% }; absent: ${absent:-none}"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
if [[ -n "${MIXTRAIN_BF16_GEMM:-}" ]]; then
  echo "mixtrain bfloat16 GEMM method: forced, MIXTRAIN_BF16_GEMM=$MIXTRAIN_BF16_GEMM"
else
  echo "mixtrain bfloat16 GEMM method: mixtrain's run-time calibration (amx with AMX tiles, dot with vdpbf16ps, or" \
       "widen to float32, whichever times fastest on this CPU; MIXTRAIN_BF16_GEMM=amx|dot|widen forces one)"
fi
if [[ -n "${MIXTRAIN_F16_GEMM:-}" ]]; then
  echo "mixtrain float16 GEMM method: forced, MIXTRAIN_F16_GEMM=$MIXTRAIN_F16_GEMM"
else
  echo "mixtrain float16 GEMM method: mixtrain's run-time calibration (amx, the AMX split into bfloat16 products," \
       "or widen to float32, whichever times fastest on this CPU; MIXTRAIN_F16_GEMM=amx|widen|fp16 forces one, fp16 being"\
       "AVX512-FP16 FMAs, which the calibration does not pick)"
fi

echo "== building helpers"
have_fma=0 have_dnnl=0 have_torch=0
if ! want gemm; then
  :  # fma_peak and oneDNN only take part in the GEMM section
elif "$cxx" -std=c++20 -O2 -pthread "$root/bench/fma_peak.cpp" -o "$work/fma_peak" 2>"$work/fma_peak.log"; then
  have_fma=1
else
  echo "fma_peak: does not build here (needs an x86-64 g++ with AVX-512 intrinsics), skipped:"; head -5 "$work/fma_peak.log"
fi
if ! want gemm; then
  :
elif "$cxx" -std=c++20 -O2 "$root/bench/peer_dnnl.cpp" -o "$work/peer_dnnl" -ldnnl 2>"$work/peer_dnnl.log"; then
  have_dnnl=1
else
  echo "oneDNN: peer_dnnl does not build against -ldnnl here (apt-get install libdnnl-dev), peer skipped:"
  head -3 "$work/peer_dnnl.log"
fi
python_torch="${PYTHON_TORCH:-}"
if [[ -z "$python_torch" ]]; then
  for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c 'import torch' 2>/dev/null; then python_torch="$p"; break; fi
  done
fi
if [[ -n "$python_torch" ]] && "$python_torch" -c 'import torch' 2>/dev/null; then
  have_torch=1
else
  echo "PyTorch: not importable (apt-get install python3-torch, or set PYTHON_TORCH=...), peer skipped"
fi
torch_env=()
if [[ $have_torch == 1 && "${PEER_TORCH_BLAS:-auto}" == auto ]]; then
  for d in /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/x86_64-linux-gnu/openblas-pthread; do
    if [[ -e "$d/libblas.so.3" ]]; then torch_env=(env "LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"); break; fi
  done
fi

# Each round runs every measurement once; the summary keeps the best GFLOP/s and the lowest ms/step of each
# case over the rounds. On a shared machine a neighbour's burst can halve one measurement; spreading the
# repeats over a few minutes makes it unlikely that all of them are hit.
for round in $(seq 1 "$rounds"); do
  echo "== round $round of $rounds (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  if want gemm; then
    if [[ $have_fma == 1 ]]; then
      echo "-- fma_peak ($threads threads)"
      "$work/fma_peak" --threads "$threads" --seconds "$seconds" | tee "$work/fma_r$round.jsonl"
    fi
    echo "-- mixtrain bench gemm"
    "$mixtrain" bench gemm --sizes 512,1024,2048 --seconds "$seconds" --json "$work/mixtrain_gemm_r$round.json"
    if [[ $have_dnnl == 1 ]]; then
      echo "-- oneDNN matmul"
      "$work/peer_dnnl" --sizes 512,1024,2048 --seconds "$seconds" | tee "$work/dnnl_r$round.jsonl"
    fi
    if [[ $have_torch == 1 ]]; then
      echo "-- PyTorch matmul"
      "${torch_env[@]}" "$python_torch" "$root/bench/peer_torch.py" matmul --sizes 512,1024,2048 \
        --seconds "$seconds" --threads "$threads" | tee "$work/torch_matmul_r$round.jsonl"
    fi
  fi
  if want mlp; then
    echo "-- mixtrain bench step"
    for policy in float32 mixed_float16 mixed_bfloat16; do
      "$mixtrain" bench step --hidden 4096,4096 --batch-size 256 --policy "$policy" --steps "$steps" \
        --json "$work/step_${policy}_r$round.json"
    done
    if [[ $have_torch == 1 ]]; then
      echo "-- PyTorch step"
      for variant in float32 autocast_bfloat16; do
        "${torch_env[@]}" "$python_torch" "$root/bench/peer_torch.py" step --variant "$variant" --hidden 4096,4096 \
          --batch-size 256 --steps "$steps" --threads "$threads" | tee "$work/torch_step_${variant}_r$round.jsonl"
      done
    fi
  fi
  if want cnn; then
    echo "-- mixtrain bench step --model cnn"
    for policy in float32 mixed_float16 mixed_bfloat16; do
      "$mixtrain" bench step --model cnn --batch-size 256 --policy "$policy" --steps "$steps" \
        --json "$work/cnn_step_${policy}_r$round.json"
    done
    if [[ $have_torch == 1 ]]; then
      echo "-- PyTorch step --model cnn"
      for variant in float32 autocast_bfloat16; do
        "${torch_env[@]}" "$python_torch" "$root/bench/peer_torch.py" step --model cnn --variant "$variant" \
          --batch-size 256 --steps "$steps" --threads "$threads" | tee "$work/torch_cnn_step_${variant}_r$round.jsonl"
      done
    fi
  fi
  if want transformer; then
    # The shapes of `mixtrain train --model transformer --data moby-dick`'s defaults (83 characters).
    echo "-- mixtrain bench step --model transformer"
    for policy in float32 mixed_float16 mixed_bfloat16; do
      "$mixtrain" bench step --model transformer --vocabulary 83 --context 64 --width 128 --layers 2 --heads 4 \
        --batch-size 32 --policy "$policy" --steps "$steps" --json "$work/transformer_step_${policy}_r$round.json"
    done
    if [[ $have_torch == 1 ]]; then
      echo "-- PyTorch step --model transformer"
      for variant in float32 autocast_bfloat16; do
        "${torch_env[@]}" "$python_torch" "$root/bench/peer_torch.py" step --model transformer --variant "$variant" \
          --vocabulary 83 --context 64 --width 128 --layers 2 --heads 4 --batch-size 32 --steps "$steps" \
          --threads "$threads" | tee "$work/torch_transformer_step_${variant}_r$round.jsonl"
      done
    fi
  fi
  if want transformer512; then
    # Issue 43's language-model shape; the pair its speed target names (mixed_bfloat16 vs autocast bfloat16).
    lm_shape=(--vocabulary 2048 --context 512 --width 256 --layers 4 --heads 8 --batch-size 8 --steps "$steps")
    echo "-- mixtrain bench step --model transformer, context 512"
    "$mixtrain" bench step --model transformer "${lm_shape[@]}" --policy mixed_bfloat16 \
      --json "$work/lm512_step_mixed_bfloat16_r$round.json"
    if [[ $have_torch == 1 ]]; then
      echo "-- PyTorch step --model transformer, context 512"
      "${torch_env[@]}" "$python_torch" "$root/bench/peer_torch.py" step --model transformer \
        --variant autocast_bfloat16 "${lm_shape[@]}" --threads "$threads" | tee "$work/torch_lm512_step_r$round.jsonl"
    fi
  fi
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$work" "$threads" "$rounds" <<'EOF'
import json, os, sys

work, threads, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])

def jsonl(name):
    rows = []
    for r in range(1, rounds + 1):
        path = os.path.join(work, f"{name}_r{r}.jsonl")
        if os.path.exists(path):
            with open(path) as f:
                rows += [json.loads(line) for line in f if line.strip().startswith("{")]
    return rows

def loads(name):
    out = []
    for r in range(1, rounds + 1):
        path = os.path.join(work, f"{name}_r{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                out.append(json.load(f))
    return out

def best(rows, key):
    """The row with the highest GFLOP/s per key over the rounds (an unsupported case has no GFLOP/s)."""
    out = {}
    for r in rows:
        k = key(r)
        if k not in out or r.get("gflops", 0) > out[k].get("gflops", 0):
            out[k] = r
    return out

peak = best(jsonl("fma"), lambda r: r["dtype"])
fp32_peak = peak.get("float32", {}).get("gflops")

def dtype_peak(d):
    """The measured peak of the fastest multiply-add that can compute dtype d: float32 FMAs always (16-bit
    inputs can be widened to float32), or the dtype's own instruction (vdpbf16ps, vfmadd231ph) where the CPU
    has it and it is faster. None when fma_peak did not run."""
    rows = [peak.get("float32")] + ([peak.get(d)] if d != "float32" else [])
    rows = [r for r in rows if r and r.get("available") and r.get("gflops")]
    return max(rows, key=lambda r: r["gflops"]) if rows else None

mix = {k: r["gflops"] for k, r in best([g for run in loads("mixtrain_gemm") for g in run["gemm"]],
                                        lambda r: (r["n"], r["dtype"])).items()}
dnnl = best([r for r in jsonl("dnnl") if r["what"] == "peer_dnnl"], lambda r: (r["n"], r["dtype"]))
torch_mm = best([r for r in jsonl("torch_matmul") if r["what"] == "peer_torch_matmul"], lambda r: (r["n"], r["dtype"]))
step = {p: min(loads(f"step_{p}"), key=lambda r: r["ms_per_step"])
        for p in ("float32", "mixed_float16", "mixed_bfloat16") if loads(f"step_{p}")}
torch_step = {}
for v in ("float32", "autocast_bfloat16"):
    rows = [r for r in jsonl(f"torch_step_{v}") if r["what"] == "peer_torch_step"]
    if rows:
        torch_step[v] = min(rows, key=lambda r: r["ms_per_step"])
info = {r["what"]: r for r in jsonl("dnnl") + jsonl("torch_matmul") if r["what"].endswith("_info")}

def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"

def peer_gflops(table, key):
    r = table.get(key)
    if r is None:
        return None, "not run"
    if not r.get("supported", True):
        return None, "unsupported"
    return r["gflops"], f"{r['gflops']:.0f}"

print()
print(f"== results ({threads} threads, best of {rounds} rounds; ratios are the result, GFLOP/s and ms are notes)")
if peak:
    print("FMA peak: " + "; ".join(
        f"{d} {r['instruction']} {r['gflops']:.0f} GFLOP/s ({r['gflops_1_thread']:.0f} on 1 thread)"
        if r["available"] else f"{d} {r['instruction']}: not available" for d, r in peak.items()))
    print("GEMM share of peak, per dtype, against the fastest multiply-add that computes it: " + "; ".join(
        f"{d} {dtype_peak(d)['instruction']} {dtype_peak(d)['gflops']:.0f}" for d in ("float32", "float16", "bfloat16")
        if dtype_peak(d)))
    per_round = [r["gflops"] for r in jsonl("fma") if r["dtype"] == "float32" and r["available"]]
    print("float32 FMA peak per round: " + ", ".join(f"{g:.0f}" for g in per_round) +
          " GFLOP/s (a round well below the best one shared the CPU with other work)")
if "peer_dnnl_info" in info:
    i = info["peer_dnnl_info"]
    print(f"oneDNN {i['version']} (isa {i['isa']})")
if "peer_torch_info" in info:
    i = info["peer_torch_info"]
    print(f"PyTorch {i['version']}, float32 BLAS: {i.get('blas') or 'linked in'}")
if mix:
    print()
    print("GEMM n x n x n")
    print("| n | dtype | mixtrain / oneDNN | mixtrain / PyTorch | mixtrain % of its dtype's peak | mixtrain vs its float32 |"
          " mixtrain GFLOP/s | oneDNN GFLOP/s | PyTorch GFLOP/s |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (n, d), g in sorted(mix.items(), key=lambda kv: (kv[0][0], ["float32", "float16", "bfloat16"].index(kv[0][1]))):
        dg, dtext = peer_gflops(dnnl, (n, d))
        tg, ttext = peer_gflops(torch_mm, (n, d))
        dp = dtype_peak(d)
        pct = f"{100 * g / dp['gflops']:.0f}%" if dp else "-"
        vs_dnnl = ratio(g, dg) if dg else dtext
        vs_torch = ratio(g, tg) if tg else ttext
        print(f"| {n} | {d} | {vs_dnnl} | {vs_torch} | {pct} | {ratio(g, mix[(n, 'float32')])} | {g:.0f} | {dtext} | {ttext} |")

f32_ms = step["float32"]["ms_per_step"] if "float32" in step else None
if len(step) == 3:
    print()
    print("Training step, MLP 784-4096-4096-10, batch 256, Adam (median ms/step, lowest over the rounds)")
    print("| mixtrain policy | PyTorch peer | mixtrain speedup vs peer | vs mixtrain float32 | mixtrain ms | PyTorch ms |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    peer_of = {"float32": "float32", "mixed_float16": "autocast_bfloat16", "mixed_bfloat16": "autocast_bfloat16"}
    for p, r in step.items():
        t = torch_step.get(peer_of[p])
        t_ms = t["ms_per_step"] if t else None
        speed = ratio(t_ms, r["ms_per_step"]) if t_ms else "not run"
        print(f"| {p} | {peer_of[p]} | {speed} | {ratio(f32_ms, r['ms_per_step'])} | {r['ms_per_step']:.1f} | "
              f"{f'{t_ms:.1f}' if t_ms else '-'} |")

cnn_policies = ("float32", "mixed_float16", "mixed_bfloat16")
cnn_step = {p: loads(f"cnn_step_{p}") for p in cnn_policies}
torch_cnn = {v: [r for r in jsonl(f"torch_cnn_step_{v}") if r["what"] == "peer_torch_step"]
             for v in ("float32", "autocast_bfloat16")}
if all(cnn_step.values()):
    best_ms = lambda rows: min(r["ms_per_step"] for r in rows) if rows else None
    layout = next((r.get("layout") for rows in torch_cnn.values() for r in rows), None)
    print()
    print("Training step, CNN (--model cnn: 28x28x1, Conv3x3 32 and 64 with BatchNorm, ReLU and MaxPool 2, Dense 128,"
          f" Dropout 0.3, Dense 10), batch 256, Adam; PyTorch layout {layout or '-'}"
          " (median ms/step, lowest over the rounds)")
    print("| mixtrain policy | PyTorch peer | mixtrain speedup vs peer | vs mixtrain float32 | mixtrain ms | PyTorch ms |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    cnn_pairs = [("float32", "float32"), ("mixed_float16", "float32"), ("mixed_bfloat16", "autocast_bfloat16")]
    cnn_f32 = best_ms(cnn_step["float32"])
    for p, v in cnn_pairs:
        m_ms, t_ms = best_ms(cnn_step[p]), best_ms(torch_cnn[v])
        print(f"| {p} | {v} | {ratio(t_ms, m_ms) if t_ms else 'not run'} | {ratio(cnn_f32, m_ms)} | {m_ms:.1f} | "
              f"{f'{t_ms:.1f}' if t_ms else '-'} |")
    t_bf, t_f32 = best_ms(torch_cnn["autocast_bfloat16"]), best_ms(torch_cnn["float32"])
    if t_bf and t_f32:
        print(f"PyTorch autocast bfloat16 vs PyTorch float32: {ratio(t_f32, t_bf)}")
    # Round by round, each side's median from the same round: on a shared machine the spread is part of the result.
    for p, v in cnn_pairs:
        per_round = [t["ms_per_step"] / m["ms_per_step"] for m, t in zip(cnn_step[p], torch_cnn[v])]
        if per_round:
            print(f"round by round, mixtrain {p} vs PyTorch {v}: " + ", ".join(f"{x:.2f}x" for x in per_round))

tr_policies = ("float32", "mixed_float16", "mixed_bfloat16")
tr_step = {p: loads(f"transformer_step_{p}") for p in tr_policies}
torch_tr = {v: [r for r in jsonl(f"torch_transformer_step_{v}") if r["what"] == "peer_torch_step"]
            for v in ("float32", "autocast_bfloat16")}
if all(tr_step.values()):
    best_ms = lambda rows: min(r["ms_per_step"] for r in rows) if rows else None
    best_tok = lambda rows: max(r["tokens_per_second"] for r in rows) if rows else None
    shape = tr_step["float32"][0]
    weights = shape["weights"]
    print()
    print(f"Training step, transformer (--model transformer: V {shape['vocabulary']}, T {shape['context']},"
          f" D {shape['width']}, {shape['layers']} layers, {shape['heads']} heads, {weights:,} weights), batch"
          f" {shape['batch_size']}, AdamW with clipping (median ms/step, lowest over the rounds)")
    peer_weights = {r["weights"] for rows in torch_tr.values() for r in rows}
    if peer_weights and peer_weights != {weights}:
        print(f"WARNING: PyTorch's transformer holds {sorted(peer_weights)} weights, mixtrain's {weights}:"
              " not the same model")
    print("| mixtrain policy | mixtrain ms | tokens/s | vs PyTorch float32 | vs PyTorch autocast bfloat16 |"
          " vs mixtrain float32 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    t_f32, t_bf = best_ms(torch_tr["float32"]), best_ms(torch_tr["autocast_bfloat16"])
    tr_f32 = best_ms(tr_step["float32"])
    for p in tr_policies:
        m_ms = best_ms(tr_step[p])
        print(f"| {p} | {m_ms:.1f} | {best_tok(tr_step[p]):.0f} | {ratio(t_f32, m_ms) if t_f32 else 'not run'} |"
              f" {ratio(t_bf, m_ms) if t_bf else 'not run'} | {ratio(tr_f32, m_ms)} |")
    for v in ("float32", "autocast_bfloat16"):
        if torch_tr[v]:
            print(f"PyTorch {v}: {best_ms(torch_tr[v]):.1f} ms/step, {best_tok(torch_tr[v]):.0f} tokens/s")
    if t_bf and t_f32:
        print(f"PyTorch autocast bfloat16 vs PyTorch float32: {ratio(t_f32, t_bf)}")
    # Round by round, each side's median from the same round: on a shared machine the spread is part of the result.
    for p, v in (("float32", "float32"), ("mixed_float16", "float32"), ("mixed_bfloat16", "autocast_bfloat16"),
                 ("mixed_float16", "autocast_bfloat16")):
        per_round = [t["ms_per_step"] / m["ms_per_step"] for m, t in zip(tr_step[p], torch_tr[v])]
        if per_round:
            print(f"round by round, mixtrain {p} vs PyTorch {v}: " + ", ".join(f"{x:.2f}x" for x in per_round))
    for p in ("mixed_float16", "mixed_bfloat16"):
        per_round = [f["ms_per_step"] / m["ms_per_step"] for f, m in zip(tr_step["float32"], tr_step[p])]
        print(f"round by round, mixtrain {p} vs mixtrain float32: " + ", ".join(f"{x:.2f}x" for x in per_round))

lm = loads("lm512_step_mixed_bfloat16")
torch_lm = [r for r in jsonl("torch_lm512_step") if r["what"] == "peer_torch_step"]
if lm:
    m_ms = min(r["ms_per_step"] for r in lm)
    t_ms = min(r["ms_per_step"] for r in torch_lm) if torch_lm else None
    shape = lm[0]
    print()
    print(f"Training step, transformer at context {shape['context']} (V {shape['vocabulary']}, D {shape['width']},"
          f" {shape['layers']} layers, {shape['heads']} heads, {shape['weights']:,} weights), batch"
          f" {shape['batch_size']}, AdamW with clipping (median ms/step, lowest over the rounds)")
    if torch_lm and {r["weights"] for r in torch_lm} != {shape["weights"]}:
        print("WARNING: PyTorch's transformer does not hold as many weights as mixtrain's: not the same model")
    print("| mixtrain mixed_bfloat16 ms | PyTorch autocast bfloat16 ms | mixtrain speedup | target 1.5x met |")
    print("| ---: | ---: | ---: | --- |")
    print(f"| {m_ms:.0f} | {f'{t_ms:.0f}' if t_ms else 'not run'} | {ratio(t_ms, m_ms) if t_ms else '-'} |"
          f" {('yes' if t_ms / m_ms >= 1.5 else 'no') if t_ms else '-'} |")
    per_round = [t["ms_per_step"] / m["ms_per_step"] for m, t in zip(lm, torch_lm)]
    if per_round:
        print("round by round, mixtrain mixed_bfloat16 vs PyTorch autocast bfloat16: " +
              ", ".join(f"{x:.2f}x" for x in per_round))

if not (mix or step):
    sys.exit(0)  # the targets below are GEMM and MLP-step targets
print()
print("Targets")
print("| target | measured | met |")
print("| --- | --- | --- |")
sizes = sorted({n for n, _ in mix})
def row(name, values, goal, unit="x"):
    if not values:
        print(f"| {name} | not measured | - |")
        return
    fmt = (lambda v: f"{v:.0f}%") if unit == "%" else (lambda v: f"{v:.2f}x")
    shown = ", ".join(fmt(v) for v in values)
    print(f"| {name} | {shown} | {'yes' if min(values) >= goal else 'no'} |")
row("float32 GEMM >= 75% of fp32 FMA peak (n = " + "/".join(map(str, sizes)) + ")",
    [100 * mix[(n, "float32")] / fp32_peak for n in sizes] if fp32_peak else [], 75, "%")
big = [n for n in sizes if n >= 1024]
def peer_ratios(table):
    out = []
    for n in big:
        g, _ = peer_gflops(table, (n, "bfloat16"))
        if g:
            out.append(mix[(n, "bfloat16")] / g)
    return out
row("bfloat16 GEMM >= 1.2x oneDNN (n = " + "/".join(map(str, big)) + ")", peer_ratios(dnnl), 1.2)
row("bfloat16 GEMM >= 1.2x PyTorch (n = " + "/".join(map(str, big)) + ")", peer_ratios(torch_mm), 1.2)
row("bfloat16 GEMM >= 5x float32 (n = " + "/".join(map(str, big)) + ")",
    [mix[(n, "bfloat16")] / mix[(n, "float32")] for n in big], 5.0)
row("float16 GEMM >= 1.8x float32", [mix[(n, "float16")] / mix[(n, "float32")] for n in sizes], 1.8)
bf = torch_step.get("autocast_bfloat16")
mlp_ratio = lambda num, p: [num / step[p]["ms_per_step"]] if num and p in step else []
row("step mixed_bfloat16 >= 2x PyTorch autocast bf16", mlp_ratio(bf["ms_per_step"] if bf else None, "mixed_bfloat16"),
    2.0)
row("step mixed_bfloat16 >= 2.5x mixtrain float32", mlp_ratio(f32_ms, "mixed_bfloat16"), 2.5)
row("step mixed_float16 >= 1.5x mixtrain float32", mlp_ratio(f32_ms, "mixed_float16"), 1.5)
EOF

if [[ -n "$out" ]]; then
  mkdir -p "$out"
  cp "$work"/*.json "$work"/*.jsonl "$out"/ 2>/dev/null || true
  echo "raw results in $out"
fi
