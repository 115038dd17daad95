/*
 * floor - the least a halted vCPU's wake-up can cost on this host with the LAPIC in user space,
 * against KVM's in-kernel LAPIC, with no VMM around either: a real-mode guest loop and a C
 * loop on the host. It answers "how far below KVM could lull get at best?" (issue 12,
 * docs/PERFORMANCE.md).
 *
 * The guest (16-bit real mode, interrupts through the IVT, only instructions the emulator of
 * ENVIRONMENT.md has) records a sample per event in a ring: a timer's lateness (its handler's
 * TSC less the deadline) or an IPI's latency (the target handler's TSC less the sender's just
 * before its ICR write). Modes:
 *   kernel      KVM_CREATE_IRQCHIP; the guest puts its LAPIC in x2APIC and TSC-deadline mode,
 *               loops: rdtsc, add the interval, WRMSR IA32_TSC_DEADLINE, sti; hlt; its handler
 *               writes the x2APIC EOI. No exit reaches user space.
 *   user-msr    no irqchip; the same loop, WRMSR 0x6E0 exits through the MSR filter (lull's MSR
 *               path with PV EOI: two exits per event), HLT exits; no EOI.
 *   user-pv     no irqchip; the guest stores its deadline in memory (lull's PV deadline), read
 *               at the HLT exit: one exit per event.
 *   ipi-kernel  two vCPUs, as `lull bench wakeup`'s wake-ipi: the target idles GAP_US on its
 *               timer (kernel: WRMSR), announces its halt and halts; the sender waits DELAY_US
 *               after the announcement and writes the x2APIC ICR.
 *   ipi-user    the same with no irqchip: the ICR write exits (no LAPIC: reason INVAL), the
 *               sender's thread kicks the target as lull's mailbox does (a flag, and the
 *               eventfd if the target is blocked); the gap is a PV deadline.
 *   ipi-user-poll  ipi-user, the target polling the flag for up to 200 us at the HLT for the
 *               IPI (not at the gap's), as KVM's halt polling (halt_poll_ns) may.
 * The host's wait in user modes is lull's: at the HLT exit an absolute timerfd is armed for the
 * stored deadline (or disarmed), then ppoll on it and the kick eventfd, an expiry left unread,
 * a kick drained; the vector is injected through kvm_run's synced vCPU events (no ioctl);
 * timer slack 1 ns. No timer advance, no bookkeeping: what is left is the price of the exits,
 * the system calls and the sleep. KVM's halt polling is left as the host sets it.
 *
 * After a one-second warm-up it reports, over SECONDS: events, the halting vCPU's thread CPU
 * time per event (CLOCK_THREAD_CPUTIME_ID: KVM_RUN, the exits, the wait, the wake-up) and the
 * median sample of the window (the last 4096 at most).
 * Usage: floor kernel|user-msr|user-pv INTERVAL_US SECONDS
 *        floor ipi-kernel|ipi-user|ipi-user-poll DELAY_US SECONDS    (one `floor:` line)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/kvm.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
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
#define TIMER_VECTOR 0x40
#define IPI_VECTOR 0x41
#define DEADLINE 0x500  /* u64: the deadline the guest armed (user-pv reads it at HLT) */
#define INTERVAL 0x508  /* u64: TSC ticks between timer events */
#define SAMPLES 0x510   /* u32: events the handlers counted */
#define USE_MSR 0x518   /* u8: arm with WRMSR 0x6E0 (else only store to DEADLINE) */
#define USE_LAPIC 0x519 /* u8: set up the x2APIC and write its EOI (kernel modes) */
#define TIMER_SAMPLES 0x51a /* u8: the timer handler records its lateness (timer modes) */
#define SENT 0x520      /* u64: the sender's TSC just before its ICR write */
#define READY 0x528     /* u8: the IPI target is about to halt */
#define DELAY 0x540     /* u64: TSC ticks the sender waits after READY */
#define RING 0x9000     /* u32[RING_LEN]: the handlers' samples (TSC ticks), by SAMPLES */
#define RING_LEN 4096
#define GAP_US 1000     /* the IPI target's idle time on its timer between samples */

/*
 * The guest: 16-bit real mode, position-independent but for the data addresses above.
 * Timer modes run timer_loop on vCPU 0; IPI modes run ipi_sender on vCPU 0 and ipi_target
 * on vCPU 1. Each handler stores its sample in the ring: the timer's lateness (its TSC less
 * the deadline), the IPI's latency (its TSC less the sender's).
 */
extern const unsigned char guest_start[], guest_timer_loop[], guest_ipi_sender[],
    guest_ipi_target[], guest_timer_handler[], guest_ipi_handler[], guest_end[];
__asm__(".pushsection .rodata\n"
        ".code16\n"
        "guest_start:\n"
        "lapic_setup:\n"
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
        "  ret\n"
        "eoi:\n"
        "  cmpb $0, 0x519\n"
        "  je 1f\n"
        "  movl $0x80b, %ecx\n"        /* x2APIC EOI */
        "  xorl %eax, %eax\n"
        "  xorl %edx, %edx\n"
        "  wrmsr\n"
        "1:\n"
        "  ret\n"
        "record:\n"                    /* ring[SAMPLES % RING_LEN] = eax; SAMPLES++ */
        "  movw 0x510, %bx\n"
        "  andw $0xfff, %bx\n"
        "  shlw $2, %bx\n"
        "  movl %eax, 0x9000(%bx)\n"
        "  incl 0x510\n"
        "  ret\n"
        "guest_timer_loop:\n"
        "  call lapic_setup\n"
        "2:\n"
        "  rdtsc\n"
        "  addl 0x508, %eax\n"
        "  adcl 0x50c, %edx\n"
        "  movl %eax, 0x500\n"
        "  movl %edx, 0x504\n"
        "  cmpb $0, 0x518\n"
        "  je 3f\n"
        "  movl $0x6e0, %ecx\n"
        "  wrmsr\n"
        "3:\n"
        "  sti\n"
        "  hlt\n"
        "  jmp 2b\n"
        "guest_timer_handler:\n"
        "  rdtsc\n"
        "  cmpb $0, 0x51a\n"
        "  je 1f\n"
        "  subl 0x500, %eax\n"
        "  call record\n"
        "1:\n"
        "  call eoi\n"
        "  iret\n"
        "guest_ipi_sender:\n"
        "  call lapic_setup\n"
        "4:\n"
        "  cmpb $0, 0x528\n"
        "  je 4b\n"
        "  movb $0, 0x528\n"
        "  rdtsc\n"
        "  addl 0x540, %eax\n"
        "  adcl 0x544, %edx\n"
        "  movl %eax, %esi\n"
        "  movl %edx, %edi\n"
        "5:\n"
        "  rdtsc\n"
        "  cmpl %edi, %edx\n"
        "  jb 5b\n"
        "  ja 6f\n"
        "  cmpl %esi, %eax\n"
        "  jb 5b\n"
        "6:\n"
        "  rdtsc\n"
        "  movl %eax, 0x520\n"
        "  movl %edx, 0x524\n"
        "  movl $0x830, %ecx\n"        /* x2APIC ICR: fixed, vector 0x41, to APIC ID 1 */
        "  movl $0x41, %eax\n"
        "  movl $1, %edx\n"
        "  wrmsr\n"
        "  jmp 4b\n"
        /* The deadline is armed inline, as in the timer loop, not in a shared subroutine:
         * every emulated instruction costs ~1.5 us here, and call/ret would add two. */
        "guest_ipi_target:\n"       /* idle a gap on the timer, then halt for the IPI */
        "  call lapic_setup\n"
        "7:\n"
        "  rdtsc\n"
        "  addl 0x508, %eax\n"
        "  adcl 0x50c, %edx\n"
        "  movl %eax, 0x500\n"
        "  movl %edx, 0x504\n"
        "  cmpb $0, 0x518\n"
        "  je 8f\n"
        "  movl $0x6e0, %ecx\n"
        "  wrmsr\n"
        "8:\n"
        "  sti\n"
        "  hlt\n"
        "  cli\n"
        "  movl $0, 0x500\n"          /* no deadline while it waits for the IPI */
        "  movl $0, 0x504\n"
        "  movb $1, 0x528\n"
        "  sti\n"
        "  hlt\n"
        "  jmp 7b\n"
        "guest_ipi_handler:\n"
        "  rdtsc\n"
        "  subl 0x520, %eax\n"
        "  call record\n"
        "  call eoi\n"
        "  iret\n"
        "guest_end:\n"
        ".code64\n"
        ".popsection\n");

enum mode { KERNEL, USER_MSR, USER_PV, IPI_KERNEL, IPI_USER, IPI_USER_POLL, MODES };
static const char *const NAMES[MODES] = {"kernel",     "user-msr", "user-pv",
                                         "ipi-kernel", "ipi-user", "ipi-user-poll"};

static int in_kernel(enum mode m) { return m == KERNEL || m == IPI_KERNEL; }
static int is_ipi(enum mode m) { return m >= IPI_KERNEL; }

/* The user-space poll of ipi-user-poll, before the target blocks. */
#define POLL_NS 200000

struct vcpu {
    struct vm *vm;
    int id, fd;
    struct kvm_run *run;
    int kick;  /* eventfd: the IPI sender's kick (user modes) */
    /* lull's mailbox handshake (user modes): the sender sets KICKED and writes the eventfd
     * only if the target is BLOCKED; the target sets BLOCKED before it looks for a kick. */
    _Atomic unsigned state;
    clockid_t cpu_clock;
    pthread_t thread;
};

struct vm {
    enum mode mode;
    int ncpus;
    struct vcpu cpu[2];
    unsigned char *mem;
    uint64_t tsc_khz;
    int64_t tsc_offset; /* guest TSC - host TSC */
    volatile int stop;
};

static void die(const char *what) {
    perror(what);
    exit(1);
}

static uint64_t now_ns(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void on_kick(int sig) { (void)sig; }

#define BLOCKED 1u
#define KICKED 2u

static void put64(struct vm *vm, uint32_t at, uint64_t v) { memcpy(vm->mem + at, &v, 8); }

static uint32_t samples(const struct vm *vm) {
    uint32_t n;
    memcpy(&n, vm->mem + SAMPLES, sizeof(n));
    return n;
}

static void create_vcpu(struct vm *vm, int kvm, int vmfd, int id, const unsigned char *entry) {
    struct vcpu *c = &vm->cpu[id];
    c->vm = vm;
    c->id = id;
    c->fd = ioctl(vmfd, KVM_CREATE_VCPU, id);
    if (c->fd < 0)
        die("KVM_CREATE_VCPU");
    int size = ioctl(kvm, KVM_GET_VCPU_MMAP_SIZE, 0);
    c->run = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
    if (c->run == MAP_FAILED)
        die("mmap kvm_run");
    c->kick = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->kick < 0)
        die("eventfd");

    int n = 128;
    struct kvm_cpuid2 *cpuid = calloc(1, sizeof(*cpuid) + n * sizeof(struct kvm_cpuid_entry2));
    cpuid->nent = (uint32_t)n;
    if (ioctl(kvm, KVM_GET_SUPPORTED_CPUID, cpuid) < 0)
        die("KVM_GET_SUPPORTED_CPUID");
    for (uint32_t i = 0; i < cpuid->nent; i++)
        if (cpuid->entries[i].function == 1) /* APIC ID (EBX 31:24) */
            cpuid->entries[i].ebx = (cpuid->entries[i].ebx & 0xffffff) | ((uint32_t)id << 24);
    if (ioctl(c->fd, KVM_SET_CPUID2, cpuid) < 0)
        die("KVM_SET_CPUID2");
    free(cpuid);

    struct kvm_sregs sregs;
    if (ioctl(c->fd, KVM_GET_SREGS, &sregs) < 0)
        die("KVM_GET_SREGS");
    sregs.cs.base = 0;
    sregs.cs.selector = 0;
    if (ioctl(c->fd, KVM_SET_SREGS, &sregs) < 0)
        die("KVM_SET_SREGS");
    struct kvm_regs regs = {.rip = CODE + (uint64_t)(entry - guest_start),
                            .rsp = 0x8000 - 0x1000 * (uint64_t)id, .rflags = 2};
    if (ioctl(c->fd, KVM_SET_REGS, &regs) < 0)
        die("KVM_SET_REGS");
    if (in_kernel(vm->mode)) {
        /* An application processor of the in-kernel LAPIC waits for INIT/SIPI: start it. */
        struct kvm_mp_state mp = {.mp_state = KVM_MP_STATE_RUNNABLE};
        if (ioctl(c->fd, KVM_SET_MP_STATE, &mp) < 0)
            die("KVM_SET_MP_STATE");
    } else {
        c->run->kvm_valid_regs = KVM_SYNC_X86_EVENTS;
    }
}

static void setup(struct vm *vm, int kvm, uint64_t param_us) {
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
    if (in_kernel(vm->mode)) {
        if (ioctl(fd, KVM_CREATE_IRQCHIP, 0) < 0)
            die("KVM_CREATE_IRQCHIP");
    } else {
        /* WRMSR 0x6E0 exits through the filter; the x2APIC ICR, with no LAPIC, as invalid. */
        struct kvm_enable_cap cap = {
            .cap = KVM_CAP_X86_USER_SPACE_MSR,
            .args = {KVM_MSR_EXIT_REASON_FILTER | KVM_MSR_EXIT_REASON_INVAL}};
        if (ioctl(fd, KVM_ENABLE_CAP, &cap) < 0)
            die("KVM_CAP_X86_USER_SPACE_MSR");
        static uint8_t deny = 0;
        struct kvm_msr_filter filter = {.flags = KVM_MSR_FILTER_DEFAULT_ALLOW};
        filter.ranges[0] = (struct kvm_msr_filter_range){
            .flags = KVM_MSR_FILTER_WRITE, .nmsrs = 1, .base = 0x6e0, .bitmap = &deny};
        if (ioctl(fd, KVM_X86_SET_MSR_FILTER, &filter) < 0)
            die("KVM_X86_SET_MSR_FILTER");
    }
    vm->ncpus = is_ipi(vm->mode) ? 2 : 1;
    if (is_ipi(vm->mode)) {
        create_vcpu(vm, kvm, fd, 0, guest_ipi_sender);
        create_vcpu(vm, kvm, fd, 1, guest_ipi_target);
    } else {
        create_vcpu(vm, kvm, fd, 0, guest_timer_loop);
    }

    memcpy(vm->mem + CODE, guest_start, (size_t)(guest_end - guest_start));
    uint16_t ivt[2][2] = {{(uint16_t)(CODE + (guest_timer_handler - guest_start)), 0},
                          {(uint16_t)(CODE + (guest_ipi_handler - guest_start)), 0}};
    memcpy(vm->mem + 4 * TIMER_VECTOR, ivt, sizeof(ivt));
    vm->tsc_khz = (uint64_t)ioctl(vm->cpu[0].fd, KVM_GET_TSC_KHZ, 0);
    uint64_t ticks = param_us * vm->tsc_khz / 1000;
    if (is_ipi(vm->mode)) {
        put64(vm, DELAY, ticks);
        put64(vm, INTERVAL, GAP_US * vm->tsc_khz / 1000);
    } else {
        put64(vm, INTERVAL, ticks);
        vm->mem[TIMER_SAMPLES] = 1;
    }
    vm->mem[USE_MSR] = vm->mode == KERNEL || vm->mode == USER_MSR || vm->mode == IPI_KERNEL;
    vm->mem[USE_LAPIC] = in_kernel(vm->mode);

    if (!in_kernel(vm->mode)) {
        /* The guest TSC's offset from the host's, read between two host reads. */
        struct {
            struct kvm_msrs h;
            struct kvm_msr_entry e;
        } msrs = {.h = {.nmsrs = 1}, .e = {.index = 0x10}};
        int64_t best = INT64_MAX;
        for (int i = 0; i < 8; i++) {
            uint64_t a = __rdtsc();
            if (ioctl(vm->cpu[0].fd, KVM_GET_MSRS, &msrs) != 1)
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
    uint64_t now = now_ns(CLOCK_MONOTONIC);
    int64_t host = (int64_t)(deadline - (uint64_t)vm->tsc_offset);
    int64_t ticks = host - (int64_t)__rdtsc();
    return now + (uint64_t)(ticks > 0 ? ticks * 1000000 / (int64_t)vm->tsc_khz : 0);
}

/* Injects `vector` at the next entry through the synced vCPU events (no ioctl). */
static void inject(struct kvm_run *run, uint8_t vector) {
    struct kvm_vcpu_events *ev = &run->s.regs.events;
    ev->interrupt.injected = 1;
    ev->interrupt.nr = vector;
    ev->interrupt.soft = 0;
    ev->flags = 0;
    run->kvm_dirty_regs = KVM_SYNC_X86_EVENTS;
}

static void *vcpu_thread(void *arg) {
    struct vcpu *c = arg;
    struct vm *vm = c->vm;
    prctl(PR_SET_TIMERSLACK, 1UL);
    pthread_getcpuclockid(pthread_self(), &c->cpu_clock);
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    if (tfd < 0)
        die("timerfd_create");
    uint64_t deadline = 0;
    while (!vm->stop) {
        if (ioctl(c->fd, KVM_RUN, 0) < 0) {
            if (errno == EINTR)
                continue;
            die("KVM_RUN");
        }
        struct kvm_run *run = c->run;
        switch (run->exit_reason) {
        case KVM_EXIT_X86_WRMSR:
            if (run->msr.index == 0x6e0) {
                deadline = run->msr.data;
            } else if (run->msr.index == 0x830) {
                struct vcpu *t = &vm->cpu[(uint32_t)(run->msr.data >> 32) & 1];
                uint64_t one = 1;
                if ((atomic_fetch_or(&t->state, KICKED) & BLOCKED) && write(t->kick, &one, 8) != 8)
                    die("kick");
            }
            run->msr.error = 0;
            break;
        case KVM_EXIT_HLT: {
            /* lull's wait: the wake-up timerfd (armed for a timer) and the kick eventfd. */
            /* Armed for the deadline, or disarmed (an expiry is left unread: re-arming
             * clears it). */
            if (vm->mode != USER_MSR)
                memcpy(&deadline, vm->mem + DEADLINE, sizeof(deadline));
            uint64_t at = deadline ? deadline_mono(vm, deadline) : 0;
            struct itimerspec its = {
                .it_value = {(time_t)(at / 1000000000u), (long)(at % 1000000000u)}};
            if (timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL) < 0)
                die("timerfd_settime");
            int kicked = 0;
            if (vm->mode == IPI_USER_POLL && !deadline) {
                uint64_t until = now_ns(CLOCK_MONOTONIC) + POLL_NS;
                while (!(kicked = atomic_load(&c->state) & KICKED) &&
                       now_ns(CLOCK_MONOTONIC) < until)
                    __builtin_ia32_pause();
            }
            if (!kicked && !(atomic_fetch_or(&c->state, BLOCKED) & KICKED)) {
                struct pollfd fds[2] = {{.fd = c->kick, .events = POLLIN},
                                        {.fd = tfd, .events = POLLIN}};
                while (ppoll(fds, 2, NULL, NULL) < 0 && errno == EINTR && !vm->stop)
                    ;
                uint64_t n;
                if (fds[0].revents && read(c->kick, &n, 8) != 8)
                    die("drain kick");
            }
            kicked = atomic_exchange(&c->state, 0) & KICKED;
            inject(run, kicked ? IPI_VECTOR : TIMER_VECTOR);
            break;
        }
        default:
            fprintf(stderr, "floor: unexpected exit %u\n", run->exit_reason);
            exit(1);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: floor kernel|user-msr|user-pv INTERVAL_US SECONDS\n"
                        "       floor ipi-kernel|ipi-user|ipi-user-poll DELAY_US SECONDS\n");
        return 2;
    }
    struct vm vm = {.mode = MODES};
    for (int m = 0; m < MODES; m++)
        if (!strcmp(argv[1], NAMES[m]))
            vm.mode = (enum mode)m;
    if (vm.mode == MODES) {
        fprintf(stderr, "floor: unknown mode %s\n", argv[1]);
        return 2;
    }
    uint64_t param_us = strtoull(argv[2], NULL, 10);
    unsigned seconds = (unsigned)strtoul(argv[3], NULL, 10);
    int kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC);
    if (kvm < 0)
        die("/dev/kvm");
    setup(&vm, kvm, param_us);
    signal(SIGUSR1, on_kick);

    for (int i = 0; i < vm.ncpus; i++)
        if (pthread_create(&vm.cpu[i].thread, NULL, vcpu_thread, &vm.cpu[i]))
            die("pthread_create");
    /* The halting vCPU: the timer's, or the IPI's target. */
    struct vcpu *halting = &vm.cpu[vm.ncpus - 1];
    sleep(1);
    uint32_t s0 = samples(&vm);
    uint64_t c0 = now_ns(halting->cpu_clock);
    sleep(seconds);
    uint32_t s1 = samples(&vm);
    uint64_t c1 = now_ns(halting->cpu_clock);
    vm.stop = 1;
    for (int i = 0; i < vm.ncpus; i++) {
        vm.cpu[i].run->immediate_exit = 1;
        pthread_kill(vm.cpu[i].thread, SIGUSR1);
    }
    for (int i = 0; i < vm.ncpus; i++)
        pthread_join(vm.cpu[i].thread, NULL);

    uint32_t events = s1 - s0;
    if (events == 0) {
        fprintf(stderr, "floor: the guest counted no event (mode %s)\n", argv[1]);
        return 1;
    }
    /* The ring's last samples, all from the measured window. */
    int n = (int)(events < RING_LEN ? events : RING_LEN);
    uint64_t *v = calloc((size_t)n, sizeof(*v));
    for (int i = 0; i < n; i++) {
        uint32_t at = (s1 - 1 - (uint32_t)i) % RING_LEN, ticks;
        memcpy(&ticks, vm.mem + RING + 4 * at, 4);
        v[i] = (uint64_t)ticks * 1000000 / vm.tsc_khz; /* ns */
    }
    printf("floor: mode %s %s_us %llu events %u cpu_per_event_us %.1f %s_p50_us %.1f\n",
           argv[1], is_ipi(vm.mode) ? "delay" : "interval", (unsigned long long)param_us,
           events, (double)(c1 - c0) / events / 1000.0, is_ipi(vm.mode) ? "wakeup" : "late",
           median(v, n) / 1000.0);
    return 0;
}
