/*
 * mb-entry.S - multiboot (v1) header and entry point of the multiboot test images.
 *
 * A multiboot loader (lull, QEMU's -kernel) enters mb_start in 32-bit protected mode, paging
 * off, flat segments, interrupts off, EAX = 0x2BADB002, EBX = the multiboot information
 * block. We load the runtime's GDT (lib/entry.S rt_gdt), take CPU 0's stack, zero .bss and
 * call mb_boot(eax, ebx) (mb-boot.c), which hands over to the shared runtime.
 */
#define MB_HEADER_MAGIC 0x1BADB002
#define MB_HEADER_FLAGS 0           /* ELF program headers say where to load; no extras */
#define KERNEL_CS 0x08
#define KERNEL_DS 0x10
#define STACK_SIZE 16384

    .section .multiboot, "a"
    .balign 4
    .long MB_HEADER_MAGIC
    .long MB_HEADER_FLAGS
    .long -(MB_HEADER_MAGIC + MB_HEADER_FLAGS)

    .code32
    .section .text.mbentry, "ax"
    .globl mb_start
mb_start:
    cli
    cld
    movl %eax, %edx                 /* magic */
    movl %ebx, %esi                 /* multiboot info */
    lgdt mb_gdt_desc
    ljmp $KERNEL_CS, $1f
1:  movw $KERNEL_DS, %ax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    movw %ax, %fs
    movw %ax, %gs
    movl $(rt_stacks + STACK_SIZE), %esp    /* CPU 0's stack */
    xorl %ebp, %ebp
    movl $__bss_start, %edi
    movl $__bss_end, %ecx
    subl %edi, %ecx
    xorl %eax, %eax
    rep stosb
    pushl %esi
    pushl %edx
    call mb_boot                    /* never returns */
2:  cli
    hlt
    jmp 2b

    .section .data
    .balign 8
mb_gdt_desc:
    .word 3 * 8 - 1                 /* rt_gdt (lib/entry.S) has 3 entries */
    .long rt_gdt

    .section .note.GNU-stack, "", @progbits
