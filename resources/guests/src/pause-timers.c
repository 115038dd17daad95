/*
 * pause-timers - every CPU runs its LAPIC timer in each mode in turn and counts each interrupt,
 * so that a pause, resume, snapshot or restore of the VM in the middle can be checked: every
 * timer fires, exactly once, and none early.
 *
 * The BSP starts the APs; all CPUs meet at a barrier, then each CPU runs three phases with
 * its own period ns + cpu_index * spread_ns:
 *   deadline  `count` TSC-deadline timers (skipped if CPUID does not offer TSC-deadline),
 *   oneshot   `count` one-shot timers (divide 1),
 *   periodic  one periodic timer for `count` ticks, then masked.
 * Each armed timer is waited for with `sti; hlt` until its interrupt; an interrupt that comes
 * more than early_ns before its expected time (for periodic tick i: start + i * period) is
 * early. Each CPU then waits quiet_ms with its timer masked: any interrupt after the last one
 * expected is a timer that fired twice. The guest fails if any timer was early, fired twice
 * (a count above the number armed), or never fired (an AP that does not finish within
 * timeout_ms; a lost timer on the BSP is caught by the runner's timeout).
 * Afterwards the BSP prints one line per CPU and the overall maximum lateness:
 *   pause-timers: cpu I: deadline N oneshot N periodic N max_late_ns L
 *   pause-timers: timers T max_late_ns L
 *   pause-timers: PASS
 * Parameters: count=20 (per phase) ns=10000000 spread_ns=1000000 early_ns=0 quiet_ms=50
 *             timeout_ms=60000
 */
#include "rt.h"

#define TIMER_VECTOR 0x40
#define SPURIOUS_VECTOR 0xff

enum { DEADLINE, ONESHOT, PERIODIC, PHASES };
static const char *phase_name[PHASES] = {"deadline", "oneshot", "periodic"};

struct cpu_state {
    volatile u32 irqs;     /* timer interrupts taken */
    volatile u64 irq_tsc;  /* TSC at the top of the last one */
    u32 fired[PHASES];     /* interrupts counted per phase */
    s64 max_late;          /* ns */
    s64 most_early;        /* ns: the earliest interrupt (negative lateness), 0 if none */
    u32 doubles;           /* interrupts beyond the one a wait expected */
};

static struct cpu_state cpu[RT_MAX_CPUS];
static volatile u8 index_of_apic[256];
static volatile u32 ready, go, done;
static u32 count, has_deadline;
static u64 period_ns, spread_ns, early_ns, quiet_ms;

static void timer_irq(struct trap_frame *f)
{
    u64 now = rdtsc();
    struct cpu_state *c = &cpu[index_of_apic[lapic_id()]];
    c->irq_tsc = now;
    c->irqs++;
    lapic_eoi();
}

static void spurious_irq(struct trap_frame *f) { printf("pause-timers: spurious interrupt\n"); }

/* Waits (interrupts off between checks) until interrupt number `want` has come. */
static void wait_for(struct cpu_state *c, u32 want)
{
    while (c->irqs < want) {
        sti_hlt();
        cli();
    }
    if (c->irqs > want)
        c->doubles += c->irqs - want;
}

/* Records the lateness of the interrupt just taken against `expected` (TSC). */
static void record(struct cpu_state *c, u32 phase, u64 expected)
{
    s64 late = tsc_to_ns((s64)(c->irq_tsc - expected));
    if (late > c->max_late)
        c->max_late = late;
    if (late < c->most_early)
        c->most_early = late;
    c->fired[phase]++;
}

static void run_phases(u32 idx)
{
    struct cpu_state *c = &cpu[idx];
    u64 ns = period_ns + idx * spread_ns;
    u32 init = (u32)(ns * rt_bus_khz / 1000000);
    u64 ticks = ns_to_tsc((u64)init * 1000000 / rt_bus_khz); /* the bus-clock period */
    u32 want = 0;
    cli();
    if (has_deadline) {
        xapic_write(APIC_LVT_TIMER, TIMER_VECTOR | LVT_TIMER_TSC_DEADLINE);
        for (u32 i = 0; i < count; i++) {
            u64 deadline = rdtsc() + ns_to_tsc(ns);
            wrmsr(MSR_TSC_DEADLINE, deadline);
            wait_for(c, ++want);
            record(c, DEADLINE, deadline);
        }
    }
    xapic_write(APIC_TIMER_DIV, 0xb); /* divide by 1 */
    xapic_write(APIC_LVT_TIMER, TIMER_VECTOR | LVT_TIMER_ONESHOT);
    for (u32 i = 0; i < count; i++) {
        u64 expected = rdtsc();
        xapic_write(APIC_TIMER_INIT, init);
        expected += ticks;
        wait_for(c, ++want);
        record(c, ONESHOT, expected);
    }
    xapic_write(APIC_LVT_TIMER, TIMER_VECTOR | LVT_TIMER_PERIODIC);
    u64 start = rdtsc();
    xapic_write(APIC_TIMER_INIT, init);
    for (u32 i = 1; i <= count; i++) {
        wait_for(c, ++want);
        record(c, PERIODIC, start + i * ticks);
    }
    xapic_write(APIC_LVT_TIMER, LVT_MASKED);
    xapic_write(APIC_TIMER_INIT, 0);
    /* A timer that fires twice shows up here, after the last one expected. */
    sti();
    delay_ns(quiet_ms * 1000000);
    cli();
    if (c->irqs > want)
        c->doubles += c->irqs - want;
}

static void ap_main(u32 index)
{
    lapic_enable(SPURIOUS_VECTOR);
    index_of_apic[lapic_id()] = (u8)index;
    __atomic_fetch_add(&ready, 1, __ATOMIC_SEQ_CST);
    while (!go)
        cpu_relax();
    run_phases(index);
    __atomic_fetch_add(&done, 1, __ATOMIC_SEQ_CST);
}

int main(void)
{
    u32 ncpus = smp_cpu_count();
    count = (u32)cmdline_u64("count", 20);
    period_ns = cmdline_u64("ns", 10000000);
    spread_ns = cmdline_u64("spread_ns", 1000000);
    early_ns = cmdline_u64("early_ns", 0);
    quiet_ms = cmdline_u64("quiet_ms", 50);
    u64 timeout_ms = cmdline_u64("timeout_ms", 60000);
    has_deadline = cpu_has_tsc_deadline();
    if (count == 0)
        fail("count=0: arm at least one timer per phase");
    if (period_ns == 0)
        fail("ns=0: the period must be positive");
    if (ncpus > RT_MAX_CPUS)
        ncpus = RT_MAX_CPUS;
    rt_set_irq_handler(TIMER_VECTOR, timer_irq);
    rt_set_irq_handler(SPURIOUS_VECTOR, spurious_irq);
    lapic_enable(SPURIOUS_VECTOR);
    index_of_apic[lapic_id()] = 0;
    printf("pause-timers: %u CPUs, %u timers per phase, period %llu ns + cpu * %llu ns%s\n",
           ncpus, count, period_ns, spread_ns, has_deadline ? "" : " (no TSC-deadline)");
    if (ncpus > 1) {
        u32 online = smp_start_aps(ncpus, ap_main, 5000);
        u64 end = rdtsc() + ns_to_tsc(5000000000ull);
        while (ready < online && rdtsc() < end)
            cpu_relax();
        if (ready != ncpus - 1)
            fail("%u of %u AP(s) came up", ready, ncpus - 1);
    }
    printf("pause-timers: running\n");
    go = 1;
    run_phases(0);
    u64 end = rdtsc() + ns_to_tsc(timeout_ms * 1000000);
    while (done < ncpus - 1 && rdtsc() < end)
        cpu_relax();
    if (done != ncpus - 1)
        fail("%u of %u AP(s) finished within %llu ms: a timer never fired", done, ncpus - 1,
             timeout_ms);

    u32 timers = 0;
    s64 max_late = 0;
    for (u32 j = 0; j < ncpus; j++) {
        struct cpu_state *c = &cpu[j];
        printf("pause-timers: cpu %u: %s %u %s %u %s %u max_late_ns %lld\n", j,
               phase_name[DEADLINE], c->fired[DEADLINE], phase_name[ONESHOT], c->fired[ONESHOT],
               phase_name[PERIODIC], c->fired[PERIODIC], c->max_late);
        if (c->most_early < -(s64)early_ns)
            fail("cpu %u: a timer interrupt came %lld ns early (tolerance %llu ns)", j,
                 -c->most_early, early_ns);
        if (c->doubles)
            fail("cpu %u: %u timer interrupt(s) more than timers armed", j, c->doubles);
        timers += c->fired[DEADLINE] + c->fired[ONESHOT] + c->fired[PERIODIC];
        if (c->max_late > max_late)
            max_late = c->max_late;
    }
    printf("pause-timers: timers %u max_late_ns %lld\n", timers, max_late);
    printf("pause-timers: PASS\n");
    return RT_EXIT_PASS;
}
