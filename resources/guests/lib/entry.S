/*
 * entry.S - PVH entry point, GDT, interrupt stubs and the AP 32-bit entry.
 *
 * PVH boot (Xen's PHYS32 entry, used by QEMU and lull): we start in 32-bit protected mode,
 * paging off, flat segments, interrupts off, EBX = physical address of hvm_start_info.
 * We stay in that mode: load our own GDT, take CPU 0's stack and call rt_start(ebx).
 */
#define KERNEL_CS 0x08
#define KERNEL_DS 0x10
#define STACK_SIZE 16384

/* ---- the PVH ELF note: XEN_ELFNOTE_PHYS32_ENTRY (18), name "Xen" ---- */
/* The descriptor is 8 bytes (entry, 0) like Linux's, so QEMU's ELF64 reader gets a zero high half. */
    .section .note.pvh, "a", @note
    .balign 4
    .long 4                 /* n_namesz: "Xen\0" */
    .long 8                 /* n_descsz */
    .long 18                /* n_type: XEN_ELFNOTE_PHYS32_ENTRY */
    .asciz "Xen"
    .balign 4
    .long _start
    .long 0

    .code32
    .section .text.entry, "ax"
    .globl _start
_start:
    cli
    cld
    movl %ebx, %esi                 /* keep hvm_start_info across the GDT switch */
    lgdt gdt_desc
    ljmp $KERNEL_CS, $1f
1:  movw $KERNEL_DS, %ax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    movw %ax, %fs
    movw %ax, %gs
    movl $(rt_stacks + STACK_SIZE), %esp    /* CPU 0's stack */
    xorl %ebp, %ebp
    /* Zero .bss (the per-CPU stacks live in .stacks, which is not zeroed). */
    movl $__bss_start, %edi
    movl $__bss_end, %ecx
    subl %edi, %ecx
    xorl %eax, %eax
    rep stosb
    pushl %esi
    call rt_start                   /* never returns */
2:  cli
    hlt
    jmp 2b

/*
 * 32-bit entry for application processors, reached from the real-mode trampoline with a far
 * jump through our GDT. Each AP takes the next CPU index and its stack, then calls
 * rt_ap_start(index). APs beyond RT_MAX_CPUS (8) park with interrupts off.
 */
    .globl rt_ap_entry32
rt_ap_entry32:
    movw $KERNEL_DS, %ax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    movw %ax, %fs
    movw %ax, %gs
    movl $1, %eax
    lock xaddl %eax, rt_next_cpu_index  /* eax = this AP's index (BSP is 0) */
    cmpl $8, %eax
    jae 3f
    movl %eax, %ecx
    incl %ecx
    shll $14, %ecx                  /* (index + 1) * STACK_SIZE */
    leal rt_stacks(%ecx), %esp
    xorl %ebp, %ebp
    pushl %eax
    call rt_ap_start                /* never returns */
3:  cli
    hlt
    jmp 3b

/*
 * Interrupt stubs: one 16-byte stub per vector at rt_isr_stubs + 16 * vector. Each pushes a
 * dummy error code (for vectors where the CPU pushes none) and the vector, then joins
 * isr_common, which saves the registers and calls trap_dispatch(struct trap_frame *).
 */
    .balign 16
    .globl rt_isr_stubs
rt_isr_stubs:
    .set vec, 0
    .rept 256
    .balign 16
    .if (vec == 8) || ((vec >= 10) && (vec <= 14)) || (vec == 17) || (vec == 21) || (vec == 29) || (vec == 30)
    .else
    pushl $0                        /* dummy error code */
    .endif
    pushl $vec
    jmp isr_common
    .set vec, vec + 1
    .endr

isr_common:
    pushal
    cld
    pushl %esp                      /* struct trap_frame * */
    call trap_dispatch
    addl $4, %esp
    popal
    addl $8, %esp                   /* vector + error code */
    /*
     * Return without IRET: KVM's instruction emulator implements IRET only in real mode, and
     * on our hosts every CPL0 instruction is emulated, so a 32-bit IRET is a KVM internal
     * error (seen under QEMU: "emulation failure" at the 0xcf byte). We never change CPL or
     * CS (everything runs at CPL0 in selector 0x08), so the frame [EIP, CS, EFLAGS] can be
     * unwound as POPF + near RET: reorder it to [EFLAGS, EIP], restore EFLAGS with IF clear,
     * and if IF was set, STI right before RET (STI's one-instruction shadow keeps an
     * interrupt from arriving before the RET; if one did, it would nest correctly anyway).
     */
    pushl %eax                      /* [eax, EIP, CS, EFLAGS] */
    movl 4(%esp), %eax              /* EIP */
    xchgl %eax, 12(%esp)            /* EFLAGS slot <- EIP, eax <- EFLAGS */
    movl %eax, 8(%esp)              /* CS slot <- EFLAGS */
    popl %eax                       /* [old EIP, EFLAGS, EIP] */
    leal 4(%esp), %esp              /* [EFLAGS, EIP] (LEA leaves the flags alone) */
    btrl $9, (%esp)                 /* clear IF in the saved copy; CF = old IF */
    jnc 1f
    popfl
    sti
    ret
1:  popfl
    ret

/* ---- GDT: null, flat 32-bit code (0x08), flat data (0x10) ---- */
    .section .data
    .balign 16
    .globl rt_gdt, rt_gdt_end
rt_gdt:
    .quad 0
    .quad 0x00cf9a000000ffff        /* 0x08: code, base 0, limit 4 GiB, 32-bit */
    .quad 0x00cf92000000ffff        /* 0x10: data, base 0, limit 4 GiB */
rt_gdt_end:
    .balign 8
gdt_desc:
    .word rt_gdt_end - rt_gdt - 1
    .long rt_gdt

    .globl rt_next_cpu_index
    .balign 4
rt_next_cpu_index:
    .long 1

    .section .note.GNU-stack, "", @progbits
