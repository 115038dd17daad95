/* virtio.c - see virtio.h. */
#include "virtio.h"

/* Parse "4K@0xd0000000:5" (size in K, base in hex, irq in decimal). */
static int parse_device(const char *p, struct virtio_loc *d)
{
    while (*p && *p != '@')
        p++;
    if (*p++ != '@' || p[0] != '0' || p[1] != 'x')
        return 0;
    p += 2;
    u32 base = 0, irq = 0;
    for (;; p++) {
        u32 c = (u8)*p;
        if (c >= '0' && c <= '9')
            base = base * 16 + (c - '0');
        else if (c >= 'a' && c <= 'f')
            base = base * 16 + (c - 'a' + 10);
        else
            break;
    }
    if (*p++ != ':')
        return 0;
    for (; *p >= '0' && *p <= '9'; p++)
        irq = irq * 10 + (u32)(*p - '0');
    d->base = base;
    d->irq = irq;
    return base != 0;
}

u32 virtio_find_devices(struct virtio_loc *locs, u32 max)
{
    static const char key[] = "virtio_mmio.device=";
    const char *p = cmdline();
    u32 n = 0;
    while (*p && n < max) {
        while (*p == ' ')
            p++;
        if (!strncmp(p, key, sizeof(key) - 1)) {
            if (!parse_device(p + sizeof(key) - 1, &locs[n]))
                fail("cannot parse %s", p);
            n++;
        }
        while (*p && *p != ' ')
            p++;
    }
    return n;
}

void ioapic_route(u32 pin, u8 vector)
{
    mmio_write32(IOAPIC_BASE, 0x10 + 2 * pin + 1);
    mmio_write32(IOAPIC_BASE + 0x10, 0); /* destination APIC 0 */
    mmio_write32(IOAPIC_BASE, 0x10 + 2 * pin);
    mmio_write32(IOAPIC_BASE + 0x10, vector); /* fixed, physical, edge, active high */
}

u64 virtio_begin(u32 base, u32 device_id, const char *what)
{
    u32 magic = mmio_read32(base + R_MAGIC), version = mmio_read32(base + R_VERSION);
    u32 id = mmio_read32(base + R_DEVICE_ID);
    if (magic != VIRTIO_MAGIC || version != 2 || id != device_id)
        fail("no %s (version 2) at 0x%x: magic 0x%x version %u device %u", what, base, magic,
             version, id);
    mmio_write32(base + R_STATUS, 0);
    mmio_write32(base + R_STATUS, S_ACK);
    mmio_write32(base + R_STATUS, S_ACK | S_DRIVER);
    mmio_write32(base + R_DEV_FEATURES_SEL, 0);
    u32 lo = mmio_read32(base + R_DEV_FEATURES);
    mmio_write32(base + R_DEV_FEATURES_SEL, 1);
    u32 hi = mmio_read32(base + R_DEV_FEATURES);
    return ((u64)hi << 32) | lo;
}

void virtio_accept(u32 base, u64 features)
{
    mmio_write32(base + R_DRV_FEATURES_SEL, 0);
    mmio_write32(base + R_DRV_FEATURES, (u32)features);
    mmio_write32(base + R_DRV_FEATURES_SEL, 1);
    mmio_write32(base + R_DRV_FEATURES, (u32)(features >> 32));
    mmio_write32(base + R_STATUS, S_ACK | S_DRIVER | S_FEATURES_OK);
    if (!(mmio_read32(base + R_STATUS) & S_FEATURES_OK))
        fail("device 0x%x refused features 0x%llx", base, features);
}

void virtio_queue(u32 base, u32 q, u32 size, const void *desc, const void *avail,
                  const void *used)
{
    mmio_write32(base + R_QUEUE_SEL, q);
    u32 max = mmio_read32(base + R_QUEUE_NUM_MAX);
    if (max < size)
        fail("queue %u of 0x%x holds %u descriptors, need %u", q, base, max, size);
    mmio_write32(base + R_QUEUE_NUM, size);
    mmio_write32(base + R_QUEUE_DESC_LO, (u32)desc);
    mmio_write32(base + R_QUEUE_DESC_HI, 0);
    mmio_write32(base + R_QUEUE_AVAIL_LO, (u32)avail);
    mmio_write32(base + R_QUEUE_AVAIL_HI, 0);
    mmio_write32(base + R_QUEUE_USED_LO, (u32)used);
    mmio_write32(base + R_QUEUE_USED_HI, 0);
    mmio_write32(base + R_QUEUE_READY, 1);
}

void virtio_driver_ok(u32 base)
{
    mmio_write32(base + R_STATUS, S_ACK | S_DRIVER | S_FEATURES_OK | S_DRIVER_OK);
}
