#!/bin/sh
# Renders the sample comparison report in headless Chromium and checks what a reader would see:
# every policy's loss curve is in the DOM with points, float32's seed band, the recovery marker, the bar
# charts and the layers' dtypes are drawn, and a screenshot of the page is produced.
#   chromium_render_test.sh RENDER_SAMPLE_REPORT [SCREENSHOT_COPY.png]
# Without /usr/bin/chromium (or $CHROMIUM) the test passes with a message, unless
# MIXTRAIN_REQUIRE_CHROMIUM is set, in which case a missing browser is a failure.
set -eu

render=${1:?usage: chromium_render_test.sh RENDER_SAMPLE_REPORT [SCREENSHOT_COPY.png]}
copy_to=${2:-}
chromium=${CHROMIUM:-/usr/bin/chromium}

if [ ! -x "$chromium" ]; then
  if [ -n "${MIXTRAIN_REQUIRE_CHROMIUM:-}" ]; then
    echo "FAIL: $chromium not found, and MIXTRAIN_REQUIRE_CHROMIUM is set" >&2
    exit 1
  fi
  echo "SKIP: $chromium not found; install it (apt-get install chromium) to run this check"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*" >&2
  if [ -s "$work/chromium.log" ]; then
    echo "--- chromium output (last 20 lines, D-Bus noise left out) ---" >&2
    grep -v -i dbus "$work/chromium.log" | tail -n 20 >&2
  fi
  exit 1
}

"$render" "$work/report.html" > "$work/policies.txt" 2> "$work/table.txt" || fail "$render failed"
[ -s "$work/policies.txt" ] || fail "$render printed no policy names"

# Offline, no first-run UI, no background traffic: the page must render from the file alone.
browse() {
  timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$(mktemp -d "$work/profile.XXXXXX")" "$@" >> "$work/chromium.out" 2>> "$work/chromium.log"
}

browse --dump-dom "file://$work/report.html" || fail "chromium --dump-dom failed"
mv "$work/chromium.out" "$work/dom.html"
grep -q '<table class="results">' "$work/dom.html" || fail "the rendered DOM has no results table"
while IFS= read -r policy; do
  n=$(grep -o "<polyline class=\"series\" data-series=\"$policy\"[^>]* points=\"[0-9][^\"]*\"" "$work/dom.html" | wc -l)
  [ "$n" -ge 1 ] || fail "no polyline with points for policy '$policy' in the rendered DOM"
  echo "ok: $policy: $n polyline(s) with points"
done < "$work/policies.txt"

# float32's seed band shaded (polygons with points), the recovery marker, and the bar charts: steps/s, peak
# memory and the largest batch, one bar per policy each.
n=$(grep -o '<polygon class="band" data-band="[^"]*"[^>]* points="[0-9][^"]*"' "$work/dom.html" | wc -l)
[ "$n" -ge 2 ] || fail "float32's band is not drawn behind the loss and validation-loss curves ($n polygons)"
echo "ok: band: $n polygon(s)"
n=$(grep -o '<g class="marker" data-x="[0-9][^"]*"' "$work/dom.html" | wc -l)
[ "$n" -ge 1 ] || fail "no recovery marker on the loss chart"
grep -q 'class="marker-label"[^>]*>mixed_bfloat16: dense → float32' "$work/dom.html" || fail "the recovery marker has no label"
echo "ok: $n recovery marker(s)"
policies=$(wc -l < "$work/policies.txt")
n=$(grep -o '<rect class="bar" data-bar="[^"]*" x="[0-9][^"]*" y="[0-9][^"]*" width="[0-9][^"]*" height="[0-9.]*"' "$work/dom.html" | wc -l)
[ "$n" -ge $((3 * policies)) ] || fail "expected $((3 * policies)) bars (steps/s, memory, largest batch), found $n"
echo "ok: $n bars"
grep -q '<table class="dtypes">' "$work/dom.html" || fail "no table of the layers' compute dtypes"

browse --screenshot="$work/report.png" --window-size=1200,1400 --hide-scrollbars "file://$work/report.html" ||
  fail "chromium --screenshot failed"
[ -f "$work/report.png" ] || fail "no screenshot was written"
[ "$(head -c 8 "$work/report.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || fail "the screenshot is not a PNG"
size=$(wc -c < "$work/report.png")
[ "$size" -gt 30000 ] || fail "the screenshot is only $size bytes; the page probably rendered blank"
echo "ok: screenshot $size bytes"
if [ -n "$copy_to" ]; then
  cp "$work/report.png" "$copy_to"
  echo "screenshot copied to $copy_to"
fi
