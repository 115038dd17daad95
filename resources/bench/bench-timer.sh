#!/usr/bin/env bash
# Runs the `timer` crate's criterion benchmarks, prints every median, and ends with one line:
#   timer-bench: enqueue_cancel_ns=<median> timerfd_arm_disarm_ns=<median> idle_cycle_ns=<median> central_contended_ns=<median>
# Medians are read from criterion's target/criterion/<bench>/new/estimates.json.
#   enqueue_cancel_ns      arm + cancel of a pinned timer on the local TimerBase
#   timerfd_arm_disarm_ns  timerfd_settime arm + disarm (two syscalls), same run
#   idle_cycle_ns          deactivate + activate of one CPU in a 512-CPU hierarchy, uncontended
#   central_contended_ns   arm + cancel on the central model's shared queue, 2 threads
# Extra arguments go to `cargo bench` (e.g. a filter). Honours CARGO_TARGET_DIR.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-$root/target}"
crit="$target/criterion"

cargo bench -p timer --bench timer -- "$@" >&2

# median <bench id>: the median point estimate in ns, one decimal.
median() {
    local f="$crit/$1/new/estimates.json"
    if [[ ! -f "$f" ]]; then
        echo "NA"
        return
    fi
    sed -nE 's/.*"median":\{"confidence_interval":\{[^}]*\},"point_estimate":([0-9.eE+-]+).*/\1/p' "$f" |
        awk '{ printf "%.1f\n", $1 }'
}

echo "benchmark medians (ns):"
find "$crit" -path '*/new/estimates.json' | sort | while read -r f; do
    id="${f#"$crit"/}"
    id="${id%/new/estimates.json}"
    [[ "$id" == */report* ]] && continue
    printf '  %-40s %s\n' "$id" "$(median "$id")"
done

echo "timer-bench: enqueue_cancel_ns=$(median enqueue_cancel/pinned)" \
    "timerfd_arm_disarm_ns=$(median timerfd/arm_disarm)" \
    "idle_cycle_ns=$(median idle_cycle/uncontended/512)" \
    "central_contended_ns=$(median central/contended_2_threads)"
