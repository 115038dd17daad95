/*
 * smp-timer - every CPU runs its own LAPIC timer at the same time and halts between expiries.
 *
 * This is the per-vCPU ("pinned") timer case with several halted vCPUs: the BSP starts the
 * APs, all CPUs meet at a barrier, then each CPU `count` times arms its timer
 * (TSC-deadline if offered, else one-shot with divide 1) for its own period
 * ns + cpu_index * spread_ns (so expiries do not coincide), waits with `sti; hlt` and records
 * the lateness (TSC at the top of the handler - expected expiry). No CPU prints while
 * measuring; afterwards the BSP prints min/p50/max per CPU and over all CPUs.
 * FAIL if an AP does not finish within timeout_ms in total, or an interrupt is more than
 * early_ns early. Each CPU waits in HLT with its own timer as the only wake-up source, so a
 * timer interrupt lost on the BSP is caught only by the runner's timeout.
 * Parameters: cpus=N count=5 (max 64) ns=1000000 spread_ns=100000 timeout_ms=5000
 *             early_ns=10000 mode=deadline|oneshot
 */
#include "rt.h"

#define TIMER_VECTOR 0x40
#define SPURIOUS_VECTOR 0xff
#define MAX_SAMPLES 64

static volatile u32 ready, go, done;
static volatile u8 index_of_apic[256];
static volatile u32 irq_count[RT_MAX_CPUS];
static volatile u64 irq_tsc[RT_MAX_CPUS];
static s64 late[RT_MAX_CPUS][MAX_SAMPLES];
static volatile u32 samples[RT_MAX_CPUS];

static u32 count, use_deadline;
static u64 period_ns, spread_ns, early_ns;

/* Timer interrupt (any CPU): timestamp first, then count for this CPU, EOI. */
static void timer_irq(struct trap_frame *f)
{
    u64 now = rdtsc();
    u32 idx = index_of_apic[lapic_id()];
    irq_tsc[idx] = now;
    irq_count[idx]++;
    lapic_eoi();
}

/* Spurious-vector interrupt: report it, no EOI. */
static void spurious_irq(struct trap_frame *f) { printf("smp-timer: spurious interrupt\n"); }

/* One CPU's measurement loop: arm, halt until the interrupt, record the lateness. */
static void run_timers(u32 idx)
{
    u64 ticks = ns_to_tsc(period_ns + idx * spread_ns);
    u32 init = (u32)((period_ns + idx * spread_ns) * rt_bus_khz / 1000000);
    if (use_deadline) {
        xapic_write(APIC_LVT_TIMER, TIMER_VECTOR | LVT_TIMER_TSC_DEADLINE);
    } else {
        xapic_write(APIC_TIMER_DIV, 0xb); /* divide by 1 */
        xapic_write(APIC_LVT_TIMER, TIMER_VECTOR | LVT_TIMER_ONESHOT);
        ticks = ns_to_tsc((u64)init * 1000000 / rt_bus_khz);
    }
    for (u32 i = 0; i < count; i++) {
        u32 before = irq_count[idx];
        cli();
        u64 expected = rdtsc();
        if (use_deadline) {
            expected += ticks;
            wrmsr(MSR_TSC_DEADLINE, expected);
        } else {
            xapic_write(APIC_TIMER_INIT, init);
            expected += ticks;
        }
        while (irq_count[idx] == before) {
            sti_hlt();
            cli();
        }
        late[idx][i] = tsc_to_ns((s64)(irq_tsc[idx] - expected));
        samples[idx] = i + 1;
    }
    xapic_write(APIC_LVT_TIMER, LVT_MASKED);
}

/* AP body: enable the LAPIC, meet at the barrier, measure, report done. */
static void ap_main(u32 index)
{
    lapic_enable(SPURIOUS_VECTOR);
    index_of_apic[lapic_id()] = (u8)index;
    __atomic_fetch_add(&ready, 1, __ATOMIC_SEQ_CST);
    while (!go)
        cpu_relax();
    run_timers(index);
    __atomic_fetch_add(&done, 1, __ATOMIC_SEQ_CST);
}

/* Start the APs, run everyone's timers, print per-CPU and overall lateness. */
int main(void)
{
    char mode[12] = "deadline";
    u32 ncpus = smp_cpu_count();
    count = (u32)cmdline_u64("count", 5);
    period_ns = cmdline_u64("ns", 1000000);
    spread_ns = cmdline_u64("spread_ns", 100000);
    early_ns = cmdline_u64("early_ns", 10000);
    u64 timeout_ms = cmdline_u64("timeout_ms", 5000);
    cmdline_str("mode", mode, sizeof(mode));
    use_deadline = strncmp(mode, "oneshot", 8) != 0;
    if (use_deadline && !cpu_has_tsc_deadline()) {
        printf("smp-timer: TSC-deadline not offered (CPUID.1:ECX[24] = 0): using one-shot\n");
        use_deadline = 0;
    }
    if (count == 0 || count > MAX_SAMPLES)
        fail("count=%u: must be 1..%u", count, MAX_SAMPLES);
    if (period_ns == 0)
        fail("ns=0: the period must be positive");
    if (ncpus > RT_MAX_CPUS)
        ncpus = RT_MAX_CPUS;

    rt_set_irq_handler(TIMER_VECTOR, timer_irq);
    rt_set_irq_handler(SPURIOUS_VECTOR, spurious_irq);
    lapic_enable(SPURIOUS_VECTOR);
    index_of_apic[lapic_id()] = 0;
    printf("smp-timer: %u CPUs, %s, period %llu ns + cpu * %llu ns, count %u\n", ncpus,
           use_deadline ? "tsc-deadline" : "one-shot div1", period_ns, spread_ns, count);

    if (ncpus > 1) {
        u32 online = smp_start_aps(ncpus, ap_main, 5000);
        u64 end = rdtsc() + ns_to_tsc(5000000000ull);
        while (ready < online && rdtsc() < end)
            cpu_relax();
        if (ready != ncpus - 1)
            fail("%u of %u AP(s) came up", ready, ncpus - 1);
    }
    go = 1;
    run_timers(0);
    u64 end = rdtsc() + ns_to_tsc(timeout_ms * 1000000);
    while (done < ncpus - 1 && rdtsc() < end)
        cpu_relax();
    if (done != ncpus - 1) {
        for (u32 j = 1; j < ncpus; j++)
            if (samples[j] != count)
                printf("smp-timer: cpu %u: %u of %u timer interrupts\n", j, samples[j], count);
        fail("%u of %u AP(s) finished within %llu ms", done, ncpus - 1, timeout_ms);
    }

    s64 all[RT_MAX_CPUS * MAX_SAMPLES];
    u32 n = 0;
    for (u32 j = 0; j < ncpus; j++) {
        for (u32 i = 0; i < count; i++) {
            if (late[j][i] < -(s64)early_ns)
                fail("cpu %u #%u: interrupt %lld ns early (tolerance %llu ns)", j, i,
                     -late[j][i], early_ns);
            all[n++] = late[j][i];
        }
        sort_s64(late[j], count);
        printf("smp-timer: cpu %u: n=%u lateness ns min %lld p50 %lld max %lld\n", j, count,
               late[j][0], late[j][count / 2], late[j][count - 1]);
    }
    sort_s64(all, n);
    printf("smp-timer: all: n=%u lateness ns min %lld p50 %lld max %lld\n", n, all[0],
           all[n / 2], all[n - 1]);
    printf("smp-timer: PASS\n");
    return RT_EXIT_PASS;
}
