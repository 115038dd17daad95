/*
 * lapic-conformance-nmi.h - the nmi_pairs check: two NMIs that arrive together are both taken,
 * and before a fixed IPI sent after one of them.
 *
 * Per round, AP 1 (64-bit mode, where IRETQ ends NMI blocking) sends itself an NMI while the
 * BSP sends it one too, and the BSP then sends it fixed vector VEC_PAIR. AP 1 waits for
 * VEC_PAIR's handler with `sti; hlt` and expects to have handled exactly 2 NMIs by then:
 *   - two NMIs with none in service are both kept (one is delivered, the other stays pending
 *     until the handler's IRET; KVM's `process_nmi` keeps two), one in service plus one
 *     pending likewise;
 *   - an NMI is taken before a fixed interrupt its sender sent after it (NMIs have priority
 *     over maskable interrupts, and the NMI handler runs with IF=0).
 * The check fails on any round with other than 2, or if the NMIs in all are not 2 per round
 * (lost, where the rounds alone would only show them late). `nmi_rounds=1000` (0 skips).
 *
 * Included once, by lapic-conformance.c, after its reporting helpers and
 * lapic-conformance-cpu.h (whose `lm` carries the handshake, offsets 32-64).
 */
#ifndef LAPIC_CONFORMANCE_NMI_H
#define LAPIC_CONFORMANCE_NMI_H

#include "rt.h"

#define VEC_PAIR 0x68

/* AP 1's side, entered from its parking loop (%ebx = &lm, IF=0) once `lm.pair_rounds` is set. */
__asm__(".text\n"
        ".globl conf_pairs64, conf_pair_irq64\n"
        ".code64\n"
        "conf_pairs64:\n"
        "1:  movl 12(%ebx), %eax\n"   /* the BSP's wake-up NMI handled? */
        "    cmpl 36(%ebx), %eax\n"
        "    jae 2f\n"
        "    pause\n"
        "    jmp 1b\n"
        "2:  xorl %esi, %esi\n"       /* %esi: the round */
        "3:  incl %esi\n"
        "    cmpl 32(%ebx), %esi\n"
        "    ja 9f\n"
        "    movl 12(%ebx), %edi\n"   /* %edi: NMIs before the round */
        "    movl %esi, 40(%ebx)\n"   /* ready: the BSP sends an NMI, then VEC_PAIR */
        "    movl $0x44400, %eax\n"   /* self NMI: shorthand self, assert, NMI */
        "    movl %eax, 0xFEE00300\n"
        "4:  cmpl %esi, 44(%ebx)\n"   /* until VEC_PAIR's handler ran */
        "    jae 5f\n"
        "    sti\n"
        "    hlt\n"
        "    cli\n"
        "    jmp 4b\n"
        "5:  movl 48(%ebx), %eax\n"   /* NMIs taken before VEC_PAIR this round */
        "    subl %edi, %eax\n"
        "    cmpl $2, %eax\n"
        "    je 7f\n"
        "    cmpl $0, 52(%ebx)\n"
        "    jne 6f\n"
        "    movl %esi, 56(%ebx)\n"
        "    movl %eax, 60(%ebx)\n"
        "6:  incl 52(%ebx)\n"
        "7:  movl %esi, 64(%ebx)\n"
        "    jmp 3b\n"
        "9:  movl $0, 32(%ebx)\n"     /* done: park again */
        "    jmp conf_park64\n"
        "conf_pair_irq64:\n"
        "    .byte 0x50, 0x53\n"      /* push %rax; push %rbx */
        "    movl $lm, %ebx\n"
        "    movl 12(%ebx), %eax\n"
        "    movl %eax, 48(%ebx)\n"
        "    lock incl 44(%ebx)\n"
        "    xorl %eax, %eax\n"
        "    movl %eax, 0xFEE000B0\n" /* EOI */
        "    .byte 0x5b, 0x58\n"      /* pop %rbx; pop %rax */
        "    iretq\n"
        ".code32\n");
extern char conf_pair_irq64[];

/* The BSP's side; AP 1 must be parked in 64-bit mode (check_long_mode passed). */
static void check_nmi_pairs(void)
{
    u32 rounds = (u32)cmdline_u64("nmi_rounds", 1000);
    if (rounds == 0) {
        skip("nmi_pairs", "nmi_rounds=0");
        return;
    }
    gate64(VEC_PAIR, conf_pair_irq64);
    lm.pair_base = lm.nmis + 1;
    lm.pair_rounds = rounds;
    xapic_write(APIC_ICR_HI, 1u << 24);
    xapic_write(APIC_ICR_LO, ICR_ASSERT | APIC_NMI); /* wakes AP 1 from its parking HLT */
    u32 sent = 0;
    for (u32 r = 1; r <= rounds; r++) {
        u64 end = deadline_after_ms(timeout_ms);
        while (lm.pair_round != r && rdtsc() < end)
            cpu_relax();
        if (lm.pair_round != r)
            break;
        xapic_write(APIC_ICR_HI, 1u << 24);
        xapic_write(APIC_ICR_LO, ICR_ASSERT | APIC_NMI);
        xapic_write(APIC_ICR_LO, ICR_ASSERT | VEC_PAIR);
        sent = r;
    }
    u64 end = deadline_after_ms(timeout_ms);
    while (lm.pair_done != sent && rdtsc() < end)
        cpu_relax();
    delay_ns(1000000);
    u32 nmis = lm.nmis - lm.pair_base;
    printf("lapic-conformance: nmi_pairs: %u rounds, %u failed, %u NMIs of %u\n", lm.pair_done,
           lm.pair_failed, nmis, 2 * rounds);
    check("nmi_pairs", lm.pair_done == rounds && lm.pair_failed == 0 && nmis == 2 * rounds,
          "%u of %u rounds done, %u took other than 2 NMIs before the fixed IPI (first: round %u, "
          "%u); %u NMIs in all, %u sent",
          lm.pair_done, rounds, lm.pair_failed, lm.pair_first, lm.pair_first_n, nmis, 2 * rounds);
}

#endif
