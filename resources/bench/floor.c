/*
 * floor - the least a timer event of a halted vCPU can cost on this host with the LAPIC in user
 * space, against KVM's in-kernel LAPIC, with no VMM around either: one vCPU, one real-mode
 * guest loop, one C loop on the host. It answers "how far below KVM could lull get at best?"
 * (docs/PERFORMANCE.md, issue 12).
 *
 * The guest (16-bit real mode, interrupts through the IVT, no instruction the emulator of
 * ENVIRONMENT.md lacks) loops: rdtsc, add the interval, arm the deadline, sti; hlt. Its
 * handler of vector 0x40 counts the event and, with the in-kernel LAPIC, writes the x2APIC EOI.
 * Modes:
 *   kernel    KVM_CREATE_IRQCHIP; the guest puts its LAPIC in x2APIC and TSC-deadline mode and
 *             writes IA32_TSC_DEADLINE (0x6E0); KVM does the rest, no exit reaches user space.
 *   user-msr  no irqchip; WRMSR 0x6E0 exits through the MSR filter (lull's MSR path with PV
 *             EOI: two exits per event), HLT exits, the host waits and injects.
 *   user-pv   no irqchip; the guest stores its deadline in memory (lull's PV deadline) and the
 *             host reads it at the HLT exit: one exit per event.
 * The host's wait is lull's: an absolute timerfd armed at the HLT exit, ppoll on it and an
 * eventfd (the kick), expiry left unread; the vector is injected through kvm_run's synced vCPU
 * events (no ioctl); timer slack 1 ns. No timer advance, no bookkeeping.
 *
 * After a one-second warm-up it reports, over SECONDS: events, the vCPU thread's CPU time per
 * event (CLOCK_THREAD_CPUTIME_ID of that thread: KVM_RUN, the exits, the wait and the wake-up on
 * its account) and the lateness of the injection after the deadline (user modes; p50).
 * Usage: floor MODE INTERVAL_US SECONDS     (prints one `floor:` line)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/kvm.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include "median.h"

/* Guest physical layout (one 1 MiB slot at 0). */
#define MEM_SIZE 0x100000
#define CODE 0x1000
#define STACK 0x8000
#define VECTOR 0x40
#define PV_DEADLINE 0x500 /* u64: the deadline the guest stores (user-pv) */
#define INTERVAL 0x508    /* u64: TSC ticks between events */
#define EVENTS 0x510      /* u32: events the handler counted */
#define USE_MSR 0x518     /* u8: arm with WRMSR 0x6E0 (else store to PV_DEADLINE) */
#define USE_LAPIC 0x519   /* u8: set up the x2APIC and write its EOI (kernel mode) */

/* The guest: 16-bit real mode, position-independent but for the data addresses above. */
extern const unsigned char guest_start[], guest_handler[], guest_end[];
__asm__(".pushsection .rodata\n"
        ".code16\n"
        "guest_start:\n"
        "  cmpb $0, 0x519\n"
        "  je 1f\n"
        "  movl $0x1b, %ecx\n"         /* IA32_APIC_BASE: x2APIC on */
        "  rdmsr\n"
        "  orl $0xc00, %eax\n"
        "  wrmsr\n"
        "  movl $0x80f, %ecx\n"        /* SVR: software-enabled, spurious 0xff */
        "  movl $0x1ff, %eax\n"
        "  xorl %edx, %edx\n"
        "  wrmsr\n"
        "  movl $0x832, %ecx\n"        /* LVT timer: TSC-deadline mode, vector 0x40 */
        "  movl $0x40040, %eax\n"
        "  wrmsr\n"
        "1:\n"
        "  rdtsc\n"
        "  addl 0x508, %eax\n"
        "  adcl 0x50c, %edx\n"
        "  cmpb $0, 0x518\n"
        "  je 2f\n"
        "  movl $0x6e0, %ecx\n"
        "  wrmsr\n"
        "  jmp 3f\n"
        "2:\n"
        "  movl %eax, 0x500\n"
        "  movl %edx, 0x504\n"
        "3:\n"
        "  sti\n"
        "  hlt\n"
        "  jmp 1b\n"
        "guest_handler:\n"
        "  incl 0x510\n"
        "  cmpb $0, 0x519\n"
        "  je 4f\n"
        "  movl $0x80b, %ecx\n"        /* x2APIC EOI */
        "  xorl %eax, %eax\n"
        "  xorl %edx, %edx\n"
        "  wrmsr\n"
        "4:\n"
        "  iret\n"
        "guest_end:\n"
        ".code64\n"
        ".popsection\n");

enum mode { KERNEL, USER_MSR, USER_PV };

struct vm {
    enum mode mode;
    int vcpu;
    struct kvm_run *run;
    unsigned char *mem;
    uint64_t tsc_khz;
    int64_t tsc_offset; /* guest TSC - host TSC */
    volatile int stop;
    clockid_t cpu_clock;
    /* Lateness samples (ns) of the measured window. */
    uint64_t *late;
    size_t nlate, cap;
    volatile int measuring;
};

static void die(const char *what) {
    perror(what);
    exit(1);
}

static uint64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static uint64_t thread_cpu_ns(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void on_kick(int sig) { (void)sig; }

static void setup(struct vm *vm, int kvm, uint64_t interval_us) {
    int fd = ioctl(kvm, KVM_CREATE_VM, 0);
    if (fd < 0)
        die("KVM_CREATE_VM");
    vm->mem = mmap(NULL, MEM_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (vm->mem == MAP_FAILED)
        die("mmap guest");
    struct kvm_userspace_memory_region region = {
        .slot = 0, .guest_phys_addr = 0, .memory_size = MEM_SIZE,
        .userspace_addr = (uint64_t)vm->mem};
    if (ioctl(fd, KVM_SET_USER_MEMORY_REGION, &region) < 0)
        die("KVM_SET_USER_MEMORY_REGION");
    if (vm->mode == KERNEL) {
        if (ioctl(fd, KVM_CREATE_IRQCHIP, 0) < 0)
            die("KVM_CREATE_IRQCHIP");
    } else {
        struct kvm_enable_cap cap = {.cap = KVM_CAP_X86_USER_SPACE_MSR,
                                     .args = {KVM_MSR_EXIT_REASON_FILTER}};
        if (ioctl(fd, KVM_ENABLE_CAP, &cap) < 0)
            die("KVM_CAP_X86_USER_SPACE_MSR");
        static uint8_t deny = 0;
        struct kvm_msr_filter filter = {.flags = KVM_MSR_FILTER_DEFAULT_ALLOW};
        filter.ranges[0] = (struct kvm_msr_filter_range){
            .flags = KVM_MSR_FILTER_WRITE, .nmsrs = 1, .base = 0x6e0, .bitmap = &deny};
        if (ioctl(fd, KVM_X86_SET_MSR_FILTER, &filter) < 0)
            die("KVM_X86_SET_MSR_FILTER");
    }
    vm->vcpu = ioctl(fd, KVM_CREATE_VCPU, 0);
    if (vm->vcpu < 0)
        die("KVM_CREATE_VCPU");
    int size = ioctl(kvm, KVM_GET_VCPU_MMAP_SIZE, 0);
    vm->run = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, vm->vcpu, 0);
    if (vm->run == MAP_FAILED)
        die("mmap kvm_run");

    int n = 128;
    struct kvm_cpuid2 *cpuid = calloc(1, sizeof(*cpuid) + n * sizeof(struct kvm_cpuid_entry2));
    cpuid->nent = (uint32_t)n;
    if (ioctl(kvm, KVM_GET_SUPPORTED_CPUID, cpuid) < 0)
        die("KVM_GET_SUPPORTED_CPUID");
    if (ioctl(vm->vcpu, KVM_SET_CPUID2, cpuid) < 0)
        die("KVM_SET_CPUID2");
    free(cpuid);

    struct kvm_sregs sregs;
    if (ioctl(vm->vcpu, KVM_GET_SREGS, &sregs) < 0)
        die("KVM_GET_SREGS");
    sregs.cs.base = 0;
    sregs.cs.selector = 0;
    if (ioctl(vm->vcpu, KVM_SET_SREGS, &sregs) < 0)
        die("KVM_SET_SREGS");
    struct kvm_regs regs = {.rip = CODE, .rsp = STACK, .rflags = 2};
    if (ioctl(vm->vcpu, KVM_SET_REGS, &regs) < 0)
        die("KVM_SET_REGS");

    size_t len = (size_t)(guest_end - guest_start);
    memcpy(vm->mem + CODE, guest_start, len);
    uint16_t ivt[2] = {(uint16_t)(CODE + (guest_handler - guest_start)), 0};
    memcpy(vm->mem + 4 * VECTOR, ivt, sizeof(ivt));
    vm->tsc_khz = (uint64_t)ioctl(vm->vcpu, KVM_GET_TSC_KHZ, 0);
    uint64_t ticks = interval_us * vm->tsc_khz / 1000;
    memcpy(vm->mem + INTERVAL, &ticks, sizeof(ticks));
    vm->mem[USE_MSR] = vm->mode != USER_PV;
    vm->mem[USE_LAPIC] = vm->mode == KERNEL;

    if (vm->mode != KERNEL) {
        vm->run->kvm_valid_regs = KVM_SYNC_X86_EVENTS;
        /* The guest TSC's offset from the host's, read between two host reads. */
        struct {
            struct kvm_msrs h;
            struct kvm_msr_entry e;
        } msrs = {.h = {.nmsrs = 1}, .e = {.index = 0x10}};
        int64_t best = INT64_MAX;
        for (int i = 0; i < 8; i++) {
            uint64_t a = __rdtsc();
            if (ioctl(vm->vcpu, KVM_GET_MSRS, &msrs) != 1)
                die("KVM_GET_MSRS");
            uint64_t b = __rdtsc();
            if ((int64_t)(b - a) < best) {
                best = (int64_t)(b - a);
                vm->tsc_offset = (int64_t)(msrs.e.data - (a + (b - a) / 2));
            }
        }
    }
}

/* The CLOCK_MONOTONIC time of guest TSC `deadline`. */
static uint64_t deadline_mono(const struct vm *vm, uint64_t deadline) {
    uint64_t now = mono_ns();
    int64_t host = (int64_t)(deadline - (uint64_t)vm->tsc_offset);
    int64_t ticks = host - (int64_t)__rdtsc();
    return now + (uint64_t)(ticks > 0 ? ticks * 1000000 / (int64_t)vm->tsc_khz : 0);
}

static void *vcpu_thread(void *arg) {
    struct vm *vm = arg;
    prctl(PR_SET_TIMERSLACK, 1UL);
    pthread_getcpuclockid(pthread_self(), &vm->cpu_clock);
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
    int kick = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (tfd < 0 || kick < 0)
        die("timerfd/eventfd");
    uint64_t deadline = 0;
    while (!vm->stop) {
        if (ioctl(vm->vcpu, KVM_RUN, 0) < 0) {
            if (errno == EINTR)
                continue;
            die("KVM_RUN");
        }
        struct kvm_run *run = vm->run;
        switch (run->exit_reason) {
        case KVM_EXIT_X86_WRMSR:
            deadline = run->msr.data;
            run->msr.error = 0;
            break;
        case KVM_EXIT_HLT: {
            if (vm->mode == USER_PV)
                memcpy(&deadline, vm->mem + PV_DEADLINE, sizeof(deadline));
            uint64_t at = deadline_mono(vm, deadline);
            struct itimerspec its = {.it_value = {(time_t)(at / 1000000000u),
                                                  (long)(at % 1000000000u)}};
            if (timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL) < 0)
                die("timerfd_settime");
            struct pollfd fds[2] = {{.fd = kick, .events = POLLIN}, {.fd = tfd, .events = POLLIN}};
            while (ppoll(fds, 2, NULL, NULL) < 0 && errno == EINTR && !vm->stop)
                ;
            if (vm->measuring && vm->nlate < vm->cap) {
                uint64_t t = mono_ns();
                vm->late[vm->nlate++] = t > at ? t - at : 0;
            }
            struct kvm_vcpu_events *ev = &run->s.regs.events;
            ev->interrupt.injected = 1;
            ev->interrupt.nr = VECTOR;
            ev->interrupt.soft = 0;
            ev->flags = 0;
            run->kvm_dirty_regs = KVM_SYNC_X86_EVENTS;
            break;
        }
        default:
            fprintf(stderr, "floor: unexpected exit %u\n", run->exit_reason);
            exit(1);
        }
    }
    return NULL;
}

static uint32_t guest_events(const struct vm *vm) {
    uint32_t n;
    memcpy(&n, vm->mem + EVENTS, sizeof(n));
    return n;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: floor kernel|user-msr|user-pv INTERVAL_US SECONDS\n");
        return 2;
    }
    struct vm vm = {0};
    if (!strcmp(argv[1], "kernel"))
        vm.mode = KERNEL;
    else if (!strcmp(argv[1], "user-msr"))
        vm.mode = USER_MSR;
    else if (!strcmp(argv[1], "user-pv"))
        vm.mode = USER_PV;
    else {
        fprintf(stderr, "floor: unknown mode %s\n", argv[1]);
        return 2;
    }
    uint64_t interval_us = strtoull(argv[2], NULL, 10);
    unsigned seconds = (unsigned)strtoul(argv[3], NULL, 10);
    int kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC);
    if (kvm < 0)
        die("/dev/kvm");
    setup(&vm, kvm, interval_us);
    vm.cap = (size_t)seconds * 1000000u / interval_us + 16;
    vm.late = calloc(vm.cap, sizeof(uint64_t));
    signal(SIGUSR1, on_kick);

    pthread_t t;
    if (pthread_create(&t, NULL, vcpu_thread, &vm))
        die("pthread_create");
    sleep(1);
    uint32_t e0 = guest_events(&vm);
    uint64_t c0 = thread_cpu_ns(vm.cpu_clock);
    vm.measuring = 1;
    sleep(seconds);
    vm.measuring = 0;
    uint32_t e1 = guest_events(&vm);
    uint64_t c1 = thread_cpu_ns(vm.cpu_clock);
    vm.stop = 1;
    vm.run->immediate_exit = 1;
    pthread_kill(t, SIGUSR1);
    pthread_join(t, NULL);

    uint32_t events = e1 - e0;
    if (events == 0) {
        fprintf(stderr, "floor: the guest counted no event (mode %s)\n", argv[1]);
        return 1;
    }
    char late[32] = "-";
    if (vm.nlate)
        snprintf(late, sizeof(late), "%.1f", median(vm.late, (int)vm.nlate) / 1000.0);
    printf("floor: mode %s interval_us %llu events %u cpu_per_event_us %.1f late_p50_us %s\n",
           argv[1], (unsigned long long)interval_us, events,
           (double)(c1 - c0) / events / 1000.0, late);
    return 0;
}
