/*
 * mb-apic-base - IA32_APIC_BASE as kvm-unit-tests' apic test checks it: CPUID.1:EDX[9]
 * (APIC present) follows the global enable bit, and an xAPIC moved to another base answers
 * there (ALTERNATE_APIC_BASE 0xfed40000). Prints
 *   mb-apic-base: cpuid apic bit: enabled 1, disabled 0, re-enabled 1
 *   mb-apic-base: relocated to 0xfed40000: version 0x... (same as at 0xfee00000)
 *   mb-apic-base: PASS
 */
#include "mb.h"

#define APIC_BASE_BSP (1u << 8)
#define APIC_BASE_EXTD (1u << 10)
#define APIC_BASE_EN (1u << 11)
#define ALTERNATE_APIC_BASE 0xfed40000u

static u32 cpuid_apic(void) { return (cpuid(1, 0).edx >> 9) & 1; }

int main(void)
{
    u64 orig = rdmsr(MSR_APIC_BASE);
    lapic_enable(0xff);
    u32 version = xapic_read(APIC_VERSION);
    printf("mb-apic-base: IA32_APIC_BASE 0x%llx, version 0x%x\n", orig, version);

    u32 enabled = cpuid_apic();
    wrmsr(MSR_APIC_BASE, orig & ~(u64)(APIC_BASE_EN | APIC_BASE_EXTD));
    u32 disabled = cpuid_apic();
    wrmsr(MSR_APIC_BASE, ALTERNATE_APIC_BASE | APIC_BASE_BSP | APIC_BASE_EN);
    u32 reenabled = cpuid_apic();
    printf("mb-apic-base: cpuid apic bit: enabled %u, disabled %u, re-enabled %u\n", enabled,
           disabled, reenabled);

    u32 moved = mmio_read32(ALTERNATE_APIC_BASE + APIC_VERSION);
    u64 now = rdmsr(MSR_APIC_BASE);
    printf("mb-apic-base: relocated to 0x%x: version 0x%x (0x%x at 0xfee00000), "
           "IA32_APIC_BASE 0x%llx\n",
           ALTERNATE_APIC_BASE, moved, version, now);
    wrmsr(MSR_APIC_BASE, orig);
    u32 back = xapic_read(APIC_VERSION);
    if (!enabled || disabled || !reenabled)
        fail("CPUID.1:EDX[9] does not follow IA32_APIC_BASE.EN (%u %u %u)", enabled, disabled,
             reenabled);
    if (moved != version || (now & ~0xfffull) != ALTERNATE_APIC_BASE)
        fail("the relocated APIC does not answer at 0x%x", ALTERNATE_APIC_BASE);
    if (back != version)
        fail("the APIC moved back reads version 0x%x", back);
    printf("mb-apic-base: PASS\n");
    return RT_EXIT_PASS;
}
