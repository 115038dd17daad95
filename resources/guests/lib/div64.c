/*
 * div64.c - 64-bit division helpers that gcc calls in 32-bit code (normally from libgcc).
 *
 * We provide our own so the build needs no 32-bit multilib libgcc, and so the common case
 * (a divisor that fits in 32 bits: kHz, 10, 1000) costs two DIV instructions: every guest
 * instruction at CPL0 is emulated on our hosts (~1.5 us each), so a bit-by-bit loop hurts.
 */
#include "rt.h"

/* 64 / 32 -> 64 quotient with two 32-bit DIVs; *rem gets the remainder. */
static u64 udiv64_32(u64 n, u32 d, u32 *rem)
{
    u32 hi = (u32)(n >> 32), lo = (u32)n;
    u32 qhi = hi / d; /* 32-bit division: a plain DIV */
    u32 r = hi % d;
    u32 qlo;
    /* (r:lo) / d: r < d, so the quotient fits in 32 bits. */
    __asm__("divl %4" : "=a"(qlo), "=d"(r) : "a"(lo), "d"(r), "rm"(d));
    if (rem)
        *rem = r;
    return ((u64)qhi << 32) | qlo;
}

/* Unsigned 64-bit division and remainder; the general case is shift-and-subtract. */
static u64 udivmod64(u64 n, u64 d, u64 *rem)
{
    if (d == 0) {
        /* Mirror the hardware: divide error. Our #DE handler reports it. */
        volatile u32 zero = 0;
        u32 one = 1;
        u32 hi = 0;
        __asm__ volatile("divl %2" : "+a"(one), "+d"(hi) : "r"(zero));
    }
    if ((d >> 32) == 0) {
        u32 r;
        u64 q = udiv64_32(n, (u32)d, &r);
        if (rem)
            *rem = r;
        return q;
    }
    u64 q = 0, r = 0;
    for (int i = 63; i >= 0; i--) {
        r = (r << 1) | ((n >> i) & 1);
        if (r >= d) {
            r -= d;
            q |= 1ull << i;
        }
    }
    if (rem)
        *rem = r;
    return q;
}

/* gcc: unsigned 64-bit quotient. */
u64 __udivdi3(u64 n, u64 d) { return udivmod64(n, d, NULL); }

/* gcc: unsigned 64-bit remainder. */
u64 __umoddi3(u64 n, u64 d)
{
    u64 r;
    udivmod64(n, d, &r);
    return r;
}

/* gcc: signed 64-bit quotient (truncates toward zero). */
s64 __divdi3(s64 n, s64 d)
{
    int neg = (n < 0) != (d < 0);
    u64 q = udivmod64(n < 0 ? -(u64)n : (u64)n, d < 0 ? -(u64)d : (u64)d, NULL);
    return neg ? -(s64)q : (s64)q;
}

/* gcc: signed 64-bit remainder (sign of the dividend). */
s64 __moddi3(s64 n, s64 d)
{
    u64 r;
    udivmod64(n < 0 ? -(u64)n : (u64)n, d < 0 ? -(u64)d : (u64)d, &r);
    return n < 0 ? -(s64)r : (s64)r;
}

/* gcc: unsigned 64-bit quotient and remainder in one call. */
u64 __udivmoddi4(u64 n, u64 d, u64 *rem) { return udivmod64(n, d, rem); }
