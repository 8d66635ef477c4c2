#!/usr/bin/env bash
# The hostile case of per-tensor FP8 scaling, end to end (--mlp-outliers STEP, a test switch; docs/FP8.md): from
# that update on a few of the transformer's MLP hidden channels are 2^14 times larger, the inverse folded into
# mlp_out. Checked: float32 and mixed_bfloat16 train bit for bit as without the switch (the fold is exact there);
# right after the jump, inspect shows mlp_out's FP8 input saturating under the delayed recipe (its amax history has
# not seen the jump) and not under current scaling, and no other layer's; the jump lands at the same update in a
# resumed run; with a ramp (STEP:LOG2:RISE) delayed saturates on each of the ramp's updates and current on none, and
# compare --recover moves only the mlp_out layers to mixed_bfloat16 and ends inside float32's band; the switch is
# refused for other models and blocks and malformed values (exit status 2). Small models.
set -u
bin="$1"
source "$(dirname "$0")/lib.sh"
start_checks
python3 - "$tmp/text.txt" <<'PY'
import random, sys
random.seed(7)
words = "the whale sea ship captain white harpoon deck sail storm crew ocean night wind".split()
with open(sys.argv[1], "w") as f:
    f.write(" ".join(random.choice(words) for _ in range(1300)))
PY
tiny=(--model transformer --data "text:$tmp/text.txt" --context 16 --width 32 --layers 1 --heads 2 --batch-size 16 --seed 2)
run() {  # run NAME FLAGS...: trains, writes $tmp/NAME.json
  local name="$1"; shift
  "$bin" train "${tiny[@]}" --json "$tmp/$name.json" "$@" >"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; fail "$name: exit status $?"; }
}
# One bfloat16 GEMM method for every run, as the runs compared bit for bit below need: each process otherwise picks
# the fastest by timing it, and on a loaded machine two processes can pick different ones (whose sums round
# differently).
export MIXTRAIN_BF16_GEMM=widen
# The fold is exact wherever the product is not quantized: the same step losses, bit for bit.
for p in float32 mixed_bfloat16; do
  run "$p" --policy "$p" --steps 8 --eval-every 8
  run "${p}_jump" --policy "$p" --steps 8 --eval-every 8 --mlp-outliers 3
  run "${p}_jump20" --policy "$p" --steps 8 --eval-every 8 --mlp-outliers 3:20
  run "${p}_ramp" --policy "$p" --steps 8 --eval-every 8 --mlp-outliers 3:20:5
  python3 - "$tmp/$p.json" "$tmp/${p}_jump.json" "$tmp/${p}_jump20.json" "$tmp/${p}_ramp.json" <<'PY' || fail "$p: the switch changed the training"
import json, sys
a, *others = (json.load(open(p)) for p in sys.argv[1:])
for b in others:
    assert a["step_loss"] == b["step_loss"] and a["epochs"][-1]["val_loss"] == b["epochs"][-1]["val_loss"], (a["step_loss"], b["step_loss"])
PY
done
# Under mixed_float8 the jump reaches the FP8 product; a run saved at update 6 and resumed jumps where the
# uninterrupted one does (the update count travels in the checkpoint; a constant rate, so the first 6 steps of a
# 6-step run are those of a 12-step one).
fp8=(--policy mixed_float8 --eval-every 6 --lr-schedule constant --warmup-steps 0)
run fp8 "${fp8[@]}" --steps 12
run fp8_jump "${fp8[@]}" --steps 12 --mlp-outliers 8
run fp8_half "${fp8[@]}" --steps 6 --mlp-outliers 8 --save "$tmp/ck.safetensors"
run fp8_resumed "${fp8[@]}" --steps 12 --mlp-outliers 8 --resume "$tmp/ck.safetensors"
python3 - "$tmp" <<'PY' || fail "mixed_float8 with the jump"
import json, sys
d = sys.argv[1]
plain, jump = json.load(open(d + "/fp8.json")), json.load(open(d + "/fp8_jump.json"))
# Step 9 is the first after 8 updates.
assert plain["step_loss"][:8] == jump["step_loss"][:8], "the steps before the jump differ"
assert plain["step_loss"][8] != jump["step_loss"][8], "the jump does not reach the FP8 product"
resumed = json.load(open(d + "/fp8_resumed.json"))
assert resumed["step_loss"] == jump["step_loss"], (resumed["step_loss"], jump["step_loss"])
PY
# Right after the jump: an epoch of training (its update count from a float32 run), then inspect.
run count --policy float32 --epochs 1
updates=$(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['step_loss']))" "$tmp/count.json")
for recipe in delayed current; do
  "$bin" inspect "${tiny[@]}" --policy mixed_float8 --fp8-recipe "$recipe" --epochs 1 --mlp-outliers "$updates" \
    --json "$tmp/inspect_$recipe.json" >"$tmp/inspect_$recipe.log" 2>&1 || { cat "$tmp/inspect_$recipe.log"; fail "inspect $recipe"; }
done
python3 - "$tmp" <<'PY' || fail "inspect after the jump"
import json, sys
d = sys.argv[1]
def inputs(recipe):
    layers = json.load(open(f"{d}/inspect_{recipe}.json"))["layers"]
    return {l["layer"]: r for l in layers for r in l["fp8"] if r["tensor"] == "input"}
delayed, current = inputs("delayed"), inputs("current")
out = "block_1/mlp_out"
# 1 in 64 of the 128 hidden channels: 1.56% of the input, all of it above the stale scale's range.
assert delayed[out]["saturated_fraction"] >= 0.01, delayed[out]
assert current[out]["saturated_fraction"] == 0 and current[out]["flushed_fraction"] > 0, current[out]
for name, r in list(delayed.items()) + list(current.items()):
    assert name == out or r["saturated_fraction"] == 0, (name, r)
print("after the jump: delayed saturates", delayed[out]["saturated_fraction"], "current saturates 0, flushes",
      current[out]["flushed_fraction"])
PY
# The ramp (STEP:LOG2:RISE): the factor climbs by 2^RISE an update, so a delayed scale, which learns an update's amax
# at the next one, is behind on each update of the ramp. Inspected right after the ramp's first, second and third
# updates (the ramp starts 0, 1 or 2 updates before the end of the epoch inspect trains): delayed saturates mlp_out's
# input past the FP8 rung's 1% on each, current on none (it flushes instead: one scale for values 2^15 apart).
# A 400-word text (32 updates an epoch) keeps the six inspections short.
python3 - "$tmp/short.txt" <<'PY'
import random, sys
random.seed(7)
words = "the whale sea ship captain white harpoon deck sail storm crew ocean night wind".split()
with open(sys.argv[1], "w") as f:
    f.write(" ".join(random.choice(words) for _ in range(400)))
PY
short=(--model transformer --data "text:$tmp/short.txt" --context 16 --width 32 --layers 1 --heads 2 --batch-size 16
       --seed 2)
"$bin" train "${short[@]}" --policy float32 --epochs 1 --json "$tmp/short_count.json" >"$tmp/short_count.log" 2>&1 \
  || { cat "$tmp/short_count.log"; fail "short: exit status $?"; }
short_updates=$(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['step_loss']))" "$tmp/short_count.json")
for k in 0 1 2; do
  for recipe in delayed current; do
    "$bin" inspect "${short[@]}" --policy mixed_float8 --fp8-recipe "$recipe" --epochs 1 \
      --mlp-outliers "$((short_updates - k)):15:5" --json "$tmp/ramp_${recipe}_$k.json" \
      >"$tmp/ramp_$recipe.log" 2>&1 || { cat "$tmp/ramp_$recipe.log"; fail "inspect the ramp, $recipe"; }
  done
done
python3 - "$tmp" <<'PY' || fail "inspect on the ramp"
import json, sys
d = sys.argv[1]
def mlp_out(recipe, k):
    layers = json.load(open(f"{d}/ramp_{recipe}_{k}.json"))["layers"]
    return [r for l in layers if l["layer"] == "block_1/mlp_out" for r in l["fp8"] if r["tensor"] == "input"][0]
for k in range(3):
    delayed, current = mlp_out("delayed", k), mlp_out("current", k)
    print(f"ramp update {k + 1}: delayed saturates {delayed['saturated_fraction']:.4f}, current saturates "
          f"{current['saturated_fraction']:.4f} and flushes {current['flushed_fraction']:.4f}")
    assert delayed["saturated_fraction"] >= 0.01, (k, delayed)
    assert current["saturated_fraction"] == 0, (k, current)
PY
# compare --recover under the ramp, on the first 200,000 characters of Moby Dick: the FP8 rung sees mlp_out's input
# saturate on three steps in a row and moves the two blocks' mlp_out, and nothing else, to mixed_bfloat16 (the
# report's final layer policies); the run ends judged inside float32's band. Under current scaling the same run
# guarded by the ladder saturates nothing and nothing moves.
require_moby_dick
head -c 200000 "$(moby_dick_path)" >"$tmp/moby.txt"
moby=(--model transformer --data "text:$tmp/moby.txt" --context 32 --width 32 --layers 2 --heads 2 --batch-size 16
      --seed 3 --steps 300 --eval-every 100 --mlp-outliers 100:15:5)
"$bin" compare "${moby[@]}" --policies float32,mixed_float8 --recover --baseline-seeds 2 --out "$tmp/compare" \
  >"$tmp/compare.log" 2>&1 || { tail -20 "$tmp/compare.log"; fail "compare --recover on the ramp"; }
"$bin" train "${moby[@]}" --policy mixed_float8 --fp8-recipe current --recover --json "$tmp/ramp_current.json" \
  >"$tmp/ramp_current.log" 2>&1 || { tail -20 "$tmp/ramp_current.log"; fail "train --recover on the ramp, current"; }
python3 - "$tmp" <<'PY' || fail "compare --recover on the ramp"
import json, sys
d = sys.argv[1]
fp8 = json.load(open(d + "/compare/report.json"))["policies"]["mixed_float8"]
acts = [(e["action"], e.get("layers", [])) for e in fp8["recovery"]]
print("recovery:", acts)
print("mixed_float8:", fp8["numerics_verdict"], "-", fp8["verdict_reason"])
out = ["block_1/mlp_out", "block_2/mlp_out"]
assert [a for a, _ in acts] == ["layers_to_bfloat16", "rollback"], acts
assert sorted(acts[0][1]) == out, acts
assert "steps in a row" in fp8["recovery"][0]["reason"], fp8["recovery"][0]
current = json.load(open(d + "/ramp_current.json"))
assert current["recovery"] == [], current["recovery"]
# The unguarded policies (as built: the float8 layers mixed_float8, the logits float32) against the recovered run's.
built = current["layer_policies"]
assert all(built[name] == "mixed_float8" for name in out), built
for name, policy in fp8["layer_policies"].items():
    assert policy == ("mixed_bfloat16" if name in out else built[name]), (name, policy, built[name])
# The numerics verdict: inside float32's band (the verdict itself also weighs speed, which FP8 lacks on a CPU).
assert fp8["numerics_verdict"] == "tracks", (fp8["numerics_verdict"], fp8["verdict_reason"])
PY
expect_refusal() {  # expect_refusal PATTERN FLAGS...
  local pattern="$1"; shift
  "$bin" train --epochs 1 "$@" >"$tmp/out" 2>"$tmp/err"
  local status=$?
  [ "$status" -eq 2 ] || fail "$*: exit status $status, expected 2"
  grep -q -- "$pattern" "$tmp/err" || { cat "$tmp/err"; fail "$*: the message does not say '$pattern'"; }
}
expect_refusal "applies to --model transformer only" --model mlp --data "$tmp/text.csv" --mlp-outliers 3
expect_refusal "needs the Dense pair of --mlp gelu\|with --mlp gelu only" "${tiny[@]}" --mlp swiglu --mlp-outliers 3
expect_refusal "must be a step >= 0" "${tiny[@]}" --mlp-outliers -1
expect_refusal "LOG2 must be an integer from 1 to 24" "${tiny[@]}" --mlp-outliers 3:25
expect_refusal "LOG2 must be an integer from 1 to 24" "${tiny[@]}" --mlp-outliers 3:x
expect_refusal "LOG2 must be an integer from 1 to 24" "${tiny[@]}" --mlp-outliers 3::2
expect_refusal "RISE must be an integer from 1 to LOG2" "${tiny[@]}" --mlp-outliers 3:14:15
expect_refusal "RISE must be an integer from 1 to LOG2" "${tiny[@]}" --mlp-outliers 3:14:0
expect_refusal "RISE must be an integer from 1 to LOG2" "${tiny[@]}" --mlp-outliers 3:14:x
expect_refusal "RISE must be an integer from 1 to LOG2" "${tiny[@]}" --mlp-outliers 3:14:7:1
exit "$fails"
