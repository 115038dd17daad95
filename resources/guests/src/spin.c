/*
 * spin - a CPU-bound guest: every vCPU counts loop iterations for a wall-clock duration, with
 * interrupts enabled and no timer of its own, then the BSP reports the total throughput. Used
 * to see what lull's CPU quota and idle injection take away from a guest that always wants
 * to run.
 *
 * Parameters: ms=<duration, default 1000>; the vCPU count comes from the MP table / CPUID.
 * Prints:
 *   spin: <n> vCPU(s), <iterations> iterations in <ms> ms (<per_ms> per ms)
 *   spin: PASS
 * and exits 0.
 */
#include "rt.h"

static volatile u32 done_aps;
static volatile u64 ap_iterations[RT_MAX_CPUS];
static u64 ticks, start;

/* Count iterations until the TSC says the duration has passed. */
static u64 spin_until_end(void)
{
    u64 iterations = 0;
    sti();
    while (rdtsc() - start < ticks) {
        for (u32 i = 0; i < 100; i++)
            __asm__ volatile("" ::: "memory");
        iterations++;
    }
    cli();
    return iterations;
}

/* An AP spins alongside the BSP and records its count. */
static void ap_main(u32 cpu)
{
    ap_iterations[cpu] = spin_until_end();
    __atomic_add_fetch(&done_aps, 1, __ATOMIC_SEQ_CST);
}

/* Start the APs, spin, add up. */
int main(void)
{
    u64 ms = cmdline_u64("ms", 1000);
    u32 ncpus = smp_cpu_count();
    ticks = ms * rt_tsc_khz;
    start = rdtsc();
    u32 online = ncpus > 1 ? smp_start_aps(ncpus, ap_main, 5000) : 0;
    u64 total = spin_until_end();
    u64 end = rdtsc() + ns_to_tsc(5000000000ull);
    while (done_aps < online && rdtsc() < end)
        cpu_relax();
    if (done_aps != online)
        fail("%u of %u AP(s) finished", done_aps, online);
    for (u32 cpu = 1; cpu <= online; cpu++)
        total += ap_iterations[cpu];
    printf("spin: %u vCPU(s), %llu iterations in %llu ms (%llu per ms)\n", online + 1, total, ms,
           total / (ms ? ms : 1));
    printf("spin: PASS\n");
    return RT_EXIT_PASS;
}
