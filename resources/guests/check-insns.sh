#!/usr/bin/env bash
# check-insns.sh ELF... : fail (exit 1) if a guest contains an instruction listed in
# forbidden-insns.txt, printing each offending line. 32-bit code is disassembled as i386,
# the AP trampoline (.text16, up to rt_ap_trampoline_data) as i8086.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rules=${FORBIDDEN_INSNS:-$here/forbidden-insns.txt}

# Disassemble one ELF's code as "FILE<TAB>ADDR<TAB>MNEMONIC<TAB>OPERANDS" lines.
disasm() {
    local elf=$1
    objdump -d -w --no-show-raw-insn -m i386 -j .text "$elf"
    if objdump -h "$elf" | grep -q ' \.text16 '; then
        local start stop
        start=$(nm "$elf" | awk '$3 == "rt_ap_trampoline" { print $1 }')
        stop=$(nm "$elf" | awk '$3 == "rt_ap_trampoline_data" { print $1 }')
        objdump -d -w --no-show-raw-insn -m i8086 -j .text16 \
            --start-address=0x"$start" --stop-address=0x"$stop" "$elf"
    fi
}

status=0
for elf in "$@"; do
    if ! disasm "$elf" | awk -v file="$elf" -v rules="$rules" '
        BEGIN {
            n = 0
            while ((getline line < rules) > 0) {
                if (line ~ /^[ \t]*(#|$)/) continue
                split(line, f, /[ \t]+/)
                kind[n] = f[1]; re[n] = f[2]; n++
            }
            bad = 0
        }
        /^ *[0-9a-f]+:\t/ {
            addr = $1; sub(/:$/, "", addr)
            text = $0; sub(/^ *[0-9a-f]+:\t/, "", text)
            # strip prefixes
            while (match(text, /^(lock|rep|repz|repnz|repe|repne|data16|data32|addr16|addr32|cs|ds|es|ss|fs|gs|notrack|bnd) +/))
                text = substr(text, RLENGTH + 1)
            mn = text; sub(/ .*/, "", mn)
            ops = text; if (!sub(/^[^ ]+ +/, "", ops)) ops = ""
            sub(/ *#.*/, "", ops)
            for (i = 0; i < n; i++) {
                hit = (kind[i] == "mnemonic") ? (mn ~ ("^(" re[i] ")$")) : (ops ~ re[i])
                if (hit) {
                    printf "%s: forbidden instruction at 0x%s: %s   (rule: %s %s)\n", file, addr, text, kind[i], re[i]
                    bad = 1
                    break
                }
            }
        }
        END { exit bad }'; then
        status=1
    fi
done
exit $status
