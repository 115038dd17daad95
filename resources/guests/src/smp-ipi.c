/*
 * smp-ipi - IPIs between CPUs: how long a fixed IPI takes to wake a halted (or polling) AP.
 *
 * The BSP starts every AP (as smp-hello). Each AP enables its xAPIC and waits for IPIs in
 * `sti; hlt` (target=hlt, default) or spinning with interrupts on (target=poll). Then:
 *   unicast:   for each AP, `count` times: wait `gap_us` (so the AP is back in HLT), read the
 *              TSC, write the ICR (fixed, physical destination = the AP's APIC ID); latency =
 *              TSC at the top of the AP's handler - that TSC (KVM keeps vCPU TSCs in sync).
 *   broadcast: `count` times an all-but-self IPI; latency to the last AP to wake.
 * Prints min/p50/max per AP and for the broadcast. FAIL if an IPI is not handled within
 * timeout_ms, or a latency is negative beyond skew_ns (TSCs out of sync).
 * Parameters: cpus=N count=5 (max 64) gap_us=1000 timeout_ms=100 skew_ns=10000
 *             target=hlt|poll
 */
#include "rt.h"

#define IPI_VECTOR 0x50
#define SPURIOUS_VECTOR 0xff
#define MAX_SAMPLES 64

static volatile u32 ready, stop, target_poll;
static volatile u32 apic_of[RT_MAX_CPUS];
static volatile u8 index_of_apic[256];
static volatile u32 irq_count[RT_MAX_CPUS];
static volatile u64 irq_tsc[RT_MAX_CPUS];

/* IPI handler (any CPU): timestamp first, then find our index from the APIC ID, EOI. */
static void ipi_irq(struct trap_frame *f)
{
    u64 now = rdtsc();
    u32 idx = index_of_apic[lapic_id()];
    irq_tsc[idx] = now;
    irq_count[idx]++;
    lapic_eoi();
}

/* Spurious-vector interrupt: report it, no EOI. */
static void spurious_irq(struct trap_frame *f) { printf("smp-ipi: spurious interrupt\n"); }

/* AP body: enable the LAPIC, report ready, then wait for IPIs until told to stop. */
static void ap_main(u32 index)
{
    lapic_enable(SPURIOUS_VECTOR);
    u32 id = lapic_id();
    apic_of[index] = id;
    index_of_apic[id] = (u8)index;
    __atomic_fetch_add(&ready, 1, __ATOMIC_SEQ_CST);
    for (;;) {
        cli();
        if (stop)
            break;
        if (target_poll) {
            sti();
            while (!stop)
                cpu_relax();
        } else {
            sti_hlt();
        }
    }
}

static u32 count, ncpus;
static u64 gap_ns, timeout_ms, skew_ns;

/* Wait (BSP, interrupts off) until AP `j` has handled more than `before` IPIs. */
static int wait_handled(u32 j, u32 before)
{
    u64 end = rdtsc() + ns_to_tsc(timeout_ms * 1000000);
    while (irq_count[j] == before)
        if (rdtsc() > end)
            return 0;
    return 1;
}

/* Check a latency sample for TSC skew, then print the sorted summary. */
static void check_and_report(const char *what, s64 *lat, u32 n)
{
    sort_s64(lat, n);
    if (lat[0] < -(s64)skew_ns)
        fail("%s: negative latency %lld ns: TSCs out of sync beyond %llu ns", what, lat[0],
             skew_ns);
    printf("smp-ipi: %s: n=%u latency ns min %lld p50 %lld max %lld\n", what, n, lat[0],
           lat[n / 2], lat[n - 1]);
}

/* Unicast IPIs from the BSP to AP j. */
static void test_unicast(u32 j)
{
    s64 lat[MAX_SAMPLES];
    for (u32 i = 0; i < count; i++) {
        u32 before = irq_count[j];
        delay_ns(gap_ns);
        xapic_write(APIC_ICR_HI, apic_of[j] << 24);
        u64 t0 = rdtsc();
        xapic_write(APIC_ICR_LO, ICR_FIXED | ICR_ASSERT | IPI_VECTOR);
        if (!wait_handled(j, before))
            fail("unicast to cpu %u (apic %u) #%u: not handled within %llu ms", j, apic_of[j], i,
                 timeout_ms);
        lat[i] = tsc_to_ns((s64)(irq_tsc[j] - t0));
    }
    char what[40];
    snprintf(what, sizeof(what), "bsp -> cpu %u (%s)", j, target_poll ? "polling" : "halted");
    check_and_report(what, lat, count);
}

/* All-but-self IPIs: latency until the last AP has handled it. */
static void test_broadcast(void)
{
    s64 lat[MAX_SAMPLES];
    u32 before[RT_MAX_CPUS];
    for (u32 i = 0; i < count; i++) {
        for (u32 j = 1; j < ncpus; j++)
            before[j] = irq_count[j];
        delay_ns(gap_ns);
        u64 t0 = rdtsc();
        xapic_write(APIC_ICR_LO, ICR_ALL_BUT_SELF | ICR_FIXED | ICR_ASSERT | IPI_VECTOR);
        u64 last = t0;
        for (u32 j = 1; j < ncpus; j++) {
            if (!wait_handled(j, before[j]))
                fail("broadcast #%u: cpu %u did not handle it within %llu ms", i, j, timeout_ms);
            if (irq_tsc[j] > last)
                last = irq_tsc[j];
        }
        lat[i] = tsc_to_ns((s64)(last - t0));
    }
    check_and_report("broadcast, last AP", lat, count);
}

/* Start the APs, measure, stop them, print PASS. */
int main(void)
{
    char target[8] = "hlt";
    ncpus = smp_cpu_count();
    count = (u32)cmdline_u64("count", 5);
    gap_ns = cmdline_u64("gap_us", 1000) * 1000;
    timeout_ms = cmdline_u64("timeout_ms", 100);
    skew_ns = cmdline_u64("skew_ns", 10000);
    cmdline_str("target", target, sizeof(target));
    target_poll = !strncmp(target, "poll", 5);
    if (count == 0 || count > MAX_SAMPLES)
        fail("count=%u: must be 1..%u", count, MAX_SAMPLES);
    if (ncpus > RT_MAX_CPUS)
        ncpus = RT_MAX_CPUS;
    if (ncpus < 2)
        fail("needs at least 2 CPUs (found %u; QEMU: -smp 2, or cpus=N)", ncpus);

    rt_set_irq_handler(IPI_VECTOR, ipi_irq);
    rt_set_irq_handler(SPURIOUS_VECTOR, spurious_irq);
    lapic_enable(SPURIOUS_VECTOR);
    apic_of[0] = lapic_id();
    index_of_apic[apic_of[0]] = 0;
    printf("smp-ipi: %u CPUs, count %u, gap %llu us, APs wait by %s\n", ncpus, count,
           gap_ns / 1000, target_poll ? "polling" : "hlt");

    u32 online = smp_start_aps(ncpus, ap_main, 5000);
    u64 end = rdtsc() + ns_to_tsc(5000000000ull);
    while (ready < online && rdtsc() < end)
        cpu_relax();
    if (ready != ncpus - 1)
        fail("%u of %u AP(s) came up", ready, ncpus - 1);

    cli();
    for (u32 j = 1; j < ncpus; j++)
        test_unicast(j);
    test_broadcast();

    stop = 1;
    xapic_write(APIC_ICR_LO, ICR_ALL_BUT_SELF | ICR_FIXED | ICR_ASSERT | IPI_VECTOR);
    printf("smp-ipi: PASS\n");
    return RT_EXIT_PASS;
}
