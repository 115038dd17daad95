/*
 * print.c - COM1 output (polled 16550), a tiny printf, and the few string helpers we need.
 *
 * printf formats into a buffer first and writes it under a spinlock, so lines from several
 * CPUs do not interleave. Supported: %d %i %u %x %X %s %c %p %% with optional '0' flag and
 * width, and the l / ll length modifiers (%llu, %lld, %llx, %lu, ...).
 */
#include "rt.h"

#define UART_THR 0 /* transmit holding register */
#define UART_IER 1
#define UART_FCR 2
#define UART_LCR 3
#define UART_MCR 4
#define UART_LSR 5
#define UART_LSR_THRE 0x20

static volatile u32 print_lock;

/* Program COM1 for 115200 8N1, FIFO on, interrupts off. */
void serial_init(void)
{
    outb(PORT_SERIAL + UART_IER, 0x00);
    outb(PORT_SERIAL + UART_LCR, 0x80); /* DLAB: divisor follows */
    outb(PORT_SERIAL + 0, 0x01);        /* 115200 baud */
    outb(PORT_SERIAL + 1, 0x00);
    outb(PORT_SERIAL + UART_LCR, 0x03); /* 8N1 */
    outb(PORT_SERIAL + UART_FCR, 0x07); /* FIFO enable + clear */
    outb(PORT_SERIAL + UART_MCR, 0x03); /* DTR, RTS */
}

/* Write one byte, waiting (bounded) for the transmitter to be empty. */
void serial_putc(char c)
{
    for (u32 i = 0; i < 100000; i++)
        if (inb(PORT_SERIAL + UART_LSR) & UART_LSR_THRE)
            break;
    outb(PORT_SERIAL + UART_THR, (u8)c);
}

/* Take the print lock (xchg is locked implicitly). */
static void print_lock_acquire(void)
{
    u32 one = 1;
    for (;;) {
        u32 old = one;
        __asm__ volatile("xchgl %0, %1" : "+r"(old), "+m"(print_lock) : : "memory");
        if (old == 0)
            return;
        while (print_lock)
            cpu_relax();
    }
}

/* Release the print lock; also used to break it when an exception hits inside printf. */
void rt_print_unlock(void)
{
    barrier();
    print_lock = 0;
}

/* Output state for the formatter: a bounded buffer. */
struct out {
    char *buf;
    u32 size, len;
};

/* Append one character (dropping it if the buffer is full, keeping room for the NUL). */
static void out_c(struct out *o, char c)
{
    if (o->len + 1 < o->size)
        o->buf[o->len] = c;
    o->len++;
}

/* Format an unsigned 64-bit value in base 10 or 16 with width / zero padding. */
static void out_num(struct out *o, u64 v, u32 base, int upper, int neg, u32 width, int zero)
{
    char tmp[24];
    const char *digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
    u32 n = 0;
    do {
        tmp[n++] = digits[v % base];
        v /= base;
    } while (v);
    u32 len = n + (neg ? 1 : 0);
    if (neg && zero)
        out_c(o, '-');
    for (; len < width; len++)
        out_c(o, zero ? '0' : ' ');
    if (neg && !zero)
        out_c(o, '-');
    while (n)
        out_c(o, tmp[--n]);
}

int vsnprintf(char *buf, u32 size, const char *fmt, va_list ap)
{
    struct out o = { buf, size, 0 };
    for (const char *p = fmt; *p; p++) {
        if (*p != '%') {
            out_c(&o, *p);
            continue;
        }
        p++;
        int zero = 0, lng = 0;
        u32 width = 0;
        if (*p == '0') {
            zero = 1;
            p++;
        }
        while (*p >= '0' && *p <= '9')
            width = width * 10 + (u32)(*p++ - '0');
        while (*p == 'l') {
            lng++;
            p++;
        }
        switch (*p) {
        case 'd':
        case 'i': {
            s64 v = lng >= 2 ? va_arg(ap, s64) : lng ? va_arg(ap, long) : va_arg(ap, int);
            out_num(&o, v < 0 ? (u64)-v : (u64)v, 10, 0, v < 0, width, zero);
            break;
        }
        case 'u':
        case 'x':
        case 'X': {
            u64 v = lng >= 2 ? va_arg(ap, u64)
                    : lng     ? va_arg(ap, unsigned long)
                              : va_arg(ap, unsigned int);
            out_num(&o, v, *p == 'u' ? 10 : 16, *p == 'X', 0, width, zero);
            break;
        }
        case 'p':
            out_c(&o, '0');
            out_c(&o, 'x');
            out_num(&o, (u32)va_arg(ap, void *), 16, 0, 0, 8, 1);
            break;
        case 's': {
            const char *s = va_arg(ap, const char *);
            if (!s)
                s = "(null)";
            u32 len = strlen(s);
            for (; len < width; len++)
                out_c(&o, ' ');
            while (*s)
                out_c(&o, *s++);
            break;
        }
        case 'c':
            out_c(&o, (char)va_arg(ap, int));
            break;
        case '%':
            out_c(&o, '%');
            break;
        case 0:
            p--; /* lone '%' at the end */
            break;
        default:
            out_c(&o, '%');
            out_c(&o, *p);
        }
    }
    if (size)
        buf[o.len < size ? o.len : size - 1] = 0;
    return (int)o.len;
}

int snprintf(char *buf, u32 size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, size, fmt, ap);
    va_end(ap);
    return n;
}

int vprintf(const char *fmt, va_list ap)
{
    char buf[512];
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    print_lock_acquire();
    for (const char *p = buf; *p; p++) {
        if (*p == '\n')
            serial_putc('\r');
        serial_putc(*p);
    }
    rt_print_unlock();
    return n;
}

int printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vprintf(fmt, ap);
    va_end(ap);
    return n;
}

void *memset(void *d, int c, u32 n)
{
    u8 *p = d;
    while (n--)
        *p++ = (u8)c;
    return d;
}

void *memcpy(void *d, const void *s, u32 n)
{
    u8 *dp = d;
    const u8 *sp = s;
    while (n--)
        *dp++ = *sp++;
    return d;
}

u32 strlen(const char *s)
{
    u32 n = 0;
    while (s[n])
        n++;
    return n;
}

int strncmp(const char *a, const char *b, u32 n)
{
    for (; n; n--, a++, b++) {
        if (*a != *b)
            return (u8)*a - (u8)*b;
        if (!*a)
            return 0;
    }
    return 0;
}
