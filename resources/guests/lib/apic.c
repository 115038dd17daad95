/*
 * apic.c - local APIC helpers (xAPIC MMIO, x2APIC MSRs) and AP bring-up by INIT/SIPI.
 */
#include "rt.h"

void lapic_enable(u8 spurious_vector)
{
    u64 base = rdmsr(MSR_APIC_BASE);
    if (!(base & (1u << 11))) /* globally disabled: enable at the default base */
        wrmsr(MSR_APIC_BASE, (base & 0xfff) | XAPIC_BASE | (1u << 11));
    xapic_write(APIC_TPR, 0);
    xapic_write(APIC_SVR, 0x100u | spurious_vector);
}

int lapic_vector_bit(u32 base, u8 vec)
{
    return (xapic_read(base + 0x10 * (vec / 32)) >> (vec % 32)) & 1;
}

int lapic_send_ipi(u32 dest_apic_id, u32 icr_lo)
{
    xapic_write(APIC_ICR_HI, dest_apic_id << 24);
    xapic_write(APIC_ICR_LO, icr_lo);
    for (u32 i = 0; i < 100000; i++)
        if (!(xapic_read(APIC_ICR_LO) & ICR_BUSY))
            return 0;
    return -1;
}

void x2apic_enable(void)
{
    u64 base = rdmsr(MSR_APIC_BASE);
    wrmsr(MSR_APIC_BASE, base | (1u << 11) | (1u << 10));
}

int cpu_has_tsc_deadline(void) { return (cpuid(1, 0).ecx >> 24) & 1; }

int cpu_has_x2apic(void) { return (cpuid(1, 0).ecx >> 21) & 1; }

/* ---- SMP ---- */

extern char rt_ap_trampoline[], rt_ap_trampoline_end[]; /* ap-trampoline.S */

static volatile u32 cpus_online = 1; /* the BSP */
static volatile ap_entry_t ap_fn;

u32 smp_online(void) { return cpus_online; }

void smp_set_ap_function(ap_entry_t fn) { ap_fn = fn; }

u32 smp_cpu_count(void)
{
    u32 n = (u32)cmdline_u64("cpus", 0);
    if (n)
        return n;
    if (cpuid(0, 0).eax >= 0xb) {
        struct cpuid_regs r = cpuid(0xb, 1);
        if (((r.ecx >> 8) & 0xff) == 2 && (r.ebx & 0xffff)) /* level type 2 = core */
            return r.ebx & 0xffff;
    }
    struct cpuid_regs r = cpuid(1, 0);
    if (r.edx & (1u << 28)) /* HTT: EBX[23:16] = logical processors per package */
        return (r.ebx >> 16) & 0xff;
    return 1;
}

/* Called on each AP from rt_ap_start(): count it online, then run the guest's function. */
void rt_ap_online(u32 index)
{
    __atomic_fetch_add(&cpus_online, 1, __ATOMIC_SEQ_CST);
    if (ap_fn)
        ap_fn(index);
}

u32 smp_start_aps(u32 ncpus, ap_entry_t fn, u32 timeout_ms)
{
    if (ncpus > RT_MAX_CPUS)
        ncpus = RT_MAX_CPUS;
    ap_fn = fn;
    /* The real-mode hook: copy the trampoline to the SIPI vector page below 1 MiB. */
    u32 len = (u32)(rt_ap_trampoline_end - rt_ap_trampoline);
    memcpy((void *)(RT_AP_TRAMPOLINE_PAGE << 12), rt_ap_trampoline, len);
    barrier();
    u32 before = cpus_online;
    for (u32 id = 1; id < ncpus; id++) {
        /* INIT, 10 ms, then two STARTUPs 200 us apart (Intel SDM / MP spec sequence). */
        if (lapic_send_ipi(id, ICR_INIT | ICR_ASSERT))
            printf("%s: INIT to APIC %u stuck in delivery\n", guest_name, id);
        delay_ns(10000000);
        for (int i = 0; i < 2; i++) {
            if (lapic_send_ipi(id, ICR_STARTUP | ICR_ASSERT | RT_AP_TRAMPOLINE_PAGE))
                printf("%s: SIPI to APIC %u stuck in delivery\n", guest_name, id);
            delay_ns(200000);
        }
    }
    u64 deadline = rdtsc() + ns_to_tsc((u64)timeout_ms * 1000000);
    while (cpus_online - before < ncpus - 1 && rdtsc() < deadline)
        cpu_relax();
    return cpus_online - before;
}
