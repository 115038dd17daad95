/*
 * virtio-blk - a virtio 1.x driver over MMIO (register layout version 2) that checks lull's
 * virtio-blk device from the guest side: the handshake, one split virtqueue, the interrupt,
 * and the requests IN, OUT, FLUSH, GET_ID, with their error statuses.
 *
 * Devices come from the command line, as Linux takes them (lull appends one word per --disk):
 *   virtio_mmio.device=4K@0xd0000000:5 [virtio_mmio.device=4K@0xd0001000:6]
 * The first device must be writable; a second one, if given, must be read-only.
 *
 * Interrupts: the device's IOAPIC pin (edge, active high) goes to vector 0x40 + device index;
 * the handler reads InterruptStatus and acknowledges it. Every request waits for its
 * interrupt (with interrupts enabled around a pause loop, bounded by a 2 s TSC deadline), then
 * checks the used ring.
 *
 * What it writes to the first disk (byte i of sector s is PATTERN(s, i); see pattern()):
 *   sectors 0-7   one 4 KiB OUT request
 *   sectors 8-15  one OUT request whose 4 KiB are split over two descriptors
 *   last sector   one OUT request
 * then FLUSH, one 8 KiB IN of sectors 0-15 (compared), GET_ID (printed as "id <text>"), an
 * IN at the capacity (IOERR), an IN straddling the end (IOERR), request type 11 (UNSUPP).
 * The read-only disk: VIRTIO_BLK_F_RO offered, IN works, OUT gives IOERR.
 *
 * Parameters:
 *   bench=N  then N 4 KiB OUT requests (sectors 24-535, round robin); prints the guest-TSC
 *            time per request
 *   rate_ms=MS  then 4 KiB OUT requests (sectors 24-535, round robin) for MS ms of guest
 *            TSC, each waited for with STI;HLT (the vCPU halts while its request waits for
 *            the device, e.g. for a rate limiter's refill); prints
 *            "virtio-blk: rate <bytes> bytes in <ns> ns, <bytes/s> bytes/s, <n> requests".
 *            With ap=spin every AP spins (runs) meanwhile, with ap=idle every AP halts
 *            with interrupts off; the APs are not started otherwise.
 *   snapshot_ms=MS  first (before the checks above) writes sectors 32-39 and flushes, prints
 *            "virtio-blk: written and flushed, waiting for a snapshot", halts for MS ms of
 *            guest TSC (woken by a periodic LAPIC timer every 10 ms) while the host pauses,
 *            snapshots, ends lull and restores the VM in a new one, then reads sectors 32-39
 *            back through the same queue (the device must continue at its saved indices),
 *            compares, prints "virtio-blk: read back after the snapshot" and goes on
 *   idle=1   then writes sectors 16-23 WITHOUT a flush, prints "virtio-blk: idle after
 *            writes" and halts with interrupts off until the VMM stops it (the host checks
 *            that the data is in the file after SIGTERM)
 * Otherwise prints "virtio-blk: PASS" and exits 0.
 */
#include "virtio.h"

#define MAX_DEVS 2

/* Wait for a request's interrupt halted (rate_ms), not in a pause loop. */
static volatile int halt_wait;
static int rate_ap_spins;
#define QSIZE 8
#define VEC_BASE 0x40
#define F_RO 5      /* VIRTIO_BLK_F_RO */
#define F_FLUSH 9   /* VIRTIO_BLK_F_FLUSH */

#define T_IN 0
#define T_OUT 1
#define T_FLUSH 4
#define T_GET_ID 8
#define BLK_OK 0
#define BLK_IOERR 1
#define BLK_UNSUPP 2

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
struct blk_header {
    u32 type;
    u32 reserved;
    u64 sector;
};

struct vdev {
    u32 base;
    u32 irq;
    u64 features;
    u64 capacity;
    u16 avail_idx;
    volatile u32 irqs;
    struct desc desc[QSIZE] __attribute__((aligned(16)));
    struct avail avail __attribute__((aligned(2)));
    struct used used __attribute__((aligned(4)));
    struct blk_header hdr;
    volatile u8 status;
};

static struct vdev devs[MAX_DEVS];
static u32 ndevs;
static u8 buf[8192] __attribute__((aligned(4096)));
static u8 check_buf[8192] __attribute__((aligned(4096)));
static char id[21];

static u32 rd(struct vdev *d, u32 reg) { return mmio_read32(d->base + reg); }
static void wr(struct vdev *d, u32 reg, u32 v) { mmio_write32(d->base + reg, v); }

/* Byte i of sector s as this guest writes it (the host test computes the same). */
static u8 pattern(u32 sector, u32 i) { return (u8)((sector * 131 + i) ^ 0x5a); }

static void fill(u8 *p, u32 first_sector, u32 sectors)
{
    for (u32 s = 0; s < sectors; s++)
        for (u32 i = 0; i < 512; i++)
            p[s * 512 + i] = pattern(first_sector + s, i);
}

static void on_irq(struct trap_frame *f)
{
    struct vdev *d = &devs[f->vector - VEC_BASE];
    u32 isr = rd(d, R_INT_STATUS);
    wr(d, R_INT_ACK, isr);
    if (isr & 1)
        d->irqs++;
    lapic_eoi();
}

/* Every virtio_mmio.device= word of the command line, in order. */
static void find_devices(void)
{
    struct virtio_loc locs[MAX_DEVS];
    ndevs = virtio_find_devices(locs, MAX_DEVS);
    for (u32 i = 0; i < ndevs; i++) {
        devs[i].base = locs[i].base;
        devs[i].irq = locs[i].irq;
    }
}

/* The driver's side of the handshake (virtio 1.2, 3.1.1); accepts VERSION_1, FLUSH, RO. */
static void init_device(struct vdev *d, u32 index)
{
    d->features = virtio_begin(d->base, 2, "virtio-blk");
    u32 lo = (u32)d->features, hi = (u32)(d->features >> 32);
    if (!(hi & 1) || !(lo & (1u << F_FLUSH)))
        fail("device 0x%x offers features 0x%x%08x: VERSION_1 or FLUSH missing", d->base, hi, lo);
    virtio_accept(d->base, (1ull << 32) | (lo & ((1u << F_FLUSH) | (1u << F_RO))));
    virtio_queue(d->base, 0, QSIZE, d->desc, &d->avail, &d->used);
    virtio_driver_ok(d->base);
    d->capacity = ((u64)rd(d, R_CONFIG + 4) << 32) | rd(d, R_CONFIG);
    rt_set_irq_handler(VEC_BASE + index, on_irq);
    ioapic_route(d->irq, VEC_BASE + index);
    printf("virtio-blk: device %u at 0x%x irq %u: %llu sectors, features 0x%llx\n", index,
           d->base, d->irq, d->capacity, d->features);
}

struct seg {
    void *addr;
    u32 len;
};

/* How a request ended: its status byte and the used length the device reported. */
struct done {
    u8 status;
    u32 used;
};

/*
 * One request: header, the data segments (device-writable if `in`), status. Waits for the
 * interrupt and checks the used element.
 */
static struct done request(struct vdev *d, u32 type, u64 sector, const struct seg *segs,
                           u32 nsegs, int in)
{
    d->hdr.type = type;
    d->hdr.reserved = 0;
    d->hdr.sector = sector;
    d->status = 0xee;
    u32 n = 0;
    d->desc[n] = (struct desc){(u32)&d->hdr, sizeof(d->hdr), DESC_F_NEXT, 1};
    for (u32 i = 0; i < nsegs; i++) {
        n++;
        d->desc[n] = (struct desc){(u32)segs[i].addr, segs[i].len,
                                   (u16)(DESC_F_NEXT | (in ? DESC_F_WRITE : 0)), (u16)(n + 1)};
    }
    n++;
    d->desc[n] = (struct desc){(u32)&d->status, 1, DESC_F_WRITE, 0};

    cli();
    u32 irqs = d->irqs;
    u16 before = d->avail_idx;
    d->avail.ring[before % QSIZE] = 0;
    barrier();
    d->avail_idx = before + 1;
    d->avail.idx = d->avail_idx;
    barrier();
    wr(d, R_QUEUE_NOTIFY, 0);
    u64 deadline = rdtsc() + (u64)rt_tsc_khz * 2000;
    if (halt_wait) {
        /* STI;HLT: the interrupt shadow makes the check and the halt atomic. */
        while (d->irqs == irqs)
            __asm__ volatile("sti; hlt; cli" ::: "memory");
    }
    sti();
    while (d->irqs == irqs && rdtsc() < deadline)
        cpu_relax();
    cli();
    if (d->irqs == irqs)
        fail("no interrupt for request type %u on 0x%x within 2 s", type, d->base);
    volatile struct used *u = &d->used;
    if (u->idx != d->avail_idx)
        fail("used index %u after request %u", u->idx, d->avail_idx);
    struct used_elem e = u->ring[before % QSIZE];
    if (e.id != 0)
        fail("used element names descriptor %u, not 0", e.id);
    return (struct done){d->status, e.len};
}

static struct done rw(struct vdev *d, u32 type, u64 sector, void *p, u32 len)
{
    struct seg s = {p, len};
    return request(d, type, sector, &s, len ? 1 : 0, type != T_OUT);
}

static void expect(const char *what, struct done got, u8 status, u32 used)
{
    if (got.status != status || got.used != used)
        fail("%s: status %u used length %u, expected status %u used length %u", what,
             got.status, got.used, status, used);
}

static void check_writable(struct vdev *d)
{
    if (d->features & (1u << F_RO))
        fail("the first disk is read-only");
    if (d->capacity < 536)
        fail("the first disk has %llu sectors; the test needs 536", d->capacity);
    fill(buf, 0, 8);
    expect("write sectors 0-7", rw(d, T_OUT, 0, buf, 4096), BLK_OK, 1);
    fill(buf, 8, 8);
    struct seg halves[2] = {{buf, 2048}, {buf + 2048, 2048}};
    expect("write sectors 8-15 in two segments", request(d, T_OUT, 8, halves, 2, 0), BLK_OK,
           1);
    u32 last = (u32)d->capacity - 1;
    fill(buf, last, 1);
    expect("write the last sector", rw(d, T_OUT, last, buf, 512), BLK_OK, 1);
    expect("flush", rw(d, T_FLUSH, 0, NULL, 0), BLK_OK, 1);
    printf("virtio-blk: written and flushed\n");

    memset(check_buf, 0, sizeof(check_buf));
    expect("read sectors 0-15", rw(d, T_IN, 0, check_buf, 8192), BLK_OK, 8193);
    fill(buf, 0, 16);
    for (u32 i = 0; i < 8192; i++)
        if (check_buf[i] != buf[i])
            fail("read back byte %u (sector %u) is 0x%x, wrote 0x%x", i, i / 512, check_buf[i],
                 buf[i]);
    printf("virtio-blk: read back 16 sectors\n");

    memset(id, 0, sizeof(id));
    expect("get id", rw(d, T_GET_ID, 0, id, 20), BLK_OK, 21);
    printf("virtio-blk: id %s\n", id);

    expect("read at the capacity", rw(d, T_IN, d->capacity, buf, 512), BLK_IOERR, 1);
    expect("read across the end", rw(d, T_IN, last, buf, 1024), BLK_IOERR, 1);
    expect("request type 11", rw(d, 11, 0, NULL, 0), BLK_UNSUPP, 1);
    printf("virtio-blk: error statuses right\n");
}

static void check_readonly(struct vdev *d)
{
    if (!(d->features & (1u << F_RO)))
        fail("the second disk does not offer VIRTIO_BLK_F_RO");
    expect("read-only read", rw(d, T_IN, 0, buf, 512), BLK_OK, 513);
    expect("read-only write", rw(d, T_OUT, 0, buf, 512), BLK_IOERR, 1);
    printf("virtio-blk: read-only disk refuses writes\n");
}

static volatile u32 rate_done;

/* An AP during the rate test: spins until the BSP is done (ap=spin) or halts for good. */
static void rate_ap(u32 cpu)
{
    (void)cpu;
    if (rate_ap_spins) {
        while (!rate_done)
            cpu_relax();
        return;
    }
    for (;;)
        __asm__ volatile("cli; hlt" ::: "memory");
}

static void rate(struct vdev *d, u64 ms)
{
    char ap[8];
    if (cmdline_str("ap", ap, sizeof(ap))) {
        rate_ap_spins = ap[0] == 's';
        u32 ncpus = smp_cpu_count();
        if (ncpus > 1 && smp_start_aps(ncpus, rate_ap, 5000) != ncpus - 1)
            fail("not every AP started");
    }
    fill(buf, 24, 8);
    halt_wait = 1;
    u64 ticks = ms * rt_tsc_khz, start = rdtsc(), bytes = 0, n = 0;
    while (rdtsc() - start < ticks) {
        if (rw(d, T_OUT, 24 + (n % 64) * 8, buf, 4096).status != BLK_OK)
            fail("rate write %llu failed", n);
        bytes += 4096;
        n++;
    }
    halt_wait = 0;
    rate_done = 1;
    u64 ns = (u64)tsc_to_ns((s64)(rdtsc() - start));
    printf("virtio-blk: rate %llu bytes in %llu ns, %llu bytes/s, %llu requests\n", bytes, ns,
           ns ? bytes * 1000000000ull / ns : 0, n);
}

static void bench(struct vdev *d, u32 count)
{
    fill(buf, 24, 8);
    u64 start = rdtsc();
    for (u32 i = 0; i < count; i++)
        if (rw(d, T_OUT, 24 + (i % 64) * 8, buf, 4096).status != BLK_OK)
            fail("bench write %u failed", i);
    u64 ns = (u64)tsc_to_ns((s64)(rdtsc() - start));
    printf("virtio-blk: bench %u writes of 4 KiB, %llu ns per request\n", count,
           count ? ns / count : 0);
}

static volatile u32 wait_ticks;

static void on_wait_tick(struct trap_frame *f)
{
    (void)f;
    wait_ticks++;
    lapic_eoi();
}

#define WAIT_VEC 0x50

/* Writes and flushes sectors 32-39, halts `ms` ms for the host's snapshot, reads them back. */
static void across_snapshot(struct vdev *d, u64 ms)
{
    fill(buf, 32, 8);
    expect("write sectors 32-39", rw(d, T_OUT, 32, buf, 4096), BLK_OK, 1);
    expect("flush sectors 32-39", rw(d, T_FLUSH, 0, NULL, 0), BLK_OK, 1);
    printf("virtio-blk: written and flushed, waiting for a snapshot\n");
    rt_set_irq_handler(WAIT_VEC, on_wait_tick);
    xapic_write(APIC_TIMER_DIV, 0xb); /* divide by 1 */
    xapic_write(APIC_LVT_TIMER, WAIT_VEC | LVT_TIMER_PERIODIC);
    xapic_write(APIC_TIMER_INIT, rt_bus_khz * 10);
    u64 end = rdtsc() + ms * rt_tsc_khz;
    while (rdtsc() < end) {
        sti_hlt();
        cli();
    }
    xapic_write(APIC_LVT_TIMER, LVT_MASKED);
    memset(check_buf, 0, sizeof(check_buf));
    expect("read sectors 32-39 after the snapshot", rw(d, T_IN, 32, check_buf, 4096), BLK_OK,
           4097);
    for (u32 i = 0; i < 4096; i++)
        if (check_buf[i] != buf[i])
            fail("after the snapshot, byte %u (sector %u) is 0x%x, wrote 0x%x", i, 32 + i / 512,
                 check_buf[i], buf[i]);
    printf("virtio-blk: read back after the snapshot (%u timer ticks)\n", wait_ticks);
}

int main(void)
{
    find_devices();
    if (ndevs == 0)
        fail("no virtio_mmio.device= on the command line (run with --disk)");
    /* An uninitialised 8259 (KVM's, with --irqchip kernel) must not turn the lines into
     * ExtINT interrupts: mask it, and LINT0. */
    outb(0x21, 0xff);
    outb(0xa1, 0xff);
    lapic_enable(0xff);
    xapic_write(APIC_LVT_LINT0, LVT_MASKED);
    for (u32 i = 0; i < ndevs; i++)
        init_device(&devs[i], i);
    u64 snapshot_ms = cmdline_u64("snapshot_ms", 0);
    if (snapshot_ms)
        across_snapshot(&devs[0], snapshot_ms);
    check_writable(&devs[0]);
    if (ndevs > 1)
        check_readonly(&devs[1]);
    u32 count = (u32)cmdline_u64("bench", 0);
    if (count)
        bench(&devs[0], count);
    u64 rate_ms = cmdline_u64("rate_ms", 0);
    if (rate_ms)
        rate(&devs[0], rate_ms);
    if (cmdline_u64("idle", 0)) {
            fill(buf, 16, 8);
        expect("write sectors 16-23", rw(&devs[0], T_OUT, 16, buf, 4096), BLK_OK, 1);
        printf("virtio-blk: idle after writes\n");
        for (;;)
            __asm__ volatile("cli; hlt" ::: "memory");
    }
    printf("virtio-blk: PASS\n");
    return RT_EXIT_PASS;
}
