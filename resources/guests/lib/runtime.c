/*
 * runtime.c - start-up, IDT and trap dispatch, exits, command line and TSC time.
 *
 * Boot order (CPU 0): entry.S _start -> rt_start(hvm_start_info) -> main() -> guest_exit().
 */
#include "rt.h"

/* PVH start info (xen/include/public/arch-x86/hvm/start_info.h), the fields we use. */
struct hvm_start_info {
    u32 magic; /* 0x336ec578 */
    u32 version;
    u32 flags;
    u32 nr_modules;
    u64 modlist_paddr;
    u64 cmdline_paddr;
    u64 rsdp_paddr;
    u64 memmap_paddr;
    u32 memmap_entries;
    u32 reserved;
};
#define HVM_START_MAGIC 0x336ec578u

struct idt_gate {
    u16 offset_lo;
    u16 selector;
    u8 zero;
    u8 type_attr; /* 0x8E: present, DPL 0, 32-bit interrupt gate */
    u16 offset_hi;
} __attribute__((packed));

struct idt_desc {
    u16 limit;
    u32 base;
} __attribute__((packed));

extern char rt_isr_stubs[]; /* entry.S: 256 stubs, 16 bytes apart */

static struct idt_gate idt[256] __attribute__((aligned(16)));
static irq_handler_t irq_handlers[256];
static char cmdline_buf[1024];

u32 rt_tsc_khz;
u32 rt_bus_khz;

/* Per-CPU stacks (RT_MAX_CPUS x RT_STACK_SIZE), not zeroed at boot; entry.S picks one. */
char rt_stacks[RT_MAX_CPUS * RT_STACK_SIZE] __attribute__((section(".stacks"), aligned(16)));

/* Fill the IDT with the assembly stubs and load it (shared by all CPUs). */
static void idt_init(void)
{
    for (u32 v = 0; v < 256; v++) {
        u32 addr = (u32)rt_isr_stubs + 16 * v;
        idt[v].offset_lo = addr & 0xffff;
        idt[v].selector = 0x08;
        idt[v].zero = 0;
        idt[v].type_attr = 0x8E;
        idt[v].offset_hi = addr >> 16;
    }
}

/* Load the IDT register on this CPU. */
static void idt_load(void)
{
    struct idt_desc d = { sizeof(idt) - 1, (u32)idt };
    __asm__ volatile("lidt %0" ::"m"(d));
}

void rt_set_irq_handler(u8 vec, irq_handler_t h) { irq_handlers[vec] = h; }

static const char *const exception_names[32] = {
    "#DE divide error", "#DB debug", "NMI", "#BP breakpoint", "#OF overflow",
    "#BR bound range", "#UD invalid opcode", "#NM device not available", "#DF double fault",
    "coprocessor overrun", "#TS invalid TSS", "#NP segment not present", "#SS stack fault",
    "#GP general protection", "#PF page fault", "reserved", "#MF x87 error",
    "#AC alignment check", "#MC machine check", "#XM SIMD error", "#VE virtualization",
    "#CP control protection",
};

extern void rt_print_unlock(void);

/* C side of every interrupt stub: exceptions are fatal, other vectors go to their handler. */
void trap_dispatch(struct trap_frame *f)
{
    u32 v = f->vector;
    if (v < 32) {
        rt_print_unlock(); /* we may have faulted inside printf */
        printf("%s: FAIL: exception vector %u (%s) error 0x%x at eip 0x%x eflags 0x%x\n",
               guest_name, v, exception_names[v] ? exception_names[v] : "reserved", f->error,
               f->eip, f->eflags);
        guest_exit(RT_EXIT_EXCEPTION);
    }
    if (irq_handlers[v]) {
        irq_handlers[v](f);
        return;
    }
    if (v == 0x27 || v == 0x2f)
        return; /* spurious IRQ 7/15 from the masked 8259s: no EOI */
    printf("%s: FAIL: unexpected interrupt vector %u at eip 0x%x\n", guest_name, v, f->eip);
    guest_exit(RT_EXIT_UNEXPECTED_IRQ);
}

void guest_exit(u32 code)
{
    outl(PORT_TEST_EXIT, code);
    /* Not under lull/QEMU's exit device: stop here. */
    for (;;)
        __asm__ volatile("cli; hlt");
}

void fail(const char *fmt, ...)
{
    va_list ap;
    char buf[256];
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    printf("%s: FAIL: %s\n", guest_name, buf);
    guest_exit(RT_EXIT_FAIL);
}

/* Copy the PVH command line into our own buffer (the loader's copy may sit at 0x8000 etc.). */
static void cmdline_init(const struct hvm_start_info *si)
{
    cmdline_buf[0] = 0;
    if (si->cmdline_paddr == 0 || si->cmdline_paddr >= 0x100000000ull)
        return;
    const char *src = (const char *)(u32)si->cmdline_paddr;
    u32 i = 0;
    for (; i < sizeof(cmdline_buf) - 1 && src[i]; i++)
        cmdline_buf[i] = src[i];
    cmdline_buf[i] = 0;
}

const char *cmdline(void) { return cmdline_buf; }

/* Find `key=` as a whole word in the command line; returns a pointer to its value. */
static const char *cmdline_find(const char *key)
{
    u32 klen = strlen(key);
    const char *p = cmdline_buf;
    while (*p) {
        while (*p == ' ')
            p++;
        if (!strncmp(p, key, klen) && p[klen] == '=')
            return p + klen + 1;
        while (*p && *p != ' ')
            p++;
    }
    return NULL;
}

u64 cmdline_u64(const char *key, u64 def)
{
    const char *p = cmdline_find(key);
    if (!p || !*p || *p == ' ')
        return def;
    u64 v = 0;
    if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
        p += 2;
        for (; *p && *p != ' '; p++) {
            u32 d;
            if (*p >= '0' && *p <= '9')
                d = *p - '0';
            else if (*p >= 'a' && *p <= 'f')
                d = *p - 'a' + 10;
            else if (*p >= 'A' && *p <= 'F')
                d = *p - 'A' + 10;
            else
                return def;
            v = (v << 4) | d;
        }
        return v;
    }
    for (; *p && *p != ' '; p++) {
        if (*p < '0' || *p > '9')
            return def;
        v = v * 10 + (u32)(*p - '0');
    }
    return v;
}

int cmdline_str(const char *key, char *buf, u32 size)
{
    const char *p = cmdline_find(key);
    if (!p || size == 0)
        return 0;
    u32 i = 0;
    for (; i < size - 1 && p[i] && p[i] != ' '; i++)
        buf[i] = p[i];
    buf[i] = 0;
    return 1;
}

/* Read TSC and bus kHz from the hypervisor timing leaf 0x40000010, or exit. */
static void timing_init(void)
{
    struct cpuid_regs r = cpuid(1, 0);
    if (!(r.ecx & (1u << 31))) {
        printf("%s: FAIL: no hypervisor (CPUID.1:ECX[31] clear): TSC frequency unknown\n",
               guest_name);
        guest_exit(RT_EXIT_NO_TIMING_LEAF);
    }
    r = cpuid(0x40000000, 0);
    if (r.eax < 0x40000010) {
        printf("%s: FAIL: hypervisor max leaf 0x%x < 0x40000010: no TSC/bus frequency leaf"
               " (QEMU: -cpu host,+invtsc,vmware-cpuid-freq=on)\n",
               guest_name, r.eax);
        guest_exit(RT_EXIT_NO_TIMING_LEAF);
    }
    r = cpuid(0x40000010, 0);
    rt_tsc_khz = r.eax;
    rt_bus_khz = r.ebx;
    if (rt_tsc_khz == 0 || rt_bus_khz == 0) {
        printf("%s: FAIL: CPUID 0x40000010 reports TSC %u kHz, bus %u kHz\n", guest_name,
               rt_tsc_khz, rt_bus_khz);
        guest_exit(RT_EXIT_NO_TIMING_LEAF);
    }
}

/*
 * Remap the legacy 8259 PICs to vectors 0x20-0x2f and mask every line. A BIOS (SeaBIOS
 * under QEMU) leaves them at vector 8 with the PIT unmasked, which would look like a #DF as
 * soon as a guest enables interrupts. lull has no PIC: these writes are ignored there.
 */
static void pic_disable(void)
{
    outb(0x20, 0x11); /* ICW1: init, ICW4 follows */
    outb(0xa0, 0x11);
    outb(0x21, 0x20); /* ICW2: vector base */
    outb(0xa1, 0x28);
    outb(0x21, 0x04); /* ICW3: slave on IRQ2 */
    outb(0xa1, 0x02);
    outb(0x21, 0x01); /* ICW4: 8086 mode */
    outb(0xa1, 0x01);
    outb(0x21, 0xff); /* mask all */
    outb(0xa1, 0xff);
}

/* First C code on CPU 0: bring the runtime up, run main, exit with its result. */
void rt_start(const struct hvm_start_info *si) __attribute__((noreturn));
void rt_start(const struct hvm_start_info *si)
{
    outb(PORT_BOOT_MARKER, 123); /* lull logs the boot time */
    serial_init();
    idt_init();
    idt_load();
    pic_disable();
    if (!si || si->magic != HVM_START_MAGIC) {
        printf("%s: FAIL: no PVH start info (ebx=0x%x)\n", guest_name, (u32)si);
        guest_exit(RT_EXIT_BAD_BOOT);
    }
    cmdline_init(si);
    timing_init();
    guest_exit((u32)main());
}

extern void rt_ap_online(u32 index);

/* First C code on an AP (from entry.S rt_ap_entry32). */
void rt_ap_start(u32 index) __attribute__((noreturn));
void rt_ap_start(u32 index)
{
    idt_load();
    rt_ap_online(index); /* smp.c: runs the guest's AP function, then parks */
    for (;;)
        __asm__ volatile("cli; hlt");
}

s64 tsc_to_ns(s64 ticks)
{
    if (ticks < 0)
        return -(s64)(((u64)-ticks * 1000000ull) / rt_tsc_khz);
    return (s64)(((u64)ticks * 1000000ull) / rt_tsc_khz);
}

u64 ns_to_tsc(u64 ns) { return ns * rt_tsc_khz / 1000000ull; }

void delay_ns(u64 ns)
{
    u64 end = rdtsc() + ns_to_tsc(ns);
    while (rdtsc() < end)
        cpu_relax();
}

void sort_s64(s64 *v, u32 n)
{
    for (u32 i = 1; i < n; i++) {
        s64 x = v[i];
        u32 j = i;
        for (; j > 0 && v[j - 1] > x; j--)
            v[j] = v[j - 1];
        v[j] = x;
    }
}
