/*
 * smp-hello - bring up every CPU by INIT/SIPI and have each one report its APIC ID.
 *
 * The CPU count comes from `cpus=N` on the command line, else CPUID leaf 0xB (logical
 * processors at the core level), else CPUID.1:EBX[23:16], else 1. APIC IDs are assumed to be
 * 0..N-1 (lull's MP table; QEMU's default topology). The BSP starts the APs through the
 * runtime's real-mode trampoline (page 0x8000), waits up to timeout_ms (default 5000) and
 * passes when every AP has printed
 *   smp-hello: cpu <index> apic id <id> online
 * Parameters: cpus=N timeout_ms=5000
 */
#include "rt.h"

static volatile u32 reported;
static volatile u32 apic_ids[RT_MAX_CPUS];

/* Runs on each AP: report, then return to the runtime, which parks the CPU (CLI; HLT). */
static void ap_main(u32 index)
{
    u32 id = cpuid(1, 0).ebx >> 24;
    apic_ids[index] = id;
    printf("smp-hello: cpu %u apic id %u online\n", index, id);
    __atomic_fetch_add(&reported, 1, __ATOMIC_SEQ_CST);
}

/* Start all APs and check that each reported. */
int main(void)
{
    u32 n = smp_cpu_count();
    u32 timeout_ms = (u32)cmdline_u64("timeout_ms", 5000);
    if (n > RT_MAX_CPUS) {
        printf("smp-hello: %u CPUs, the runtime supports %u: starting %u\n", n, RT_MAX_CPUS,
               RT_MAX_CPUS);
        n = RT_MAX_CPUS;
    }
    lapic_enable(0xff);
    apic_ids[0] = lapic_id();
    printf("smp-hello: cpu 0 apic id %u is the BSP; starting %u AP(s)\n", apic_ids[0], n - 1);
    if (n == 1) {
        printf("smp-hello: PASS (1 CPU, nothing to start)\n");
        return RT_EXIT_PASS;
    }
    u64 t0 = rdtsc();
    u32 online = smp_start_aps(n, ap_main, timeout_ms);
    /* An AP counts as online before it prints: wait (bounded) for its report too. */
    u64 end = rdtsc() + ns_to_tsc((u64)timeout_ms * 1000000);
    while (reported < online && rdtsc() < end)
        cpu_relax();
    u64 took = (u64)tsc_to_ns((s64)(rdtsc() - t0)) / 1000;
    printf("smp-hello: %u of %u AP(s) reported in %llu us\n", reported, n - 1, took);
    if (reported != n - 1)
        fail("%u of %u AP(s) came up within %u ms", reported, n - 1, timeout_ms);
    printf("smp-hello: PASS\n");
    return RT_EXIT_PASS;
}
