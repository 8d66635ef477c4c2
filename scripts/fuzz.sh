#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang, AddressSanitizer + UndefinedBehaviorSanitizer) and runs each for a
# bounded time from its seed corpus (fuzz/corpus/<target>/). Fails when any target crashes, hangs past the
# per-input timeout, goes past the memory limits (RSS, or one allocation), leaks, or trips a sanitizer; the input
# that did it is kept under out/fuzz/ and the tail of the log is printed.
#
#   bash scripts/fuzz.sh                         # every target, 45 s each
#   bash scripts/fuzz.sh --seconds 600 idx csv   # a longer run of two targets
#
# Options: --seconds N (per target, default 45), --rss-mb N (default 1024), --malloc-mb N (largest single
# allocation, default 256), --timeout N (seconds per input, default 10), --jobs N (targets at once, default nproc),
# --build-dir DIR (default build-sanitize: the sanitizer tests' build, scripts/sanitizer_build.sh), --no-build
# (run what is built).
# New inputs that reach new code go to out/fuzz/corpus/<target>/, not into the committed corpus.
set -euo pipefail
cd "$(dirname "$0")/.."

all_targets=(idx csv text safetensors checkpoint args)
# Targets whose findings are printed but do not fail the run (space-separated names), for a reader with a known
# defect whose fix is pending elsewhere; empty: every finding fails.
read -r -a report_only <<<"${MIXTRAIN_FUZZ_REPORT_ONLY:-}"

seconds=45 rss_mb=1024 malloc_mb=256 timeout=10 jobs=$(nproc) build_dir=build-sanitize build=1 targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --rss-mb) rss_mb=$2; shift 2 ;;
    --malloc-mb) malloc_mb=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
  [ -d "fuzz/corpus/$t" ] || { echo "fuzz.sh: no target '$t' (targets: ${all_targets[*]})" >&2; exit 2; }
done

if [ "$build" = 1 ]; then
  # Only what the fuzz targets need is built; where scripts/sanitize.sh built first, that is the targets' own files.
  . scripts/sanitizer_build.sh
  configure_sanitizer_build "$build_dir"
  # shellcheck disable=SC2046  # one target name per word
  ninja -C "$build_dir" -j "$(nproc)" $(printf 'fuzz_%s ' "${targets[@]}")
fi

out=out/fuzz
mkdir -p "$out/corpus"
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:abort_on_error=1:symbolize=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
# Each run's input files (the readers take paths) go to a directory of its own, in memory where there is a tmpfs,
# removed at the end.
export TMPDIR
if [ -d /dev/shm ] && [ -w /dev/shm ]; then TMPDIR=$(mktemp -d -p /dev/shm); else TMPDIR=$(mktemp -d); fi
trap 'rm -rf "$TMPDIR"' EXIT

run_target() {
  local t=$1
  mkdir -p "$out/corpus/$t"
  # The first directory receives new inputs; the committed seeds (regression inputs included) are read first.
  "$build_dir/fuzz/fuzz_$t" -max_total_time="$seconds" -rss_limit_mb="$rss_mb" -malloc_limit_mb="$malloc_mb" \
    -timeout="$timeout" -print_final_stats=1 -artifact_prefix="$out/$t-" "$out/corpus/$t" "fuzz/corpus/$t" \
    >"$out/$t.log" 2>&1
}

declare -A pid_of
failed=() reported=()
finish() {
  local t=$1
  if wait "${pid_of[$t]}"; then
    echo "fuzz $t: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$out/$t.log" | grep -o '[0-9]*$') inputs" \
      "in ${seconds} s, no finding"
  else
    echo "fuzz $t: FAILED; log $out/$t.log, input $(ls "$out/$t-"* 2>/dev/null | head -1):"
    grep -E 'ERROR|SUMMARY|runtime error|==[0-9]+==|fuzz:' "$out/$t.log" | head -20 || tail -20 "$out/$t.log"
    if [[ " ${report_only[*]} " == *" $t "* ]]; then reported+=("$t"); else failed+=("$t"); fi
  fi
}

running=()
for t in "${targets[@]}"; do
  rm -f "$out/$t-"*
  run_target "$t" &
  pid_of[$t]=$!
  running+=("$t")
  if [ ${#running[@]} -ge "$jobs" ]; then
    finish "${running[0]}"
    running=("${running[@]:1}")
  fi
done
for t in "${running[@]}"; do finish "$t"; done

[ ${#reported[@]} -eq 0 ] || echo "fuzz.sh: findings in ${reported[*]} reported, not failing the run (report-only)"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: ${targets[*]}: no findings (${seconds} s each)"
