#!/usr/bin/env bash
# Runs every cargo-fuzz target for N seconds each (default 10): fuzz/smoke.sh [N] [TARGET...]
# Needs the nightly toolchain and cargo-fuzz (installed here if missing).
set -euo pipefail
secs="${1:-10}"
shift || true
cd "$(dirname "$0")"
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install --locked cargo-fuzz
fi
if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
failed=()
for t in "${targets[@]}"; do
    echo "== fuzz $t for ${secs}s"
    mkdir -p "corpus/$t"
    # Seeds for decoders whose input random bytes rarely reach (JSON, for one).
    if [ -d "seeds/$t" ]; then
        cp -n "seeds/$t"/* "corpus/$t/"
    fi
    if ! cargo +nightly fuzz run "$t" -- -max_total_time="$secs" -rss_limit_mb=2048; then
        failed+=("$t")
    fi
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz targets that failed: ${failed[*]}" >&2
    exit 1
fi
echo "fuzzed ${#targets[@]} targets for ${secs}s each: no failure"
