/*
 * mb-smp - a multiboot image as QEMU's -kernel boots it: checks the multiboot entry (EAX
 * magic, information block with memory sizes, memory map, command line and modules), reads
 * fw_cfg (signature, CPU count, RAM size, an unknown key), pc-testdev's scratch register
 * (QEMU: -device pc-testdev), reads an unclaimed port, brings up
 * every CPU by INIT/SIPI broadcast (vector 0, trampoline at address 0), then exits through
 * port 0xf4 with the code given as `exit=N` (default 0), written as 1, 2 or 4 bytes.
 * Prints, in this order:
 *   mb-smp: multiboot magic 0x2badb002 flags 0x... loader "lull"
 *   mb-smp: mem_lower 639 KiB mem_upper N KiB
 *   mb-smp: cmdline "<program> <args>"
 *   mb-smp: mmap 0x... +0x... type T          (one line per entry)
 *   mb-smp: module 0: N bytes "<name>" starts "<first bytes>"   (one per module)
 *   mb-smp: fw_cfg signature "QEMU" id 0x... cpus N max N ram N MiB unknown 0x0
 *   mb-smp: pc-testdev scratch 0x1234ab78   (0x12345678 written at 0xe0, 0xab at 0xe9)
 *   mb-smp: unclaimed port 0x5658 reads 0xff
 *   mb-smp: cpu <index> apic id <id> online   (each AP)
 *   mb-smp: N of N CPUs online
 *   mb-smp: PASS, exit code N (W-byte write)
 * Parameters: exit=N exit_width=1|2|4 (size of the write to 0xf4) timeout_ms=5000
 */
#include "mb.h"

static volatile u32 reported;

static void ap_main(u32 index)
{
    printf("mb-smp: cpu %u apic id %u online\n", index, cpuid(1, 0).ebx >> 24);
    __atomic_fetch_add(&reported, 1, __ATOMIC_SEQ_CST);
}

/* Print up to 16 bytes as text, '.' for anything unprintable. */
static void printable(char *out, const u8 *p, u32 n)
{
    u32 i = 0;
    for (; i < n && i < 16; i++)
        out[i] = (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '"') ? (char)p[i] : '.';
    out[i] = 0;
}

static void check_boot_info(void)
{
    const struct multiboot_info *mi = mb_info;
    if (mb_magic != MB_BOOT_MAGIC)
        fail("EAX at entry was 0x%x, not 0x2badb002", mb_magic);
    u32 need = MB_INFO_MEM | MB_INFO_CMDLINE | MB_INFO_MMAP;
    if ((mi->flags & need) != need)
        fail("multiboot flags 0x%x lack mem, cmdline or mmap (0x%x)", mi->flags, need);
    printf("mb-smp: multiboot magic 0x%x flags 0x%x loader \"%s\"\n", mb_magic, mi->flags,
           (mi->flags & MB_INFO_LOADER_NAME) ? (const char *)mi->boot_loader_name : "");
    printf("mb-smp: mem_lower %u KiB mem_upper %u KiB\n", mi->mem_lower, mi->mem_upper);
    printf("mb-smp: cmdline \"%s\"\n", (const char *)mi->cmdline);
    u32 ram_above_1m = 0;
    for (u32 at = mi->mmap_addr; at < mi->mmap_addr + mi->mmap_length;) {
        const struct multiboot_mmap_entry *e = (const void *)at;
        printf("mb-smp: mmap 0x%llx +0x%llx type %u\n", e->addr, e->len, e->type);
        if (e->type == 1 && e->addr == 0x100000)
            ram_above_1m = (u32)(e->len >> 10);
        at += e->size + 4;
    }
    if (ram_above_1m != mi->mem_upper)
        fail("mem_upper %u KiB disagrees with the memory map (%u KiB at 1 MiB)", mi->mem_upper,
             ram_above_1m);
    if (mi->flags & MB_INFO_MODS) {
        const struct multiboot_module *m = (const void *)mi->mods_addr;
        for (u32 i = 0; i < mi->mods_count; i++) {
            char head[17];
            printable(head, (const u8 *)m[i].mod_start, m[i].mod_end - m[i].mod_start);
            printf("mb-smp: module %u: %u bytes \"%s\" starts \"%s\"\n", i,
                   m[i].mod_end - m[i].mod_start, (const char *)m[i].string, head);
        }
    }
}

int main(void)
{
    u32 code = (u32)cmdline_u64("exit", 0);
    u32 timeout_ms = (u32)cmdline_u64("timeout_ms", 5000);
    check_boot_info();

    u64 sig = fw_cfg_read(FW_CFG_SIGNATURE, 4);
    char sig_text[5] = { (char)sig, (char)(sig >> 8), (char)(sig >> 16), (char)(sig >> 24), 0 };
    u32 id = (u32)fw_cfg_read(FW_CFG_ID, 4);
    u32 cpus = (u32)fw_cfg_read(FW_CFG_NB_CPUS, 2);
    u32 max_cpus = (u32)fw_cfg_read(FW_CFG_MAX_CPUS, 2);
    u64 ram = fw_cfg_read(FW_CFG_RAM_SIZE, 8);
    u32 unknown = (u32)fw_cfg_read(0x7f00, 4);
    printf("mb-smp: fw_cfg signature \"%s\" id 0x%x cpus %u max %u ram %llu MiB unknown 0x%x\n",
           sig_text, id, cpus, max_cpus, ram >> 20, unknown);
    if (strncmp(sig_text, "QEMU", 4) || cpus == 0 || unknown != 0)
        fail("fw_cfg does not look like QEMU's");
    outl(0xe0, 0x12345678); /* pc-testdev scratch register, also byte-wise at 0xe8 */
    outb(0xe9, 0xab);
    u32 scratch = inl(0xe0);
    printf("mb-smp: pc-testdev scratch 0x%x\n", scratch);
    if (scratch != 0x1234ab78)
        fail("pc-testdev scratch register reads 0x%x, not 0x1234ab78", scratch);
    u8 port = inb(0x5658);
    printf("mb-smp: unclaimed port 0x5658 reads 0x%x\n", port);
    if (port != 0xff)
        fail("an unclaimed port read 0x%x, not 0xff", port);

    lapic_enable(0xff);
    if (cpus > RT_MAX_CPUS)
        cpus = RT_MAX_CPUS;
    u32 online = 1;
    if (cpus > 1) {
        online += mb_start_aps_broadcast(cpus, ap_main, timeout_ms);
        u64 end = rdtsc() + ns_to_tsc((u64)timeout_ms * 1000000);
        while (reported < online - 1 && rdtsc() < end)
            cpu_relax();
    }
    printf("mb-smp: %u of %u CPUs online\n", online, cpus);
    if (online != cpus || reported != cpus - 1)
        fail("%u of %u CPUs came up (%u reported) within %u ms", online, cpus, reported,
             timeout_ms);
    u32 width = (u32)cmdline_u64("exit_width", 4);
    printf("mb-smp: PASS, exit code %u (%u-byte write)\n", code, width);
    if (width == 1)
        outb(PORT_TEST_EXIT, (u8)code);
    else if (width == 2)
        outw(PORT_TEST_EXIT, (u16)code);
    return (int)code;
}
