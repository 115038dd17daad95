/*
 * ap-trampoline.S - real-mode start of an application processor.
 *
 * An AP woken by INIT + SIPI(vector V) starts in real mode at CS = V << 8, IP = 0. This code
 * is linked into the image (above 1 MiB) in section .text16 and copied by smp_start_aps() to
 * the page RT_AP_TRAMPOLINE_PAGE << 12 (0x8000) before the SIPIs are sent. It is position
 * independent within that page: it addresses its own data through DS = CS.
 * It loads the runtime's GDT, sets CR0.PE and far-jumps to rt_ap_entry32 (entry.S).
 */
    .section .text16, "ax"
    .code16
    .globl rt_ap_trampoline, rt_ap_trampoline_data, rt_ap_trampoline_end
rt_ap_trampoline:
    cli
    cld
    movw %cs, %ax
    movw %ax, %ds
    lgdtl (rt_ap_trampoline_data - rt_ap_trampoline)
    movl %cr0, %eax
    orl $1, %eax                    /* CR0.PE; paging stays off */
    movl %eax, %cr0
    ljmpl $0x08, $rt_ap_entry32

    .balign 8
rt_ap_trampoline_data:
    .word 3 * 8 - 1                 /* rt_gdt in entry.S has 3 entries */
    .long rt_gdt
rt_ap_trampoline_end:
    .code32

    .section .note.GNU-stack, "", @progbits
