/*
 * mb-boot.c - from the multiboot entry to the shared runtime, and the helpers of mb.h.
 *
 * The runtime (../lib/runtime.c rt_start) takes a PVH hvm_start_info for its command line;
 * mb_boot gives it one that carries the multiboot command line, and keeps EAX/EBX for the
 * image to check (mb_magic, mb_info).
 */
#include "mb.h"

/* The fields of hvm_start_info that rt_start reads (see ../lib/runtime.c). */
struct hvm_start_info {
    u32 magic, version, flags, nr_modules;
    u64 modlist_paddr, cmdline_paddr, rsdp_paddr, memmap_paddr;
    u32 memmap_entries, reserved;
};

u32 mb_magic;
const struct multiboot_info *mb_info;

void rt_start(const struct hvm_start_info *si) __attribute__((noreturn));
void mb_boot(u32 magic, const struct multiboot_info *info) __attribute__((noreturn));

void mb_boot(u32 magic, const struct multiboot_info *info)
{
    static struct hvm_start_info si;
    mb_magic = magic;
    mb_info = info;
    si.magic = 0x336ec578u;
    si.version = 1;
    if (magic == MB_BOOT_MAGIC && info && (info->flags & MB_INFO_CMDLINE))
        si.cmdline_paddr = info->cmdline;
    rt_start(&si);
}

u64 fw_cfg_read(u16 key, u32 bytes)
{
    u64 v = 0;
    outw(FW_CFG_PORT_SEL, key);
    for (u32 i = 0; i < bytes && i < 8; i++)
        v |= (u64)inb(FW_CFG_PORT_DATA) << (8 * i);
    return v;
}

u32 ioapic_read(u32 reg)
{
    mmio_write32(IOAPIC_BASE, reg);
    return mmio_read32(IOAPIC_BASE + 0x10);
}

void ioapic_write(u32 reg, u32 value)
{
    mmio_write32(IOAPIC_BASE, reg);
    mmio_write32(IOAPIC_BASE + 0x10, value);
}

extern char rt_ap_trampoline[], rt_ap_trampoline_end[]; /* ../lib/ap-trampoline.S */

u32 mb_start_aps_broadcast(u32 ncpus, ap_entry_t fn, u32 timeout_ms)
{
    if (ncpus > RT_MAX_CPUS)
        ncpus = RT_MAX_CPUS;
    smp_set_ap_function(fn);
    /* A volatile pointer, so that the compiler cannot treat the copy to 0 as a null store. */
    u8 *volatile page0 = (u8 *)0;
    u32 len = (u32)(rt_ap_trampoline_end - rt_ap_trampoline);
    for (u32 i = 0; i < len; i++)
        page0[i] = (u8)rt_ap_trampoline[i];
    barrier();
    u32 before = smp_online();
    /*
     * As kvm-unit-tests' ap_init(): INIT (level assert), then at once one STARTUP with vector
     * 0 and the level bit clear, both to all but self.
     */
    if (lapic_send_ipi(0, ICR_ALL_BUT_SELF | ICR_INIT | ICR_ASSERT))
        printf("%s: broadcast INIT stuck in delivery\n", guest_name);
    if (lapic_send_ipi(0, ICR_ALL_BUT_SELF | ICR_STARTUP | 0x00))
        printf("%s: broadcast SIPI stuck in delivery\n", guest_name);
    u64 deadline = rdtsc() + ns_to_tsc((u64)timeout_ms * 1000000);
    while (smp_online() - before < ncpus - 1 && rdtsc() < deadline)
        cpu_relax();
    return smp_online() - before;
}
