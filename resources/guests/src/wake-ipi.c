/*
 * wake-ipi - wake-up latency of a halted vCPU: an IPI sent `delay_us` after the target halted.
 *
 * CPU 1 (the target) repeatedly announces that it is about to halt (TSC into `halt_tsc`, a
 * sequence number into `halting`) and waits in `sti; hlt`. CPU 0 (the sender) waits for the
 * announcement, spins until `delay_us` of TSC time have passed since it, reads the TSC and
 * sends a fixed IPI; the target's handler reads the TSC first thing. Latency = handler TSC -
 * sender TSC (vCPU TSCs are in sync under KVM). `count` samples; between two, the target
 * idles `gap_us` on its TSC-deadline timer (HLT) before it announces its next halt, so each
 * sample costs the target two wake-ups: its timer and the IPI.
 * With a 1 us delay the IPI may arrive before the target's HLT (every guest instruction is
 * emulated here, ~1.5 us each); the latency then includes the rest of its way into HLT.
 * Prints:
 *   wake-ipi: delay_us D: n=N latency ns min A p50 B p90 C p99 E max F mean M
 *   wake-ipi: PASS
 * Parameters: count=200 (max 1000) delay_us=50 gap_us=1000 timeout_ms=100
 */
#include "rt.h"

#define IPI_VECTOR 0x50
#define TIMER_VECTOR 0x40
#define SPURIOUS_VECTOR 0xff
#define MAX_SAMPLES 1000

static volatile u32 halting, handled, ready, stop, timer_ticks;
static volatile u64 halt_tsc, irq_tsc;
static u64 gap_ns;
static volatile u32 target_apic;
static s64 lat[MAX_SAMPLES];

/* IPI handler (the target): timestamp first, then EOI. */
static void ipi_irq(struct trap_frame *f)
{
    u64 now = rdtsc();
    irq_tsc = now;
    handled++;
    lapic_eoi();
}

static void spurious_irq(struct trap_frame *f) {}

/* The target's gap timer. */
static void timer_irq(struct trap_frame *f)
{
    timer_ticks++;
    lapic_eoi();
}

/* The target: announce, halt, repeat until told to stop. */
static void ap_main(u32 index)
{
    lapic_enable(SPURIOUS_VECTOR);
    target_apic = lapic_id();
    xapic_write(APIC_LVT_TIMER, TIMER_VECTOR | LVT_TIMER_TSC_DEADLINE);
    ready = 1;
    for (u32 seq = 1;; seq++) {
        cli();
        if (stop)
            break;
        u32 before = handled;
        if (seq > 1) {
            /* Between samples: idle for gap_us on a TSC-deadline timer, as an idle vCPU. */
            u32 ticks = timer_ticks;
            wrmsr(MSR_TSC_DEADLINE, rdtsc() + ns_to_tsc(gap_ns));
            while (timer_ticks == ticks) {
                sti_hlt();
                cli();
            }
        }
        halt_tsc = rdtsc();
        halting = seq;
        while (handled == before && !stop) {
            sti_hlt();
            cli();
        }
    }
}

/* The sender: `count` samples, then the sorted summary. */
int main(void)
{
    u32 count = (u32)cmdline_u64("count", 200);
    u64 delay_ticks = ns_to_tsc(cmdline_u64("delay_us", 50) * 1000);
    gap_ns = cmdline_u64("gap_us", 1000) * 1000;
    u64 timeout_ticks = ns_to_tsc(cmdline_u64("timeout_ms", 100) * 1000000);
    if (count == 0 || count > MAX_SAMPLES)
        fail("count=%u: must be 1..%u", count, MAX_SAMPLES);
    if (smp_cpu_count() < 2)
        fail("needs 2 CPUs (lull --cpus 2)");
    rt_set_irq_handler(IPI_VECTOR, ipi_irq);
    rt_set_irq_handler(SPURIOUS_VECTOR, spurious_irq);
    rt_set_irq_handler(TIMER_VECTOR, timer_irq);
    if (!cpu_has_tsc_deadline())
        fail("needs the TSC-deadline timer (CPUID.1:ECX[24])");
    lapic_enable(SPURIOUS_VECTOR);
    printf("wake-ipi: count %u delay_us %llu gap_us %llu\n", count,
           cmdline_u64("delay_us", 50), cmdline_u64("gap_us", 1000));
    smp_start_aps(2, ap_main, 5000);
    u64 end = rdtsc() + ns_to_tsc(5000000000ull);
    while (!ready && rdtsc() < end)
        cpu_relax();
    if (!ready)
        fail("the target CPU did not come up");

    cli();
    u32 seen = 0;
    for (u32 i = 0; i < count; i++) {
        u64 deadline = rdtsc() + timeout_ticks;
        while (halting == seen)
            if (rdtsc() > deadline)
                fail("sample %u: the target did not announce its halt", i);
        seen = halting;
        u64 at = halt_tsc + delay_ticks;
        while (rdtsc() < at)
            ;
        u32 before = handled;
        xapic_write(APIC_ICR_HI, target_apic << 24);
        u64 t0 = rdtsc();
        xapic_write(APIC_ICR_LO, ICR_FIXED | ICR_ASSERT | IPI_VECTOR);
        deadline = rdtsc() + timeout_ticks;
        while (handled == before)
            if (rdtsc() > deadline)
                fail("sample %u: IPI not handled within the timeout", i);
        lat[i] = tsc_to_ns((s64)(irq_tsc - t0));
    }
    stop = 1;
    xapic_write(APIC_ICR_LO, ICR_FIXED | ICR_ASSERT | IPI_VECTOR);

    sort_s64(lat, count);
    s64 sum = 0;
    for (u32 i = 0; i < count; i++)
        sum += lat[i];
    printf("wake-ipi: delay_us %llu: n=%u latency ns min %lld p50 %lld p90 %lld p99 %lld max "
           "%lld mean %lld\n",
           cmdline_u64("delay_us", 50), count, lat[0], lat[count / 2], lat[count * 9 / 10],
           lat[count * 99 / 100], lat[count - 1], sum / (s64)count);
    printf("wake-ipi: PASS\n");
    return RT_EXIT_PASS;
}
