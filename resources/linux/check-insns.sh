#!/usr/bin/env bash
# check-insns.sh OBJ... : fail (exit 1) if the x86-64 code of a kernel object contains an
# instruction that lull's guest rules forbid (resources/guests/forbidden-insns.txt: guest CPL0
# code is emulated on our hosts, see /work/shared/ENVIRONMENT.md). Every code section is
# disassembled in 64-bit mode (the guests' check-insns.sh reads 32-bit guests' .text only).
# Used by build.sh on lull's own kernel code (kernel/lull_workload.o), not on all of Linux,
# whose unreachable paths (BUG's ud2, alternatives' replacement code) would match.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rules=${FORBIDDEN_INSNS:-$here/../guests/forbidden-insns.txt}

status=0
for obj in "$@"; do
    # "MNEMONIC OPERANDS" per instruction: address, prefixes and objdump's comments removed.
    insns=$(objdump -d -w --no-show-raw-insn "$obj" |
        sed -nE 's/^ *[0-9a-f]+:\t//p' |
        sed -E ':p; s/^(lock|rep|repz|repnz|repe|repne|data16|data32|addr32|cs|ds|es|fs|gs|ss|notrack|bnd) +//; tp; s/ *#.*//')
    while read -r kind re; do
        case $kind in
        mnemonic) pattern="^($re)( |\$)" ;;
        operand) pattern="^[^ ]+ +.*$re" ;;
        *) continue ;; # comments and blank lines
        esac
        if hits=$(grep -E -- "$pattern" <<<"$insns"); then
            while IFS= read -r hit; do
                printf '%s: forbidden instruction: %s   (rule: %s %s)\n' "$obj" "$hit" "$kind" "$re" >&2
            done <<<"$hits"
            status=1
        fi
    done <"$rules"
done
exit $status
