/*
 * rt.h - the lull test-guest runtime (32-bit protected mode, paging off).
 *
 * A guest is one C file that defines `int main(void)`. Before main runs, the runtime has:
 *   - entered from the PVH entry point with its own flat GDT and an IDT (exceptions print
 *     vector, error code and EIP, then exit with RT_EXIT_EXCEPTION; interrupt vectors go to
 *     handlers registered with rt_set_irq_handler());
 *   - set up COM1 (polled 16550) for printf();
 *   - copied the PVH command line (see cmdline_u64()/cmdline_str());
 *   - read the TSC and LAPIC-bus frequencies from CPUID 0x40000010 (rt_tsc_khz, rt_bus_khz),
 *     or exited with RT_EXIT_NO_TIMING_LEAF if the hypervisor does not offer that leaf.
 * main's return value goes to guest_exit(): 0 = pass.
 *
 * Everything here must compile to plain integer instructions: guest CPL0 code is emulated
 * instruction by instruction on our hosts (see forbidden-insns.txt).
 */
#ifndef LULL_RT_H
#define LULL_RT_H

#include <stdarg.h>
#include <stdint.h>

typedef uint64_t u64;
typedef int64_t s64;
typedef uint32_t u32;
typedef int32_t s32;
typedef uint16_t u16;
typedef uint8_t u8;

#define NULL ((void *)0)
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* ---- exit codes (written to port 0xf4; the VMM exits with (code << 1) | 1) ---- */
#define RT_EXIT_PASS 0            /* the test passed */
#define RT_EXIT_FAIL 1            /* the test's own check failed (it printed "FAIL: why") */
#define RT_EXIT_EXCEPTION 2       /* an unexpected CPU exception (vector 0-31) */
#define RT_EXIT_NO_TIMING_LEAF 3  /* CPUID 0x40000010 missing: TSC/bus frequency unknown */
#define RT_EXIT_BAD_BOOT 4        /* no valid PVH hvm_start_info in EBX */
#define RT_EXIT_UNEXPECTED_IRQ 5  /* an interrupt vector with no registered handler */
#define RT_EXIT_SKIP 6            /* the guest cannot run here (feature missing); not a pass */

#define RT_MAX_CPUS 8
#define RT_STACK_SIZE 16384
#define RT_AP_TRAMPOLINE_PAGE 0x08 /* SIPI vector: the AP starts at 0x8000 in real mode */

/* ---- ports and MMIO ---- */
#define PORT_SERIAL 0x3f8
#define PORT_TEST_EXIT 0xf4
#define PORT_BOOT_MARKER 0x3f0

/* Write a byte to an I/O port. */
static inline void outb(u16 port, u8 v) { __asm__ volatile("outb %0, %1" ::"a"(v), "Nd"(port)); }
/* Write a 32-bit value to an I/O port. */
static inline void outl(u16 port, u32 v) { __asm__ volatile("outl %0, %1" ::"a"(v), "Nd"(port)); }
/* Read a byte from an I/O port. */
static inline u8 inb(u16 port)
{
    u8 v;
    __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}
/* Read a 32-bit MMIO register. */
static inline u32 mmio_read32(u32 addr) { return *(volatile u32 *)addr; }
/* Write a 32-bit MMIO register. */
static inline void mmio_write32(u32 addr, u32 v) { *(volatile u32 *)addr = v; }

/* ---- CPU helpers ---- */
struct cpuid_regs {
    u32 eax, ebx, ecx, edx;
};
/* Execute CPUID for (leaf, subleaf). */
static inline struct cpuid_regs cpuid(u32 leaf, u32 subleaf)
{
    struct cpuid_regs r;
    __asm__ volatile("cpuid" : "=a"(r.eax), "=b"(r.ebx), "=c"(r.ecx), "=d"(r.edx)
                     : "a"(leaf), "c"(subleaf));
    return r;
}
/* Read the time-stamp counter (plain RDTSC; RDTSCP is not available at CPL0 here). */
static inline u64 rdtsc(void)
{
    u32 lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((u64)hi << 32) | lo;
}
/* Read a model-specific register. */
static inline u64 rdmsr(u32 msr)
{
    u32 lo, hi;
    __asm__ volatile("rdmsr" : "=a"(lo), "=d"(hi) : "c"(msr));
    return ((u64)hi << 32) | lo;
}
/* Write a model-specific register. */
static inline void wrmsr(u32 msr, u64 v)
{
    __asm__ volatile("wrmsr" ::"c"(msr), "a"((u32)v), "d"((u32)(v >> 32)) : "memory");
}
/* Enable interrupts. */
static inline void sti(void) { __asm__ volatile("sti" ::: "memory"); }
/* Disable interrupts. */
static inline void cli(void) { __asm__ volatile("cli" ::: "memory"); }
/* Enable interrupts and halt until one arrives (STI's shadow makes the pair atomic). */
static inline void sti_hlt(void) { __asm__ volatile("sti; hlt" ::: "memory"); }
/* Spin-wait hint. */
static inline void cpu_relax(void) { __asm__ volatile("pause" ::: "memory"); }
/* Compiler barrier. */
static inline void barrier(void) { __asm__ volatile("" ::: "memory"); }

/* ---- exits ---- */
/* Write `code` to the test-exit port; never returns. */
void guest_exit(u32 code) __attribute__((noreturn));
/* Print "<name>: FAIL: <msg>" and exit with RT_EXIT_FAIL. */
void fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* ---- output ---- */
void serial_init(void);
void serial_putc(char c);
int printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int vprintf(const char *fmt, va_list ap);
int snprintf(char *buf, u32 size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int vsnprintf(char *buf, u32 size, const char *fmt, va_list ap);
/* The guest's name, used as the prefix of runtime messages; each guest defines it. */
extern const char guest_name[];

/* ---- string helpers (no libc) ---- */
void *memset(void *d, int c, u32 n);
void *memcpy(void *d, const void *s, u32 n);
u32 strlen(const char *s);
int strncmp(const char *a, const char *b, u32 n);

/* ---- command line (PVH hvm_start_info.cmdline_paddr), "key=value key2=value2 flag" ---- */
const char *cmdline(void);
/* Value of `key=N` (decimal or 0x hex), or `def` if absent or malformed. */
u64 cmdline_u64(const char *key, u64 def);
/* Copy the value of `key=...` into buf (NUL-terminated); returns 0 if absent. */
int cmdline_str(const char *key, char *buf, u32 size);

/* ---- time ---- */
extern u32 rt_tsc_khz; /* CPUID 0x40000010 EAX */
extern u32 rt_bus_khz; /* CPUID 0x40000010 EBX */
/* TSC ticks -> nanoseconds (signed, for lateness). */
s64 tsc_to_ns(s64 ticks);
/* Nanoseconds -> TSC ticks. */
u64 ns_to_tsc(u64 ns);
/* Busy-wait (interrupts untouched) for `ns` nanoseconds of TSC time. */
void delay_ns(u64 ns);

/* ---- interrupts ---- */
struct trap_frame {
    u32 edi, esi, ebp, esp_unused, ebx, edx, ecx, eax; /* pushal */
    u32 vector, error;                                  /* pushed by the stub */
    u32 eip, cs, eflags;                                /* pushed by the CPU */
};
typedef void (*irq_handler_t)(struct trap_frame *f);
/* Route interrupt vector `vec` (32-255) to `h` (called with interrupts disabled). */
void rt_set_irq_handler(u8 vec, irq_handler_t h);

/* ---- local APIC: xAPIC MMIO at 0xFEE00000 and x2APIC MSRs 0x800+ ---- */
#define XAPIC_BASE 0xFEE00000u
#define APIC_ID 0x020
#define APIC_VERSION 0x030
#define APIC_TPR 0x080
#define APIC_PPR 0x0A0
#define APIC_EOI 0x0B0
#define APIC_LDR 0x0D0
#define APIC_SVR 0x0F0
#define APIC_ISR 0x100 /* 8 registers, 0x10 apart */
#define APIC_TMR 0x180
#define APIC_IRR 0x200
#define APIC_ESR 0x280
#define APIC_ICR_LO 0x300
#define APIC_ICR_HI 0x310
#define APIC_LVT_TIMER 0x320
#define APIC_LVT_LINT0 0x350
#define APIC_LVT_LINT1 0x360
#define APIC_LVT_ERROR 0x370
#define APIC_TIMER_INIT 0x380
#define APIC_TIMER_CUR 0x390
#define APIC_TIMER_DIV 0x3E0
#define APIC_SELF_IPI 0x3F0 /* x2APIC only */

#define LVT_MASKED (1u << 16)
#define LVT_TIMER_ONESHOT (0u << 17)
#define LVT_TIMER_PERIODIC (1u << 17)
#define LVT_TIMER_TSC_DEADLINE (2u << 17)
#define ICR_FIXED (0u << 8)
#define ICR_INIT (5u << 8)
#define ICR_STARTUP (6u << 8)
#define ICR_BUSY (1u << 12)
#define ICR_ASSERT (1u << 14)
#define ICR_SELF (1u << 18)
#define ICR_ALL_BUT_SELF (3u << 18)

#define MSR_APIC_BASE 0x1B
#define MSR_TSC_DEADLINE 0x6E0
#define MSR_X2APIC_BASE 0x800

/* Read an xAPIC register (offset from 0xFEE00000). */
static inline u32 xapic_read(u32 reg) { return mmio_read32(XAPIC_BASE + reg); }
/* Write an xAPIC register. */
static inline void xapic_write(u32 reg, u32 v) { mmio_write32(XAPIC_BASE + reg, v); }
/* Read an x2APIC register (xAPIC offset, mapped to MSR 0x800 + reg/16). */
static inline u64 x2apic_read(u32 reg) { return rdmsr(MSR_X2APIC_BASE + (reg >> 4)); }
/* Write an x2APIC register. */
static inline void x2apic_write(u32 reg, u64 v) { wrmsr(MSR_X2APIC_BASE + (reg >> 4), v); }

/* Software-enable the xAPIC with the given spurious vector; TPR = 0. */
void lapic_enable(u8 spurious_vector);
/* Signal end of interrupt (xAPIC). */
static inline void lapic_eoi(void) { xapic_write(APIC_EOI, 0); }
/* This CPU's xAPIC ID (bits 31:24 of the ID register). */
static inline u32 lapic_id(void) { return xapic_read(APIC_ID) >> 24; }
/* Is bit `vec` set in the 256-bit register bank at `base` (APIC_ISR/TMR/IRR)? */
int lapic_vector_bit(u32 base, u8 vec);
/* Send an IPI through the xAPIC ICR and wait until the delivery status is idle. */
int lapic_send_ipi(u32 dest_apic_id, u32 icr_lo);
/* Switch this CPU's LAPIC to x2APIC mode (IA32_APIC_BASE.EXTD). */
void x2apic_enable(void);
/* CPUID feature tests. */
int cpu_has_tsc_deadline(void); /* CPUID.1:ECX[24] */
int cpu_has_x2apic(void);       /* CPUID.1:ECX[21] */

/* ---- SMP ---- */
typedef void (*ap_entry_t)(u32 cpu_index);
/*
 * Start the APs with APIC IDs 1..ncpus-1 by INIT/SIPI: each comes in through the real-mode
 * trampoline (ap-trampoline.S) at RT_AP_TRAMPOLINE_PAGE << 12, switches to protected mode,
 * takes a stack and calls fn(cpu_index) with cpu_index in 1..ncpus-1 (in arrival order).
 * Returns the number of APs that reached fn within timeout_ms.
 */
u32 smp_start_aps(u32 ncpus, ap_entry_t fn, u32 timeout_ms);
/* Number of CPUs that have entered C code (BSP included). */
u32 smp_online(void);
/* The function APs run, for guests that start APs themselves (smp_start_aps sets it). */
void smp_set_ap_function(ap_entry_t fn);
/*
 * How many CPUs the machine has: `cpus=N` from the command line, else CPUID 0xB (logical
 * processors at the core level), else CPUID.1:EBX[23:16] (if HTT), else 1. APIC IDs are
 * assumed to be 0..N-1 (lull's MP table, QEMU's default topology).
 */
u32 smp_cpu_count(void);

/* ---- statistics ---- */
/* Sort `n` signed values ascending (insertion sort; n is small). */
void sort_s64(s64 *v, u32 n);

int main(void);

/* build.sh compiles each guest with -DGUEST_NAME="name": that file defines guest_name. */
#ifdef GUEST_NAME
const char guest_name[] = GUEST_NAME;
#endif

#endif
