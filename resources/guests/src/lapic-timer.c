/*
 * lapic-timer - the local APIC timer in one-shot, periodic and TSC-deadline modes.
 *
 * For each mode, `count` times: arm a timer `ns` nanoseconds ahead, wait for its interrupt
 * (STI; HLT by default), and record the lateness = TSC read first thing in the interrupt
 * handler - the TSC at which the timer should have expired, in ns. Then print min/p50/max.
 *   one-shot, divide 1 and 16: initial count = ns * bus_kHz / 1e6 / divide; the expected
 *       expiry is the TSC read just before the initial-count write (so the write's own cost
 *       counts as lateness, never as earliness). The current-count register, read right after
 *       arming, must be <= the initial count and decreasing.
 *   periodic, divide 1: `count` interrupts from one arming, each measured from the end of
 *       the period it falls in (t0 + k * period); interrupt #i before t0 + (i + 1) * period
 *       = early = FAIL (two in one period are fine after a late one); skipped periods
 *       (coalesced ticks of a late vCPU) are counted.
 *   tsc-deadline (if CPUID.1:ECX[24]): IA32_TSC_DEADLINE = now + ns of TSC; the MSR must read
 *       0 after the interrupt. Then: arm and write 0 at once; no interrupt may arrive within
 *       2 * ns (polled with interrupts on, not HLT).
 * FAIL if an interrupt is missing after timeout_ms or arrives more than early_ns early.
 *
 * Parameters: count=5 (max 64) ns=1000000 timeout_ms=1000 early_ns=10000 wait=hlt|poll
 *             verbose=0|1 (print every sample)
 * With wait=hlt the only wake-up source is the timer under test: a lost interrupt leaves
 * the CPU halted and only the runner's timeout ends the guest; wait=poll keeps the
 * in-guest TSC timeout effective in that case too.
 */
#include "rt.h"

#define TIMER_VECTOR 0x40
#define SPURIOUS_VECTOR 0xff
#define MAX_SAMPLES 256

static volatile u32 irq_count;
static volatile u64 irq_tsc;

static u32 count, verbose, wait_poll;
static u64 period_ns, timeout_ms, early_ns;

/* Timer interrupt: timestamp first, then count and EOI. */
static void timer_irq(struct trap_frame *f)
{
    irq_tsc = rdtsc();
    irq_count++;
    lapic_eoi();
}

/* Spurious-vector interrupt: no EOI (the APIC does not set ISR for it). */
static void spurious_irq(struct trap_frame *f) { printf("lapic-timer: spurious interrupt\n"); }

/*
 * Wait with interrupts enabled until irq_count moves past `before` or the TSC passes
 * `deadline`. Returns 1 if the interrupt came. Leaves interrupts disabled.
 */
static int wait_irq(u32 before, u64 deadline)
{
    if (wait_poll) {
        /* Interrupts stay enabled for the whole poll: toggling CLI/STI per iteration leaves
         * only a one-instruction window and delays delivery by milliseconds here. */
        sti();
        while (irq_count == before && rdtsc() <= deadline)
            cpu_relax();
        cli();
        return irq_count != before;
    }
    for (;;) {
        cli();
        if (irq_count != before)
            return 1;
        if (rdtsc() > deadline)
            return 0;
        sti_hlt(); /* the STI shadow closes the race with an interrupt after the check */
    }
}

/* Print min/p50/p99/max of the lateness samples (sorted in place), in ns. */
static void report(const char *mode, s64 *late, u32 n)
{
    sort_s64(late, n);
    printf("lapic-timer: %s: n=%u lateness ns min %lld p50 %lld p99 %lld max %lld\n", mode, n,
           late[0], late[n / 2], late[(n * 99) / 100], late[n - 1]);
}

/* Check one lateness sample against the early tolerance. */
static void check_not_early(const char *mode, u32 i, s64 late)
{
    if (verbose)
        printf("lapic-timer: %s #%u lateness %lld ns\n", mode, i, late);
    if (late < -(s64)early_ns)
        fail("%s #%u: interrupt %lld ns early (tolerance %llu ns)", mode, i, -late, early_ns);
}

/*
 * Stop the timer (initial count 0, deadline 0) and let any interrupt already in flight land
 * before the next mode or divide value is programmed. Writing 0 to the initial count first
 * matters under KVM's in-kernel LAPIC: a divide-configuration write while a period is still
 * recorded (even for an expired one-shot) restarts the timer and fires a stray interrupt.
 */
static void timer_quiesce(void)
{
    xapic_write(APIC_TIMER_INIT, 0);
    if (cpu_has_tsc_deadline())
        wrmsr(MSR_TSC_DEADLINE, 0);
    u32 before = irq_count;
    u64 end = rdtsc() + 2 * ns_to_tsc(period_ns);
    sti();
    while (rdtsc() < end)
        cpu_relax();
    cli();
    if (irq_count != before)
        printf("lapic-timer: note: %u stray timer interrupt(s) while stopping the timer\n",
               irq_count - before);
}

/* One-shot mode with divide value `div` (1, 2, 4, ... 128). */
static void test_oneshot(u32 div)
{
    static const u8 div_code[8] = { 0xb, 0x0, 0x1, 0x2, 0x3, 0x8, 0x9, 0xa }; /* 1..128 */
    u32 log2 = 0;
    while ((1u << log2) < div)
        log2++;
    char mode[32];
    snprintf(mode, sizeof(mode), "one-shot div%u", div);

    u64 init64 = period_ns * rt_bus_khz / 1000000 / div;
    if (init64 == 0 || init64 > 0xffffffffull)
        fail("%s: initial count %llu for %llu ns out of range", mode, init64, period_ns);
    u32 init = (u32)init64;
    /* The period actually programmed, after rounding the count down. */
    u64 ticks = ns_to_tsc((u64)init * div * 1000000 / rt_bus_khz);

    timer_quiesce();
    xapic_write(APIC_TIMER_DIV, div_code[log2]);
    xapic_write(APIC_LVT_TIMER, TIMER_VECTOR | LVT_TIMER_ONESHOT);
    printf("lapic-timer: %s: initial count %u (%llu ns at bus %u kHz)\n", mode, init,
           (u64)init * div * 1000000 / rt_bus_khz, rt_bus_khz);

    s64 late[MAX_SAMPLES];
    u32 count_late_reads = 0;
    for (u32 i = 0; i < count; i++) {
        u32 before = irq_count;
        cli();
        u64 t0 = rdtsc();
        xapic_write(APIC_TIMER_INIT, init);
        u32 c1 = xapic_read(APIC_TIMER_CUR);
        u64 t1 = rdtsc();
        u32 c2 = xapic_read(APIC_TIMER_CUR);
        u64 t2 = rdtsc();
        u64 expected = t0 + ticks;
        if (!wait_irq(before, expected + ns_to_tsc(timeout_ms * 1000000)))
            fail("%s #%u: no timer interrupt within %llu ms of expiry", mode, i, timeout_ms);
        late[i] = tsc_to_ns((s64)(irq_tsc - expected));
        /* Counting down: c1 <= init and c2 < c1. A read of 0 is fine only after the expiry
         * (a slow, emulated MMIO read can land after it); 0 before it is an early expiry. */
        u64 tol = ns_to_tsc(early_ns);
        if (c1 > init || (c1 == 0 && t1 + tol < expected) || (c2 == 0 && t2 + tol < expected) ||
            (c2 != 0 && c2 >= c1))
            fail("%s #%u: current count not counting down: init %u, then %u, %u", mode, i, init,
                 c1, c2);
        if (c2 == 0)
            count_late_reads++;
        if (verbose)
            printf("lapic-timer: %s #%u current count %u -> %u\n", mode, i, c1, c2);
        u32 after = xapic_read(APIC_TIMER_CUR);
        if (after != 0)
            fail("%s #%u: current count %u after expiry (lateness %lld ns), want 0", mode, i,
                 after, late[i]);
        check_not_early(mode, i, late[i]);
    }
    report(mode, late, count);
    if (count_late_reads)
        printf("lapic-timer: %s: %u of %u current-count checks came after expiry (read 0)\n",
               mode, count_late_reads, count);
}

/*
 * Periodic mode, divide 1: `count` interrupts from one arming. The k-th period ends at
 * t0 + k * P (t0 = TSC before the initial-count write). Each interrupt is assigned to the
 * period it falls in; its lateness is measured from that period's end. Two interrupts in one
 * period mean one came early (FAIL); skipped periods are ticks the (late) vCPU had coalesced
 * and are counted, not failed.
 */
static void test_periodic(void)
{
    const char *mode = "periodic div1";
    u64 init64 = period_ns * rt_bus_khz / 1000000;
    if (init64 == 0 || init64 > 0xffffffffull)
        fail("%s: initial count %llu for %llu ns out of range", mode, init64, period_ns);
    u32 init = (u32)init64;
    u64 period = ns_to_tsc((u64)init * 1000000 / rt_bus_khz);

    timer_quiesce();
    xapic_write(APIC_TIMER_DIV, 0xb); /* divide by 1 */
    xapic_write(APIC_LVT_TIMER, TIMER_VECTOR | LVT_TIMER_PERIODIC);
    s64 late[MAX_SAMPLES];
    u64 prev_tick = 0, missed = 0;
    cli();
    u64 t0 = rdtsc();
    xapic_write(APIC_TIMER_INIT, init);
    for (u32 i = 0; i < count; i++) {
        u32 before = irq_count;
        u64 due = t0 + (prev_tick + 1) * period;
        if (!wait_irq(before, due + ns_to_tsc(timeout_ms * 1000000)))
            fail("%s #%u: no timer interrupt within %llu ms of period end", mode, i, timeout_ms);
        u64 tick = (irq_tsc - t0) / period;
        /*
         * The LAPIC never raises more interrupts than periods have elapsed: interrupt #i
         * (from 0) may not come before t0 + (i + 1) * period. Two interrupts may share a
         * period when the first was delivered late (host load); that is not early.
         */
        u64 earliest = t0 + (u64)(i + 1) * period - ns_to_tsc(early_ns);
        if (irq_tsc < earliest)
            fail("%s #%u: interrupt before %u periods had elapsed (early by %lld ns)", mode, i,
                 i + 1, tsc_to_ns((s64)(earliest - irq_tsc)));
        if (tick > prev_tick)
            missed += tick - prev_tick - 1;
        late[i] = tsc_to_ns((s64)(irq_tsc - t0 - tick * period));
        if (verbose)
            printf("lapic-timer: %s #%u period %llu lateness %lld ns\n", mode, i, tick, late[i]);
        prev_tick = tick;
    }
    xapic_write(APIC_TIMER_INIT, 0);
    report(mode, late, count);
    printf("lapic-timer: %s: %u interrupts over %llu periods (%llu coalesced)\n", mode, count,
           prev_tick, missed);
}

/* TSC-deadline mode: lateness, MSR cleared on expiry, and cancel by writing 0. */
static void test_tsc_deadline(void)
{
    const char *mode = "tsc-deadline";
    if (!cpu_has_tsc_deadline()) {
        printf("lapic-timer: %s: not offered (CPUID.1:ECX[24] = 0), skipped\n", mode);
        return;
    }
    timer_quiesce();
    xapic_write(APIC_LVT_TIMER, TIMER_VECTOR | LVT_TIMER_TSC_DEADLINE);
    u64 ticks = ns_to_tsc(period_ns);

    s64 late[MAX_SAMPLES];
    for (u32 i = 0; i < count; i++) {
        u32 before = irq_count;
        cli();
        u64 deadline = rdtsc() + ticks;
        wrmsr(MSR_TSC_DEADLINE, deadline);
        if (!wait_irq(before, deadline + ns_to_tsc(timeout_ms * 1000000)))
            fail("%s #%u: no timer interrupt within %llu ms of the deadline", mode, i,
                 timeout_ms);
        late[i] = tsc_to_ns((s64)(irq_tsc - deadline));
        u64 msr = rdmsr(MSR_TSC_DEADLINE);
        if (msr != 0)
            fail("%s #%u: IA32_TSC_DEADLINE reads 0x%llx after expiry, want 0", mode, i, msr);
        check_not_early(mode, i, late[i]);
    }
    report(mode, late, count);

    /* Cancel: arm, disarm at once, then poll (interrupts on) for twice the period. An
     * interrupt is wrong only if the disarm was certainly in time: a vCPU thread the host
     * preempts between the two writes can reach the second after the deadline, when the
     * interrupt is already due (the SDM: writing 0 disarms the timer; it does not take back
     * an interrupt it has generated). */
    u32 before = irq_count;
    cli();
    u64 deadline = rdtsc() + ticks;
    wrmsr(MSR_TSC_DEADLINE, deadline);
    wrmsr(MSR_TSC_DEADLINE, 0);
    u64 disarmed = rdtsc();
    u64 end = disarmed + 2 * ticks;
    sti();
    while (rdtsc() < end && irq_count == before)
        cpu_relax();
    cli();
    if (irq_count != before && disarmed < deadline)
        fail("%s: interrupt arrived after the deadline was cancelled (wrmsr 0)", mode);
    if (irq_count != before)
        printf("lapic-timer: %s: note: the disarm came %lld ns after the deadline (the vCPU "
               "was held up), its interrupt was already due\n",
               mode, tsc_to_ns((s64)(disarmed - deadline)));
    printf("lapic-timer: %s: cancel by writing 0: no interrupt in %llu ns\n", mode,
           2 * period_ns);
}

/* Enable the xAPIC, run the modes, print PASS. */
int main(void)
{
    char wait[8] = "hlt";
    count = (u32)cmdline_u64("count", 5);
    period_ns = cmdline_u64("ns", 1000000);
    timeout_ms = cmdline_u64("timeout_ms", 1000);
    early_ns = cmdline_u64("early_ns", 10000);
    verbose = (u32)cmdline_u64("verbose", 0);
    cmdline_str("wait", wait, sizeof(wait));
    wait_poll = !strncmp(wait, "poll", 5);
    if (count == 0 || count > MAX_SAMPLES)
        fail("count=%u: must be 1..%u", count, MAX_SAMPLES);
    if (period_ns == 0)
        fail("ns=0: the period must be positive");

    printf("lapic-timer: tsc %u kHz, bus %u kHz, period %llu ns, count %u, wait %s\n",
           rt_tsc_khz, rt_bus_khz, period_ns, count, wait_poll ? "poll" : "hlt");
    rt_set_irq_handler(TIMER_VECTOR, timer_irq);
    rt_set_irq_handler(SPURIOUS_VECTOR, spurious_irq);
    lapic_enable(SPURIOUS_VECTOR);
    printf("lapic-timer: xAPIC id %u version 0x%x svr 0x%x\n", lapic_id(),
           xapic_read(APIC_VERSION), xapic_read(APIC_SVR));

    test_oneshot(1);
    test_oneshot(16);
    test_periodic();
    test_tsc_deadline();

    xapic_write(APIC_LVT_TIMER, LVT_MASKED);
    printf("lapic-timer: PASS\n");
    return RT_EXIT_PASS;
}
