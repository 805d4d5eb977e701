//! Branch records end to end: the LBR stack, MSR_LBR_SELECT, freeze on PMI, BTS and the
//! adaptive PEBS LBR group, on each preset with LBRs.
//!
//! Run with `--pmu-backend precise --cpu-model P --cmdline P`; with `--pmu-backend off
//! --cpu-model P --cmdline "P off"` only the MSR rules and "entries stay empty" are checked.
//!
//! Every branch comes from two asm regions whose addresses are global labels, so each expected
//! FROM/TO is exact: `br_seq` (9 taken branches of six kinds) and `br_chain` (40 `jmp +0`).
//! Both start with a WRMSR (ECX, EDX:EAX) that enables recording and end with a WRMSR of
//! ESI into the same MSR, so no compiler-generated branch is ever recorded. All of it runs at
//! CPL0 and is short: the precise backend single-steps while LBR or BTS is on.

#![no_std]
#![no_main]

use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicU64, Ordering};

use guest_tests::idt::TrapFrame;
use guest_tests::msr_index::*;
use guest_tests::pebs::{self as pb, layout};
use guest_tests::test::TestResult;
use guest_tests::{cpu, ensure, ensure_eq, entry, fail, lapic, msr, pmi, println};

global_asm!(
    ".pushsection .text.br_regions, \"ax\"",
    // br_seq: ECX = MSR, EDX:EAX = enable value, ESI = final value. Clobbers R8, R9.
    ".global br_seq",
    "br_seq:",
    "wrmsr",
    ".global br_b1",
    "br_b1: jmp br_t1", // 1: JMP rel
    "ud2",
    ".global br_t1",
    "br_t1:",
    ".global br_b2",
    "br_b2: call br_f1", // 2: CALL rel
    ".global br_t3",
    "br_t3:",
    ".global br_b4",
    "br_b4: jmp br_t4", // 4: JMP rel
    ".global br_f1",
    "br_f1:",
    ".global br_b3",
    "br_b3: ret", // 3: RET
    ".global br_t4",
    "br_t4:",
    "mov r8d, 3",
    ".global br_t5",
    "br_t5:",
    "dec r8d",
    ".global br_b5",
    "br_b5: jnz br_t5", // 5, 6: Jcc taken twice, then falls through
    "lea r9, [rip + br_t7]",
    ".global br_b7",
    "br_b7: jmp r9", // 7: JMP r/m
    "ud2",
    ".global br_t7",
    "br_t7:",
    "lea r9, [rip + br_f2]",
    ".global br_b8",
    "br_b8: call r9", // 8: CALL r/m
    ".global br_t9",
    "br_t9:",
    "mov eax, esi",
    "xor edx, edx",
    "wrmsr",
    "ret",
    ".global br_f2",
    "br_f2:",
    ".global br_b9",
    "br_b9: ret", // 9: RET
    // br_chain: same convention; 40 `jmp +0` (EB 00, 2 bytes each, always taken).
    ".global br_chain",
    "br_chain:",
    "wrmsr",
    ".global br_chain_start",
    "br_chain_start:",
    ".rept 40",
    ".byte 0xeb, 0x00",
    ".endr",
    ".global br_chain_end",
    "br_chain_end:",
    "mov eax, esi",
    "xor edx, edx",
    "wrmsr",
    "ret",
    ".popsection",
);

unsafe extern "C" {
    fn br_seq();
    fn br_chain();
    static br_b1: u8;
    static br_t1: u8;
    static br_b2: u8;
    static br_f1: u8;
    static br_b3: u8;
    static br_t3: u8;
    static br_b4: u8;
    static br_t4: u8;
    static br_b5: u8;
    static br_t5: u8;
    static br_b7: u8;
    static br_t7: u8;
    static br_b8: u8;
    static br_f2: u8;
    static br_b9: u8;
    static br_t9: u8;
    static br_chain_start: u8;
    static br_chain_end: u8;
}

/// Taken branches in `br_chain`.
const CHAIN: usize = 40;

/// The 9 taken branches of `br_seq`, oldest first: (from, to).
fn seq() -> [(u64, u64); 9] {
    let a = |p: *const u8| p as u64;
    [
        (a(&raw const br_b1), a(&raw const br_t1)),
        (a(&raw const br_b2), a(&raw const br_f1)),
        (a(&raw const br_b3), a(&raw const br_t3)),
        (a(&raw const br_b4), a(&raw const br_t4)),
        (a(&raw const br_b5), a(&raw const br_t5)),
        (a(&raw const br_b5), a(&raw const br_t5)),
        (a(&raw const br_b7), a(&raw const br_t7)),
        (a(&raw const br_b8), a(&raw const br_f2)),
        (a(&raw const br_b9), a(&raw const br_t9)),
    ]
}

/// Branch k (0-based) of `br_chain`.
fn chain(k: usize) -> (u64, u64) {
    let s = (&raw const br_chain_start) as u64 + 2 * k as u64;
    (s, s + 2)
}

/// One preset's branch-record facts, written from the SDM (17.4.8.1 formats, Table 17-4 LBR
/// stack sizes, 17.7-17.12 MSR locations) and resources/cpu-models/*.toml.
struct Preset {
    name: &'static str,
    /// Architectural PMU version (freeze-on-PMI: v2/v3 clear DEBUGCTL.LBR, v4+ set LBR_Frz).
    version: u32,
    /// IA32_PERF_CAPABILITIES[5:0].
    lbr_format: u64,
    /// Entries in the stack.
    depth: usize,
    /// Core 2 MSR locations (0x40 / 0x60) instead of 0x680 / 0x6C0.
    core2: bool,
    /// MSR_LBR_INFO_x (format 5).
    info: bool,
    /// Adaptive PEBS (LBR group).
    adaptive: bool,
}

const PRESETS: &[Preset] = &[
    Preset {
        name: "core2",
        version: 2,
        lbr_format: 1,
        depth: 4,
        core2: true,
        info: false,
        adaptive: false,
    },
    Preset {
        name: "nehalem",
        version: 3,
        lbr_format: 3,
        depth: 16,
        core2: false,
        info: false,
        adaptive: false,
    },
    Preset {
        name: "haswell",
        version: 3,
        lbr_format: 4,
        depth: 16,
        core2: false,
        info: false,
        adaptive: false,
    },
    Preset {
        name: "skylake",
        version: 4,
        lbr_format: 5,
        depth: 32,
        core2: false,
        info: true,
        adaptive: false,
    },
    Preset {
        name: "icelake-server",
        version: 5,
        lbr_format: 5,
        depth: 32,
        core2: false,
        info: true,
        adaptive: true,
    },
    Preset {
        name: "sapphire-rapids",
        version: 5,
        lbr_format: 5,
        depth: 32,
        core2: false,
        info: true,
        adaptive: true,
    },
];

static PRESET: AtomicU64 = AtomicU64::new(0);

fn p() -> &'static Preset {
    let i = usize::try_from(PRESET.load(Ordering::SeqCst)).unwrap_or(0);
    &PRESETS[i.min(PRESETS.len() - 1)]
}

impl Preset {
    fn lbr_from_msr(&self, n: usize) -> u32 {
        let base = if self.core2 {
            CORE2_LASTBRANCH_0_FROM_IP
        } else {
            MSR_LASTBRANCH_0_FROM_IP
        };
        base + u32::try_from(n).unwrap_or(0)
    }
    fn lbr_to_msr(&self, n: usize) -> u32 {
        let base = if self.core2 {
            CORE2_LASTBRANCH_0_TO_IP
        } else {
            MSR_LASTBRANCH_0_TO_IP
        };
        base + u32::try_from(n).unwrap_or(0)
    }
    fn info_msr(&self, n: usize) -> u32 {
        MSR_LBR_INFO_0 + u32::try_from(n).unwrap_or(0)
    }
    /// LBR_SELECT exists (Nehalem and later).
    fn select(&self) -> bool {
        !self.core2
    }
}

#[unsafe(no_mangle)]
extern "C" fn guest_main(cpu: u64, mem_size: u64) -> ! {
    entry::init(cpu, mem_size);
    let line = entry::cmdline();
    let mut words = line.split_whitespace();
    let name = words.next().unwrap_or("");
    let off = words.any(|w| w == "off");
    let Some(i) = PRESETS.iter().position(|q| q.name == name) else {
        println!("FAIL preset: unknown preset {name:?} in --cmdline");
        println!("0 passed, 1 failed");
        guest_tests::exit::exit(1)
    };
    PRESET.store(i as u64, Ordering::SeqCst);
    lapic::set_lvtpc(pmi::lvtpc_nmi() | lapic::LVT_MASKED);
    if off {
        guest_tests::test::run_all(
            "branches-off",
            guest_tests::tests![lbr_msr_rules, lbr_entries_stay_empty, bts_stays_empty],
        )
    }
    guest_tests::test::run_all(
        "branches",
        guest_tests::tests![
            lbr_msr_rules,
            lbr_exact_sequence,
            lbr_tos_wraps,
            lbr_chain_longer_than_depth,
            lbr_select_jcc,
            lbr_select_cpl0,
            lbr_select_calls_returns,
            lbr_select_jumps,
            lbr_call_stack_mode,
            lbr_freeze_on_pmi,
            bts_sequence_in_order,
            bts_off_os_stores_nothing,
            bts_threshold_pmi,
            bts_circular_wrap,
            bts_full_with_btint_stops,
            pebs_lbr_group,
        ],
    )
}

// ---- helpers ----

fn wr(m: u32, v: u64) {
    // SAFETY: only PMU / LBR / DS MSRs are written by this guest.
    unsafe { msr::wrmsr(m, v) }
}

/// Zero every FROM/TO(/INFO) entry and TOS (DEBUGCTL.LBR is clear, so nothing records).
fn clear_stack() {
    let p = p();
    wr(IA32_DEBUGCTL, 0);
    for n in 0..p.depth {
        wr(p.lbr_from_msr(n), 0);
        wr(p.lbr_to_msr(n), 0);
        if p.info {
            wr(p.info_msr(n), 0);
        }
    }
    wr(MSR_LASTBRANCH_TOS, 0);
    if p.select() {
        wr(MSR_LBR_SELECT, 0);
    }
}

/// Run `br_seq` with WRMSR(`m`, `on`) first and WRMSR(`m`, `off`) last (both below 2^32).
fn run_seq(m: u32, on: u64, off: u64) {
    let (on, off) = (lo32(on), lo32(off));
    // SAFETY: br_seq writes `m` twice and clobbers the registers listed; it uses 8 bytes of
    // stack for its calls.
    unsafe {
        asm!("call {f}", f = sym br_seq, inout("ecx") m => _, inout("eax") on => _,
             inout("edx") 0u32 => _, in("esi") off, out("r8") _, out("r9") _)
    }
}

/// As [`run_seq`] for `br_chain`.
fn run_chain(m: u32, on: u64, off: u64) {
    let (on, off) = (lo32(on), lo32(off));
    // SAFETY: as in `run_seq`.
    unsafe {
        asm!("call {f}", f = sym br_chain, inout("ecx") m => _, inout("eax") on => _,
             inout("edx") 0u32 => _, in("esi") off, out("r8") _, out("r9") _)
    }
}

/// Enable PMC0 with `evtsel` (WRMSR, counted), then `br_seq` with DEBUGCTL = `dbg` first and
/// 0 last. The CALL into br_seq is the first branch PMC0 can count.
fn run_seq_counted(evtsel: u64, dbg: u64) {
    let (lo, hi) = (lo32(evtsel), lo32(evtsel >> 32));
    // SAFETY: PMU MSRs only, as in `run_seq`.
    unsafe {
        asm!(
            "wrmsr",
            "mov ecx, {dbgmsr:e}",
            "mov eax, {dbg:e}",
            "xor edx, edx",
            "call {f}",
            f = sym br_seq,
            dbgmsr = in(reg) IA32_DEBUGCTL,
            dbg = in(reg) lo32(dbg),
            inout("ecx") IA32_PERFEVTSEL0 => _, inout("eax") lo => _, inout("edx") hi => _,
            in("esi") 0u32, out("r8") _, out("r9") _,
        )
    }
}

fn lo32(v: u64) -> u32 {
    u32::try_from(v & 0xFFFF_FFFF).unwrap_or(0)
}

struct Stack {
    tos: usize,
    /// Newest first: (from, to, info).
    e: [(u64, u64, u64); 32],
}

fn read_stack() -> Stack {
    let p = p();
    let tos = usize::try_from(msr::rdmsr(MSR_LASTBRANCH_TOS)).unwrap_or(usize::MAX);
    let mut e = [(0, 0, 0); 32];
    for (k, slot) in e.iter_mut().enumerate().take(p.depth) {
        let i = (tos % p.depth + p.depth - k) % p.depth;
        let info = if p.info { msr::rdmsr(p.info_msr(i)) } else { 0 };
        *slot = (
            msr::rdmsr(p.lbr_from_msr(i)),
            msr::rdmsr(p.lbr_to_msr(i)),
            info,
        );
    }
    Stack { tos, e }
}

/// The stack holds exactly `branches` (oldest first) pushed from TOS `tos0` onto a cleared
/// stack: TOS advanced modulo the depth, entries newest first, untouched slots zero. With
/// LBR_INFO: mispredict / TSX bits clear, bits 60:16 clear, elapsed cycles non-zero.
fn check_stack(tos0: usize, branches: &[(u64, u64)]) -> TestResult {
    let p = p();
    let s = read_stack();
    let n = branches.len();
    ensure_eq!(s.tos, (tos0 + n) % p.depth, "TOS");
    for k in 0..p.depth {
        let (f, t, info) = s.e[k];
        let want = if k < n { branches[n - 1 - k] } else { (0, 0) };
        if (f, t) != want {
            fail!(
                "entry {k} (newest first): got {f:#x}->{t:#x}, expected {:#x}->{:#x}",
                want.0,
                want.1
            );
        }
        if p.info {
            if k < n {
                let cycles = info & LBR_CYCLES_MASK;
                ensure!(
                    info & !LBR_CYCLES_MASK == 0 && cycles != 0,
                    "entry {k}: LBR_INFO {info:#x} (want flags clear, cycles > 0)"
                );
            } else {
                ensure_eq!(info, 0, "untouched LBR_INFO");
            }
        }
    }
    Ok(())
}

fn seq_except(skip: &[usize]) -> ([(u64, u64); 9], usize) {
    let all = seq();
    let mut out = [(0, 0); 9];
    let mut n = 0;
    for (i, b) in all.iter().enumerate() {
        if !skip.contains(&(i + 1)) {
            out[n] = *b;
            n += 1;
        }
    }
    (out, n)
}

// ---- LBR MSRs ----

fn expect_gp_read(m: u32) -> TestResult {
    ensure_eq!(msr::rdmsr_safe(m).err(), Some(13), "RDMSR #GP");
    Ok(())
}

fn expect_gp_write(m: u32, v: u64) -> TestResult {
    // SAFETY: the write is expected to fault; if it does not, it only touches an LBR MSR.
    let r = unsafe { msr::wrmsr_safe(m, v) };
    if r != Err(13) {
        fail!("WRMSR {m:#x} <- {v:#x}: got {r:?}, expected #GP");
    }
    Ok(())
}

fn expect_rw(m: u32, v: u64) -> TestResult {
    // SAFETY: LBR MSRs only.
    let r = unsafe { msr::wrmsr_safe(m, v) };
    if r.is_err() {
        fail!("WRMSR {m:#x} <- {v:#x} faulted: {r:?}");
    }
    let got = msr::rdmsr_safe(m);
    if got != Ok(v) {
        fail!("MSR {m:#x}: wrote {v:#x}, read {got:x?}");
    }
    Ok(())
}

/// Read-back and #GP rules of the LBR MSRs (SDM 17.4.8, 17.7.1, 17.12: locations per family;
/// MSR_LBR_SELECT from Nehalem, EN_CALLSTACK from LBR format 4; LBR_INFO with format 5).
fn lbr_msr_rules() -> TestResult {
    let p = p();
    clear_stack();
    if let Ok(cap) = msr::rdmsr_safe(IA32_PERF_CAPABILITIES) {
        ensure_eq!(cap & PERF_CAP_LBR_FMT_MASK, p.lbr_format, "LBR format");
    } else if p.lbr_format != 0 {
        fail!(
            "IA32_PERF_CAPABILITIES #GP but the preset has LBR format {}",
            p.lbr_format
        );
    }
    ensure_eq!(msr::rdmsr(MSR_LASTBRANCH_TOS), 0, "TOS after clear");
    for tos in [1, p.depth - 1] {
        expect_rw(MSR_LASTBRANCH_TOS, tos as u64)?;
    }
    expect_gp_write(MSR_LASTBRANCH_TOS, p.depth as u64)?;
    for n in [0, 1, p.depth - 1] {
        let v = 0x1000_0000 + 0x111 * n as u64;
        expect_rw(p.lbr_from_msr(n), v)?;
        expect_rw(p.lbr_to_msr(n), v + 0x40)?;
        if p.info {
            expect_rw(p.info_msr(n), 0x1234 + n as u64)?;
        }
    }
    if p.info {
        expect_gp_read(MSR_LBR_INFO_0 + 32)?;
    } else {
        expect_gp_read(MSR_LBR_INFO_0)?;
    }
    if p.core2 {
        // Nehalem locations and MSR_LBR_SELECT do not exist on Core 2.
        expect_gp_read(MSR_LASTBRANCH_0_FROM_IP)?;
        expect_gp_read(MSR_LASTBRANCH_0_TO_IP)?;
        expect_gp_read(MSR_LBR_SELECT)?;
        expect_gp_write(MSR_LBR_SELECT, 0)?;
    } else {
        // Nor do the Core 2 locations elsewhere.
        expect_gp_read(CORE2_LASTBRANCH_0_FROM_IP)?;
        expect_gp_read(CORE2_LASTBRANCH_0_TO_IP)?;
        expect_rw(MSR_LBR_SELECT, LBR_SELECT_FILTER_MASK)?;
        if p.lbr_format >= 4 {
            expect_rw(MSR_LBR_SELECT, LBR_SELECT_EN_CALLSTACK | LBR_SELECT_JCC)?;
        } else {
            expect_gp_write(MSR_LBR_SELECT, LBR_SELECT_EN_CALLSTACK)?;
        }
        expect_gp_write(MSR_LBR_SELECT, 1 << 10)?;
        if p.depth == 16 {
            // 0x690 / 0x6D0: past a 16-deep stack (0x6A0 / 0x6E0 are other MSRs).
            expect_gp_read(p.lbr_from_msr(16))?;
            expect_gp_read(p.lbr_to_msr(16))?;
        }
    }
    // DEBUGCTL: LBR and FREEZE_LBRS_ON_PMI (v2+) read back; bits 2-5 are reserved.
    expect_rw(IA32_DEBUGCTL, DEBUGCTL_FREEZE_LBRS_ON_PMI)?;
    expect_gp_write(IA32_DEBUGCTL, 1 << 2)?;
    expect_rw(IA32_DEBUGCTL, 0)?;
    clear_stack();
    Ok(())
}

// ---- LBR recording ----

fn lbr_exact_sequence() -> TestResult {
    clear_stack();
    run_seq(IA32_DEBUGCTL, DEBUGCTL_LBR, 0);
    check_stack(0, &seq())?;
    // Disabled: a second run records nothing.
    clear_stack();
    run_seq(IA32_DEBUGCTL, 0, 0);
    check_stack(0, &[])
}

fn lbr_tos_wraps() -> TestResult {
    let p = p();
    let tos0 = p.depth - 3;
    clear_stack();
    wr(MSR_LASTBRANCH_TOS, tos0 as u64);
    run_seq(IA32_DEBUGCTL, DEBUGCTL_LBR, 0);
    check_stack(tos0, &seq())
}

fn lbr_chain_longer_than_depth() -> TestResult {
    let p = p();
    ensure_eq!(
        (&raw const br_chain_end) as u64 - (&raw const br_chain_start) as u64,
        2 * CHAIN as u64,
        "chain size"
    );
    clear_stack();
    run_chain(IA32_DEBUGCTL, DEBUGCTL_LBR, 0);
    let mut all = [(0, 0); CHAIN];
    for (k, b) in all.iter_mut().enumerate() {
        *b = chain(k);
    }
    // Only the newest `depth` survive; check_stack compares newest first.
    check_stack(CHAIN - p.depth, &all[CHAIN - p.depth..])
}

fn with_select(sel: u64, skip: &[usize]) -> TestResult {
    if !p().select() {
        return Ok(());
    }
    clear_stack();
    wr(MSR_LBR_SELECT, sel);
    run_seq(IA32_DEBUGCTL, DEBUGCTL_LBR, 0);
    wr(MSR_LBR_SELECT, 0);
    let (b, n) = seq_except(skip);
    check_stack(0, &b[..n])
}

/// MSR_LBR_SELECT: a set bit suppresses (SDM Table 17-11).
fn lbr_select_jcc() -> TestResult {
    with_select(LBR_SELECT_JCC, &[5, 6])
}

fn lbr_select_cpl0() -> TestResult {
    with_select(LBR_SELECT_CPL_EQ_0, &[1, 2, 3, 4, 5, 6, 7, 8, 9])
}

fn lbr_select_calls_returns() -> TestResult {
    with_select(
        LBR_SELECT_NEAR_REL_CALL | LBR_SELECT_NEAR_IND_CALL | LBR_SELECT_NEAR_RET,
        &[2, 3, 8, 9],
    )
}

fn lbr_select_jumps() -> TestResult {
    with_select(
        LBR_SELECT_NEAR_REL_JMP | LBR_SELECT_NEAR_IND_JMP,
        &[1, 4, 7],
    )?;
    // Only the indirect call survives calls/returns/JCC/rel-jump suppression.
    with_select(
        LBR_SELECT_NEAR_REL_CALL
            | LBR_SELECT_NEAR_RET
            | LBR_SELECT_JCC
            | LBR_SELECT_NEAR_REL_JMP
            | LBR_SELECT_NEAR_IND_JMP,
        &[1, 2, 3, 4, 5, 6, 7, 9],
    )
}

/// Call-stack mode (SDM 17.11, format >= 4): calls push, returns pop.
fn lbr_call_stack_mode() -> TestResult {
    let p = p();
    if p.lbr_format < 4 {
        return Ok(());
    }
    clear_stack();
    wr(
        MSR_LBR_SELECT,
        LBR_SELECT_EN_CALLSTACK
            | LBR_SELECT_JCC
            | LBR_SELECT_NEAR_REL_JMP
            | LBR_SELECT_NEAR_IND_JMP
            | LBR_SELECT_FAR_BRANCH,
    );
    run_seq(IA32_DEBUGCTL, DEBUGCTL_LBR, 0);
    wr(MSR_LBR_SELECT, 0);
    // call 2 (TOS 1), ret 3 pops (TOS 0), call 8 overwrites slot 1, ret 9 pops (TOS 0).
    ensure_eq!(msr::rdmsr(MSR_LASTBRANCH_TOS), 0, "TOS");
    let s = seq();
    ensure_eq!(msr::rdmsr(p.lbr_from_msr(1)), s[7].0, "slot 1 FROM");
    ensure_eq!(msr::rdmsr(p.lbr_to_msr(1)), s[7].1, "slot 1 TO");
    for n in 2..p.depth {
        ensure_eq!(msr::rdmsr(p.lbr_from_msr(n)), 0, "untouched FROM");
    }
    Ok(())
}

static HOOK_RIP: AtomicU64 = AtomicU64::new(0);
static HOOK_A: AtomicU64 = AtomicU64::new(0);
static HOOK_B: AtomicU64 = AtomicU64::new(0);

fn freeze_hook(f: &mut TrapFrame) {
    HOOK_RIP.store(f.rip, Ordering::SeqCst);
    HOOK_A.store(msr::rdmsr(IA32_DEBUGCTL), Ordering::SeqCst);
    HOOK_B.store(msr::rdmsr(IA32_PERF_GLOBAL_STATUS), Ordering::SeqCst);
}

/// Branches retired (C4H/00H), OS, EN.
const BR_OS: u64 = 0xc4 | 1 << 17 | 1 << 22;

fn clear_counters() {
    wr(IA32_PERFEVTSEL0, 0);
    wr(IA32_PMC0, 0);
    wr(IA32_PERF_GLOBAL_CTRL, 0);
    if p().adaptive {
        wr(IA32_PEBS_ENABLE, 0);
        wr(MSR_PEBS_DATA_CFG, 0);
    }
    wr(
        IA32_PERF_GLOBAL_OVF_CTRL,
        msr::rdmsr(IA32_PERF_GLOBAL_STATUS),
    );
}

/// FREEZE_LBRS_ON_PMI (SDM 17.4.7; 18.2.4.1 for v4): PMC0 overflows on the 4th counted branch
/// (the CALL into br_seq, then branches 1-3); the LBRs hold branches 1-3 and nothing after,
/// not even the PMI handler's.
fn lbr_freeze_on_pmi() -> TestResult {
    let p = p();
    clear_stack();
    clear_counters();
    wr(IA32_PMC0, 0xFFFF_FFFF - 3);
    wr(IA32_PERF_GLOBAL_CTRL, 1);
    HOOK_RIP.store(0, Ordering::SeqCst);
    pmi::set_hook(Some(freeze_hook));
    lapic::set_lvtpc(pmi::lvtpc_nmi());
    let before = pmi::nmi_count();
    run_seq_counted(
        BR_OS | EVTSEL_INT,
        DEBUGCTL_LBR | DEBUGCTL_FREEZE_LBRS_ON_PMI,
    );
    wr(IA32_PERFEVTSEL0, 0);
    cpu::spin_until(|| pmi::nmi_count() > before, 100);
    pmi::set_hook(None);
    lapic::set_lvtpc(pmi::lvtpc_nmi() | lapic::LVT_MASKED);
    let status = msr::rdmsr(IA32_PERF_GLOBAL_STATUS);
    let r = check_stack(0, &seq()[..3]);
    wr(IA32_DEBUGCTL, 0);
    clear_counters();
    r?;
    ensure_eq!(pmi::nmi_count() - before, 1, "PMIs");
    ensure_eq!(HOOK_RIP.load(Ordering::SeqCst), seq()[2].1, "PMI RIP");
    let (dbg, st) = (HOOK_A.load(Ordering::SeqCst), HOOK_B.load(Ordering::SeqCst));
    if p.version >= 4 {
        ensure!(
            dbg & DEBUGCTL_LBR != 0 && st & GLOBAL_STATUS_LBR_FRZ != 0,
            "v4: at the PMI DEBUGCTL {dbg:#x} (LBR stays set), STATUS {st:#x} (LBR_Frz set)"
        );
        ensure!(
            status & GLOBAL_STATUS_LBR_FRZ != 0,
            "LBR_Frz cleared itself"
        );
    } else {
        ensure!(
            dbg & DEBUGCTL_LBR == 0 && dbg & DEBUGCTL_FREEZE_LBRS_ON_PMI != 0,
            "v2/v3: DEBUGCTL at the PMI {dbg:#x} (want LBR clear, FREEZE_LBRS_ON_PMI kept)"
        );
        ensure!(
            st & GLOBAL_STATUS_LBR_FRZ == 0,
            "LBR_Frz on a v{} PMU",
            p.version
        );
    }
    ensure!(status & 1 != 0, "PMC0 overflow bit missing: {status:#x}");
    Ok(())
}

// ---- BTS ----

/// DS save area BTS fields (SDM Figure 17-8, 64-bit format).
const BTS_BASE: u64 = 0x00;
const BTS_INDEX: u64 = 0x08;
const BTS_MAX: u64 = 0x10;
const BTS_THRESHOLD: u64 = 0x18;
const REC: u64 = 24;
/// Byte the buffer is filled with before a run.
const FILL: u8 = 0xA5;

fn bts_setup(max_records: u64, threshold_records: u64) -> u64 {
    let ds = pb::ds_page();
    let base = pb::buf_page(0);
    pb::ds_setup(ds, 0, 0, 0, 0);
    pb::fill(base, 4096, FILL);
    pb::wr64(ds + BTS_BASE, base);
    pb::wr64(ds + BTS_INDEX, base);
    pb::wr64(ds + BTS_MAX, base + max_records * REC);
    pb::wr64(ds + BTS_THRESHOLD, base + threshold_records * REC);
    wr(IA32_DS_AREA, ds);
    base
}

fn bts_index() -> u64 {
    pb::rd64(pb::ds_page() + BTS_INDEX)
}

/// Record `slot` holds branch (from, to); flags: bit 4 "predicted" (no mispredicts are
/// modelled) except on Core 2, which does not report it (SDM 17.4.9.1 note).
fn check_record(base: u64, slot: u64, b: (u64, u64)) -> TestResult {
    let a = base + slot * REC;
    let (f, t, fl) = (pb::rd64(a), pb::rd64(a + 8), pb::rd64(a + 16));
    let want_fl = if p().core2 { 0 } else { 1 << 4 };
    if (f, t, fl) != (b.0, b.1, want_fl) {
        fail!(
            "BTS record {slot}: got {f:#x}->{t:#x} flags {fl:#x}, expected {:#x}->{:#x} flags {want_fl:#x}",
            b.0,
            b.1
        );
    }
    Ok(())
}

fn untouched_after(a: u64, end: u64) -> TestResult {
    let len = usize::try_from(end - a).unwrap_or(0);
    if let Some(x) = pb::first_not(a, len, FILL) {
        fail!("byte at {x:#x} written (beyond the expected records)");
    }
    Ok(())
}

const TR_BTS: u64 = DEBUGCTL_TR | DEBUGCTL_BTS;

fn bts_sequence_in_order() -> TestResult {
    clear_stack();
    let base = bts_setup(64, 65);
    run_seq(IA32_DEBUGCTL, TR_BTS, 0);
    let idx = bts_index();
    for (k, b) in seq().iter().enumerate() {
        check_record(base, k as u64, *b)?;
    }
    ensure_eq!(idx, base + 9 * REC, "BTS Index");
    untouched_after(base + 9 * REC, base + 4096)?;
    // BTS alone leaves the LBR stack alone.
    check_stack(0, &[])
}

fn bts_off_os_stores_nothing() -> TestResult {
    let base = bts_setup(64, 65);
    run_seq(IA32_DEBUGCTL, TR_BTS | DEBUGCTL_BTS_OFF_OS, 0);
    ensure_eq!(bts_index(), base, "BTS Index");
    untouched_after(base, base + 4096)?;
    // TR without BTS: bus messages only, nothing stored.
    run_seq(IA32_DEBUGCTL, DEBUGCTL_TR, 0);
    ensure_eq!(bts_index(), base, "BTS Index (TR only)");
    untouched_after(base, base + 4096)
}

fn bts_hook(f: &mut TrapFrame) {
    HOOK_RIP.store(f.rip, Ordering::SeqCst);
    HOOK_A.store(bts_index(), Ordering::SeqCst);
}

/// BTINT (SDM 17.4.9.4): a PMI once BTS Index reaches the threshold (3 records); the PMI
/// handler's own branches then fill the buffer to its absolute maximum (5 records) and stop.
fn bts_threshold_pmi() -> TestResult {
    let base = bts_setup(5, 3);
    HOOK_RIP.store(0, Ordering::SeqCst);
    pmi::set_hook(Some(bts_hook));
    lapic::set_lvtpc(pmi::lvtpc_nmi());
    let before = pmi::nmi_count();
    run_seq(IA32_DEBUGCTL, TR_BTS | DEBUGCTL_BTINT, 0);
    cpu::spin_until(|| pmi::nmi_count() > before, 100);
    pmi::set_hook(None);
    lapic::set_lvtpc(pmi::lvtpc_nmi() | lapic::LVT_MASKED);
    ensure_eq!(pmi::nmi_count() - before, 1, "PMIs");
    ensure_eq!(HOOK_RIP.load(Ordering::SeqCst), seq()[2].1, "PMI RIP");
    let at_pmi = HOOK_A.load(Ordering::SeqCst);
    ensure!(
        (base + 3 * REC..=base + 5 * REC).contains(&at_pmi),
        "BTS Index at the PMI {:#x} (base {base:#x})",
        at_pmi
    );
    for (k, b) in seq().iter().take(3).enumerate() {
        check_record(base, k as u64, *b)?;
    }
    ensure_eq!(bts_index(), base + 5 * REC, "BTS Index (full)");
    untouched_after(base + 5 * REC, base + 4096)?;
    let st = msr::rdmsr(IA32_PERF_GLOBAL_STATUS);
    ensure_eq!(st, 0, "GLOBAL_STATUS (BTS sets no status bit)");
    Ok(())
}

/// BTINT clear: circular buffer of 4 records; 9 branches wrap twice (SDM 17.4.9.3).
fn bts_circular_wrap() -> TestResult {
    let base = bts_setup(4, 5);
    lapic::set_lvtpc(pmi::lvtpc_nmi());
    let before = pmi::nmi_count();
    run_seq(IA32_DEBUGCTL, TR_BTS, 0);
    cpu::spin_until(|| false, 20);
    lapic::set_lvtpc(pmi::lvtpc_nmi() | lapic::LVT_MASKED);
    ensure_eq!(pmi::nmi_count() - before, 0, "PMIs");
    let s = seq();
    for (slot, k) in [(0, 8), (1, 5), (2, 6), (3, 7)] {
        check_record(base, slot, s[k])?;
    }
    ensure_eq!(bts_index(), base + REC, "BTS Index");
    untouched_after(base + 4 * REC, base + 4096)
}

/// BTINT set, threshold past the maximum: the buffer fills (4 records) and further records
/// are dropped, without a PMI.
fn bts_full_with_btint_stops() -> TestResult {
    let base = bts_setup(4, 5);
    lapic::set_lvtpc(pmi::lvtpc_nmi());
    let before = pmi::nmi_count();
    run_seq(IA32_DEBUGCTL, TR_BTS | DEBUGCTL_BTINT, 0);
    cpu::spin_until(|| false, 20);
    lapic::set_lvtpc(pmi::lvtpc_nmi() | lapic::LVT_MASKED);
    ensure_eq!(pmi::nmi_count() - before, 0, "PMIs");
    for (k, b) in seq().iter().take(4).enumerate() {
        check_record(base, k as u64, *b)?;
    }
    ensure_eq!(bts_index(), base + 4 * REC, "BTS Index");
    untouched_after(base + 4 * REC, base + 4096)
}

// ---- adaptive PEBS ----

/// BR_INST_RETIRED.ALL_BRANCHES (C4H/04H, PEBS-capable), OS, EN, adaptive record.
const BR_ALL_PEBS: u64 = 0xc4 | 0x04 << 8 | 1 << 17 | 1 << 22 | EVTSEL_ADAPTIVE;

/// Adaptive PEBS with the LBR group (SDM 18.9.2.2.4): PMC0 overflows on the 6th counted
/// branch (the CALL, then br_seq 1-5); the record's 8 LBR entries are branches 5..1 newest
/// first, then the cleared entries, each identical to the LBR MSRs.
fn pebs_lbr_group() -> TestResult {
    let p = p();
    if !p.adaptive {
        return Ok(());
    }
    const N: usize = 8;
    let cfg = layout::CFG_LBRS | (N as u64 - 1) << layout::CFG_LBR_SHIFT;
    clear_stack();
    clear_counters();
    let ds = pb::ds_page();
    let base = pb::buf_page(1);
    pb::fill(base, 4096, FILL);
    pb::ds_setup(ds, base, base, base + 4096, base + 4096);
    wr(IA32_DS_AREA, ds);
    wr(MSR_PEBS_DATA_CFG, cfg);
    wr(IA32_PMC0, 0xFFFF_FFFF - 5);
    wr(IA32_PEBS_ENABLE, 1);
    wr(IA32_PERF_GLOBAL_CTRL, 1);
    run_seq_counted(BR_ALL_PEBS, DEBUGCTL_LBR);
    wr(IA32_PERFEVTSEL0, 0);
    let index = pb::ds_index(ds);
    let stack = read_stack();
    clear_counters();
    let size = layout::adaptive_size(cfg) as u64;
    ensure_eq!(index, base + size, "PEBS Index (one record)");
    let Some(off) = layout::adaptive_groups(cfg)[3] else {
        fail!("no LBR group offset");
    };
    // After the record br_seq pushed 4 more branches: the record's entry j is stack entry
    // j + 4.
    let s = seq();
    for j in 0..N {
        let a = base + (off + j * layout::adaptive::LBR_ENTRY) as u64;
        let (f, t, i) = (pb::rd64(a), pb::rd64(a + 8), pb::rd64(a + 16));
        let want = if j < 5 { s[4 - j] } else { (0, 0) };
        if (f, t) != want {
            fail!(
                "record LBR {j}: got {f:#x}->{t:#x}, expected {:#x}->{:#x}",
                want.0,
                want.1
            );
        }
        ensure_eq!((f, t, i), stack.e[j + 4], "record LBR entry vs LBR MSRs");
    }
    check_stack(0, &s)
}

// ---- outside precise mode ----

fn lbr_entries_stay_empty() -> TestResult {
    clear_stack();
    run_seq(IA32_DEBUGCTL, DEBUGCTL_LBR, 0);
    run_chain(IA32_DEBUGCTL, DEBUGCTL_LBR, 0);
    check_stack(0, &[])
}

fn bts_stays_empty() -> TestResult {
    let base = bts_setup(64, 65);
    run_seq(IA32_DEBUGCTL, TR_BTS, 0);
    ensure_eq!(bts_index(), base, "BTS Index");
    untouched_after(base, base + 4096)
}
