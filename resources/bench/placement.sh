#!/usr/bin/env bash
# Wake placement on/off (`lull run --wake-placement`), measured both ways (docs/PERFORMANCE.md,
# "Wake placement"):
#   the case it is written for: VMS VMs of CPUS vCPUs of `idle-sim` whose vCPUs sleep MIX
#     (default 1 ms timers) between timer interrupts, all on this host's CPUs at once:
#     wake-ups that came on another host CPU per wake-up (lull's `wake_migrations` / `blocks`),
#     and the guests' own timer lateness p50/p99 (their histograms merged over all VMs);
#   the pathological case: the same, with a CPU-bound host task (`busy.c`, pinned nowhere)
#     running beside the VMs: its throughput (iterations per second over the VMs' lifetime),
#     also relative to what it gets alone.
# Each repetition runs every (competitor, mode) cell in an order that alternates between
# repetitions, so a drift of the host's load hits both modes alike.
#
# Usage: resources/bench/placement.sh [--lull PATH] [--kit DIR] [--vms N] [--cpus N]
#          [--duration-ms MS] [--mix MIX] [--reps N] [--modes off,cache-hot] [--json PATH]
# Prints one line per run on stderr and a table on stdout; --json writes every run and the
# medians per cell. Needs gcc, jq-free python3, a built lull (default target/release/lull)
# and the kit's guests (`make guests`).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
lull="$root/target/release/lull"
kit="${LULL_KIT:-$root/target/kit}"
vms=3
cpus=2
duration_ms=8000
mix="100:1"
reps=3
modes="off,cache-hot"
json=""
while [[ $# -gt 0 ]]; do
    case "$1" in
    --lull) lull="$2"; shift 2 ;;
    --kit) kit="$2"; shift 2 ;;
    --vms) vms="$2"; shift 2 ;;
    --cpus) cpus="$2"; shift 2 ;;
    --duration-ms) duration_ms="$2"; shift 2 ;;
    --mix) mix="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --modes) modes="$2"; shift 2 ;;
    --json) json="$2"; shift 2 ;;
    *) echo "placement.sh: unknown argument $1 (see the top of $0)" >&2; exit 2 ;;
    esac
done

guest="$kit/guests/idle-sim.elf"
[[ -x "$lull" ]] || { echo "placement.sh: no lull at $lull (cargo build --release)" >&2; exit 4; }
[[ -f "$guest" ]] || { echo "placement.sh: no $guest (make guests)" >&2; exit 4; }
work="$(mktemp -d /tmp/lull-placement.XXXXXX)"
echo "placement.sh: logs in $work" >&2
gcc -O2 -o "$work/busy" "$root/resources/bench/busy.c"
IFS=',' read -r -a mode_list <<<"$modes"

# busy_for SECONDS: the competitor alone, its line.
busy_for() {
    "$work/busy" >"$work/busy-alone.out" &
    local pid=$!
    sleep "$1"
    kill -TERM "$pid"
    wait "$pid"
    cat "$work/busy-alone.out"
}

# one_run TAG MODE COMPETE: VMS VMs in MODE (and the competitor if COMPETE=1); writes
# $work/TAG.* and prints one summary line.
one_run() {
    local tag="$1" mode="$2" compete="$3" pids=() busy_pid=""
    if [[ "$compete" == 1 ]]; then
        "$work/busy" >"$work/$tag.busy" &
        busy_pid=$!
    fi
    for ((v = 0; v < vms; v++)); do
        "$lull" run --kernel "$guest" --cpus "$cpus" --memory 64M \
            --wake-placement "$mode" \
            --cmdline "duration_ms=$duration_ms mix=$mix ipi_pct=0 seed=$((v + 1))" \
            --serial "file=$work/$tag-vm$v.console" --metrics "$work/$tag-vm$v.json" \
            2>"$work/$tag-vm$v.stderr" &
        pids+=($!)
    done
    local failed=0
    for p in "${pids[@]}"; do
        # idle-sim exits 0 through the test port: lull's status 1.
        wait "$p" || [[ $? == 1 ]] || failed=1
    done
    if [[ -n "$busy_pid" ]]; then
        kill -TERM "$busy_pid"
        wait "$busy_pid"
    fi
    echo "$tag mode=$mode compete=$compete failed=$failed"
}

load="$(cut -d' ' -f1-3 /proc/loadavg)"
echo "placement.sh: load average before: $load" >&2
runs=()
alone=()
for ((r = 0; r < reps; r++)); do
    alone+=("$(busy_for 3)")
    order=("${mode_list[@]}")
    if ((r % 2 == 1)); then
        order=()
        for ((i = ${#mode_list[@]} - 1; i >= 0; i--)); do order+=("${mode_list[i]}"); done
    fi
    for compete in 0 1; do
        for mode in "${order[@]}"; do
            tag="r$r-c$compete-$mode"
            line="$(one_run "$tag" "$mode" "$compete")"
            echo "placement.sh: $line" >&2
            runs+=("$tag")
        done
    done
done

python3 "$root/resources/bench/placement_summary.py" "$work" "$json" "$load" \
    "$vms" "$cpus" "$duration_ms" "$mix" "$reps" "${alone[*]}" "${runs[@]}"
