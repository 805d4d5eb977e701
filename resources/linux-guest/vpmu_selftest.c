// SPDX-License-Identifier: GPL-2.0
/*
 * Boot-time PEBS self-test for the vmm virtual PMU (copied to arch/x86/events/ by
 * resources/linux-guest/build.sh; it lives there to use "perf_event.h").
 *
 * The development host cannot run guest user space (SYSCALL lands in user mode), so the test
 * is a late initcall. It runs only when the command line carries vpmu_selftest.fmt=N, the
 * PEBS format the VMM's CPU model advertises; without it the kernel boots on to /init (the
 * real-VMX `perf` tool path). Parameters:
 *   vpmu_selftest.fmt=N          expected PEBS format (0..5); the test is skipped if absent
 *   vpmu_selftest.period=P       sample period in cycles (default 40000000: ~19 ms of vCPU
 *                                time at the perf backend's 2.1 GHz, about one PMI per tick)
 *   vpmu_selftest.duration_ms=D  workload time per mode (default 2000, measured with the TSC)
 *   vpmu_selftest.min_samples=M  fewest samples a mode must collect (default 20)
 *   vpmu_selftest.exit_port=0    do not write the verdict to port 0xf4 (default 1)
 *
 * Two modes sample a precise cycles event (:p for fmt0/1, whose :pp would need LBRs; :pp
 * for fmt2+) with a fixed period while a non-precise cycles event counts beside it as the
 * reference:
 *   "pmi"   wakeup_events=1 turns off auto-reload and large PEBS: the interrupt threshold is
 *           one record, so every record must raise a PMI (an NMI) that drains it into the
 *           overflow handler, and Linux re-arms the counter itself (RDMSR/RDPMC + WRMSR).
 *   "large" fixed period, no wakeups: auto-reload from the DS reset slot and large PEBS; the
 *           records pile up and are drained by a buffer-full PMI or when the event stops.
 *
 * Proof that samples came through the PEBS drain: the x86_pmu_drain_pebs static call (the
 * one entry point of every PEBS drain, from the PMI or not) is pointed at a wrapper for the
 * test. The wrapper counts the records in the DS area before the driver consumes them and
 * marks "inside a drain" while it runs; the overflow handler counts samples delivered inside
 * and outside a drain. A PEBS-enabled counter has its EVTSEL.INT bit cleared, so only a drain
 * may deliver its samples. Large PEBS hands all but the last record of a drain to
 * perf_event_output(), which has no ring buffer for a kernel counter, so that mode checks
 * the IPs of the raw records the wrapper saw (the record's second quadword is the IP in
 * every format: pebs_record_core/nhm/hsw/skl .ip, pebs_basic .ip).
 */

#include <linux/init.h>
#include <linux/kallsyms.h>
#include <linux/moduleparam.h>
#include <linux/perf_event.h>
#include <linux/static_call.h>
#include <linux/sysctl.h>
#include <linux/delay.h>
#include <asm/intel_ds.h>
#include <asm/io.h>
#include <asm/msr.h>
#include <asm/tsc.h>

#include "perf_event.h"

static int fmt = -1;
module_param(fmt, int, 0444);
static ulong period = 40000000;
module_param(period, ulong, 0444);
static uint duration_ms = 2000;
module_param(duration_ms, uint, 0444);
static uint min_samples = 20;
module_param(min_samples, uint, 0444);
static bool exit_port = true;
module_param(exit_port, bool, 0444);

/* The VMM's exit port: a 32-bit write of V ends `vmm run` with status (V << 1) | 1. */
#define VPMU_EXIT_PORT 0xf4
/*
 * Share of samples that must fall in the workload. The rest is NMI exit code: the perf
 * backend's clock charges the VMM's exit handling to the guest, so the code right after the
 * PMI handler re-enables the counters (sched_clock, the "NMI handler took too long" printk)
 * gets samples, more of them on a loaded host (90-99 % idle, 80 % seen under load). Every IP
 * must still be kernel text, and hot_a must beat hot_b.
 */
#define IP_IN_WORKLOAD_PERCENT 60
/* Reference counter tolerance: the two events start and stop a few µs apart. */
#define REF_TOLERANCE_PERCENT 10
#define MAX_OUTSIDE_SHOWN 4

static unsigned int passed, failed;

static __printf(2, 3) void check(bool ok, const char *fmtstr, ...)
{
	struct va_format vaf;
	va_list args;

	va_start(args, fmtstr);
	vaf.fmt = fmtstr;
	vaf.va = &args;
	if (ok) {
		passed++;
		pr_info("PASS %pV\n", &vaf);
	} else {
		failed++;
		pr_info("FAIL %pV\n", &vaf);
	}
	va_end(args);
}

/* ---- workload: three functions with known addresses, nothing else runs in them ---- */

/*
 * noipa as well as noinline: no constprop/isra clone may run in place of the function whose
 * address and size the test looks up.
 */
#define VPMU_WORKLOAD noinline __attribute__((__noipa__))

static volatile u64 sink;
static volatile u64 round_iters = 3000;

static VPMU_WORKLOAD u64 vpmu_hot_a(u64 n)
{
	u64 x = n, i;

	for (i = 0; i < n; i++)
		x = x * 6364136223846793005ULL + 1442695040888963407ULL;
	return x;
}

/* Same body as vpmu_hot_a, run a third as long: it must collect fewer samples. */
static VPMU_WORKLOAD u64 vpmu_hot_b(u64 n)
{
	u64 x = n + 1, i;

	for (i = 0; i < n; i++)
		x = x * 6364136223846793005ULL + 1442695040888963407ULL;
	return x;
}

/* Runs rounds of hot_a (3 parts) and hot_b (1 part) for duration_ms, timed with the TSC. */
static VPMU_WORKLOAD void vpmu_workload(u64 tsc_ticks)
{
	u64 start = rdtsc();

	do {
		sink += vpmu_hot_a(3 * round_iters);
		sink += vpmu_hot_b(round_iters);
	} while (rdtsc() - start < tsc_ticks);
}

struct fn_span {
	unsigned long start, end;
};

static struct fn_span ranges[3];

static bool fn_range(void *fn, struct fn_span *r)
{
	unsigned long size, off;

	if (!kallsyms_lookup_size_offset((unsigned long)fn, &size, &off) || off != 0)
		return false;
	r->start = (unsigned long)fn;
	r->end = r->start + size;
	return true;
}

static bool ip_in(const struct fn_span *r, unsigned long ip)
{
	return ip >= r->start && ip < r->end;
}

static bool in_workload(unsigned long ip)
{
	int i;

	for (i = 0; i < ARRAY_SIZE(ranges); i++)
		if (ip_in(&ranges[i], ip))
			return true;
	return false;
}

/* ---- observation: drain wrapper and overflow handler (NMI context: counters only) ---- */

struct observed {
	/* drain wrapper */
	int in_drain;
	unsigned int drains_pmi, drains_other;
	unsigned long records, records_in_workload, records_not_text, records_bad;
	/* overflow handler */
	unsigned long samples, samples_in_drain, samples_in_workload, samples_hot_a, samples_hot_b;
	unsigned long samples_bad_period, samples_not_text, throttled;
	unsigned long outside[MAX_OUTSIDE_SHOWN], outside_rec[MAX_OUTSIDE_SHOWN];
	unsigned int n_outside, n_outside_rec;
};

static struct observed obs;
static void (*orig_drain)(struct pt_regs *iregs, struct perf_sample_data *data);

static void vpmu_drain_wrapper(struct pt_regs *iregs, struct perf_sample_data *data)
{
	struct cpu_hw_events *cpuc = this_cpu_ptr(&cpu_hw_events);
	struct debug_store *ds = cpuc->ds;
	int size = cpuc->pebs_record_size ?: x86_pmu.pebs_record_size;

	if (iregs)
		obs.drains_pmi++;
	else
		obs.drains_other++;
	if (ds && size > 0) {
		u64 at = ds->pebs_buffer_base;
		u64 top = ds->pebs_index;

		if (top < at || top > ds->pebs_absolute_maximum) {
			obs.records_bad++;
		} else {
			for (; at + size <= top; at += size) {
				unsigned long ip = *(u64 *)(at + 8);

				obs.records++;
				if (!kernel_text_address(ip))
					obs.records_not_text++;
				if (in_workload(ip))
					obs.records_in_workload++;
				else if (obs.n_outside_rec < MAX_OUTSIDE_SHOWN)
					obs.outside_rec[obs.n_outside_rec++] = ip;
			}
		}
	}
	obs.in_drain++;
	orig_drain(iregs, data);
	obs.in_drain--;
}

static void vpmu_overflow(struct perf_event *event, struct perf_sample_data *data,
			  struct pt_regs *regs)
{
	unsigned long ip = instruction_pointer(regs);

	obs.samples++;
	if (!kernel_text_address(ip))
		obs.samples_not_text++;
	if (obs.in_drain)
		obs.samples_in_drain++;
	if (data->period != period)
		obs.samples_bad_period++;
	/* __perf_event_account_interrupt() sets this when this sample throttled the event. */
	if (event->hw.interrupts == ~0ULL)
		obs.throttled++;
	if (ip_in(&ranges[0], ip))
		obs.samples_hot_a++;
	else if (ip_in(&ranges[1], ip))
		obs.samples_hot_b++;
	if (in_workload(ip))
		obs.samples_in_workload++;
	else if (obs.n_outside < MAX_OUTSIDE_SHOWN)
		obs.outside[obs.n_outside++] = ip;
}

/* ---- one mode ---- */

static struct perf_event *create(struct perf_event_attr *attr, perf_overflow_handler_t fn,
				 const char *mode, const char *what)
{
	struct perf_event *ev = perf_event_create_kernel_counter(attr, smp_processor_id(), NULL,
								  fn, NULL);

	if (IS_ERR(ev)) {
		check(false, "%s_create_%s: perf_event_create_kernel_counter: error %ld", mode, what,
		      PTR_ERR(ev));
		return NULL;
	}
	check(true, "%s_create_%s", mode, what);
	return ev;
}

/* RDPMC (emulated by the VMM) must land between two RDMSRs of the same running counter. */
static void check_rdpmc(const char *mode, struct perf_event *ref)
{
	struct hw_perf_event *hwc = &ref->hw;
	u64 mask = x86_pmu.cntval_mask, m1, p, m2;
	unsigned long flags;

	local_irq_save(flags);
	if (hwc->idx < 0 || !hwc->event_base) {
		local_irq_restore(flags);
		check(false, "%s_rdpmc: reference event not on a counter", mode);
		return;
	}
	rdmsrl(hwc->event_base, m1);
	p = native_read_pmc(hwc->event_base_rdpmc);
	rdmsrl(hwc->event_base, m2);
	local_irq_restore(flags);
	m1 &= mask;
	p &= mask;
	m2 &= mask;
	check(m1 <= p && p <= m2, "%s_rdpmc: ecx=%#x rdmsr %llu <= rdpmc %llu <= rdmsr %llu",
	      mode, hwc->event_base_rdpmc, m1, p, m2);
}

static void run_mode(const char *mode, bool large, int precise)
{
	struct perf_event_attr attr = {
		.type = PERF_TYPE_HARDWARE,
		.config = PERF_COUNT_HW_CPU_CYCLES,
		.size = sizeof(attr),
		.pinned = 1,
		.disabled = 1,
		.exclude_user = 1,
	};
	struct perf_event *ev, *ref;
	u64 count, ref_count, enabled, running, lo, hi, want_flags;
	u64 tsc_ticks = (u64)tsc_khz * duration_ms;
	unsigned long n, i;
	bool pebs_counter;
	int idx;

	memset(&obs, 0, sizeof(obs));
	ref = create(&attr, NULL, mode, "reference");
	if (!ref)
		return;

	attr.precise_ip = precise;
	attr.sample_period = period;
	attr.sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID;
	if (!large)
		attr.wakeup_events = 1;
	ev = create(&attr, vpmu_overflow, mode, precise > 1 ? "cycles:pp" : "cycles:p");
	if (!ev) {
		perf_event_release_kernel(ref);
		return;
	}

	/* pebs_active is set once the first PEBS event reserved the DS buffers. */
	check(x86_pmu_max_precise() >= precise, "%s_max_precise: %d, want >= %d", mode,
	      x86_pmu_max_precise(), precise);

	want_flags = large ? PERF_X86_EVENT_AUTO_RELOAD | PERF_X86_EVENT_LARGE_PEBS : 0;
	check((ev->hw.flags & (PERF_X86_EVENT_AUTO_RELOAD | PERF_X86_EVENT_LARGE_PEBS)) == want_flags,
	      "%s_flags: hw.flags %#x, want auto-reload and large PEBS %s", mode, ev->hw.flags,
	      large ? "set" : "clear");

	if (!tsc_ticks) {
		pr_info("vpmu_selftest: tsc_khz unknown, assuming 1 GHz\n");
		tsc_ticks = 1000000ULL * duration_ms;
	}

	perf_event_enable(ref);
	perf_event_enable(ev);
	idx = ev->hw.idx;
	pebs_counter = idx >= 0 && (this_cpu_ptr(&cpu_hw_events)->pebs_enabled & BIT_ULL(idx));
	check_rdpmc(mode, ref);
	/*
	 * The workload runs with interrupts off and the counters stop (GLOBAL_CTRL = 0, by
	 * perf_pmu_disable) before they come back on: otherwise the timer tick and the console
	 * output of deferred printks, slow under CPL0 emulation and charged to the host task
	 * clock with their VM exits, take half the samples. PMIs are NMIs and still arrive.
	 * With no tick, no unthrottling happens either: any throttle shows.
	 */
	local_irq_disable();
	vpmu_workload(tsc_ticks);
	perf_pmu_disable(ev->pmu);
	local_irq_enable();
	perf_event_disable(ev);
	perf_event_disable(ref);
	perf_pmu_enable(ev->pmu);

	check(pebs_counter, "%s_pebs_counter: event %#llx on counter %d, PEBS_ENABLE bit %s", mode,
	      ev->hw.config, idx, pebs_counter ? "set" : "clear");

	count = perf_event_read_value(ev, &enabled, &running);
	ref_count = perf_event_read_value(ref, &enabled, &running);
	pr_info("vpmu_selftest: %s: count %llu, reference %llu, records %lu, samples %lu (hot_a %lu, hot_b %lu), drains %u in PMI + %u other\n",
		mode, count, ref_count, obs.records, obs.samples, obs.samples_hot_a,
		obs.samples_hot_b, obs.drains_pmi, obs.drains_other);

	check(obs.records_bad == 0, "%s_ds_index: pebs_index outside the buffer in %lu drains", mode,
	      obs.records_bad);
	n = large ? obs.records : obs.samples;
	check(n >= min_samples, "%s_samples: %lu %s, want >= %u", mode, n,
	      large ? "records" : "samples", min_samples);
	check(obs.samples == obs.samples_in_drain && (large || obs.drains_pmi > 0),
	      "%s_via_pebs_drain: %lu of %lu samples inside the PEBS drain, %u drains from a PMI",
	      mode, obs.samples_in_drain, obs.samples, obs.drains_pmi);
	if (!large)
		check(obs.records == obs.samples,
		      "%s_records_delivered: %lu records in the DS area, %lu reached the handler",
		      mode, obs.records, obs.samples);

	check(obs.records_not_text == 0 && obs.samples_not_text == 0,
	      "%s_ip_kernel_text: %lu record and %lu sample IPs outside kernel text", mode,
	      obs.records_not_text, obs.samples_not_text);
	if (large)
		check(obs.records && obs.records_in_workload * 100 >= obs.records * IP_IN_WORKLOAD_PERCENT,
		      "%s_ip_in_workload: %lu of %lu record IPs in the workload, want %d%%", mode,
		      obs.records_in_workload, obs.records, IP_IN_WORKLOAD_PERCENT);
	else
		check(obs.samples && obs.samples_in_workload * 100 >= obs.samples * IP_IN_WORKLOAD_PERCENT,
		      "%s_ip_in_workload: %lu of %lu sample IPs in the workload, want %d%%", mode,
		      obs.samples_in_workload, obs.samples, IP_IN_WORKLOAD_PERCENT);
	for (i = 0; i < obs.n_outside; i++)
		pr_info("vpmu_selftest: %s: sample outside the workload at %pS\n", mode,
			(void *)obs.outside[i]);
	for (i = 0; i < obs.n_outside_rec; i++)
		pr_info("vpmu_selftest: %s: record outside the workload at %pS\n", mode,
			(void *)obs.outside_rec[i]);
	if (!large)
		check(obs.samples_hot_a > obs.samples_hot_b && obs.samples_hot_b > 0,
		      "%s_hot_functions: hot_a %lu > hot_b %lu > 0 (3:1 time split)", mode,
		      obs.samples_hot_a, obs.samples_hot_b);

	check(obs.throttled == 0 && ev->hw.interrupts != ~0ULL,
	      "%s_not_throttled: %lu samples throttled the event", mode, obs.throttled);
	check(obs.samples_bad_period == 0, "%s_sample_period: %lu samples with a period other than %lu",
	      mode, obs.samples_bad_period, period);
	check(enabled == running, "%s_not_multiplexed: enabled %llu ns, running %llu ns", mode,
	      enabled, running);

	/*
	 * pmi: every period ended in a delivered sample and Linux re-armed the counter, so the
	 * count is the samples' periods plus the part of a period left at the end (one more
	 * period of slack for an overflow still pending when the event stopped).
	 * large: Linux counts records x period plus the auto-reloaded counter's distance from
	 * its reset value, so the records bound the count the same way.
	 */
	lo = (u64)n * period;
	hi = ((u64)n + 2) * period;
	check(count >= lo && count < hi, "%s_count_vs_period: count %llu, %lu x %lu = %llu, want [%llu, %llu)",
	      mode, count, n, period, lo, lo, hi);
	/* A dropped record or a wrong reload shows as a precise count apart from the reference. */
	check(ref_count > 0 && abs_diff(count, ref_count) <=
		ref_count * REF_TOLERANCE_PERCENT / 100 + 2 * period,
	      "%s_count_vs_reference: count %llu, reference %llu, want within %d%% + 2 periods",
	      mode, count, ref_count, REF_TOLERANCE_PERCENT);

	perf_event_release_kernel(ev);
	perf_event_release_kernel(ref);
}

/*
 * Writes kernel.perf_cpu_time_max_percent through its sysctl handler, as `sysctl -w` would;
 * the command line's sysctl.* arguments are applied only after the initcalls.
 */
static int set_perf_cpu_time_max_percent(int percent)
{
	char buf[16];
	size_t len = scnprintf(buf, sizeof(buf), "%d", percent);
	loff_t pos = 0;
	struct ctl_table table = {
		.procname = "perf_cpu_time_max_percent",
		.data = &sysctl_perf_cpu_time_max_percent,
		.maxlen = sizeof(int),
		.mode = 0644,
		.extra1 = SYSCTL_ZERO,
		.extra2 = SYSCTL_ONE_HUNDRED,
	};

	return perf_cpu_time_max_percent_handler(&table, 1, buf, &len, &pos);
}

static int __init vpmu_selftest(void)
{
	int precise, old_percent = sysctl_perf_cpu_time_max_percent;

	if (fmt < 0) {
		pr_info("vpmu_selftest: not requested (no vpmu_selftest.fmt= on the command line)\n");
		return 0;
	}
	pr_info("vpmu_selftest: expecting PEBS fmt%d, period %lu, %u ms per mode\n", fmt, period,
		duration_ms);

	check(x86_pmu.pebs && boot_cpu_has(X86_FEATURE_PEBS),
	      "pebs_present: x86_pmu.pebs %d, X86_FEATURE_PEBS %d", x86_pmu.pebs,
	      boot_cpu_has(X86_FEATURE_PEBS));
	check(x86_pmu.intel_cap.pebs_format == fmt, "pebs_format: driver found fmt%d, want fmt%d",
	      x86_pmu.intel_cap.pebs_format, fmt);
	precise = fmt >= 2 ? 2 : 1;

	if (!fn_range(vpmu_hot_a, &ranges[0]) || !fn_range(vpmu_hot_b, &ranges[1]) ||
	    !fn_range(vpmu_workload, &ranges[2])) {
		check(false, "workload_symbols: kallsyms does not know the workload functions");
	} else if (x86_pmu.pebs && x86_pmu.drain_pebs) {
		pr_info("vpmu_selftest: workload hot_a %ps..%#lx, hot_b %ps..%#lx\n",
			(void *)ranges[0].start, ranges[0].end, (void *)ranges[1].start,
			ranges[1].end);
		/*
		 * A PMI takes milliseconds under the development host's CPL0 emulation, so the
		 * dynamic limit would lower the sample rate until every sample throttles (the
		 * reference doc's A.7). The fixed limit, max_samples_per_tick, still applies.
		 */
		check(set_perf_cpu_time_max_percent(0) == 0,
		      "dynamic_throttling_off: kernel.perf_cpu_time_max_percent=0");
		orig_drain = x86_pmu.drain_pebs;
		static_call_update(x86_pmu_drain_pebs, vpmu_drain_wrapper);
		run_mode("pmi", false, precise);
		run_mode("large", true, precise);
		static_call_update(x86_pmu_drain_pebs, orig_drain);
		set_perf_cpu_time_max_percent(old_percent);
	}

	pr_info("%u passed, %u failed\n", passed, failed);
	if (exit_port)
		outl(failed ? 1 : 0, VPMU_EXIT_PORT);
	return 0;
}
late_initcall(vpmu_selftest);
