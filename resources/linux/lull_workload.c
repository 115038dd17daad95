// SPDX-License-Identifier: GPL-2.0
/*
 * lull_workload - a guest workload that needs no user space (kernel/lull_workload.c).
 *
 * On hosts whose KVM cannot run guest user space (PVM: see lull's ENVIRONMENT.md) a Linux
 * guest can still be measured: this runs in kernel_init() where /init would be executed,
 * after every initcall, the initramfs and the freeing of init memory, so the kernel is as it
 * would be under an idle user space. Enabled from the command line:
 *
 *   lull.workload=KIND[,seconds=S][,cpus=N][,seed=X][,max_late_ms=M][,mix=W:MS[-MS],...]
 *
 *   idle    the kernel is left alone for S seconds (its tick, NOHZ idle, RCU, workqueues as
 *           they are); then, per CPU, what the kernel itself counted meanwhile.
 *   timers  one kthread bound to every online CPU sleeps on a pinned hrtimer, S seconds
 *           long, each interval drawn from the mix like lull's idle-sim guest
 *           (default 30:1,30:4,40:10-500: weight:ms or weight:lo-hi ms, uniform; per-CPU
 *           prandom streams seeded from `seed` and the CPU number); lateness
 *           is measured in the guest, at the hrtimer callback (hard irq) and when the
 *           thread runs again, both against the programmed expiry.
 *
 * Report (one line per CPU, then cpu=all; each line "lull-workload: KIND cpu=C key=value..."):
 *   both   loc       local APIC timer interrupts (irq_stat.apic_timer_irqs: /proc's LOC)
 *          res, cal  rescheduling and function-call IPIs received (RES, CAL)
 *          wakeups   passes through the idle loop (tick_sched.idle_calls): one per HLT,
 *                    that is one per wake-up from idle
 *          tick_stops passes that stopped the tick (tick_sched.idle_sleeps, NOHZ idle)
 *          idle_us, idle_pct  idle residency (get_cpu_idle_time_us) over the run
 *   timers a second line per CPU and for all: events, late_{p50,p99,max,mean}_us
 *          (hrtimer callback - expiry),
 *          wake_{p50,p99,max}_us (thread running again - expiry); p50/p99 are the upper
 *          bound of their log-linear bucket (16 per power of two, < 6.25% wide).
 * then "lull-workload: PASS" and a write of 0 to the test-exit port 0xf4 (lull exits with
 * status 1, QEMU's isa-debug-exit likewise), or "lull-workload: FAIL <why>" and a write of
 * 1 (status 3). A panic once a workload is set writes 2 (status 5), so that no run ends in a
 * reset that reads as success. Without the port, the guest resets.
 *
 * Restores: a VM snapshotted mid-workload may be restored minutes later, many times over, and
 * on hosts where guest time runs on across the gap every armed timer fires at the resume,
 * late by all of it. lull's restore-count port (0xf8, 32 bits: how many times the VM was
 * restored; all ones under another VMM) tells that gap from the host's lateness: a timer
 * thread reads it when a timer comes more than 10 ms late and at least once a second, the
 * idle run and the waiting thread when their end comes. When the count has changed the
 * window starts again, all of it (S seconds, every counter and histogram cleared, the event
 * that saw the gap dropped), and "lull-workload: restored count=N: the window starts again"
 * is printed; the report covers only the time since the last restore. Where guest time stands
 * still across a snapshot a restore is seen within a second.
 *
 * PASS needs: the argument parsed; `cpus` CPUs online if given; every online CPU idle at
 * least once (idle) or through at least one timer (timers); every timer thread done within
 * S + 2 s; no lateness above max_late_ms (default 1000).
 *
 * Guest kernel code is emulated instruction by instruction on PVM hosts: this file must
 * compile to plain integer code (no WARN/BUG: they are ud2), which build.sh checks with
 * objdump against lull's forbidden-instruction rules.
 */

#define pr_fmt(fmt) "lull-workload: " fmt

#include <linux/bitops.h>
#include <linux/completion.h>
#include <linux/cpumask.h>
#include <linux/hrtimer.h>
#include <linux/init.h>
#include <linux/io.h>
#include <linux/kernel_stat.h>
#include <linux/kthread.h>
#include <linux/notifier.h>
#include <linux/panic_notifier.h>
#include <linux/prandom.h>
#include <linux/printk.h>
#include <linux/reboot.h>
#include <linux/sched.h>
#include <linux/string.h>
#include <linux/tick.h>
#include <asm/hardirq.h>

#include "time/tick-sched.h"

#define TEST_EXIT_PORT 0xf4
#define RESTORE_COUNT_PORT 0xf8
#define NO_RESTORE_PORT 0xffffffffu
#define RESTORE_CHECK_LATE_NS (10 * NSEC_PER_MSEC)
#define RESTORE_CHECK_EVERY_NS NSEC_PER_SEC
#define EXIT_PASS 0
#define EXIT_FAIL 1
#define EXIT_PANIC 2

#define ARG_LEN 160
#define MAX_MIX 8
#define NBUCKETS 464 /* (31 - 3) * 16 + 16: every u32 value */
#define STOP_GRACE_MS 2000

enum kind { KIND_NONE, KIND_IDLE, KIND_TIMERS };

/* An interval range of the mix; `upto` is the running sum of the weights up to this one. */
struct mix_entry {
	u32 upto, lo_ms, hi_ms;
};

/* Log-linear histogram of u32 values (ns). */
struct histogram {
	u32 count[NBUCKETS];
	u32 n, max;
	u64 sum;
};

/* What the kernel counted on one CPU. */
struct counters {
	u64 loc, res, cal, wakeups, tick_stops, idle_us;
};

/* One CPU of the timers workload: its thread, its hrtimer, its results. */
struct timer_cpu {
	struct hrtimer timer;
	struct task_struct *task;
	ktime_t expires;
	ktime_t fired_at;
	int fired;
	struct rnd_state rng;
	u32 events;
	struct histogram late, wake;
};

static char arg[ARG_LEN];
static enum kind kind;
static const char *parse_error;
static u32 seconds = 10, want_cpus, seed = 1, max_late_ms = 1000;
static struct mix_entry mix[MAX_MIX];
static u32 mix_len, mix_total;

static struct counters before[NR_CPUS], after[NR_CPUS];
static struct timer_cpu tcpu[NR_CPUS];
static ktime_t window_end;
/* The restore count the current window started under, its start and end; `window_gen`
 * counts the windows begun, so that each timer thread sees when its results belong to an old
 * one. */
static u32 restores_seen;
static ktime_t window_start;
static atomic_t window_gen;
static atomic_t timers_running;
static DECLARE_COMPLETION(timers_done);

/* Leaves the VM: the test-exit port, else a reset. Does not return. (No halt(): its MDS
 * buffer clearing is a verw, which our hosts cannot emulate.) */
static void leave(u8 code)
{
	outb(code, TEST_EXIT_PORT);
	emergency_restart();
	for (;;)
		cpu_relax();
}

static int lull_workload_panic(struct notifier_block *nb, unsigned long event, void *msg)
{
	pr_emerg("FAIL kernel panic\n");
	outb(EXIT_PANIC, TEST_EXIT_PORT);
	return NOTIFY_DONE;
}

static struct notifier_block panic_nb = {
	.notifier_call = lull_workload_panic,
};

/* Parses a decimal number at *s; advances *s. */
static u32 parse_u32(const char **s)
{
	u32 v = 0;

	while (**s >= '0' && **s <= '9')
		v = v * 10 + (u32)(*(*s)++ - '0');
	return v;
}

/* One mix entry W:MS or W:LO-HI at *s; advances *s. */
static const char *parse_mix_entry(const char **s)
{
	struct mix_entry e;
	u32 weight;

	if (mix_len == MAX_MIX)
		return "mix: at most 8 entries";
	weight = parse_u32(s);
	if (*(*s)++ != ':')
		return "mix: expected WEIGHT:MS or WEIGHT:LO-HI";
	e.lo_ms = e.hi_ms = parse_u32(s);
	if (**s == '-') {
		(*s)++;
		e.hi_ms = parse_u32(s);
	}
	if (e.lo_ms == 0 || e.hi_ms < e.lo_ms)
		return "mix: intervals must be >= 1 ms and LO <= HI";
	mix_total += weight;
	e.upto = mix_total;
	mix[mix_len++] = e;
	return NULL;
}

/* Parses `arg`: KIND then comma-separated key=value; words after mix= extend the mix. */
static const char *parse_arg(void)
{
	const char *s = arg;
	const char *key;
	bool in_mix = false;

	if (!strncmp(s, "idle", 4) && (s[4] == ',' || !s[4])) {
		kind = KIND_IDLE;
		s += 4;
	} else if (!strncmp(s, "timers", 6) && (s[6] == ',' || !s[6])) {
		kind = KIND_TIMERS;
		s += 6;
	} else {
		return "unknown kind (idle or timers)";
	}
	while (*s == ',') {
		s++;
		key = s;
		while ((*s >= 'a' && *s <= 'z') || *s == '_')
			s++;
		if (*s != '=') {
			const char *err;

			if (!in_mix)
				return "expected key=value";
			s = key;
			err = parse_mix_entry(&s);
			if (err)
				return err;
			continue;
		}
		s++;
		in_mix = false;
		if (!strncmp(key, "seconds=", 8))
			seconds = parse_u32(&s);
		else if (!strncmp(key, "cpus=", 5))
			want_cpus = parse_u32(&s);
		else if (!strncmp(key, "seed=", 5))
			seed = parse_u32(&s);
		else if (!strncmp(key, "max_late_ms=", 12))
			max_late_ms = parse_u32(&s);
		else if (!strncmp(key, "mix=", 4)) {
			const char *err;

			mix_len = mix_total = 0;
			in_mix = true;
			err = parse_mix_entry(&s);
			if (err)
				return err;
		} else {
			return "unknown key (seconds, cpus, seed, max_late_ms, mix)";
		}
	}
	if (*s)
		return "trailing characters";
	if (seconds == 0)
		return "seconds must be >= 1";
	if (kind == KIND_TIMERS && mix_total == 0)
		return "mix: the weights add up to 0";
	return NULL;
}

static int __init lull_workload_setup(char *str)
{
	strscpy(arg, str, sizeof(arg));
	return 1;
}
__setup("lull.workload=", lull_workload_setup);

/* Parses the argument and arms the panic notifier early, so that a panic anywhere later
 * in the boot ends the run with a failure status. */
static int __init lull_workload_init(void)
{
	static const struct mix_entry default_mix[] = { { 30, 1, 1 }, { 60, 4, 4 }, { 100, 10, 500 } };

	if (!arg[0])
		return 0;
	memcpy(mix, default_mix, sizeof(default_mix));
	mix_len = ARRAY_SIZE(default_mix);
	mix_total = 100;
	parse_error = parse_arg();
	atomic_notifier_chain_register(&panic_notifier_list, &panic_nb);
	return 0;
}
early_initcall(lull_workload_init);

static void snapshot(struct counters *c)
{
	unsigned int cpu;

	for_each_online_cpu(cpu) {
		const irq_cpustat_t *irqs = &per_cpu(irq_stat, cpu);

		c[cpu].loc = irqs->apic_timer_irqs;
		c[cpu].res = irqs->irq_resched_count;
		c[cpu].cal = irqs->irq_call_count;
		c[cpu].wakeups = tick_nohz_get_idle_calls_cpu(cpu);
		c[cpu].tick_stops = tick_get_tick_sched(cpu)->idle_sleeps;
		c[cpu].idle_us = get_cpu_idle_time_us(cpu, NULL);
	}
}

/* Whether the VM was restored since the window began (true for exactly one caller per
 * restore: the one that records the new count and must start the window again). */
static bool restored_since_window(void)
{
	u32 now = inl(RESTORE_COUNT_PORT), old = READ_ONCE(restores_seen);

	if (now == NO_RESTORE_PORT || now == old)
		return false;
	return cmpxchg(&restores_seen, old, now) == old;
}

/* Starts the window again after a restore: its start, the counters' first reading, the
 * timers' end; then the generation, so that every timer thread drops what it measured. */
static void restart_window(void)
{
	snapshot(before);
	window_start = ktime_get();
	WRITE_ONCE(window_end, ktime_add_ms(window_start, (u64)seconds * MSEC_PER_SEC));
	atomic_inc(&window_gen);
	pr_info("restored count=%u: the window starts again (%u s)\n", READ_ONCE(restores_seen),
		seconds);
}

/* "12.3" for a per-mille value. */
#define PERMILLE(v) (v) / 10, (v) % 10

/* Prints one line per CPU and a total of what the kernel counted over `run_us`; returns
 * false if a CPU was never idle. */
static bool report_counters(const char *what, u64 run_us)
{
	struct counters sum = {};
	unsigned int cpu, n = 0;
	bool ok = true;

	for_each_online_cpu(cpu) {
		struct counters d = {
			.loc = after[cpu].loc - before[cpu].loc,
			.res = after[cpu].res - before[cpu].res,
			.cal = after[cpu].cal - before[cpu].cal,
			.wakeups = after[cpu].wakeups - before[cpu].wakeups,
			.tick_stops = after[cpu].tick_stops - before[cpu].tick_stops,
			.idle_us = after[cpu].idle_us - before[cpu].idle_us,
		};
		u64 pm = run_us ? d.idle_us * 1000 / run_us : 0;

		pr_info("%s cpu=%u loc=%llu res=%llu cal=%llu wakeups=%llu tick_stops=%llu idle_us=%llu idle_pct=%llu.%llu\n",
			what, cpu, d.loc, d.res, d.cal, d.wakeups, d.tick_stops, d.idle_us,
			PERMILLE(pm));
		if (d.wakeups == 0 || d.idle_us == 0)
			ok = false;
		sum.loc += d.loc;
		sum.res += d.res;
		sum.cal += d.cal;
		sum.wakeups += d.wakeups;
		sum.tick_stops += d.tick_stops;
		sum.idle_us += d.idle_us;
		n++;
	}
	pr_info("%s cpu=all cpus=%u run_us=%llu loc=%llu res=%llu cal=%llu wakeups=%llu tick_stops=%llu idle_us=%llu idle_pct=%llu.%llu\n",
		what, n, run_us, sum.loc, sum.res, sum.cal, sum.wakeups, sum.tick_stops,
		sum.idle_us, PERMILLE(run_us && n ? sum.idle_us * 1000 / (run_us * n) : 0));
	return ok;
}

static const char *run_idle(void)
{
	ktime_t end;

	snapshot(before);
	window_start = ktime_get();
	end = ktime_add_ms(window_start, (u64)seconds * MSEC_PER_SEC);
	for (;;) {
		while (ktime_before(ktime_get(), end)) {
			set_current_state(TASK_UNINTERRUPTIBLE);
			schedule_hrtimeout(&end, HRTIMER_MODE_ABS);
		}
		if (!restored_since_window())
			break;
		restart_window();
		end = READ_ONCE(window_end);
	}
	snapshot(after);
	if (!report_counters("idle", ktime_us_delta(ktime_get(), window_start)))
		return "a CPU was never idle";
	return NULL;
}

/* Log-linear bucket: exact below 16, then 16 buckets per power of two. */
static u32 bucket_of(u32 v)
{
	u32 e;

	if (v < 16)
		return v;
	e = fls(v) - 1; /* bsr: fine at emulated CPL0 */
	return (e - 3) * 16 + ((v >> (e - 4)) & 15);
}

/* Smallest value of bucket b. */
static u64 bucket_lo(u32 b)
{
	u32 e;

	if (b < 16)
		return b;
	e = b / 16 + 3;
	return (u64)(16 + b % 16) << (e - 4);
}

static void hist_add(struct histogram *h, s64 ns)
{
	u32 v = ns < 0 ? 0 : ns > U32_MAX ? U32_MAX : (u32)ns;

	h->count[bucket_of(v)]++;
	if (v > h->max)
		h->max = v;
	h->n++;
	h->sum += v;
}

static void hist_merge(struct histogram *into, const struct histogram *h)
{
	u32 b;

	for (b = 0; b < NBUCKETS; b++)
		into->count[b] += h->count[b];
	if (h->max > into->max)
		into->max = h->max;
	into->n += h->n;
	into->sum += h->sum;
}

/* Upper bound (us) of the bucket holding the per-mille quantile. */
static u64 hist_quantile_us(const struct histogram *h, u32 per_mille)
{
	u64 rank = ((u64)h->n * per_mille + 999) / 1000;
	u64 seen = 0;
	u32 b;

	if (rank == 0)
		rank = 1;
	for (b = 0; b < NBUCKETS; b++) {
		seen += h->count[b];
		if (seen >= rank) {
			u64 hi = b + 1 < NBUCKETS ? bucket_lo(b + 1) - 1 : U32_MAX;

			return (hi < h->max ? hi : h->max) / NSEC_PER_USEC;
		}
	}
	return h->max / NSEC_PER_USEC;
}

static void report_timers(const char *cpu, u32 events, const struct histogram *late,
			  const struct histogram *wake)
{
	pr_info("timers cpu=%s events=%u late_p50_us=%llu late_p99_us=%llu late_max_us=%u late_mean_us=%llu wake_p50_us=%llu wake_p99_us=%llu wake_max_us=%u\n",
		cpu, events, hist_quantile_us(late, 500), hist_quantile_us(late, 990),
		late->max / (u32)NSEC_PER_USEC, late->n ? late->sum / late->n / NSEC_PER_USEC : 0,
		hist_quantile_us(wake, 500), hist_quantile_us(wake, 990),
		wake->max / (u32)NSEC_PER_USEC);
}

/* An interval from the mix, in ms: an entry by weight, then uniform in its range. */
static u32 draw_interval_ms(struct rnd_state *rng)
{
	u32 r = prandom_u32_state(rng) % mix_total;
	const struct mix_entry *e = mix;

	while (r >= e->upto) /* the last entry's upto is mix_total */
		e++;
	return e->lo_ms + prandom_u32_state(rng) % (e->hi_ms - e->lo_ms + 1);
}

/* Hard-irq callback: the time first, then wake the thread. */
static enum hrtimer_restart timer_fired(struct hrtimer *t)
{
	struct timer_cpu *c = container_of(t, struct timer_cpu, timer);

	c->fired_at = ktime_get();
	WRITE_ONCE(c->fired, 1);
	wake_up_process(c->task);
	return HRTIMER_NORESTART;
}

/* Forgets what a timer thread measured (its window was started again). */
static void clear_results(struct timer_cpu *c)
{
	c->events = 0;
	memset(&c->late, 0, sizeof(c->late));
	memset(&c->wake, 0, sizeof(c->wake));
}

/* Whether this thread's window was started again since generation `*gen` (after a look at the
 * restore count, if `look`): then its results are cleared and `*gen` is the new one. */
static bool window_restarted(struct timer_cpu *c, int *gen, bool look)
{
	if (look && restored_since_window())
		restart_window();
	if (atomic_read(&window_gen) == *gen)
		return false;
	*gen = atomic_read(&window_gen);
	clear_results(c);
	return true;
}

/* One CPU's thread: sleep on its pinned hrtimer for intervals from the mix until the end.
 * When the end has passed it looks at the restore count once more: a VM restored after its
 * window ended (or before this thread first ran) starts a new window rather than ending. */
static int timer_thread(void *data)
{
	struct timer_cpu *c = data;
	int gen = atomic_read(&window_gen);
	ktime_t now, checked = ktime_get();

	hrtimer_init(&c->timer, CLOCK_MONOTONIC, HRTIMER_MODE_ABS_PINNED_HARD);
	c->timer.function = timer_fired;
	do {
		while (ktime_before(now = ktime_get(), READ_ONCE(window_end))) {
			ktime_t end = READ_ONCE(window_end);
			ktime_t expires = ktime_add_ms(now, draw_interval_ms(&c->rng));
			s64 late;
			bool look;

			if (ktime_after(expires, end))
				expires = end;
			c->expires = expires;
			WRITE_ONCE(c->fired, 0);
			set_current_state(TASK_UNINTERRUPTIBLE);
			hrtimer_start(&c->timer, expires, HRTIMER_MODE_ABS_PINNED_HARD);
			while (!READ_ONCE(c->fired)) {
				schedule();
				set_current_state(TASK_UNINTERRUPTIBLE);
			}
			__set_current_state(TASK_RUNNING);
			now = ktime_get();
			late = ktime_to_ns(ktime_sub(c->fired_at, c->expires));
			look = late > RESTORE_CHECK_LATE_NS ||
			       ktime_to_ns(ktime_sub(now, checked)) > RESTORE_CHECK_EVERY_NS;
			if (look)
				checked = now;
			if (window_restarted(c, &gen, look))
				continue;
			c->events++;
			hist_add(&c->late, late);
			hist_add(&c->wake, ktime_to_ns(ktime_sub(now, c->expires)));
		}
	} while (window_restarted(c, &gen, true));
	if (atomic_dec_and_test(&timers_running))
		complete(&timers_done);
	return 0;
}

static const char *run_timers(void)
{
	static struct histogram all_late, all_wake;
	unsigned int cpu, started = 0;
	u32 all_events = 0;
	int gen;
	char name[8];
	const char *why = NULL;

	snapshot(before);
	window_start = ktime_get();
	window_end = ktime_add_ms(window_start, (u64)seconds * MSEC_PER_SEC);
	atomic_set(&timers_running, 1);
	for_each_online_cpu(cpu) {
		struct timer_cpu *c = &tcpu[cpu];

		prandom_seed_state(&c->rng, ((u64)seed << 32) | cpu);
		c->task = kthread_create_on_cpu(timer_thread, c, cpu, "lull-timers/%u");
		if (IS_ERR(c->task))
			return "cannot create a timer thread";
		atomic_inc(&timers_running);
		wake_up_process(c->task);
		started++;
	}
	gen = atomic_read(&window_gen);
	if (!atomic_dec_and_test(&timers_running))
		while (!wait_for_completion_timeout(&timers_done,
						    msecs_to_jiffies(seconds * MSEC_PER_SEC +
								     STOP_GRACE_MS))) {
			/* A restore moved the end (or does now: the threads may not have woken). */
			if (restored_since_window())
				restart_window();
			if (atomic_read(&window_gen) == gen)
				return "a timer thread did not finish within seconds + 2 s";
			gen = atomic_read(&window_gen);
		}
	snapshot(after);
	report_counters("timers", ktime_us_delta(ktime_get(), window_start));
	for_each_online_cpu(cpu) {
		struct timer_cpu *c = &tcpu[cpu];

		snprintf(name, sizeof(name), "%u", cpu);
		report_timers(name, c->events, &c->late, &c->wake);
		hist_merge(&all_late, &c->late);
		hist_merge(&all_wake, &c->wake);
		all_events += c->events;
		if (c->events == 0)
			why = "a CPU had no timer event";
	}
	report_timers("all", all_events, &all_late, &all_wake);
	if (!why && all_late.max > (u64)max_late_ms * NSEC_PER_MSEC)
		why = "a timer was later than max_late_ms";
	return why;
}

/*
 * Called by kernel_init() just before it executes /init: runs the workload if one was set
 * on the command line, and then leaves the VM; returns at once otherwise.
 */
void lull_workload_run(void)
{
	const char *why = parse_error;
	unsigned int online = num_online_cpus();

	if (kind == KIND_NONE && !why)
		return;
	pr_info("start kind=%s seconds=%u cpus=%u hz=%u boot_ms=%llu arg=%s (instead of /init)\n",
		kind == KIND_IDLE ? "idle" : kind == KIND_TIMERS ? "timers" : "none", seconds,
		online, HZ, ktime_to_ms(ktime_get()), arg);
	/* A VM restored before its workload began starts from its count (all ones: no port). */
	restores_seen = inl(RESTORE_COUNT_PORT);
	if (!why && want_cpus && want_cpus != online)
		why = "not as many CPUs online as cpus= asked";
	if (!why)
		why = kind == KIND_IDLE ? run_idle() : run_timers();
	if (why) {
		pr_info("FAIL %s (lull.workload=%s)\n", why, arg);
		leave(EXIT_FAIL);
	}
	pr_info("PASS\n");
	leave(EXIT_PASS);
}
