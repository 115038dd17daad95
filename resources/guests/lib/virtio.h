/*
 * virtio.h - what the test guests that drive virtio devices over MMIO share: the register
 * layout (virtio 1.2, 4.2.2, version 2), split-ring descriptors, finding the devices on the
 * command line as Linux does (`virtio_mmio.device=4K@0xd0000000:5`, one word per device, the
 * disks first, then the nets), and routing a device's IOAPIC pin to a vector.
 */
#ifndef LULL_VIRTIO_H
#define LULL_VIRTIO_H

#include "rt.h"

/* virtio-mmio registers */
#define R_MAGIC 0x000
#define R_VERSION 0x004
#define R_DEVICE_ID 0x008
#define R_DEV_FEATURES 0x010
#define R_DEV_FEATURES_SEL 0x014
#define R_DRV_FEATURES 0x020
#define R_DRV_FEATURES_SEL 0x024
#define R_QUEUE_SEL 0x030
#define R_QUEUE_NUM_MAX 0x034
#define R_QUEUE_NUM 0x038
#define R_QUEUE_READY 0x044
#define R_QUEUE_NOTIFY 0x050
#define R_INT_STATUS 0x060
#define R_INT_ACK 0x064
#define R_STATUS 0x070
#define R_QUEUE_DESC_LO 0x080
#define R_QUEUE_DESC_HI 0x084
#define R_QUEUE_AVAIL_LO 0x090
#define R_QUEUE_AVAIL_HI 0x094
#define R_QUEUE_USED_LO 0x0a0
#define R_QUEUE_USED_HI 0x0a4
#define R_CONFIG 0x100

#define VIRTIO_MAGIC 0x74726976 /* "virt" */

/* device status bits */
#define S_ACK 1
#define S_DRIVER 2
#define S_DRIVER_OK 4
#define S_FEATURES_OK 8

/* descriptor flags */
#define DESC_F_NEXT 1
#define DESC_F_WRITE 2

#define IOAPIC_BASE 0xFEC00000u

struct desc {
    u64 addr;
    u32 len;
    u16 flags;
    u16 next;
};
struct used_elem {
    u32 id;
    u32 len;
};

/* Where a device's registers are and its IOAPIC pin. */
struct virtio_loc {
    u32 base;
    u32 irq;
};

/* Every virtio_mmio.device= word of the command line, in order (at most `max`); fails the
 * test on a word it cannot parse. Returns how many. */
u32 virtio_find_devices(struct virtio_loc *locs, u32 max);

/* The start of the driver's handshake (virtio 1.2, 3.1.1) with the device at `base`: fails
 * unless it is a version-2 device of type `device_id` (`what` names it in the message);
 * resets it, sets ACKNOWLEDGE and DRIVER, and returns the features it offers. */
u64 virtio_begin(u32 base, u32 device_id, const char *what);
/* Accepts `features` and sets FEATURES_OK; fails if the device refuses them. */
void virtio_accept(u32 base, u64 features);
/* Sets up queue `q` with `size` entries at the given rings (below 4 GiB) and makes it ready;
 * fails if the device's queue is smaller. */
void virtio_queue(u32 base, u32 q, u32 size, const void *desc, const void *avail,
                  const void *used);
/* Sets DRIVER_OK: the device is live. */
void virtio_driver_ok(u32 base);

/* IOAPIC pin `pin` to `vector` on APIC 0: fixed, physical, edge, active high, unmasked. */
void ioapic_route(u32 pin, u8 vector);

#endif
