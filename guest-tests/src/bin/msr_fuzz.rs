//! Guest-side PMU MSR fuzzer: `vmm run --kernel msr_fuzz --cpu-model <preset>
//! --pmu-backend precise --cmdline "<preset> [seed=<hex>] [iters=<n>] [count=none]"`.
//!
//! Seeded pseudo-random RDMSR / WRMSR over every PMU MSR block of the preset (and absent
//! indices inside and just outside the blocks the VMM traps), with random, masked and edge
//! values. Every #GP / no-#GP outcome and every read-back (after each write too) is checked
//! against the guest's own model (`msr_fuzz/model.rs`). Every 16 iterations a counted region
//! runs with PMC0 (NetBurst: IQ_COUNTER4) on instructions retired and PEBS enabled into a
//! valid DS buffer; its count is checked exactly (`count=none`: with `--pmu-backend off`,
//! nothing counts) and the PEBS index must not move: the fuzzer never provokes an overflow
//! (writes that would let a counter that starts counting near its wrap are skipped and
//! counted), so GLOBAL_STATUS stays exact and no PMI may arrive.
//!
//! Output: the seed first; one `FAIL msr_fuzz: seed=<hex> iter=<i> msr=<idx> op=<rd|wr>
//! value=<v>: got <..> expected <..>` line per mismatch (the first 64 are printed); a summary;
//! then the usual `PASS` / `FAIL` and `N passed, M failed` lines.

#![no_std]
#![no_main]

#[path = "msr_fuzz/choose.rs"]
mod choose;
#[path = "msr_fuzz/model.rs"]
mod model;

use choose::{Candidates, Rng};
use core::fmt;
use guest_tests::fault::VEC_GP;
use guest_tests::msr_index::*;
use guest_tests::pebs::layout::{self, PebsPreset};
use guest_tests::pebs::{self as pebs_rt, BUF_PAGES};
use guest_tests::pmu::expect::{self, MISC_PMU_MASK, PRESETS, Preset};
use guest_tests::pmu::region::{self, REGION_INSNS};
use guest_tests::racy::Racy;
use guest_tests::test::TestResult;
use guest_tests::{EXIT_ABORT, entry, exit, fail, lapic, msr, pmi, println, tests};
use model::{Model, RdExpect, WrOutcome};

/// Default seed (any fixed value; printed so a failure can be replayed).
const DEFAULT_SEED: u64 = 0x5EED_F022;
/// Default iterations: well under 10 s at CPL0 instruction-emulation speed.
const DEFAULT_ITERS: u64 = 1000;
/// A counted region every this many iterations.
const INTERLUDE_EVERY: u64 = 16;
/// Percentage of 16-iteration windows that start with every counter stopped.
const QUIESCE_PCT: u64 = 90;
/// Mismatch lines printed (all are counted).
const MAX_PRINTED: u64 = 64;
/// NetBurst CRU_ESCR0: instr_retired (02H), NBOGUSNTAG, T0_OS (SDM table 19-36).
const NB_ESCR_INSTR_OS: u64 =
    0x02 << ESCR_EVENT_SELECT_SHIFT | 1 << ESCR_EVENT_MASK_SHIFT | ESCR_T0_OS;
/// IQ_CCCR4: enable, ESCR select 4 (CRU_ESCR0), active thread "any".
const NB_CCCR_CRU0: u64 = CCCR_ENABLE | 4 << CCCR_ESCR_SELECT_SHIFT | 3 << CCCR_ACTIVE_THREAD_SHIFT;

#[derive(Clone, Copy)]
struct Config {
    preset: &'static Preset,
    pebs: &'static PebsPreset,
    seed: u64,
    iters: u64,
    counts: bool,
}

static CONFIG: Racy<Option<Config>> = Racy::new(None);
static mut MODEL: Model = Model::new(&PRESETS[0], &layout::PRESETS[0]);

fn parse(cmdline: &str) -> Result<Config, &'static str> {
    let mut name = None;
    let (mut seed, mut iters, mut counts) = (DEFAULT_SEED, DEFAULT_ITERS, true);
    for tok in cmdline.split_ascii_whitespace() {
        if let Some(s) = tok.strip_prefix("seed=") {
            let s = s.trim_start_matches("0x");
            seed = u64::from_str_radix(s, 16).map_err(|_| "seed= wants hex")?;
        } else if let Some(s) = tok.strip_prefix("iters=") {
            iters = s.parse().map_err(|_| "iters= wants a decimal count")?;
        } else if let Some(s) = tok.strip_prefix("count=") {
            counts = match s {
                "exact" => true,
                "none" => false,
                _ => return Err("count= wants exact or none"),
            };
        } else {
            name = Some(tok);
        }
    }
    let name = name.ok_or("no preset named")?;
    let preset = expect::by_name(name).ok_or("unknown preset")?;
    let pebs = layout::preset(name).ok_or("unknown preset")?;
    Ok(Config {
        preset,
        pebs,
        seed,
        iters,
        counts,
    })
}

#[unsafe(no_mangle)]
extern "C" fn guest_main(cpu: u64, mem_size: u64) -> ! {
    entry::init(cpu, mem_size);
    let line = entry::cmdline().trim();
    match parse(line) {
        Ok(c) => {
            println!(
                "msr_fuzz: preset={} seed={:#x} iters={} count={}",
                c.preset.name,
                c.seed,
                c.iters,
                if c.counts { "exact" } else { "none" }
            );
            CONFIG.set(Some(c));
        }
        Err(e) => {
            println!("msr_fuzz: bad --cmdline {line:?}: {e}");
            exit::exit(EXIT_ABORT)
        }
    }
    guest_tests::test::run_all("msr_fuzz", tests![msr_fuzz])
}

/// What an access did.
#[derive(Clone, Copy)]
enum Got {
    Val(u64),
    Accepted,
    Fault(u8),
}

impl fmt::Display for Got {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Got::Val(v) => write!(f, "{v:#x}"),
            Got::Accepted => f.write_str("accepted"),
            Got::Fault(VEC_GP) => f.write_str("#GP"),
            Got::Fault(v) => write!(f, "exception #{v}"),
        }
    }
}

enum Want {
    Rd(RdExpect),
    Wr(WrOutcome),
    Text(&'static str),
}

impl fmt::Display for Want {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Want::Rd(RdExpect::Gp) | Want::Wr(WrOutcome::Gp) => f.write_str("#GP"),
            Want::Rd(RdExpect::Exact(v)) => write!(f, "{v:#x}"),
            Want::Rd(RdExpect::Range(lo, s)) => {
                write!(f, "{lo:#x}..={:#x}", lo.saturating_add(*s))
            }
            Want::Rd(RdExpect::Any) => f.write_str("any value within the mask"),
            Want::Wr(WrOutcome::Ok) => f.write_str("accepted"),
            Want::Wr(WrOutcome::Either) => f.write_str("accepted or #GP, value unchanged"),
            Want::Text(t) => f.write_str(t),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Rd,
    Wr,
}

struct Fuzz<'a> {
    m: &'a mut Model,
    rng: Rng,
    seed: u64,
    iter: u64,
    reads: u64,
    writes: u64,
    gps: u64,
    skipped: u64,
    regions: u64,
    mismatches: u64,
}

impl Fuzz<'_> {
    fn mismatch(&mut self, msr: u32, op: Op, value: u64, got: Got, want: Want) {
        self.mismatches += 1;
        if self.mismatches <= MAX_PRINTED {
            println!(
                "FAIL msr_fuzz: seed={:#x} iter={} msr={:#x} op={} value={:#x}: got {} expected {}",
                self.seed,
                self.iter,
                msr,
                if op == Op::Rd { "rd" } else { "wr" },
                value,
                got,
                want
            );
        }
    }

    /// RDMSR and check it; `op`/`value` name the operation being checked (a write's
    /// read-back reports op=wr).
    fn read(&mut self, msr: u32, op: Op, value: u64) {
        let r = msr::rdmsr_safe(msr);
        self.reads += 1;
        let want = self.m.expect_read(msr);
        match r {
            Err(v) => {
                self.gps += 1;
                if !(v == VEC_GP && want == RdExpect::Gp) {
                    self.mismatch(msr, op, value, Got::Fault(v), Want::Rd(want));
                }
            }
            Ok(got) => {
                if let Err(want) = self.m.accept_read(msr, got) {
                    self.mismatch(msr, op, value, Got::Val(got), Want::Rd(want));
                    self.m.resync(msr, got);
                }
            }
        }
        self.m.tick();
    }

    /// WRMSR unless it would provoke an overflow or BTS stores; check the outcome and the
    /// read-back. Returns whether the write was performed and accepted.
    fn write(&mut self, msr: u32, v: u64) -> bool {
        let before = self.m.counting_set();
        let (want, undo) = self.m.apply_write(msr, v);
        if want != WrOutcome::Gp && self.m.write_is_risky(before, &undo) {
            self.m.undo(undo);
            self.skipped += 1;
            return false;
        }
        // SAFETY: only PMU MSRs (MISC_ENABLE with its PMU bits flipped) and indices that name
        // no MSR are written; none of them affects the runtime (paging, APIC, GDT/IDT).
        let r = unsafe { msr::wrmsr_safe(msr, v) };
        self.writes += 1;
        self.m.tick();
        let accepted = match (want, r) {
            (WrOutcome::Ok, Ok(())) | (WrOutcome::Either, Ok(())) => true,
            (WrOutcome::Gp, Err(VEC_GP)) | (WrOutcome::Either, Err(VEC_GP)) => {
                self.gps += 1;
                false
            }
            (_, r) => {
                let got = match r {
                    Ok(()) => Got::Accepted,
                    Err(e) => Got::Fault(e),
                };
                self.mismatch(msr, Op::Wr, v, got, Want::Wr(want));
                if r.is_err() {
                    // The VMM refused: the model must not keep the write.
                    self.m.undo(undo);
                }
                r.is_ok()
            }
        };
        self.read(msr, Op::Wr, v);
        accepted && want == WrOutcome::Ok
    }

    /// One random operation.
    fn step(&mut self, c: &Candidates) {
        let msr = c.pick(&mut self.rng);
        if self.rng.chance(35) {
            self.read(msr, Op::Rd, 0);
        } else {
            let cur = match self.m.expect_read(msr) {
                RdExpect::Exact(v) | RdExpect::Range(v, _) => v,
                RdExpect::Gp | RdExpect::Any => 0,
            };
            let v = choose::value(self.m, msr, cur, &mut self.rng);
            self.write(msr, v);
        }
    }

    /// Stop every counter through checked writes: EN cleared in each selector, the fixed
    /// counters' enable fields cleared, NetBurst CCCR enables cleared, DEBUGCTL.LBR cleared.
    fn quiesce(&mut self, p: &Preset) {
        // LBR recording also makes the precise backend step.
        let d = self.m.reg(IA32_DEBUGCTL);
        if d & DEBUGCTL_LBR != 0 {
            self.write(IA32_DEBUGCTL, d & !DEBUGCTL_LBR);
        }
        if p.netburst {
            for k in 0..NETBURST_NUM_COUNTERS {
                let c = MSR_BPU_CCCR0 + k;
                let v = self.m.reg(c);
                if v & CCCR_ENABLE != 0 {
                    self.write(c, v & !CCCR_ENABLE);
                }
            }
            return;
        }
        for n in 0..p.num_gp() {
            let e = IA32_PERFEVTSEL0 + n;
            let v = self.m.reg(e);
            if v & EVTSEL_EN != 0 {
                self.write(e, v & !EVTSEL_EN);
            }
        }
        let fc = self.m.reg(IA32_FIXED_CTR_CTRL);
        if p.version() >= 2 && fc & 0x3333 != 0 {
            self.write(IA32_FIXED_CTR_CTRL, fc & !0x3333);
        }
    }

    /// Program the live counter with PEBS into the DS buffer, run the counted region, check
    /// the exact count and that no PEBS record was written.
    fn region(&mut self, p: &Preset, pb: &PebsPreset, counts: bool) {
        let ds = pebs_rt::ds_page();
        let base = pebs_rt::buf_page(0);
        let start = self.rng.next() & 0xF_FFFF;
        let (en_msr, en_val, dis_msr, ctr) = if p.netburst {
            let ok = self.write(MSR_IQ_CCCR4, 0)
                && self.write(MSR_CRU_ESCR0, NB_ESCR_INSTR_OS)
                && self.write(MSR_IQ_COUNTER4, start)
                && self.write(IA32_DS_AREA, ds)
                && self.write(
                    IA32_PEBS_ENABLE,
                    self.m.reg(IA32_PEBS_ENABLE) | NETBURST_PEBS_ENABLE_BIT,
                );
            if !ok {
                return;
            }
            (MSR_IQ_CCCR4, NB_CCCR_CRU0, MSR_CRU_ESCR0, MSR_IQ_COUNTER4)
        } else {
            let mut ok = self.write(IA32_PERFEVTSEL0, 0)
                && self.write(IA32_PMC0, start)
                && self.write(IA32_DS_AREA, ds)
                && self.write(IA32_PEBS_ENABLE, self.m.reg(IA32_PEBS_ENABLE) | 1);
            if ok && p.version() >= 2 {
                ok = self.write(IA32_PERF_GLOBAL_CTRL, self.m.reg(IA32_PERF_GLOBAL_CTRL) | 1);
            }
            if ok && p.version() >= 4 && self.m.status() & GLOBAL_STATUS_CTR_FRZ != 0 {
                ok = self.write(IA32_PERF_GLOBAL_OVF_CTRL, GLOBAL_STATUS_CTR_FRZ);
            }
            if !ok {
                return;
            }
            let ev = expect::event::INSTRUCTIONS | EVTSEL_OS | EVTSEL_EN;
            (IA32_PERFEVTSEL0, ev, IA32_PERFEVTSEL0, IA32_PMC0)
        };
        let _ = pb;
        // SAFETY: PMU MSRs only; the model is updated with the region's two writes below.
        unsafe { region::run(en_msr, en_val, dis_msr) };
        self.regions += 1;
        if p.netburst {
            self.m.set_reg(en_msr, en_val);
            self.m.set_reg(dis_msr, 0);
        } else {
            self.m.set_reg(dis_msr, 0);
        }
        self.m.tick();
        let expected = start + if counts { REGION_INSNS } else { 0 };
        self.m.set_counter_exact(ctr, expected);
        self.read(ctr, Op::Rd, 0);
        let index = pebs_rt::ds_index(ds);
        if index != base {
            self.mismatch(
                IA32_DS_AREA,
                Op::Rd,
                ds,
                Got::Val(index),
                Want::Text("PEBS index unchanged (no overflow was provoked)"),
            );
            pebs_rt::wr64(ds + pebs_rt::ds::PEBS_INDEX, base);
        }
    }
}

fn msr_fuzz() -> TestResult {
    let Some(cfg) = CONFIG.get() else {
        fail!("no configuration")
    };
    let p = cfg.preset;
    let ptr = &raw mut MODEL;
    // SAFETY: the only reference to MODEL, taken once; the guest runs on one vCPU and the PMI
    // handler does not touch it.
    let m = unsafe { &mut *ptr };
    let misc = msr::rdmsr(IA32_MISC_ENABLE);
    if misc & MISC_PMU_MASK != p.misc_pmu_bits {
        fail!("MISC_ENABLE {misc:#x}: PMU bits differ from the preset");
    }
    m.reset(p, cfg.pebs, cfg.counts, misc);
    let cands = Candidates::new(m);
    let (np, na) = cands.sizes();
    println!("msr_fuzz: {np} present and {na} absent candidate MSRs");
    let base = pebs_rt::buf_page(0);
    let max = base + 4096 * BUF_PAGES as u64;
    pebs_rt::ds_setup(pebs_rt::ds_page(), base, base, max, max);
    lapic::set_lvtpc(pmi::lvtpc_fixed());
    let pmis = pmi::pmi_count();
    let mut f = Fuzz {
        m,
        rng: Rng::new(cfg.seed),
        seed: cfg.seed,
        iter: 0,
        reads: 0,
        writes: 0,
        gps: 0,
        skipped: 0,
        regions: 0,
        mismatches: 0,
    };
    // Reset values (SDM vol. 4 table 2-2: 0, GLOBAL_CTRL = the GP enables).
    for i in choose::all_candidates(&cands) {
        f.read(i, Op::Rd, 0);
    }
    let counts = cfg.counts;
    for it in 0..cfg.iters {
        f.iter = it;
        if it % INTERLUDE_EVERY == 0 {
            f.region(p, cfg.pebs, counts);
            // The precise backend single-steps while anything counts (~20k steps/s): most
            // windows start with every counter stopped so the default run stays short.
            if f.rng.chance(QUIESCE_PCT) {
                f.quiesce(p);
            }
        }
        f.step(&cands);
    }
    let extra = pmi::pmi_count() - pmis;
    if extra != 0 {
        f.mismatch(
            IA32_PERF_GLOBAL_STATUS,
            Op::Rd,
            0,
            Got::Val(extra),
            Want::Text("no PMI (no overflow was provoked)"),
        );
    }
    println!(
        "msr_fuzz: seed={:#x} iters={}: {} reads, {} writes, {} #GP, {} writes skipped (overflow risk), {} counted regions, {} mismatches",
        cfg.seed, cfg.iters, f.reads, f.writes, f.gps, f.skipped, f.regions, f.mismatches
    );
    if f.mismatches != 0 {
        fail!(
            "{} mismatches; replay with seed={:#x} iters={}",
            f.mismatches,
            cfg.seed,
            cfg.iters
        );
    }
    Ok(())
}
