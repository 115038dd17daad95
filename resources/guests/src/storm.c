/*
 * storm - a hostile guest for lull's hardening tests: every CPU programs its LAPIC timer
 * periodic at the smallest period it can ask for (initial count 1, divide 1: 1 ns at a 1 GHz
 * bus), and with ipi=1 floods IPIs (a unicast to the next CPU and a self-IPI per iteration,
 * never waiting), with noise=1 also unclaimed port writes and reserved LAPIC register writes
 * (which lull counts and logs through its rate limiter).
 *
 * The VMM must clamp the timer (lull: 100 us minimum period, KVM: its min_timer_period_us),
 * stay responsive (answer SIGTERM) and keep its log short. With ms=N the storm ends after N
 * ms; every CPU then reports its timer and IPI interrupts and the timer rate; FAIL if a CPU got
 * no timer interrupt (or, with ipi=1, no IPI), or a CPU's timer rate exceeds max_rate
 * interrupts/s (0: no limit). With ms=0 it storms until the VMM stops it.
 *
 * Prints "storm: flooding" when the storm starts (tests wait for that line).
 * Parameters: cpus=N ms=2000 count=1 ipi=1 noise=1 max_rate=0
 */
#include "rt.h"

#define TIMER_VECTOR 0x40
#define IPI_VECTOR 0x50
#define SPURIOUS_VECTOR 0xff
#define UNCLAIMED_PORT 0x99
#define XAPIC_RESERVED 0x3F0 /* SELF_IPI exists only in x2APIC mode */

static volatile u32 stop, done;
static volatile u8 index_of_apic[256];
static volatile u32 timer_irqs[RT_MAX_CPUS];
static volatile u32 ipi_irqs[RT_MAX_CPUS];
static u32 ncpus, count, flood_ipi, noise;

static void timer_irq(struct trap_frame *f)
{
    timer_irqs[index_of_apic[lapic_id()]]++;
    lapic_eoi();
}

static void ipi_irq(struct trap_frame *f)
{
    ipi_irqs[index_of_apic[lapic_id()]]++;
    lapic_eoi();
}

static void spurious_irq(struct trap_frame *f) {}

static void timer_start(void)
{
    xapic_write(APIC_TIMER_DIV, 0xB); /* divide by 1 */
    xapic_write(APIC_LVT_TIMER, LVT_TIMER_PERIODIC | TIMER_VECTOR);
    xapic_write(APIC_TIMER_INIT, count);
}

static void timer_stop(void)
{
    xapic_write(APIC_LVT_TIMER, LVT_MASKED | TIMER_VECTOR);
    xapic_write(APIC_TIMER_INIT, 0);
}

/* One iteration of the storm on CPU `index` (interrupts on). */
static void storm_once(u32 index)
{
    if (flood_ipi) {
        u32 next = (index + 1) % ncpus;
        if (next != index) {
            xapic_write(APIC_ICR_HI, next << 24);
            xapic_write(APIC_ICR_LO, ICR_FIXED | ICR_ASSERT | IPI_VECTOR);
        }
        xapic_write(APIC_ICR_LO, ICR_FIXED | ICR_ASSERT | ICR_SELF | IPI_VECTOR);
    }
    if (noise) {
        outb(UNCLAIMED_PORT, (u8)index);
        xapic_write(XAPIC_RESERVED, 0);
    }
    if (!flood_ipi)
        sti_hlt(); /* timer-only storm: the CPU wakes once per (clamped) period */
}

static void ap_main(u32 index)
{
    lapic_enable(SPURIOUS_VECTOR);
    index_of_apic[lapic_id()] = (u8)index;
    timer_start();
    sti();
    while (!stop)
        storm_once(index);
    cli();
    timer_stop();
    __atomic_fetch_add(&done, 1, __ATOMIC_SEQ_CST);
}

int main(void)
{
    ncpus = smp_cpu_count();
    u64 ms = cmdline_u64("ms", 2000);
    count = (u32)cmdline_u64("count", 1);
    flood_ipi = (u32)cmdline_u64("ipi", 1);
    noise = (u32)cmdline_u64("noise", 1);
    u64 max_rate = cmdline_u64("max_rate", 0);
    if (ncpus > RT_MAX_CPUS)
        ncpus = RT_MAX_CPUS;

    rt_set_irq_handler(TIMER_VECTOR, timer_irq);
    rt_set_irq_handler(IPI_VECTOR, ipi_irq);
    rt_set_irq_handler(SPURIOUS_VECTOR, spurious_irq);
    lapic_enable(SPURIOUS_VECTOR);
    index_of_apic[lapic_id()] = 0;
    if (ncpus > 1) {
        u32 online = smp_start_aps(ncpus, ap_main, 5000);
        if (online + 1 < ncpus)
            fail("only %u of %u CPUs came up", online + 1, ncpus);
    }
    printf("storm: flooding: %u cpus, timer initial count %u, ipi=%u noise=%u ms=%llu\n", ncpus,
           count, flood_ipi, noise, ms);
    u64 start = rdtsc();
    u64 end = start + ns_to_tsc(ms * 1000000ull);
    timer_start();
    sti();
    while (ms == 0 || rdtsc() < end)
        storm_once(0);
    cli();
    timer_stop();
    s64 elapsed_ns = tsc_to_ns((s64)(rdtsc() - start));
    stop = 1;
    u64 wait_end = rdtsc() + ns_to_tsc(1000000000ull);
    while (done + 1 < ncpus && rdtsc() < wait_end)
        cpu_relax();
    if (done + 1 < ncpus)
        fail("%u of %u APs stopped", done, ncpus - 1);

    int ok = 1;
    for (u32 i = 0; i < ncpus; i++) {
        u64 rate = (u64)timer_irqs[i] * 1000000000ull / (u64)(elapsed_ns > 0 ? elapsed_ns : 1);
        printf("storm: cpu %u: timer %u ipi %u over %lld ms: %llu timer interrupts/s\n", i,
               timer_irqs[i], ipi_irqs[i], elapsed_ns / 1000000, rate);
        if (timer_irqs[i] == 0 || (flood_ipi && ncpus > 1 && ipi_irqs[i] == 0))
            ok = 0;
        if (max_rate && rate > max_rate)
            fail("cpu %u: %llu timer interrupts/s exceed max_rate=%llu", i, rate, max_rate);
    }
    if (!ok)
        fail("a CPU got no timer interrupt or no IPI");
    printf("storm: PASS\n");
    return RT_EXIT_PASS;
}
