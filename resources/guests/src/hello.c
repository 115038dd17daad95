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
 */
#include "rt.h"

/* Print the greeting, the command line and the frequencies. */
int main(void)
{
    printf("hello: Hello from a lull test guest\n");
    printf("hello: cmdline \"%s\"\n", cmdline());
    printf("hello: tsc_khz %u bus_khz %u\n", rt_tsc_khz, rt_bus_khz);
    printf("hello: PASS\n");
    return RT_EXIT_PASS;
}
