/*
 * lapic-conformance-cpu.h - what lapic-conformance needs of the CPU beyond the runtime (rt.h):
 *
 *   - a survivable #GP: idt_build() copies the runtime's IDT (whose exceptions are fatal) and
 *     takes over #GP, so that rdmsr_fault() / wrmsr_fault() report a fault and step over the
 *     2-byte RDMSR/WRMSR; every other #GP still goes to the runtime. Vector 3 is taken over
 *     too: KVM delivers a self-IPI with illegal vector 3 as an interrupt (see the checks).
 *     Stubs return without IRET like the runtime's (README, "Interrupt return without IRET").
 *   - 64-bit mode for AP 1: CR8 exists only there, and only IRET ends NMI blocking, which
 *     32-bit code cannot execute on our hosts. conf_long_mode() switches to long mode (identity
 *     map of 4 GiB in 2 MiB pages, the runtime's GDT plus a 64-bit code segment 0x18, a 64-bit
 *     IDT), runs the CR8 part of the cr8_tpr check, reports through `lm` and halts with IF=0;
 *     its NMI handler counts in `lm.nmis` and returns with IRETQ. From that halt an NMI with
 *     `lm.pair_rounds` set sends it to the nmi_pairs rounds (lapic-conformance-nmi.h).
 *
 * Included once, by lapic-conformance.c (every guest is one translation unit).
 */
#ifndef LAPIC_CONFORMANCE_CPU_H
#define LAPIC_CONFORMANCE_CPU_H

#include "rt.h"

/* ---- #GP catching ---- */
volatile u32 fault_armed, fault_vector;

__asm__(".text\n"
        ".globl conf_gp_stub, conf_vec3_stub\n"
        "conf_vec3_stub:\n"          /* vector 3 as an interrupt (see esr_send_illegal_vector) */
        "    movl $0, 0xFEE000B0\n"   /* EOI */
        "    jmp conf_return\n"
        "conf_gp_stub:\n"            /* [error, EIP, CS, EFLAGS] */
        "    cmpl $0, fault_armed\n"
        "    je 1f\n"
        "    movl $13, fault_vector\n"
        "    addl $4, %esp\n"
        "    jmp conf_skip\n"
        "1:  jmp rt_isr_stubs + 13 * 16\n"
        "conf_skip:\n"               /* step over the faulting instruction */
        "    movl $0, fault_armed\n"
        "    pushl %eax\n"
        "    addl $2, 4(%esp)\n"          /* RDMSR and WRMSR are 2 bytes */
        "    popl %eax\n"
        "    jmp conf_return\n"
        /* Unwind [EIP, CS, EFLAGS] as POPF + RET, as the runtime's isr_common does. */
        "conf_return:\n"
        "    pushl %eax\n"
        "    movl 4(%esp), %eax\n"
        "    xchgl %eax, 12(%esp)\n"
        "    movl %eax, 8(%esp)\n"
        "    popl %eax\n"
        "    leal 4(%esp), %esp\n"
        "    btrl $9, (%esp)\n"
        "    jnc 2f\n"
        "    popfl\n"
        "    sti\n"
        "    ret\n"
        "2:  popfl\n"
        "    ret\n");
extern char conf_gp_stub[], conf_vec3_stub[];

struct idt_gate {
    u16 lo, sel;
    u8 zero, type;
    u16 hi;
} __attribute__((packed));
struct desc32 {
    u16 limit;
    u32 base;
} __attribute__((packed));
static struct idt_gate idt[256] __attribute__((aligned(16)));

static void set_gate(u32 vec, char *stub)
{
    idt[vec].lo = (u32)stub & 0xffff;
    idt[vec].hi = (u32)stub >> 16;
    idt[vec].sel = 0x08;
    idt[vec].zero = 0;
    idt[vec].type = 0x8E;
}

/* Copy the runtime's IDT and take over vector 3 and #GP (BSP, once). */
static void idt_build(void)
{
    struct desc32 p;
    __asm__ volatile("sidt %0" : "=m"(p));
    memcpy(idt, (void *)p.base, sizeof(idt));
    set_gate(3, conf_vec3_stub);
    set_gate(13, conf_gp_stub);
}

static void idt_load_own(void)
{
    struct desc32 p = { sizeof(idt) - 1, (u32)idt };
    __asm__ volatile("lidt %0" ::"m"(p));
}

/* RDMSR/WRMSR that report a #GP instead of dying: returns the vector taken, 0 if none. */
static u32 rdmsr_fault(u32 msr, u64 *value)
{
    u32 lo = 0, hi = 0;
    fault_vector = 0;
    fault_armed = 1;
    __asm__ volatile("rdmsr" : "+a"(lo), "+d"(hi) : "c"(msr) : "memory");
    fault_armed = 0;
    *value = ((u64)hi << 32) | lo;
    return fault_vector;
}

static u32 wrmsr_fault(u32 msr, u64 v)
{
    fault_vector = 0;
    fault_armed = 1;
    __asm__ volatile("wrmsr" ::"c"(msr), "a"((u32)v), "d"((u32)(v >> 32)) : "memory");
    fault_armed = 0;
    return fault_vector;
}

/*
 * ---- long mode, for what 32-bit code cannot do here ----
 * CR8 exists only in 64-bit mode (KVM's emulator has no LOCK MOV CR0 alias), and only IRET
 * ends NMI blocking, which this runtime cannot execute in 32-bit mode (README): so AP 1 runs
 * those checks in 64-bit mode, where IRETQ works, and stays there (HLT, IF=0) to the end.
 * Identity map of 4 GiB in 2 MiB pages; GDT = the runtime's three entries + 64-bit code 0x18;
 * a 64-bit IDT: NMI counts, vector VEC_CR8 counts, other vectors EOI, exceptions park.
 */
#define VEC_CR8 0x62
u64 pml4[512] __attribute__((aligned(4096)));
static u64 pdpt[512] __attribute__((aligned(4096)));
static u64 pd[4][512] __attribute__((aligned(4096)));
static u64 gdt64[4] __attribute__((aligned(8)));
static u32 idt64[256 * 4] __attribute__((aligned(16)));
struct desc64 {
    u16 limit;
    u32 base_lo, base_hi;
} __attribute__((packed));
struct desc32 gdt64_desc;
struct desc64 idt64_desc;
/* What AP 1 does in long mode; the offsets are used by the assembly below. */
struct long_mode_state {
    u32 go;            /* 0: BSP -> AP 1: go to long mode */
    u32 parked;        /* 4: AP 1 finished the CR8 part */
    u32 fault;         /* 8: AP 1 took an exception */
    u32 nmis;          /* 12 */
    u32 cr8_irqs;      /* 16: VEC_CR8 taken */
    u32 cr8_irqs_held; /* 20: VEC_CR8 taken while CR8 was 6 */
    u32 tpr_after_cr8; /* 24: TPR after CR8 = 5 */
    u32 cr8_after_tpr; /* 28: CR8 after TPR = 0x3C */
    /* nmi_pairs (lapic-conformance-nmi.h): */
    u32 pair_rounds;   /* 32: BSP -> AP 1: rounds to run (0: stay parked) */
    u32 pair_base;     /* 36: BSP -> AP 1: `nmis` once the wake-up NMI is handled */
    u32 pair_round;    /* 40: AP 1 -> BSP: the round it is ready for */
    u32 pair_fixed;    /* 44: VEC_PAIR taken (one per round) */
    u32 pair_nmis;     /* 48: `nmis` when VEC_PAIR was last taken */
    u32 pair_failed;   /* 52: rounds with other than 2 NMIs before VEC_PAIR */
    u32 pair_first;    /* 56: the first such round */
    u32 pair_first_n;  /* 60: its NMIs */
    u32 pair_done;     /* 64: rounds finished */
};
volatile struct long_mode_state lm;

__asm__(".text\n"
        ".globl conf_long_mode, conf_park64, conf_irq64, conf_other64, conf_nmi64, conf_fault64\n"
        ".code32\n"
        "conf_long_mode:\n"              /* IF=0; never returns */
        "    movl %cr4, %eax\n"
        "    orl $0x20, %eax\n"           /* PAE */
        "    movl %eax, %cr4\n"
        "    movl $pml4, %eax\n"
        "    movl %eax, %cr3\n"
        "    movl $0xC0000080, %ecx\n"    /* EFER.LME */
        "    rdmsr\n"
        "    orl $0x100, %eax\n"
        "    wrmsr\n"
        "    lgdt gdt64_desc\n"
        "    movl %cr0, %eax\n"
        "    orl $0x80000000, %eax\n"     /* PG: IA-32e mode active */
        "    movl %eax, %cr0\n"
        "    ljmp $0x18, $1f\n"
        ".code64\n"
        /* 64-bit code in a 32-bit object: no 64-bit relocations, so data goes through
         * %ebx = &lm (address-size prefix; everything is below 4 GiB), the APIC through
         * MOV with a 64-bit moffs. */
        "1:  movl %esp, %esp\n"
        "    movl $idt64_desc, %eax\n"
        "    lidt (%eax)\n"
        "    movl $lm, %ebx\n"
        /* CR8 5 -> TPR; TPR 0x3C -> CR8 */
        "    movl $5, %eax\n"
        "    .byte 0x44, 0x0f, 0x22, 0xc0\n" /* mov %rax, %cr8 */
        "    movl 0xFEE00080, %eax\n"
        "    movl %eax, 24(%ebx)\n"
        "    movl $0x3C, %eax\n"
        "    movl %eax, 0xFEE00080\n"
        "    .byte 0x44, 0x0f, 0x20, 0xc0\n" /* mov %cr8, %rax */
        "    movl %eax, 28(%ebx)\n"
        /* CR8 6 holds a self-IPI of class 6; CR8 0 lets it in */
        "    movl $6, %eax\n"
        "    .byte 0x44, 0x0f, 0x22, 0xc0\n"
        "    xorl %eax, %eax\n"
        "    movl %eax, 0xFEE00310\n"
        "    movl $0x44062, %eax\n"
        "    movl %eax, 0xFEE00300\n"
        "    sti\n"
        "    movl $2000, %ecx\n"
        "2:  pause\n"
        "    decl %ecx\n"
        "    jnz 2b\n"
        "    cli\n"
        "    movl 16(%ebx), %eax\n"
        "    movl %eax, 20(%ebx)\n"
        "    xorl %eax, %eax\n"
        "    .byte 0x44, 0x0f, 0x22, 0xc0\n"
        "    sti\n"
        "    movl $5000, %ecx\n"
        "3:  cmpl $0, 16(%ebx)\n"
        "    jne 4f\n"
        "    pause\n"
        "    decl %ecx\n"
        "    jnz 3b\n"
        "4:  cli\n"
        "    movl $1, 4(%ebx)\n"
        "conf_park64:\n"
        "5:  cmpl $0, 32(%ebx)\n" /* nmi_pairs asked for (the BSP wakes us with an NMI) */
        "    jne conf_pairs64\n"
        "    hlt\n" /* NMIs still come in (and wake HLT) */
        "    jmp 5b\n"
        "conf_irq64:\n"
        "    .byte 0x50, 0x53\n" /* push %rax; push %rbx */
        "    movl $lm, %ebx\n"
        "    lock incl 16(%ebx)\n"
        "    jmp 7f\n"
        "conf_other64:\n"
        "    .byte 0x50, 0x53\n"
        "7:  xorl %eax, %eax\n"
        "    movl %eax, 0xFEE000B0\n" /* EOI */
        "    .byte 0x5b, 0x58\n" /* pop %rbx; pop %rax */
        "    iretq\n"
        "conf_nmi64:\n"
        "    .byte 0x53\n"
        "    movl $lm, %ebx\n"
        "    lock incl 12(%ebx)\n"
        "    .byte 0x5b\n"
        "    iretq\n"
        "conf_fault64:\n"
        "    movl $lm, %ebx\n"
        "    movl $1, 8(%ebx)\n"
        "6:  cli\n"
        "    hlt\n"
        "    jmp 6b\n"
        ".code32\n");
extern char conf_irq64[], conf_other64[], conf_nmi64[], conf_fault64[];
void conf_long_mode(void) __attribute__((noreturn));

static void gate64(u32 vec, char *handler)
{
    u32 h = (u32)handler;
    idt64[vec * 4] = (h & 0xFFFF) | (0x18u << 16);
    idt64[vec * 4 + 1] = (h & 0xFFFF0000u) | 0x8E00;
    idt64[vec * 4 + 2] = 0;
    idt64[vec * 4 + 3] = 0;
}

/* Page tables, GDT and IDT for conf_long_mode (BSP, before AP 1 goes). */
static void long_mode_setup(void)
{
    for (u32 i = 0; i < 4; i++) {
        for (u32 j = 0; j < 512; j++)
            pd[i][j] = ((u64)(i * 512 + j) << 21) | 0x83; /* present, writable, 2 MiB */
        pdpt[i] = (u32)pd[i] | 3;
    }
    pml4[0] = (u32)pdpt | 3;
    gdt64[1] = 0x00cf9a000000ffffull; /* 0x08: the runtime's 32-bit code */
    gdt64[2] = 0x00cf92000000ffffull; /* 0x10: data */
    gdt64[3] = 0x00af9a000000ffffull; /* 0x18: 64-bit code */
    gdt64_desc.limit = sizeof(gdt64) - 1;
    gdt64_desc.base = (u32)gdt64;
    for (u32 v = 0; v < 256; v++)
        gate64(v, v < 32 ? conf_fault64 : conf_other64);
    gate64(2, conf_nmi64);
    gate64(VEC_CR8, conf_irq64);
    idt64_desc.limit = sizeof(idt64) - 1;
    idt64_desc.base_lo = (u32)idt64;
    idt64_desc.base_hi = 0;
}

#endif
