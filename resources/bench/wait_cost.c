/*
 * wait_cost - what one timed sleep and wake-up costs a thread on this host, per way of waiting
 * (the lead "a futex wait instead of timerfd + ppoll" in docs/PERFORMANCE.md):
 *   ppoll    a blocked lull vCPU's wait: an absolute timerfd armed, then ppoll on it and an
 *            eventfd (the kick) without a timeout; the expiry is left unread, as lull does
 *   futex    FUTEX_WAIT_BITSET with an absolute CLOCK_MONOTONIC timeout (no fd)
 *   signal   a POSIX timer that signals the thread (like lull's running tick), then a futex
 *            wait without a timeout that the signal interrupts
 * Every sleep is PERIOD_US long; the thread's timer slack is 1 ns, as lull's vCPU threads'.
 * Per mode it prints the thread's CPU time per sleep (CLOCK_THREAD_CPUTIME_ID: the system
 * calls, the wake-up and the return to user space, on this thread's account) and the wake-up
 * lateness (p50), each the median over REPS interleaved runs of COUNT sleeps.
 * Usage: wait_cost PERIOD_US COUNT REPS   (prints one `wait-cost:` line per mode)
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <time.h>

#include "median.h"
#include <unistd.h>

enum mode { PPOLL, FUTEX, SIGNAL, MODES };
static const char *const NAMES[MODES] = {"ppoll", "futex", "signal"};

static uint64_t now_ns(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static struct timespec timespec_of(uint64_t ns) {
    struct timespec t = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    return t;
}

static void on_signal(int sig) { (void)sig; }

static int timer_fd, kick_fd;
static timer_t signal_timer;
static uint32_t futex_word;

/* One sleep until `deadline` (CLOCK_MONOTONIC ns) the way `mode` waits. */
static void sleep_until(enum mode mode, uint64_t deadline) {
    struct itimerspec at = {{0, 0}, timespec_of(deadline)};
    struct timespec abs = timespec_of(deadline);
    sigset_t none;
    sigemptyset(&none);
    switch (mode) {
    case PPOLL: {
        timerfd_settime(timer_fd, TFD_TIMER_ABSTIME, &at, NULL);
        struct pollfd fds[2] = {{kick_fd, POLLIN, 0}, {timer_fd, POLLIN, 0}};
        ppoll(fds, 2, NULL, &none);
        break;
    }
    case FUTEX:
        syscall(SYS_futex, &futex_word, FUTEX_WAIT_BITSET_PRIVATE, 0, &abs, NULL,
                FUTEX_BITSET_MATCH_ANY);
        break;
    case SIGNAL:
        timer_settime(signal_timer, TIMER_ABSTIME, &at, NULL);
        syscall(SYS_futex, &futex_word, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
        break;
    default:
        break;
    }
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: wait_cost PERIOD_US COUNT REPS\n");
        return 2;
    }
    uint64_t period = strtoull(argv[1], NULL, 10) * 1000;
    int count = atoi(argv[2]), reps = atoi(argv[3]);
    if (period == 0 || count < 1 || reps < 1)
        return 2;
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    kick_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGRTMIN + 1, &sa, NULL);
    struct sigevent ev;
    memset(&ev, 0, sizeof ev);
    ev.sigev_notify = SIGEV_THREAD_ID;
    ev.sigev_signo = SIGRTMIN + 1;
    ev._sigev_un._tid = gettid();
    if (timer_fd < 0 || kick_fd < 0 || timer_create(CLOCK_MONOTONIC, &ev, &signal_timer)) {
        perror("wait_cost");
        return 1;
    }
    uint64_t *late = calloc((size_t)count, sizeof *late);
    uint64_t *cpu[MODES], *late_p50[MODES];
    for (int m = 0; m < MODES; m++) {
        cpu[m] = calloc((size_t)reps, sizeof **cpu);
        late_p50[m] = calloc((size_t)reps, sizeof **late_p50);
    }
    for (int r = 0; r < reps; r++) {
        for (int m = 0; m < MODES; m++) {
            uint64_t cpu0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
            for (int i = 0; i < count; i++) {
                uint64_t deadline = now_ns(CLOCK_MONOTONIC) + period;
                sleep_until((enum mode)m, deadline);
                uint64_t woke = now_ns(CLOCK_MONOTONIC);
                late[i] = woke > deadline ? woke - deadline : 0;
            }
            cpu[m][r] = (now_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0) / (uint64_t)count;
            late_p50[m][r] = median(late, count);
        }
    }
    for (int m = 0; m < MODES; m++)
        printf("wait-cost: %-6s period_us=%llu cpu_per_sleep_ns=%llu late_p50_ns=%llu\n", NAMES[m],
               (unsigned long long)(period / 1000), (unsigned long long)median(cpu[m], reps),
               (unsigned long long)median(late_p50[m], reps));
    return 0;
}
