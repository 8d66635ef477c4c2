#!/usr/bin/env bash
# `mixtrain bench step --model transformer` on tiny shapes: one line and a JSON object per policy whose shapes,
# weight count (the architecture's, counted here by hand) and tokens/s agree with what was asked; bad flags
# exit 2 without writing the JSON. When PyTorch is importable, bench/peer_torch.py's transformer of the same
# shapes must hold the same number of weights (the two are the same architecture).
set -eu
bin="$1"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1

# V 11, T 8, D 16, L 2, heads 2 (head size 8), batch 3: odd sizes so that a shape mixed up shows in the count.
shape=(--vocabulary 11 --context 8 --width 16 --layers 2 --heads 2 --batch-size 3)
for policy in float32 mixed_float16 mixed_bfloat16; do
  "$bin" bench step --model transformer "${shape[@]}" --policy $policy --steps 3 --json "$tmp/$policy.json" \
    >"$tmp/$policy.out"
  cat "$tmp/$policy.out"
  for want in "transformer (V 11, T 8, D 16, L 2, heads 2," "batch 3, $policy, adamw" "ms/step" "tokens/s"; do
    grep -qF -- "$want" "$tmp/$policy.out" || { echo "FAIL: bench step output lacks '$want'"; exit 1; }
  done
done

python3 - "$tmp" <<'PY'
import json, math, sys
V, T, D, L, H, B = 11, 8, 16, 2, 2, 3
# Token and position embeddings; per block two LayerNorms (gamma, beta), q/k/v/output projections with bias,
# Dense(4D) and Dense(D) with bias; the final LayerNorm and the logits Dense(V) with bias.
block = 2 * 2 * D + 4 * (D * D + D) + (D * 4 * D + 4 * D) + (4 * D * D + D)
weights = V * D + T * D + L * block + 2 * D + D * V + V
for policy in ("float32", "mixed_float16", "mixed_bfloat16"):
    r = json.load(open(f"{sys.argv[1]}/{policy}.json"))
    want = {"model": "transformer", "policy": policy, "optimizer": "adamw", "vocabulary": V, "context": T,
            "width": D, "layers": L, "heads": H, "batch_size": B, "steps": 3, "weights": weights}
    for k, v in want.items():
        assert r[k] == v, (policy, k, r[k], v)
    ms = r["ms_per_step"]
    assert math.isfinite(ms) and ms > 0, (policy, ms)
    assert math.isclose(r["steps_per_second"], 1e3 / ms, rel_tol=1e-9), (policy, r)
    assert math.isclose(r["tokens_per_second"], B * T * 1e3 / ms, rel_tol=1e-9), (policy, r)
    print(f"{policy}: {weights} weights, {ms:.3f} ms/step, {r['tokens_per_second']:.0f} tokens/s")
PY

# --attention: the tiled kernel (the default) keeps a (B, heads, T) log-sum-exp for backward where the full one keeps
# the (B, heads, T, T) probabilities, so at T 160 (above one key tile, where the tiled kernel starts) its step peak is
# lower (2 layers x 3 x 2 x 160 x 160 bfloat16 probabilities and float32 logits scratch: hundreds of KiB).
for attention in tiled full; do
  "$bin" bench step --model transformer --vocabulary 11 --context 160 --width 16 --layers 2 --heads 2 --batch-size 3 \
    --policy mixed_bfloat16 --steps 2 --attention $attention --json "$tmp/attention_$attention.json" >/dev/null
done
python3 - "$tmp" <<'PY'
import json, sys
r = {a: json.load(open(f"{sys.argv[1]}/attention_{a}.json")) for a in ("tiled", "full")}
for a in r:
    assert r[a]["attention"] == a, r[a]
peak = {a: r[a]["step_peak_memory_bytes"] for a in r}
assert peak["tiled"] < peak["full"], peak
print(f"step peak at T 160: tiled {peak['tiled']} bytes, full {peak['full']} bytes")
PY
grep -qF '"attention": "tiled"' "$tmp/float32.json" || { echo "FAIL: the default attention is not tiled"; exit 1; }

expect_error() {  # expect_error MESSAGE ARGS...: exit status 2, MESSAGE on stderr, no JSON written
  local want="$1"; shift
  rm -f "$tmp/bad.json"
  set +e
  "$bin" bench step "$@" --json "$tmp/bad.json" >/dev/null 2>"$tmp/err"
  local rc=$?
  set -e
  [ $rc -eq 2 ] || { echo "FAIL: bench step $* exited $rc, expected 2"; cat "$tmp/err"; exit 1; }
  grep -qF -- "$want" "$tmp/err" || { echo "FAIL: bench step $*: stderr lacks '$want':"; cat "$tmp/err"; exit 1; }
  [ ! -e "$tmp/bad.json" ] || { echo "FAIL: bench step $* wrote its JSON"; exit 1; }
}
expect_error "--width applies to --model transformer only" --model cnn --width 16
expect_error "--vocabulary applies to --model transformer only" --model mlp --vocabulary 11
expect_error "--hidden does not apply to --model transformer" --model transformer --hidden 64
expect_error "--heads must be positive and divide --width 16" --model transformer --width 16 --heads 3
expect_error "--vocabulary must be an integer from 2" --model transformer --vocabulary 1
expect_error "--attention must be tiled or full, got 'flash'" --model transformer --attention flash
expect_error "--attention applies to --model transformer only" --model mlp --attention full

python_torch=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import torch' 2>/dev/null; then python_torch="$p"; break; fi
done
if [ -z "$python_torch" ]; then
  echo "PyTorch is not importable: the peer's weight count is not compared"
  exit 0
fi
for variant in float32 autocast_bfloat16; do
  "$python_torch" "$root/bench/peer_torch.py" step --model transformer --variant $variant --vocabulary 11 \
    --context 8 --width 16 --layers 2 --heads 2 --batch-size 3 --steps 2 --threads 1 >"$tmp/torch_$variant.jsonl"
done
python3 - "$tmp" <<'PY'
import json, math, sys
mixtrain = json.load(open(f"{sys.argv[1]}/float32.json"))["weights"]
for variant in ("float32", "autocast_bfloat16"):
    rows = [json.loads(l) for l in open(f"{sys.argv[1]}/torch_{variant}.jsonl") if l.startswith("{")]
    step = [r for r in rows if r["what"] == "peer_torch_step"]
    assert len(step) == 1, rows
    r = step[0]
    assert r["model"] == "transformer" and r["variant"] == variant, r
    assert r["weights"] == mixtrain, ("PyTorch and mixtrain transformers differ in size", r["weights"], mixtrain)
    assert math.isfinite(r["ms_per_step"]) and r["ms_per_step"] > 0, r
    print(f"PyTorch {variant}: {r['weights']} weights (as mixtrain), {r['ms_per_step']:.3f} ms/step")
PY
