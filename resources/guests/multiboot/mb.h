/*
 * mb.h - what the multiboot test images add to the runtime (../lib/rt.h): the multiboot
 * information block, QEMU's fw_cfg and pc-testdev ports, the IOAPIC, and AP start-up by
 * INIT/SIPI broadcast with the trampoline at physical address 0 (as kvm-unit-tests do).
 */
#ifndef LULL_MB_H
#define LULL_MB_H

#include "rt.h"

#define MB_BOOT_MAGIC 0x2BADB002u
#define MB_INFO_MEM (1u << 0)
#define MB_INFO_CMDLINE (1u << 2)
#define MB_INFO_MODS (1u << 3)
#define MB_INFO_MMAP (1u << 6)
#define MB_INFO_LOADER_NAME (1u << 9)

/* Multiboot 0.6.96 section 3.3, the fields up to the boot loader name. */
struct multiboot_info {
    u32 flags;
    u32 mem_lower, mem_upper; /* KiB below 640 KiB, KiB from 1 MiB to the first hole */
    u32 boot_device;
    u32 cmdline;
    u32 mods_count, mods_addr;
    u32 syms[4];
    u32 mmap_length, mmap_addr;
    u32 drives_length, drives_addr;
    u32 config_table;
    u32 boot_loader_name;
} __attribute__((packed));

struct multiboot_mmap_entry {
    u32 size; /* of the rest of the entry (20): the next entry is at +size+4 */
    u64 addr, len;
    u32 type; /* 1 RAM, 2 reserved */
} __attribute__((packed));

struct multiboot_module {
    u32 mod_start, mod_end, string, reserved;
};

/* EAX and EBX at entry (mb-boot.c). */
extern u32 mb_magic;
extern const struct multiboot_info *mb_info;

/* Write a 16-bit value to an I/O port. */
static inline void outw(u16 port, u16 v) { __asm__ volatile("outw %0, %1" ::"a"(v), "Nd"(port)); }

/* Read a 32-bit value from an I/O port. */
static inline u32 inl(u16 port)
{
    u32 v;
    __asm__ volatile("inl %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}

/* ---- fw_cfg: selector 0x510 (16-bit), data 0x511 (bytes, little-endian items) ---- */
#define FW_CFG_PORT_SEL 0x510
#define FW_CFG_PORT_DATA 0x511
#define FW_CFG_SIGNATURE 0x00
#define FW_CFG_ID 0x01
#define FW_CFG_RAM_SIZE 0x03
#define FW_CFG_NB_CPUS 0x05
#define FW_CFG_MAX_CPUS 0x0f
/* The first `bytes` (<= 8) bytes of item `key`, as kvm-unit-tests' fwcfg_get_u() reads them. */
u64 fw_cfg_read(u16 key, u32 bytes);

/* ---- pc-testdev: a byte write to 0x2000 + n raises (1) or lowers (0) IRQ line n ---- */
#define TESTDEV_IRQ_LINE_PORT 0x2000
static inline void set_irq_line(u32 line, int level) { outb(TESTDEV_IRQ_LINE_PORT + line, level ? 1 : 0); }

/* ---- IOAPIC at 0xFEC00000: IOREGSEL at +0, IOWIN at +0x10 ---- */
#define IOAPIC_BASE 0xFEC00000u
#define IOAPIC_REDTBL(pin) (0x10 + 2 * (pin))
#define IOAPIC_LEVEL (1u << 15)
#define IOAPIC_REMOTE_IRR (1u << 14)
#define IOAPIC_MASKED (1u << 16)
u32 ioapic_read(u32 reg);
void ioapic_write(u32 reg, u32 value);

/*
 * Start every AP with INIT then STARTUP (vector 0) sent to all-but-self, the trampoline
 * copied to physical address 0. Waits until ncpus - 1 APs are online (or timeout_ms) and
 * returns how many came up; each runs fn(index).
 */
u32 mb_start_aps_broadcast(u32 ncpus, ap_entry_t fn, u32 timeout_ms);

#endif
