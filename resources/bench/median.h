/* median.h - the median of a sample of nanosecond figures, for the C bench programs here. */
#ifndef LULL_BENCH_MEDIAN_H
#define LULL_BENCH_MEDIAN_H

#include <stdint.h>
#include <stdlib.h>

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) (n >= 1); sorts v. */
static uint64_t median(uint64_t *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_u64);
    return v[n / 2];
}

#endif
