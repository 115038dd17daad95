/*
 * idle-sim - a synthetic tickless-idle vCPU: timers from a mix of intervals, HLT in between.
 *
 * Behaves like the idle loop of a tickless Linux vCPU, with as little guest work per event as
 * possible (every guest instruction is emulated on our hosts). Every CPU, until `duration_ms`
 * has passed: draws an interval from the mix, arms its LAPIC timer (TSC-deadline, or one-shot
 * divide 1 with timer=oneshot) for it, waits in `sti; hlt`, takes the interrupt (rdtsc at the
 * top of the handler, EOI) and, for `ipi_pct` percent of its events, sends a fixed IPI to the
 * next CPU (index + 1 mod N). Nobody prints while running. Then the BSP prints:
 *   idle-sim: cpu I: events E ipis_sent S ipis_received R early X
 *   idle-sim: lateness_ns n=N min A p50 B p99 C max D mean M
 *   idle-sim: ipi_ns n=N min A p50 B p99 C max D mean M
 *   idle-sim: hist lateness LO-HI:COUNT ...     (several lines; ns, every non-empty bucket)
 *   idle-sim: hist ipi LO-HI:COUNT ...
 *   idle-sim: past_slack_ns n=N min A p50 B p99 C max D mean M   (with slack_ns only)
 *   idle-sim: hist past_slack LO-HI:COUNT ...
 *   idle-sim: PASS
 * Lateness = TSC at the top of the timer handler - the deadline; IPI latency = TSC at the top
 * of the target's handler - TSC before the sender's ICR write (vCPU TSCs are in sync). Both
 * go into log-linear histograms over TSC ticks (16 buckets per power of two, < 6.25% wide;
 * the last one is open-ended: 2^32 ticks and more, 1.65 s at 2.6 GHz, fall in it, and its
 * printed upper bound is max + 1); min, max and mean are exact (64-bit: any value),
 * p50/p99 are the upper bound of the bucket they fall in (at most max).
 * Interrupts that arrive more than early_ns before their deadline are counted as `early`.
 * With slack_ns=S (the VMM's timer slack, e.g. lull --timer-slack), each lateness is split at
 * S after the deadline: up to S is the slack the VM allowed, the rest (`past_slack`) is the
 * host's delay, in a histogram of its own.
 * Parameters:
 *   cpus=N            CPUs to use (default: all; at most 8)
 *   duration_ms=10000 how long every CPU runs its timers
 *   mix=30:1,30:4,40:10-500   WEIGHT:MS or WEIGHT:LO-HI (uniform, ms), weights are relative
 *   ipi_pct=5         percent of timer events followed by an IPI to the next CPU
 *   timer=deadline|oneshot
 *   seed=1            per-CPU xorshift seeds derive from it
 *   early_ns=10000    tolerance for early interrupts
 *   slack_ns=0        the timer slack the VMM was given: report lateness past it apart
 *   busy=0            the first `busy` CPUs run guest code (spin with interrupts on) for
 *                     the whole duration instead of idling: a VM where some vCPU always runs
 *   pv_eoi=0          1: end interrupts through KVM's paravirtual EOI when CPUID 0x40000001
 *                     offers it (KVM_FEATURE_PV_EOI, bit 6): each CPU registers a flag with
 *                     MSR_KVM_PV_EOI_EN and an EOI that finds the flag set only clears it (no
 *                     exit), as Linux's kvm_guest_apic_eoi_write does
 *   pv_deadline=0     1: arm TSC deadlines through lull's PV deadline when lull's CPUID leaf
 *                     0x40000100 offers it (0x40000101 EAX bit 0; lull --irqchip user): each
 *                     CPU registers an 8-byte slot with MSR_LULL_PV_DEADLINE and stores its
 *                     next deadline there instead of writing IA32_TSC_DEADLINE; the HLT that
 *                     follows is the only exit (docs/GUEST-ABI.md). Falls back to the MSR.
 *   pattern=mix       mix: the above. rearm-halt / rearm-busy: short deadlines re-armed
 *                     from the interrupt handler (cyclictest, high-rate hrtimers): every idle
 *                     CPU arms a TSC deadline `delta` TSC cycles ahead; its handler takes the
 *                     TSC, writes the next deadline (TSC + delta, IA32_TSC_DEADLINE or, with
 *                     pv_deadline=1 and rearm-halt, the PV slot), EOIs, then records the
 *                     lateness (its tail; tail=0: records before the write); no IPIs. Between interrupts the CPU halts (rearm-halt) or stays
 *                     busy writing '.' to the serial port, one exit per character (rearm-busy;
 *                     a newline every 64). Needs TSC-deadline. The report is the same.
 *   delta=200000      rearm-*: how far ahead each deadline is, in TSC cycles
 *   tail=1            rearm-*: 1: the handler records after its EOI (on our hosts the
 *                     deadline then passes inside the handler); 0: before its WRMSR
 * The guest exits 0 (lull status 1) when every CPU finished within duration + 2 s.
 */
#include "rt.h"

#define TIMER_VECTOR 0x40
#define IPI_VECTOR 0x50
#define SPURIOUS_VECTOR 0xff
#define MAX_MIX 8
#define NBUCKETS 464 /* (31 - 3) * 16 + 16: every u32 tick count; the last one, every larger */

extern char rt_stacks[]; /* runtime.c: RT_MAX_CPUS stacks of RT_STACK_SIZE, index order */

struct mix_entry {
    u32 weight, lo_ms, hi_ms;
};

struct histogram {
    u32 count[NBUCKETS];
    u32 n;
    u64 min, max, sum;
};

struct cpu_state {
    volatile u32 fired;
    volatile u64 fired_tsc;
    volatile u64 ipi_tx_tsc; /* written by the sender (the previous CPU) before the ICR write */
    volatile u32 ipis_received;
    volatile u32 rearming; /* rearm-*: the handler re-arms; it clears this at the end */
    u64 deadline;          /* rearm-*: the deadline armed last */
    u32 events, ipis_sent, early;
    u32 rng;
    struct histogram lateness, ipi, past_slack;
};

static struct mix_entry mix[MAX_MIX];
static u32 mix_len, mix_total;
static struct cpu_state cpu[RT_MAX_CPUS];
static volatile u32 apic_of[RT_MAX_CPUS];
static volatile u32 ready, go, done;
static u32 ncpus, ipi_pct, use_deadline, busy, use_pv_eoi, use_pv_deadline;
enum pattern { PATTERN_MIX, PATTERN_REARM_HALT, PATTERN_REARM_BUSY };
static enum pattern pattern;
static u64 rearm_delta;
static u32 rearm_tail;

#define MSR_KVM_PV_EOI_EN 0x4b564d04
#define KVM_FEATURE_PV_EOI (1u << 6)
/* One PV EOI flag per CPU, 4-byte aligned (the hypervisor sets bit 0 of the first byte). */
static volatile u32 pv_eoi_flag[RT_MAX_CPUS] __attribute__((aligned(64)));

static int kvm_offers_pv_eoi(void)
{
    struct cpuid_regs sig = cpuid(0x40000000, 0);
    if (sig.ebx != 0x4b4d564b || sig.eax < 0x40000001) /* "KVMK" */
        return 0;
    return (cpuid(0x40000001, 0).eax & KVM_FEATURE_PV_EOI) != 0;
}

#define MSR_LULL_PV_DEADLINE 0x4c554c01
#define LULL_FEATURE_PV_DEADLINE (1u << 0)

/* One PV deadline slot per CPU, 8-byte aligned (lull takes a non-zero value at the next exit). */
static volatile u64 pv_deadline_slot[RT_MAX_CPUS] __attribute__((aligned(64)));

static int lull_offers_pv_deadline(void)
{
    struct cpuid_regs sig = cpuid(0x40000100, 0);
    if (sig.ebx != 0x6c6c754c || sig.ecx != 0x6c6c754c || sig.edx != 0x6c6c754c || /* "Lull" */
        sig.eax < 0x40000101)
        return 0;
    return (cpuid(0x40000101, 0).eax & LULL_FEATURE_PV_DEADLINE) != 0;
}

/* Registers this CPU's PV EOI flag (a flat physical address: the runtime runs unpaged). */
static void pv_eoi_register(u32 idx)
{
    if (use_pv_eoi)
        wrmsr(MSR_KVM_PV_EOI_EN, (u64)(u32)&pv_eoi_flag[idx] | 1);
}

static u64 end_tsc, early_ticks, slack_ticks;

/* This CPU's index, from its stack (each CPU runs on rt_stacks[index]): no LAPIC access. */
static inline u32 this_cpu(void)
{
    u32 esp;
    __asm__ volatile("movl %%esp, %0" : "=r"(esp));
    return (esp - (u32)rt_stacks) / RT_STACK_SIZE;
}

/* Index of the highest set bit of v (v != 0), in five steps. */
static u32 msb(u32 v)
{
    u32 e = 0;
    if (v >> 16) { v >>= 16; e += 16; }
    if (v >> 8) { v >>= 8; e += 8; }
    if (v >> 4) { v >>= 4; e += 4; }
    if (v >> 2) { v >>= 2; e += 2; }
    if (v >> 1) e += 1;
    return e;
}

/* Log-linear bucket of a tick count: exact below 16, then 16 buckets per power of two. */
static u32 bucket_of(u32 v)
{
    if (v < 16)
        return v;
    u32 e = msb(v);
    return (e - 3) * 16 + ((v >> (e - 4)) & 15);
}

/* Smallest tick count of bucket b. */
static u64 bucket_lo(u32 b)
{
    if (b < 16)
        return b;
    u32 e = b / 16 + 3;
    return (u64)(16 + b % 16) << (e - 4);
}

static void hist_add(struct histogram *h, u64 ticks)
{
    /* Only the bucket is found from a clamped count: min, max and sum take the exact one. */
    h->count[bucket_of(ticks > 0xffffffffull ? 0xffffffffu : (u32)ticks)]++;
    if (h->n == 0 || ticks < h->min)
        h->min = ticks;
    if (ticks > h->max)
        h->max = ticks;
    h->n++;
    h->sum += ticks;
}

static void hist_merge(struct histogram *into, const struct histogram *h)
{
    for (u32 b = 0; b < NBUCKETS; b++)
        into->count[b] += h->count[b];
    if (h->n && (into->n == 0 || h->min < into->min))
        into->min = h->min;
    if (h->max > into->max)
        into->max = h->max;
    into->n += h->n;
    into->sum += h->sum;
}

/* Upper bound (ns) of the bucket holding the q-per-mille quantile. */
static u64 hist_quantile_ns(const struct histogram *h, u32 per_mille)
{
    u64 rank = ((u64)h->n * per_mille + 999) / 1000;
    u64 seen = 0;
    if (rank == 0)
        rank = 1;
    for (u32 b = 0; b < NBUCKETS; b++) {
        seen += h->count[b];
        if (seen >= rank) {
            u64 hi = b + 1 < NBUCKETS ? bucket_lo(b + 1) - 1 : h->max;
            if (hi > h->max)
                hi = h->max;
            return (u64)tsc_to_ns((s64)hi);
        }
    }
    return (u64)tsc_to_ns((s64)h->max);
}

static void hist_print(const char *what, const struct histogram *h)
{
    if (h->n == 0) {
        printf("idle-sim: %s_ns n=0\n", what);
        return;
    }
    u64 mean = tsc_to_ns((s64)(h->sum / h->n));
    printf("idle-sim: %s_ns n=%u min %lld p50 %llu p99 %llu max %lld mean %llu\n", what, h->n,
           tsc_to_ns((s64)h->min), hist_quantile_ns(h, 500), hist_quantile_ns(h, 990),
           tsc_to_ns((s64)h->max), mean);
    char line[480];
    u32 len = 0, items = 0;
    for (u32 b = 0; b < NBUCKETS; b++) {
        if (!h->count[b])
            continue;
        u64 lo = tsc_to_ns((s64)bucket_lo(b));
        u64 top = h->max + 1 > 0x100000000ull ? h->max + 1 : 0x100000000ull;
        u64 hi = tsc_to_ns((s64)(b + 1 < NBUCKETS ? bucket_lo(b + 1) : top));
        len += snprintf(line + len, sizeof(line) - len, " %llu-%llu:%u", lo, hi, h->count[b]);
        if (++items == 12) {
            printf("idle-sim: hist %s%s\n", what, line);
            len = items = 0;
        }
    }
    if (items)
        printf("idle-sim: hist %s%s\n", what, line);
}

/* xorshift32. */
static u32 next_random(struct cpu_state *c)
{
    u32 x = c->rng;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    c->rng = x;
    return x;
}

/* An interval from the mix, in ms. */
static u32 draw_interval_ms(struct cpu_state *c)
{
    u32 r = next_random(c) % mix_total;
    for (u32 i = 0; i < mix_len; i++) {
        if (r < mix[i].weight) {
            u32 span = mix[i].hi_ms - mix[i].lo_ms + 1;
            return mix[i].lo_ms + (span > 1 ? next_random(c) % span : 0);
        }
        r -= mix[i].weight;
    }
    return mix[mix_len - 1].lo_ms;
}

/* Parses a decimal number at *s; advances *s. */
static u32 parse_u32(const char **s)
{
    u32 v = 0;
    while (**s >= '0' && **s <= '9')
        v = v * 10 + (u32)(*(*s)++ - '0');
    return v;
}

/* mix=W:MS[-MS],... */
static void parse_mix(const char *s)
{
    mix_len = mix_total = 0;
    while (*s && mix_len < MAX_MIX) {
        struct mix_entry e;
        e.weight = parse_u32(&s);
        if (*s++ != ':')
            fail("mix: expected WEIGHT:MS or WEIGHT:LO-HI, comma-separated");
        e.lo_ms = e.hi_ms = parse_u32(&s);
        if (*s == '-') {
            s++;
            e.hi_ms = parse_u32(&s);
        }
        if (e.lo_ms == 0 || e.hi_ms < e.lo_ms)
            fail("mix: intervals must be >= 1 ms and LO <= HI");
        mix[mix_len++] = e;
        mix_total += e.weight;
        if (*s == ',')
            s++;
        else if (*s)
            fail("mix: unexpected '%c'", *s);
    }
    if (mix_total == 0)
        fail("mix: the weights add up to 0");
}

/* EOI: if the hypervisor set this CPU's flag, clearing it is the EOI; else the register. */
static void eoi(void)
{
    if (use_pv_eoi && (__atomic_exchange_n(&pv_eoi_flag[this_cpu()], 0, __ATOMIC_SEQ_CST) & 1))
        return;
    lapic_eoi();
}

/* Records the lateness of a deadline that fired at `now`. */
static void record(struct cpu_state *c, u64 now, u64 expected)
{
    c->events++;
    if (now + early_ticks < expected)
        c->early++;
    u64 late = now > expected ? now - expected : 0;
    hist_add(&c->lateness, late);
    if (slack_ticks)
        hist_add(&c->past_slack, late > slack_ticks ? late - slack_ticks : 0);
}

/* rearm-*: the next deadline, `delta` from now, as the guest's timer code would write it. */
static void arm_next(struct cpu_state *c, u32 idx)
{
    c->deadline = rdtsc() + rearm_delta;
    if (use_pv_deadline)
        pv_deadline_slot[idx] = c->deadline; /* taken at the HLT's exit */
    else
        wrmsr(MSR_TSC_DEADLINE, c->deadline);
}

/* Timer interrupt: timestamp first; rearm-*: re-arm (until the end), EOI, record (or with
 * tail=0 record first); else EOI (the main loop records). Every guest instruction is
 * emulated on our hosts (~1.5 us each): the record after the EOI (the handler's tail, as
 * Linux's hrtimer_interrupt runs its callbacks and irq_exit) takes longer than a 77 us
 * delta, so the deadline passes while the handler still runs with interrupts off, and the
 * interrupt is taken at the `sti; hlt` after it. With tail=0 only the EOI and the return lie
 * between the WRMSR and the HLT: the deadline passes while the vCPU halts. */
static void timer_irq(struct trap_frame *f)
{
    u64 now = rdtsc();
    u32 idx = this_cpu();
    struct cpu_state *c = &cpu[idx];
    c->fired_tsc = now;
    c->fired++;
    if (!c->rearming) {
        eoi();
        return;
    }
    u64 expected = c->deadline;
    if (!rearm_tail)
        record(c, now, expected);
    if (now < end_tsc)
        arm_next(c, idx);
    else
        c->rearming = 0;
    eoi();
    if (rearm_tail)
        record(c, now, expected);
}

/* IPI from the previous CPU: its latency, EOI. */
static void ipi_irq(struct trap_frame *f)
{
    u64 now = rdtsc();
    struct cpu_state *c = &cpu[this_cpu()];
    u64 sent = c->ipi_tx_tsc;
    hist_add(&c->ipi, now > sent ? now - sent : 0);
    c->ipis_received++;
    eoi();
}

static void spurious_irq(struct trap_frame *f) {}

/* One CPU until the end: arm, halt until the timer, record, sometimes IPI the next CPU. */
static void run_idle(u32 idx)
{
    struct cpu_state *c = &cpu[idx];
    u32 next = (idx + 1) % ncpus;
    pv_eoi_register(idx);
    if (use_pv_deadline)
        wrmsr(MSR_LULL_PV_DEADLINE, (u64)(u32)&pv_deadline_slot[idx] | 1);
    if (use_deadline) {
        xapic_write(APIC_LVT_TIMER, TIMER_VECTOR | LVT_TIMER_TSC_DEADLINE);
    } else {
        xapic_write(APIC_TIMER_DIV, 0xb); /* divide by 1 */
        xapic_write(APIC_LVT_TIMER, TIMER_VECTOR | LVT_TIMER_ONESHOT);
    }
    cli();
    for (;;) {
        u64 now = rdtsc();
        if (now >= end_tsc)
            break;
        u32 ms = draw_interval_ms(c);
        u64 ticks = (u64)ms * rt_tsc_khz;
        if (now + ticks > end_tsc)
            ticks = end_tsc - now;
        u32 before = c->fired;
        u64 expected;
        if (use_deadline) {
            expected = rdtsc() + ticks;
            if (use_pv_deadline)
                pv_deadline_slot[idx] = expected; /* taken at the HLT's exit below */
            else
                wrmsr(MSR_TSC_DEADLINE, expected);
        } else {
            u32 init = (u32)(ticks * rt_bus_khz / rt_tsc_khz);
            expected = rdtsc() + (u64)init * rt_tsc_khz / rt_bus_khz;
            xapic_write(APIC_TIMER_INIT, init ? init : 1);
        }
        while (c->fired == before) {
            sti_hlt();
            cli();
        }
        record(c, c->fired_tsc, expected);
        if (ncpus > 1 && next_random(c) % 100 < ipi_pct) {
            xapic_write(APIC_ICR_HI, apic_of[next] << 24);
            cpu[next].ipi_tx_tsc = rdtsc();
            xapic_write(APIC_ICR_LO, ICR_FIXED | ICR_ASSERT | IPI_VECTOR);
            c->ipis_sent++;
        }
    }
    xapic_write(APIC_LVT_TIMER, LVT_MASKED);
}

/* rearm-*: arm once; the handler re-arms until the end; halt or write to the serial port. */
static void run_rearm(u32 idx)
{
    struct cpu_state *c = &cpu[idx];
    pv_eoi_register(idx);
    if (use_pv_deadline)
        wrmsr(MSR_LULL_PV_DEADLINE, (u64)(u32)&pv_deadline_slot[idx] | 1);
    xapic_write(APIC_LVT_TIMER, TIMER_VECTOR | LVT_TIMER_TSC_DEADLINE);
    cli();
    c->rearming = 1;
    arm_next(c, idx);
    if (pattern == PATTERN_REARM_HALT) {
        while (c->rearming) {
            sti_hlt();
            cli();
        }
    } else {
        u32 column = 0;
        sti();
        while (c->rearming) {
            outb(PORT_SERIAL, ++column % 64 ? '.' : '\n');
        }
        cli();
        outb(PORT_SERIAL, '\n');
    }
    xapic_write(APIC_LVT_TIMER, LVT_MASKED);
}

/* A busy CPU: runs guest code (interrupts on) until the end. */
static void run_busy(void)
{
    sti();
    while (rdtsc() < end_tsc)
        cpu_relax();
    cli();
}

/* This CPU's part: busy or idle. */
static void run_cpu(u32 idx)
{
    if (idx < busy)
        run_busy();
    else if (pattern != PATTERN_MIX)
        run_rearm(idx);
    else
        run_idle(idx);
}

/* AP body: LAPIC on, meet at the barrier, run, report done, then take late IPIs in HLT. */
static void ap_main(u32 index)
{
    lapic_enable(SPURIOUS_VECTOR);
    apic_of[index] = lapic_id();
    __atomic_fetch_add(&ready, 1, __ATOMIC_SEQ_CST);
    while (!go)
        cpu_relax();
    run_cpu(index);
    __atomic_fetch_add(&done, 1, __ATOMIC_SEQ_CST);
}

int main(void)
{
    char buf[128] = "30:1,30:4,40:10-500";
    char timer[12] = "deadline";
    char pattern_name[12] = "mix";
    ncpus = smp_cpu_count();
    if (ncpus > RT_MAX_CPUS)
        ncpus = RT_MAX_CPUS;
    u64 duration_ms = cmdline_u64("duration_ms", 10000);
    ipi_pct = (u32)cmdline_u64("ipi_pct", 5);
    u32 seed = (u32)cmdline_u64("seed", 1);
    busy = (u32)cmdline_u64("busy", 0);
    use_pv_eoi = (u32)cmdline_u64("pv_eoi", 0);
    if (use_pv_eoi && !kvm_offers_pv_eoi()) {
        printf("idle-sim: PV EOI not offered: using the EOI register\n");
        use_pv_eoi = 0;
    }
    use_pv_deadline = (u32)cmdline_u64("pv_deadline", 0);
    if (use_pv_deadline && !lull_offers_pv_deadline()) {
        printf("idle-sim: PV deadline not offered: using IA32_TSC_DEADLINE\n");
        use_pv_deadline = 0;
    }
    early_ticks = ns_to_tsc(cmdline_u64("early_ns", 10000));
    slack_ticks = ns_to_tsc(cmdline_u64("slack_ns", 0));
    cmdline_str("mix", buf, sizeof(buf));
    parse_mix(buf);
    cmdline_str("timer", timer, sizeof(timer));
    use_deadline = strncmp(timer, "oneshot", 8) != 0;
    if (use_deadline && !cpu_has_tsc_deadline()) {
        printf("idle-sim: TSC-deadline not offered: using one-shot\n");
        use_deadline = 0;
    }
    cmdline_str("pattern", pattern_name, sizeof(pattern_name));
    if (strncmp(pattern_name, "rearm-halt", 11) == 0)
        pattern = PATTERN_REARM_HALT;
    else if (strncmp(pattern_name, "rearm-busy", 11) == 0)
        pattern = PATTERN_REARM_BUSY;
    else if (strncmp(pattern_name, "mix", 4) != 0)
        fail("pattern: expected mix, rearm-halt or rearm-busy");
    rearm_delta = cmdline_u64("delta", 200000);
    rearm_tail = (u32)cmdline_u64("tail", 1);
    if (pattern != PATTERN_MIX && !use_deadline)
        fail("pattern=%s needs TSC-deadline", pattern_name);
    if (pattern == PATTERN_REARM_BUSY)
        use_pv_deadline = 0; /* a slot takes effect at the next exit: not for a running CPU */
    if (!use_deadline)
        use_pv_deadline = 0;
    for (u32 i = 0; i < RT_MAX_CPUS; i++)
        cpu[i].rng = (seed + 1) * 2654435761u ^ (i * 40503u + 1);

    rt_set_irq_handler(TIMER_VECTOR, timer_irq);
    rt_set_irq_handler(IPI_VECTOR, ipi_irq);
    rt_set_irq_handler(SPURIOUS_VECTOR, spurious_irq);
    lapic_enable(SPURIOUS_VECTOR);
    apic_of[0] = lapic_id();
    if (pattern == PATTERN_MIX)
        printf("idle-sim: %u CPUs (%u busy), %s%s, duration %llu ms, mix %s, ipi %u%%, eoi %s\n",
               ncpus, busy, use_deadline ? "tsc-deadline" : "one-shot div1",
               use_pv_deadline ? " (pv)" : "", duration_ms, buf, ipi_pct,
               use_pv_eoi ? "pv" : "register");
    else
        printf("idle-sim: %u CPUs (%u busy), %s, tsc-deadline%s, delta %llu tsc, tail %u, "
               "duration %llu ms, eoi %s\n",
               ncpus, busy, pattern_name, use_pv_deadline ? " (pv)" : "", rearm_delta,
               rearm_tail, duration_ms, use_pv_eoi ? "pv" : "register");
    if (ncpus > 1) {
        u32 online = smp_start_aps(ncpus, ap_main, 5000);
        u64 end = rdtsc() + ns_to_tsc(5000000000ull);
        while (ready < online && rdtsc() < end)
            cpu_relax();
        if (ready != ncpus - 1)
            fail("%u of %u AP(s) came up", ready, ncpus - 1);
    }
    end_tsc = rdtsc() + ns_to_tsc(duration_ms * 1000000);
    go = 1;
    run_cpu(0);
    /* Wait for the APs in HLT (spinning at CPL0 is emulated and slow to interrupt): a 1 ms
     * TSC-deadline (or one-shot) tick wakes the BSP to look. */
    u64 end = end_tsc + ns_to_tsc(2000000000ull);
    xapic_write(APIC_LVT_TIMER, TIMER_VECTOR | (use_deadline ? LVT_TIMER_TSC_DEADLINE : 0));
    while (done < ncpus - 1 && rdtsc() < end) {
        u32 before = cpu[0].fired;
        if (use_pv_deadline)
            pv_deadline_slot[0] = rdtsc() + ns_to_tsc(1000000);
        else if (use_deadline)
            wrmsr(MSR_TSC_DEADLINE, rdtsc() + ns_to_tsc(1000000));
        else
            xapic_write(APIC_TIMER_INIT, rt_bus_khz);
        while (cpu[0].fired == before) {
            sti_hlt();
            cli();
        }
    }
    xapic_write(APIC_LVT_TIMER, LVT_MASKED);
    if (done != ncpus - 1)
        fail("%u of %u AP(s) finished within duration + 2 s", done, ncpus - 1);

    static struct histogram lateness, ipi, past_slack;
    for (u32 j = 0; j < ncpus; j++) {
        struct cpu_state *c = &cpu[j];
        printf("idle-sim: cpu %u: events %u ipis_sent %u ipis_received %u early %u\n", j,
               c->events, c->ipis_sent, c->ipis_received, c->early);
        hist_merge(&lateness, &c->lateness);
        hist_merge(&ipi, &c->ipi);
        hist_merge(&past_slack, &c->past_slack);
    }
    hist_print("lateness", &lateness);
    hist_print("ipi", &ipi);
    if (slack_ticks)
        hist_print("past_slack", &past_slack);
    printf("idle-sim: PASS\n");
    return RT_EXIT_PASS;
}
