# Shared by the end-to-end scripts (sourced): where the setup puts Moby Dick, and the rendered-report checks.

# start_checks: a scratch directory $tmp, removed when the script exits, and fail MESSAGE, which prints the
# message and counts it in $fails (the script ends with `exit "$fails"`).
start_checks() {
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  fails=0
}
fail() { echo "FAIL: $*"; fails=$((fails+1)); }

# Where scripts/setup.sh installs Moby Dick (the CLI's --data moby-dick reads the same place).
moby_dick_path() { echo "${MIXTRAIN_DATA_DIR:-${XDG_DATA_HOME:-$HOME/.local/share}/mixtrain}/moby-dick.txt"; }
require_moby_dick() {
  if [ ! -s "$(moby_dick_path)" ]; then
    echo "Moby Dick is not installed at $(moby_dick_path) (run scripts/setup.sh)"; exit 1
  fi
}

# render_report HTML DOM SCRATCH: writes the page as headless Chromium renders it into DOM. Without Chromium
# the calling script ends: as a skip (status 0), or as a failure when MIXTRAIN_REQUIRE_CHROMIUM is set (CI).
render_report() {
  local html="$1" dom="$2" scratch="$3" chromium=${CHROMIUM:-/usr/bin/chromium}
  if [ ! -x "$chromium" ]; then
    if [ -n "${MIXTRAIN_REQUIRE_CHROMIUM:-}" ]; then echo "FAIL: $chromium not found"; exit 1; fi
    echo "SKIP: chromium not installed; $html not rendered"; exit 0
  fi
  timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$(mktemp -d "$scratch/profile.XXXXXX")" --dump-dom "file://$html" \
    >"$dom" 2>"$scratch/chromium.log"
}

# expect_curves DOM MIN POLICY...: each policy's curves are drawn in the rendered page (at least MIN polylines
# with points); exits the script with status 1 otherwise.
expect_curves() {
  local dom="$1" min="$2" p n
  shift 2
  for p in "$@"; do
    n=$(grep -o "<polyline class=\"series\" data-series=\"$p\"[^>]* points=\"[0-9][^\"]*\"" "$dom" | wc -l)
    [ "$n" -ge "$min" ] || { echo "FAIL: the curves of $p are not drawn in the rendered report ($n polylines)"; exit 1; }
    echo "ok: report.html draws $p ($n polyline(s))"
  done
}
