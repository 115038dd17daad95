/*
 * spin - a CPU-bound guest: counts loop iterations for a wall-clock duration, with
 * interrupts enabled and no timer of its own, then reports its throughput. Used to see what
 * lull's CPU quota and idle injection take away from a guest that always wants to run.
 *
 * Parameters: ms=<duration, default 1000>.
 * Prints:
 *   spin: <iterations> iterations in <ms> ms (<per_ms> per ms)
 *   spin: PASS
 * and exits 0.
 */
#include "rt.h"

/* Count iterations until the TSC says `ms` have passed. */
int main(void)
{
    u64 ms = cmdline_u64("ms", 1000);
    u64 ticks = ms * rt_tsc_khz;
    u64 start = rdtsc();
    u64 iterations = 0;
    sti();
    while (rdtsc() - start < ticks) {
        for (u32 i = 0; i < 100; i++)
            __asm__ volatile("" ::: "memory");
        iterations++;
    }
    cli();
    printf("spin: %llu iterations in %llu ms (%llu per ms)\n", iterations, ms,
           iterations / (ms ? ms : 1));
    printf("spin: PASS\n");
    return RT_EXIT_PASS;
}
