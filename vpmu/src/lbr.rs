//! The legacy LBR stack (SDM 17.4.8, 17.7-17.10): FROM_IP / TO_IP (/ LBR_INFO) triplets and
//! the top-of-stack pointer, the per-format encoding of a taken branch into those MSRs, and the
//! MSR_LBR_SELECT filter.
//!
//! Entries come from the precise backend's decoded taken branches: mispredict is always 0 (no
//! branch predictor is modelled), the TSX flags are 0 (no transactional execution), and the
//! cycle count is derived from the deterministic cost model's core-cycle timestamps.
//!
//! The stack keeps the raw MSR values, so guest writes (Linux restores saved stacks) and
//! recorded branches are read back the same way, and the adaptive PEBS LBR group copies them
//! as hardware does.

use serde::{Deserialize, Serialize};

use crate::msr::*;
use crate::state::LbrEntry;

/// What kind of control transfer a taken branch is (the precise backend maps its decoder's
/// classes onto this). Interrupts, exceptions and far transfers are all "far branches" for
/// MSR_LBR_SELECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BranchType {
    /// Jcc, JCXZ, LOOP*.
    Conditional,
    /// JMP rel8/rel32.
    NearRelJmp,
    /// JMP r/m (near).
    NearIndJmp,
    /// CALL rel32.
    NearRelCall,
    /// CALL r/m (near).
    NearIndCall,
    /// RET / RET imm16 (near).
    NearRet,
    /// Far JMP/CALL/RET, IRET, SYSCALL/SYSRET, SYSENTER/SYSEXIT.
    Far,
    /// Interrupt or exception delivery (from = the interrupted IP, to = the handler).
    Interrupt,
}

impl BranchType {
    /// The MSR_LBR_SELECT bit that suppresses this kind (SDM Table 17-11).
    pub fn select_bit(self) -> u64 {
        match self {
            BranchType::Conditional => LBR_SELECT_JCC,
            BranchType::NearRelJmp => LBR_SELECT_NEAR_REL_JMP,
            BranchType::NearIndJmp => LBR_SELECT_NEAR_IND_JMP,
            BranchType::NearRelCall => LBR_SELECT_NEAR_REL_CALL,
            BranchType::NearIndCall => LBR_SELECT_NEAR_IND_CALL,
            BranchType::NearRet => LBR_SELECT_NEAR_RET,
            BranchType::Far | BranchType::Interrupt => LBR_SELECT_FAR_BRANCH,
        }
    }
}

/// One taken branch as the precise backend reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TakenBranch {
    /// Address of the branch instruction (or the interrupted instruction). Flat segmentation
    /// is assumed, so the effective and the linear address are the same (as Linux assumes
    /// when it merges the LIP and EIP formats). Outside 64-bit mode pass 32-bit values: the
    /// SDM stores the upper 32 bits as 0 there (17.4.8.1).
    pub from: u64,
    /// Branch target (or handler) address.
    pub to: u64,
    /// Kind of transfer.
    pub kind: BranchType,
    /// CPL at which the branch executed (LBR_SELECT CPL filters, BTS_OFF_OS / BTS_OFF_USR).
    pub cpl: u8,
    /// Core-cycle timestamp of the branch in the deterministic cost model (monotonic). The
    /// stack turns it into "elapsed core clocks since the last LBR update" for the formats
    /// that report cycles.
    pub cycles: u64,
}

/// What [`LbrStack::record`] did with a branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LbrAction {
    /// Pushed as the new top of stack.
    Recorded,
    /// A near return in call-stack mode popped the top entry.
    Popped,
    /// Suppressed by MSR_LBR_SELECT.
    Filtered,
}

/// A branch decoded from raw LBR MSR values, the way Linux `intel_pmu_lbr_read_64` reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodedLbr {
    /// Source address, sign-extended.
    pub from: u64,
    /// Target address, sign-extended.
    pub to: u64,
    /// Mispredict flag.
    pub mispredict: bool,
    /// TSX IN_TX flag.
    pub in_tx: bool,
    /// TSX abort flag.
    pub abort: bool,
    /// Cycle count where the format has one.
    pub cycles: Option<u16>,
}

/// Sign-extends `v` from bit `bits - 1`.
fn sign_extend(v: u64, bits: u32) -> u64 {
    let shift = 64 - bits;
    // Reinterpretation for the arithmetic shift; no value is lost.
    #[allow(
        clippy::cast_possible_wrap,
        clippy::cast_sign_loss,
        reason = "bit reinterpretation"
    )]
    let r = (((v << shift) as i64) >> shift) as u64;
    r
}

/// Elapsed cycles as the saturating 16-bit field.
fn cycles_field(elapsed: u64) -> u64 {
    elapsed.min(LBR_CYCLES_MASK)
}

/// The raw FROM_IP / TO_IP / LBR_INFO values of one branch in LBR `format` (mispredict, IN_TX
/// and ABORT clear; `elapsed` core cycles where the format reports them).
///
/// - 0: 32-bit offsets: FROM = from[31:0], TO = to[31:0] (SDM 17.4.8.1: "32-bit offset in
///   current CS of respective source/destination"). Linux's `intel_pmu_lbr_read_32` reads
///   from and to packed into one MSR: that is the single-MSR LBR of the Pentium M / Core Solo,
///   which have no separate TO_IP MSRs; no preset uses format 0.
/// - 1, 2: full 64-bit addresses.
/// - 3: FROM[63] = mispredict, FROM[62:0] = address (sign extension of bit 47).
/// - 4: FROM[63:61] = mispredict, IN_TX, ABORT, FROM[60:0] = address.
/// - 5, 7: FROM/TO full addresses; LBR_INFO[63] mispredict, [62] IN_TX, [61] ABORT (format 5
///   only), [15:0] cycles.
/// - 6: FROM[63] = mispredict, FROM[62:0] = address; TO[63:48] = cycles, TO[47:0] = address.
/// - Any other value (not defined for legacy LBRs): full 64-bit addresses, no flags.
pub fn encode(format: u8, from: u64, to: u64, elapsed: u64) -> LbrEntry {
    const LOW32: u64 = 0xFFFF_FFFF;
    let mispred = 0u64;
    let (from, to, info) = match format {
        LBR_FORMAT_32 => (from & LOW32, to & LOW32, 0),
        LBR_FORMAT_EIP_FLAGS => ((from & !LBR_FROM_MISPRED) | mispred, to, 0),
        LBR_FORMAT_EIP_FLAGS2 => {
            let flags = LBR_FROM_MISPRED | LBR_FROM_IN_TX | LBR_FROM_ABORT;
            ((from & !flags) | mispred, to, 0)
        }
        LBR_FORMAT_INFO | LBR_FORMAT_INFO2 => (from, to, mispred | cycles_field(elapsed)),
        LBR_FORMAT_TIME => {
            let addr = (1u64 << LBR_TO_CYCLES_SHIFT) - 1;
            let to = (to & addr) | (cycles_field(elapsed) << LBR_TO_CYCLES_SHIFT);
            ((from & !LBR_FROM_MISPRED) | mispred, to, 0)
        }
        _ => (from, to, 0),
    };
    LbrEntry { from, to, info }
}

/// Decodes raw LBR MSR values of `format` (the inverse of [`encode`] for canonical
/// addresses; Linux `intel_pmu_lbr_read_64` semantics).
pub fn decode(format: u8, e: &LbrEntry) -> DecodedLbr {
    let flag = |v: u64, bit: u64| v & bit != 0;
    match format {
        LBR_FORMAT_32 => DecodedLbr {
            from: e.from & 0xFFFF_FFFF,
            to: e.to & 0xFFFF_FFFF,
            ..DecodedLbr::default()
        },
        LBR_FORMAT_EIP_FLAGS => DecodedLbr {
            from: sign_extend(e.from, 63),
            to: e.to,
            mispredict: flag(e.from, LBR_FROM_MISPRED),
            ..DecodedLbr::default()
        },
        LBR_FORMAT_EIP_FLAGS2 => DecodedLbr {
            from: sign_extend(e.from, 61),
            to: e.to,
            mispredict: flag(e.from, LBR_FROM_MISPRED),
            in_tx: flag(e.from, LBR_FROM_IN_TX),
            abort: flag(e.from, LBR_FROM_ABORT),
            cycles: None,
        },
        LBR_FORMAT_INFO | LBR_FORMAT_INFO2 => DecodedLbr {
            from: e.from,
            to: e.to,
            mispredict: flag(e.info, LBR_INFO_MISPRED),
            in_tx: format == LBR_FORMAT_INFO && flag(e.info, LBR_INFO_IN_TX),
            abort: format == LBR_FORMAT_INFO && flag(e.info, LBR_INFO_ABORT),
            cycles: u16::try_from(e.info & LBR_CYCLES_MASK).ok(),
        },
        LBR_FORMAT_TIME => DecodedLbr {
            from: sign_extend(e.from, 63),
            to: sign_extend(e.to, LBR_TO_CYCLES_SHIFT),
            mispredict: flag(e.from, LBR_FROM_MISPRED),
            cycles: u16::try_from((e.to >> LBR_TO_CYCLES_SHIFT) & LBR_CYCLES_MASK).ok(),
            ..DecodedLbr::default()
        },
        _ => DecodedLbr {
            from: e.from,
            to: e.to,
            ..DecodedLbr::default()
        },
    }
}

/// Whether MSR_LBR_SELECT `select` suppresses a branch of `kind` at `cpl` (a set bit
/// suppresses: SDM Table 17-11). EN_CALLSTACK is not a filter and is ignored here.
pub fn suppressed(select: u64, kind: BranchType, cpl: u8) -> bool {
    let ring = if cpl == 0 {
        LBR_SELECT_CPL_EQ_0
    } else {
        LBR_SELECT_CPL_NEQ_0
    };
    select & ring != 0 || select & kind.select_bit() != 0
}

/// The LBR stack of one logical processor: MSR_LBR_SELECT, MSR_LASTBRANCH_TOS and the
/// FROM/TO/INFO triplets, all 0 at RESET (SDM 17.7.2: "MSR_LBR_SELECT is cleared to zero at
/// RESET"; the FROM/TO/INFO and TOS MSRs read 0 after RESET).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LbrStack {
    select: u64,
    tos: u64,
    from: Vec<u64>,
    to: Vec<u64>,
    info: Vec<u64>,
    /// Core-cycle timestamp of the last LBR update (None: none since RESET). Defaulted so
    /// states saved before it existed still load.
    #[serde(default)]
    last_update: Option<u64>,
}

impl LbrStack {
    /// An empty stack of `depth` entries in its RESET state.
    pub fn new(depth: u8) -> LbrStack {
        let d = usize::from(depth);
        LbrStack {
            from: vec![0; d],
            to: vec![0; d],
            info: vec![0; d],
            ..LbrStack::default()
        }
    }

    /// Number of entries.
    pub fn depth(&self) -> usize {
        self.from.len()
    }

    /// MSR_LBR_SELECT.
    pub fn select(&self) -> u64 {
        self.select
    }

    /// Writes MSR_LBR_SELECT (the caller has checked the writable mask).
    pub fn set_select(&mut self, v: u64) {
        self.select = v;
    }

    /// MSR_LASTBRANCH_TOS.
    pub fn tos(&self) -> u64 {
        self.tos
    }

    /// Writes MSR_LASTBRANCH_TOS (the caller has checked it is below the depth).
    pub fn set_tos(&mut self, v: u64) {
        self.tos = v;
    }

    /// MSR_LASTBRANCH_n_FROM_IP (0 for an index beyond the depth).
    pub fn from_ip(&self, n: u8) -> u64 {
        self.from.get(usize::from(n)).copied().unwrap_or(0)
    }

    /// MSR_LASTBRANCH_n_TO_IP.
    pub fn to_ip(&self, n: u8) -> u64 {
        self.to.get(usize::from(n)).copied().unwrap_or(0)
    }

    /// MSR_LBR_INFO_n.
    pub fn info(&self, n: u8) -> u64 {
        self.info.get(usize::from(n)).copied().unwrap_or(0)
    }

    /// Writes MSR_LASTBRANCH_n_FROM_IP (ignored beyond the depth; decode prevents that).
    pub fn set_from_ip(&mut self, n: u8, v: u64) {
        if let Some(s) = self.from.get_mut(usize::from(n)) {
            *s = v;
        }
    }

    /// Writes MSR_LASTBRANCH_n_TO_IP.
    pub fn set_to_ip(&mut self, n: u8, v: u64) {
        if let Some(s) = self.to.get_mut(usize::from(n)) {
            *s = v;
        }
    }

    /// Writes MSR_LBR_INFO_n.
    pub fn set_info(&mut self, n: u8, v: u64) {
        if let Some(s) = self.info.get_mut(usize::from(n)) {
            *s = v;
        }
    }

    fn tos_index(&self) -> usize {
        let d = self.depth().max(1);
        usize::try_from(self.tos).unwrap_or(0) % d
    }

    /// The stack's raw entries, newest (TOS) first, all `depth` of them.
    pub fn entries_newest_first(&self) -> Vec<LbrEntry> {
        let d = self.depth();
        let tos = self.tos_index();
        (0..d)
            .map(|k| {
                let i = (tos + d - k) % d;
                LbrEntry {
                    from: self.from[i],
                    to: self.to[i],
                    info: self.info[i],
                }
            })
            .collect()
    }

    /// Records a taken branch in LBR `format` (the caller has checked DEBUGCTL.LBR and the
    /// freeze). A recorded branch advances TOS modulo the depth and then fills that slot (SDM
    /// 17.9: TOS "is incremented by 1, modulo 16, before recording the next pair").
    ///
    /// Call-stack mode (MSR_LBR_SELECT.EN_CALLSTACK, SDM 17.11): a near return that passes the
    /// CPL filter pops the top entry (TOS decremented) instead of being recorded; the popped
    /// entry's MSRs keep their values, as readers walk down from TOS only.
    pub fn record(&mut self, format: u8, br: &TakenBranch) -> LbrAction {
        let d = self.depth();
        if d == 0 {
            return LbrAction::Filtered;
        }
        let cpl_only = self.select & (LBR_SELECT_CPL_EQ_0 | LBR_SELECT_CPL_NEQ_0);
        if self.select & LBR_SELECT_EN_CALLSTACK != 0
            && br.kind == BranchType::NearRet
            && !suppressed(cpl_only, br.kind, br.cpl)
        {
            self.tos = u64::try_from((self.tos_index() + d - 1) % d).unwrap_or(0);
            return LbrAction::Popped;
        }
        if suppressed(self.select, br.kind, br.cpl) {
            return LbrAction::Filtered;
        }
        let elapsed = br.cycles.saturating_sub(self.last_update.unwrap_or(0));
        self.last_update = Some(br.cycles);
        let i = (self.tos_index() + 1) % d;
        let e = encode(format, br.from, br.to, elapsed);
        self.from[i] = e.from;
        self.to[i] = e.to;
        self.info[i] = e.info;
        self.tos = u64::try_from(i).unwrap_or(0);
        LbrAction::Recorded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KERNEL: u64 = 0xFFFF_FFFF_8100_1234;
    const USER: u64 = 0x0000_7FFF_DEAD_BEE0;

    fn br(from: u64, to: u64, kind: BranchType, cpl: u8, cycles: u64) -> TakenBranch {
        TakenBranch {
            from,
            to,
            kind,
            cpl,
            cycles,
        }
    }

    #[test]
    fn per_format_encodings() {
        // Format 3 (Nehalem): bit 63 is the mispredict flag, bits 62:48 sign extension.
        let e = encode(LBR_FORMAT_EIP_FLAGS, KERNEL, USER, 7);
        assert_eq!(e.from, 0x7FFF_FFFF_8100_1234);
        assert_eq!(e.to, USER);
        assert_eq!(e.info, 0);
        // Format 4 (Haswell): bits 63:61 flags.
        let e = encode(LBR_FORMAT_EIP_FLAGS2, KERNEL, KERNEL, 7);
        assert_eq!(e.from, 0x1FFF_FFFF_8100_1234);
        assert_eq!(e.to, KERNEL);
        // Format 5 (Skylake): full addresses, cycles in LBR_INFO[15:0], saturating.
        let e = encode(LBR_FORMAT_INFO, KERNEL, USER, 42);
        assert_eq!((e.from, e.to, e.info), (KERNEL, USER, 42));
        assert_eq!(encode(LBR_FORMAT_INFO, 0, 0, 1 << 20).info, 0xFFFF);
        // Format 6: cycles in TO[63:48].
        let e = encode(LBR_FORMAT_TIME, KERNEL, KERNEL, 0x1234);
        assert_eq!(e.from, 0x7FFF_FFFF_8100_1234);
        assert_eq!(e.to, 0x1234_FFFF_8100_1234);
        // Formats 0-2.
        let e = encode(LBR_FORMAT_32, 0x1_2345_6789, 0xABCD_EF01_2345, 1);
        assert_eq!((e.from, e.to), (0x2345_6789, 0xEF01_2345));
        assert_eq!(encode(LBR_FORMAT_LIP, KERNEL, USER, 1).from, KERNEL);
        assert_eq!(encode(LBR_FORMAT_EIP, KERNEL, USER, 1).to, USER);
    }

    #[test]
    fn decode_inverts_encode_for_canonical_addresses() {
        for fmt in 0..=8u8 {
            for (f, t) in [(KERNEL, USER), (USER, KERNEL), (0x1000, 0x2000)] {
                let d = decode(fmt, &encode(fmt, f, t, 99));
                if fmt == LBR_FORMAT_32 {
                    assert_eq!((d.from, d.to), (f & 0xFFFF_FFFF, t & 0xFFFF_FFFF));
                } else {
                    assert_eq!((d.from, d.to), (f, t), "format {fmt}");
                }
                assert!(!d.mispredict && !d.in_tx && !d.abort);
                let has_cycles = matches!(fmt, 5..=7);
                assert_eq!(d.cycles, has_cycles.then_some(99), "format {fmt}");
            }
        }
        // A mispredicted format-3 entry decodes its flag (Linux reads bit 63).
        let d = decode(
            LBR_FORMAT_EIP_FLAGS,
            &LbrEntry {
                from: LBR_FROM_MISPRED | 0x7FFF_FFFF_8100_1234,
                to: 0,
                info: 0,
            },
        );
        assert!(d.mispredict);
        assert_eq!(d.from, KERNEL);
    }

    #[test]
    fn select_filters() {
        use BranchType::*;
        assert!(!suppressed(0, Conditional, 0));
        assert!(suppressed(LBR_SELECT_CPL_EQ_0, NearRet, 0));
        assert!(!suppressed(LBR_SELECT_CPL_EQ_0, NearRet, 3));
        assert!(suppressed(LBR_SELECT_CPL_NEQ_0, NearRet, 1));
        assert!(suppressed(LBR_SELECT_FAR_BRANCH, Interrupt, 0));
        assert!(suppressed(LBR_SELECT_FAR_BRANCH, Far, 3));
        assert!(!suppressed(LBR_SELECT_JCC, NearRelJmp, 3));
        let kinds = [
            (Conditional, LBR_SELECT_JCC),
            (NearRelCall, LBR_SELECT_NEAR_REL_CALL),
            (NearIndCall, LBR_SELECT_NEAR_IND_CALL),
            (NearRet, LBR_SELECT_NEAR_RET),
            (NearIndJmp, LBR_SELECT_NEAR_IND_JMP),
            (NearRelJmp, LBR_SELECT_NEAR_REL_JMP),
            (Far, LBR_SELECT_FAR_BRANCH),
        ];
        for (k, bit) in kinds {
            assert!(suppressed(bit, k, 0));
            assert!(!suppressed(LBR_SELECT_FILTER_MASK & !bit & !0x3, k, 0));
        }
    }

    #[test]
    fn push_wraps_and_counts_cycles_since_last_update() {
        let mut s = LbrStack::new(4);
        for k in 0..6u64 {
            let b = br(
                0x1000 + k,
                0x2000 + k,
                BranchType::NearRelJmp,
                3,
                100 * (k + 1),
            );
            assert_eq!(s.record(LBR_FORMAT_INFO, &b), LbrAction::Recorded);
        }
        // 6 pushes into a 4-deep stack from TOS 0: TOS = 6 mod 4.
        assert_eq!(s.tos(), 2);
        let e = s.entries_newest_first();
        let froms: Vec<u64> = e.iter().map(|e| e.from).collect();
        assert_eq!(froms, [0x1005, 0x1004, 0x1003, 0x1002]);
        assert_eq!(s.from_ip(2), 0x1005);
        assert_eq!(e[0].info, 100);
        // A filtered branch does not update the stack nor its cycle reference.
        s.set_select(LBR_SELECT_NEAR_REL_JMP);
        let b = br(0x9000, 0x9100, BranchType::NearRelJmp, 3, 650);
        assert_eq!(s.record(LBR_FORMAT_INFO, &b), LbrAction::Filtered);
        let b = br(0x9000, 0x9100, BranchType::Conditional, 3, 700);
        assert_eq!(s.record(LBR_FORMAT_INFO, &b), LbrAction::Recorded);
        assert_eq!(s.entries_newest_first()[0].info, 100);
    }

    #[test]
    fn call_stack_mode_pops_on_return() {
        let mut s = LbrStack::new(8);
        s.set_select(
            LBR_SELECT_EN_CALLSTACK
                | LBR_SELECT_JCC
                | LBR_SELECT_NEAR_IND_JMP
                | LBR_SELECT_NEAR_REL_JMP
                | LBR_SELECT_FAR_BRANCH,
        );
        let call = |f| br(f, 0x5000, BranchType::NearRelCall, 0, 0);
        s.record(LBR_FORMAT_INFO, &call(0x100));
        s.record(LBR_FORMAT_INFO, &call(0x200));
        assert_eq!(s.tos(), 2);
        let ret = br(0x5010, 0x205, BranchType::NearRet, 0, 0);
        assert_eq!(s.record(LBR_FORMAT_INFO, &ret), LbrAction::Popped);
        assert_eq!(s.tos(), 1);
        assert_eq!(s.entries_newest_first()[0].from, 0x100);
        s.record(LBR_FORMAT_INFO, &call(0x300));
        assert_eq!(s.entries_newest_first()[0].from, 0x300);
        assert_eq!(s.entries_newest_first()[1].from, 0x100);
        // Pops wrap below 0 like the push wraps above the depth.
        let mut t = LbrStack::new(4);
        t.set_select(LBR_SELECT_EN_CALLSTACK);
        assert_eq!(t.record(LBR_FORMAT_INFO, &ret), LbrAction::Popped);
        assert_eq!(t.tos(), 3);
    }

    #[test]
    fn zero_depth_records_nothing() {
        let mut s = LbrStack::new(0);
        let b = br(1, 2, BranchType::Far, 0, 0);
        assert_eq!(s.record(LBR_FORMAT_INFO, &b), LbrAction::Filtered);
        assert!(s.entries_newest_first().is_empty());
        assert_eq!(s.from_ip(3), 0);
    }
}
