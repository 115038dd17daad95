/*
 * virtio-net - a virtio 1.x network driver over MMIO (register layout version 2) that checks
 * lull's virtio-net device from the guest side against a real host network: the handshake
 * (VERSION_1 and MAC), the receive and transmit queues, the interrupt, and one ARP exchange.
 *
 * The device comes from the command line (lull appends one virtio_mmio.device= word per
 * --disk, then per --net); the first word whose window holds a network device (type 1) is
 * used. Its pin (edge, active high) goes to vector 0x40; the handler reads InterruptStatus,
 * acknowledges it and counts.
 *
 * What it does: posts RX_BUFS receive buffers, then sends an ARP request "who has 10.0.2.1?
 * tell 10.0.2.15" from the device's MAC (read from the configuration space) and waits, with
 * interrupts on and reading the receive queue only after an interrupt, for the reply: an ARP reply from 10.0.2.1 to 10.0.2.15 addressed to that MAC.
 * Any other frame (the host's IPv6 router solicitations, ...) is skipped and its buffer posted
 * again. The request is sent again every second, up to TRIES times. Every received buffer
 * must carry the 12-byte virtio_net_hdr_v1 with num_buffers = 1 and a used length of header +
 * frame; every sent frame must come back from the TX queue.
 *
 * Prints "virtio-net: ARP reply from 10.0.2.1 is-at xx:xx:xx:xx:xx:xx" and "virtio-net: PASS"
 * and exits 0, or fails (exit 1) with the reason: no device, refused features, no TX
 * completion within 2 s, no reply after TRIES seconds.
 *
 * The addresses are fixed: the host test gives its tap 10.0.2.1/24.
 */
#include "virtio.h"

#define MAX_DEVS 8
#define QSIZE 8
#define RX_BUFS 4
#define BUF_SIZE 2048
#define VEC 0x40
#define TRIES 5
#define HDR_BYTES 12
#define ETH_ARP 0x0806

#define NET_DEVICE_ID 1
#define F_MAC 5 /* VIRTIO_NET_F_MAC */

struct avail {
    u16 flags;
    u16 idx;
    u16 ring[QSIZE];
    u16 used_event;
};
struct used {
    u16 flags;
    u16 idx;
    struct used_elem ring[QSIZE];
    u16 avail_event;
};

/* One split virtqueue and the driver's place in it. */
struct vq {
    struct desc desc[QSIZE] __attribute__((aligned(16)));
    struct avail avail __attribute__((aligned(2)));
    struct used used __attribute__((aligned(4)));
    u16 avail_idx;
    u16 used_seen;
};

static struct vq rxq, txq;
static u8 rx_buf[RX_BUFS][BUF_SIZE] __attribute__((aligned(16)));
static u8 tx_buf[HDR_BYTES + 64] __attribute__((aligned(16)));
static u32 base, irq;
static u8 mac[6];
static volatile u32 irqs;

static const u8 my_ip[4] = {10, 0, 2, 15};
static const u8 gw_ip[4] = {10, 0, 2, 1};

static void on_irq(struct trap_frame *f)
{
    (void)f;
    u32 isr = mmio_read32(base + R_INT_STATUS);
    mmio_write32(base + R_INT_ACK, isr);
    if (isr & 1)
        irqs++;
    lapic_eoi();
}

/* Makes descriptor `i` available on `q`; notifies queue `index`. */
static void offer(struct vq *q, u32 index, u16 i)
{
    q->avail.ring[q->avail_idx % QSIZE] = i;
    barrier();
    q->avail_idx++;
    q->avail.idx = q->avail_idx;
    barrier();
    mmio_write32(base + R_QUEUE_NOTIFY, index);
}

static void post_rx(u16 i)
{
    rxq.desc[i] = (struct desc){(u32)rx_buf[i], BUF_SIZE, DESC_F_WRITE, 0};
    offer(&rxq, 0, i);
}

static void find_device(void)
{
    struct virtio_loc locs[MAX_DEVS];
    u32 n = virtio_find_devices(locs, MAX_DEVS);
    for (u32 i = 0; i < n; i++) {
        if (mmio_read32(locs[i].base + R_DEVICE_ID) == NET_DEVICE_ID) {
            base = locs[i].base;
            irq = locs[i].irq;
            return;
        }
    }
    fail("no virtio-net among %u virtio_mmio.device= words (run with --net tap=NAME)", n);
}

static void init_device(void)
{
    u64 offered = virtio_begin(base, NET_DEVICE_ID, "virtio-net");
    u64 want = (1ull << 32) | (1u << F_MAC);
    if ((offered & want) != want)
        fail("device 0x%x offers features 0x%llx: VERSION_1 or MAC missing", base, offered);
    virtio_accept(base, want);
    virtio_queue(base, 0, QSIZE, rxq.desc, &rxq.avail, &rxq.used);
    virtio_queue(base, 1, QSIZE, txq.desc, &txq.avail, &txq.used);
    u32 lo = mmio_read32(base + R_CONFIG), hi = mmio_read32(base + R_CONFIG + 4);
    for (u32 i = 0; i < 4; i++)
        mac[i] = (u8)(lo >> (8 * i));
    mac[4] = (u8)hi;
    mac[5] = (u8)(hi >> 8);
    rt_set_irq_handler(VEC, on_irq);
    ioapic_route(irq, VEC);
    virtio_driver_ok(base);
    printf("virtio-net: device at 0x%x irq %u, mac %02x:%02x:%02x:%02x:%02x:%02x\n", base, irq,
           mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]);
}

static void put16(u8 *p, u16 v)
{
    p[0] = (u8)(v >> 8);
    p[1] = (u8)v;
}

static u16 get16(const u8 *p) { return (u16)((p[0] << 8) | p[1]); }

static int same(const u8 *a, const u8 *b, u32 n)
{
    for (u32 i = 0; i < n; i++)
        if (a[i] != b[i])
            return 0;
    return 1;
}

/* Sends the ARP request and waits (bounded) for the TX queue to return it. */
static void send_arp_request(void)
{
    u8 *f = tx_buf + HDR_BYTES;
    memset(tx_buf, 0, sizeof(tx_buf));
    memset(f, 0xff, 6);            /* broadcast */
    memcpy(f + 6, mac, 6);         /* from us */
    put16(f + 12, ETH_ARP);
    put16(f + 14, 1);              /* Ethernet */
    put16(f + 16, 0x0800);         /* IPv4 */
    f[18] = 6;
    f[19] = 4;
    put16(f + 20, 1);              /* request */
    memcpy(f + 22, mac, 6);        /* sender MAC */
    memcpy(f + 28, my_ip, 4);      /* sender IP */
    memset(f + 32, 0, 6);          /* target MAC: unknown */
    memcpy(f + 38, gw_ip, 4);      /* target IP */
    /* Header and frame (padded to the 60-byte Ethernet minimum) in two descriptors. */
    txq.desc[0] = (struct desc){(u32)tx_buf, HDR_BYTES, DESC_F_NEXT, 1};
    txq.desc[1] = (struct desc){(u32)f, 60, 0, 0};
    u16 before = txq.used_seen;
    cli();
    offer(&txq, 1, 0);
    sti();
    u64 deadline = rdtsc() + (u64)rt_tsc_khz * 2000;
    while (*(volatile u16 *)&txq.used.idx == before && rdtsc() < deadline)
        cpu_relax();
    if (*(volatile u16 *)&txq.used.idx == before)
        fail("the ARP request did not come back from the TX queue within 2 s");
    volatile struct used *u = &txq.used;
    struct used_elem e = u->ring[before % QSIZE];
    if (e.id != 0 || e.len != 0)
        fail("TX used element (%u, %u), expected (0, 0)", e.id, e.len);
    txq.used_seen = before + 1;
}

/* Whether received buffer `i` (used length `len`) is the ARP reply we wait for; fails on a
 * malformed header. */
static int is_reply(u16 i, u32 len)
{
    const u8 *h = rx_buf[i], *f = rx_buf[i] + HDR_BYTES;
    if (len < HDR_BYTES + 14 || len > BUF_SIZE)
        fail("RX used length %u", len);
    if (h[10] != 1 || h[11] != 0 || h[0] != 0 || h[1] != 0)
        fail("RX header %02x %02x .. num_buffers %u", h[0], h[1], h[10] | (h[11] << 8));
    if (len < HDR_BYTES + 42 || get16(f + 12) != ETH_ARP || get16(f + 20) != 2)
        return 0;
    if (!same(f + 28, gw_ip, 4) || !same(f + 38, my_ip, 4))
        return 0;
    if (!same(f, mac, 6) || !same(f + 32, mac, 6))
        fail("ARP reply for 10.0.2.15 not addressed to our MAC");
    printf("virtio-net: ARP reply from 10.0.2.1 is-at %02x:%02x:%02x:%02x:%02x:%02x\n", f[22],
           f[23], f[24], f[25], f[26], f[27]);
    return 1;
}

/* Waits up to 1 s for the reply, looking at the used ring only after an interrupt (as a
 * driver does: a frame the device delivered without raising its line is never seen); other
 * frames are skipped and their buffers posted again. */
static int wait_reply(void)
{
    u64 deadline = rdtsc() + (u64)rt_tsc_khz * 1000;
    u32 seen = irqs;
    while (rdtsc() < deadline) {
        if (irqs == seen) {
            cpu_relax();
            continue;
        }
        seen = irqs;
        volatile struct used *u = &rxq.used;
        u16 used = u->idx;
        barrier();
        while (rxq.used_seen != used) {
            struct used_elem e = u->ring[rxq.used_seen % QSIZE];
            rxq.used_seen++;
            if (e.id >= RX_BUFS)
                fail("RX used element names descriptor %u", e.id);
            if (is_reply((u16)e.id, e.len))
                return 1;
            cli();
            post_rx((u16)e.id);
            sti();
        }
    }
    return 0;
}

int main(void)
{
    find_device();
    /* An uninitialised 8259 (KVM's, with --irqchip kernel) must not turn the lines into
     * ExtINT interrupts: mask it, and LINT0. */
    outb(0x21, 0xff);
    outb(0xa1, 0xff);
    lapic_enable(0xff);
    xapic_write(APIC_LVT_LINT0, LVT_MASKED);
    init_device();
    for (u16 i = 0; i < RX_BUFS; i++)
        post_rx(i);
    sti();
    for (u32 t = 1; t <= TRIES; t++) {
        send_arp_request();
        if (wait_reply()) {
            cli();
            printf("virtio-net: %u interrupts, %u tries\n", irqs, t);
            printf("virtio-net: PASS\n");
            return RT_EXIT_PASS;
        }
    }
    fail("no ARP reply from 10.0.2.1 after %u requests", TRIES);
}
