/*
 * migration_cost - what a wake-up on another host CPU costs a thread, and what binding costs,
 * on this host (the inputs of `--wake-placement`'s threshold, docs/PERFORMANCE.md):
 *   bind_pair_ns   one sched_setaffinity to a single CPU plus one back to the full set
 *   getcpu_ns      one sched_getcpu (glibc: rseq area or vDSO)
 *   refill_KIB_ns  time to read a KIB KiB working set again (one load per 64-byte line) right
 *                  after the thread moved to the other CPU, less the same on the CPU it warmed
 *                  it on (median of REPS alternations each)
 * Usage: migration_cost [REPS]   (needs 2 CPUs; prints one `migration-cost:` line per value)
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "median.h"

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void bind(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof s, &s)) {
        perror("sched_setaffinity");
        exit(1);
    }
}

static volatile uint64_t sink;

static uint64_t touch(volatile uint8_t *buf, size_t len) {
    uint64_t t0 = now_ns(), sum = 0;
    for (size_t i = 0; i < len; i += 64)
        sum += buf[i];
    sink += sum;
    return now_ns() - t0;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 300;
    cpu_set_t all;
    sched_getaffinity(0, sizeof all, &all);
    if (CPU_COUNT(&all) < 2) {
        fprintf(stderr, "migration_cost: needs 2 CPUs\n");
        return 1;
    }
    int a = -1, b = -1;
    for (int c = 0; c < CPU_SETSIZE && b < 0; c++)
        if (CPU_ISSET(c, &all)) {
            if (a < 0)
                a = c;
            else
                b = c;
        }
    uint64_t *v = calloc(reps, sizeof *v), *w = calloc(reps, sizeof *w);

    for (int i = 0; i < reps; i++) {
        uint64_t t0 = now_ns();
        bind(sched_getcpu());
        sched_setaffinity(0, sizeof all, &all);
        v[i] = now_ns() - t0;
    }
    printf("migration-cost: bind_pair_ns %llu\n", (unsigned long long)median(v, reps));
    {
        uint64_t t0 = now_ns();
        for (int i = 0; i < 100000; i++)
            sink += (uint64_t)sched_getcpu();
        printf("migration-cost: getcpu_ns %.1f\n", (double)(now_ns() - t0) / 100000.0);
    }

    size_t sizes[] = {16, 64, 256, 1024};
    for (unsigned k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        size_t len = sizes[k] * 1024;
        volatile uint8_t *buf = malloc(len);
        for (size_t i = 0; i < len; i++)
            buf[i] = (uint8_t)i;
        for (int i = 0; i < reps; i++) {
            bind(a);
            touch(buf, len);
            touch(buf, len); /* warm on a */
            bind(a);
            v[i] = touch(buf, len); /* stayed */
            touch(buf, len);
            bind(b);
            w[i] = touch(buf, len); /* moved */
        }
        uint64_t stay = median(v, reps), moved = median(w, reps);
        printf("migration-cost: refill_%zu_KiB_ns %lld (stay %llu moved %llu)\n", sizes[k],
               (long long)moved - (long long)stay, (unsigned long long)stay,
               (unsigned long long)moved);
        free((void *)buf);
    }
    sched_setaffinity(0, sizeof all, &all);
    return 0;
}
