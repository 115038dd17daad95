/*
 * busy - a CPU-bound host task for `placement.sh`: counts iterations of a tiny integer loop
 * until SIGTERM or SIGINT, then prints
 *   busy: iterations N seconds S rate R
 * (R in millions of iterations per second of wall time). Single-threaded, pinned nowhere: the
 * host scheduler may run it on any CPU, as it would any competing job.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static volatile sig_atomic_t stop;

static void on_signal(int sig) { (void)sig; stop = 1; }

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(void) {
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    double start = now();
    uint64_t n = 0, x = 88172645463325252ull;
    while (!stop) {
        /* xorshift: a few dependent integer ops per iteration, nothing the compiler can fold */
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        n++;
    }
    double s = now() - start;
    printf("busy: iterations %llu seconds %.3f rate %.3f check %llu\n", (unsigned long long)n, s,
           (double)n / s / 1e6, (unsigned long long)(x & 1));
    return 0;
}
