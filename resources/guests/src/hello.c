/*
 * hello - the smallest guest: proves boot, serial output, the command line, the timing leaf
 * and the exit port.
 *
 * Prints:
 *   hello: Hello from a lull test guest
 *   hello: cmdline "<the PVH command line>"
 *   hello: tsc_khz <CPUID 0x40000010 EAX> bus_khz <EBX>
 *   hello: PASS
 * and exits 0.
 *
 * Parameter fault=de|gp makes it fault instead of passing (a divide error, or a #GP from
 * reading a non-existent MSR), to test the runtime's exception report:
 *   hello: FAIL: exception vector 13 (#GP general protection) error 0x0 at eip 0x... ...
 * and exit code 2 (RT_EXIT_EXCEPTION).
 */
#include "rt.h"

/* Print the greeting, the command line and the frequencies. */
int main(void)
{
    printf("hello: Hello from a lull test guest\n");
    printf("hello: cmdline \"%s\"\n", cmdline());
    printf("hello: tsc_khz %u bus_khz %u\n", rt_tsc_khz, rt_bus_khz);

    char fault[8] = "";
    cmdline_str("fault", fault, sizeof(fault));
    if (!strncmp(fault, "de", 3)) {
        u32 q = 1, zero = 0;
        printf("hello: dividing by zero\n");
        __asm__ volatile("divl %2" : "+a"(q) : "d"(0), "r"(zero)); /* C would fold it */
        printf("hello: %u\n", q);
    } else if (!strncmp(fault, "gp", 3)) {
        printf("hello: reading MSR 0xdeadbeef\n");
        printf("hello: 0x%llx\n", rdmsr(0xdeadbeef));
    }
    printf("hello: PASS\n");
    return RT_EXIT_PASS;
}
