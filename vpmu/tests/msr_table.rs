//! One table-driven test over every MSR index the VMM traps, for every preset: reset value,
//! read-back after all-ones and random writes within the writable mask, #GP on reserved bits,
//! on absent counters and on MSRs the model lacks. The expectations are written out here from
//! the SDM, independently of the crate's own mask functions.

use vpmu::Vpmu;
use vpmu::model::{CpuModel, PRESET_NAMES};
use vpmu::msr::*;

#[derive(Debug, Clone, Copy)]
enum Expect {
    /// #GP on read and write.
    Absent,
    /// Read/write with reset value and writable mask.
    Rw { reset: u64, mask: u64 },
    /// Legacy IA32_PMCx: 32-bit write sign-extended, read masked to the width.
    LegacyPmc { width_mask: u64 },
    /// Read-only with this value.
    Ro(u64),
    /// Reads 0; writes within `mask` clear GLOBAL_STATUS bits.
    StatusReset { mask: u64 },
    /// Reads 0; writes within `mask` set GLOBAL_STATUS bits.
    StatusSet { mask: u64 },
    /// IA32_MISC_ENABLE: `ro` bits keep their reset value.
    Misc { reset: u64, ro: u64 },
    /// IA32_DS_AREA: any canonical address.
    Canonical,
}

fn ones(n: u32) -> u64 {
    if n >= 64 { u64::MAX } else { (1 << n) - 1 }
}

/// IA32_PERF_CAPABILITIES of the presets (Skylake-SP's real 0x33c5; the others composed from
/// the same fields).
fn caps(name: &str) -> Option<u64> {
    Some(match name {
        "core2" => 0xC1,
        "nehalem" => 0x11C3,
        "haswell" => 0x32C4,
        "skylake" => 0x33C5,
        "icelake-server" => 0x74C5,
        "sapphire-rapids" => 0x75C5,
        _ => return None,
    })
}

/// DEBUGCTL writable bits: LBR, BTF, TR, BTS, BTINT, BTS_OFF_OS, BTS_OFF_USR (SDM 17.4.1,
/// Figure 17-3: BTS is emulated and every preset reports it available in MISC_ENABLE[11]),
/// plus the freeze bits from v2, FREEZE_WHILE_SMM with PERF_CAPABILITIES[12] and RTM_DEBUG with
/// TSX. NetBurst MSR_DEBUGCTLA: LBR, BTF, TR, BTS, BTINT, BTS_OFF_OS, BTS_OFF_USR in bits 0-6
/// (SDM Figure 17-12).
fn debugctl(name: &str) -> u64 {
    match name {
        "netburst" => 0x7F,
        "core2" => 0x1FC3,
        "nehalem" => 0x5FC3,
        _ => 0xDFC3,
    }
}

fn pebs_enable(name: &str) -> u64 {
    match name {
        "netburst" => 0x301_FFFF,
        "core2" => 0x1,
        "icelake-server" | "sapphire-rapids" => 0xF_0000_00FF,
        _ => 0xF_0000_000F,
    }
}

/// The 43 ESCRs of a 64-bit Pentium 4 (no IQ_ESCR0/1, no 0x3BF).
fn is_escr(i: u32) -> bool {
    (0x3A0..=0x3B9).contains(&i)
        || (0x3BC..=0x3BE).contains(&i)
        || (0x3C0..=0x3C5).contains(&i)
        || (0x3C8..=0x3CD).contains(&i)
        || i == 0x3E0
        || i == 0x3E1
}

fn expect(m: &CpuModel, i: u32) -> Expect {
    use Expect::*;
    let name = m.name.as_str();
    let v = m.pmu_version;
    let gp = u32::from(m.num_gp);
    let in_range = |base: u32, n: u32| i >= base && i < base + n;
    let depth = u32::from(m.lbr_depth);
    let rw = |mask| Rw { reset: 0, mask };
    // Shared by both architectures.
    match i {
        0x1D9 => return rw(debugctl(name)),
        // Fast strings (0), perfmon available (7); BTS_UNAVAILABLE (11) clear since BTS is
        // emulated (SDM vol. 4 Table 2-2: "BTS_UNAVAILABLE: when clear, BTS is supported").
        0x1A0 => {
            return Misc {
                reset: 0x81,
                ro: 0x1880,
            };
        }
        0x600 => return Canonical,
        0x3F1 => return rw(pebs_enable(name)),
        _ => {}
    }
    if depth > 0 {
        let core2 = name == "core2";
        let (from, to) = if core2 { (0x40, 0x60) } else { (0x680, 0x6C0) };
        if i == 0x1C9 {
            return rw(u64::from(m.lbr_depth) - 1);
        }
        if i == 0x1C8 && !core2 {
            return rw(if m.lbr_format >= 4 { 0x3FF } else { 0x1FF });
        }
        if in_range(from, depth) || in_range(to, depth) {
            return rw(u64::MAX);
        }
        if in_range(0xDC0, depth) && m.lbr_format >= 5 {
            return rw(u64::MAX);
        }
    }
    if name == "netburst" {
        return match i {
            0x300..=0x311 => rw(ones(40)),
            0x360..=0x371 => rw(0xCFFF_F000),
            0x3F2 => rw(0x1F),
            _ if is_escr(i) => rw(0x7FFF_FFFF),
            _ => Absent,
        };
    }
    let gp_mask = ones(u32::from(m.gp_width));
    let fixed = (0..4)
        .filter(|&k| m.has_fixed(k))
        .fold(0u64, |a, k| a | 1 << k);
    let counters = ones(gp) | fixed << 32;
    if in_range(0xC1, gp) {
        return LegacyPmc {
            width_mask: gp_mask,
        };
    }
    if in_range(0x4C1, gp) {
        return if m.fw_write { rw(gp_mask) } else { Absent };
    }
    if in_range(0x186, gp) {
        let n = i - 0x186;
        let mut mask = 0xFFFF_FFFF;
        if v < 3 || m.anythread_deprecated {
            mask &= !(1 << 21);
        }
        if m.tsx {
            mask |= 1 << 32;
            if n == 2 {
                mask |= 1 << 33;
            }
        }
        if m.pebs_baseline {
            mask |= 1 << 34;
        }
        return rw(mask);
    }
    if in_range(0x309, 4) {
        return if fixed >> (i - 0x309) & 1 == 1 {
            rw(ones(u32::from(m.fixed_width)))
        } else {
            Absent
        };
    }
    let v4_status = if v >= 4 { 0xF << 58 } else { 0 };
    match i {
        0x38D => {
            let field = if v >= 3 && !m.anythread_deprecated {
                0xF
            } else {
                0xB
            };
            let mut mask = 0;
            for k in (0..4).filter(|k| fixed >> k & 1 == 1) {
                mask |= field << (4 * k);
                if m.pebs_baseline {
                    mask |= 1 << (32 + 4 * k);
                }
            }
            rw(mask)
        }
        0x38E => Ro(0),
        0x38F => Rw {
            reset: ones(gp),
            mask: counters,
        },
        0x390 => StatusReset {
            mask: counters | 3 << 62 | v4_status,
        },
        0x391 if v >= 4 => StatusSet {
            mask: counters | 1 << 62 | v4_status,
        },
        0x392 if v >= 4 => Ro(0),
        0x345 => caps(name).map_or(Absent, Ro),
        0x3F2 if m.pebs_format.is_adaptive() => rw(0xFF00_000F),
        0x3F6 if m.pebs_load_latency => rw(0xFFFF),
        0x3F7 if m.pebs_frontend => rw(0x7F_FF17),
        _ => Absent,
    }
}

/// xorshift64: deterministic random values.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn sext32(v: u64) -> u64 {
    let low = v & 0xFFFF_FFFF;
    if low >> 31 == 1 {
        low | 0xFFFF_FFFF_0000_0000
    } else {
        low
    }
}

fn check_index(m: &CpuModel, i: u32, rng: &mut Rng) {
    let ctx = format!("{} MSR {i:#x}", m.name);
    let fresh = || Vpmu::new(m.clone());
    let mut p = fresh();
    match expect(m, i) {
        Expect::Absent => {
            assert!(p.rdmsr(i).is_err(), "{ctx}: read of absent MSR");
            assert!(p.wrmsr(i, 0).is_err(), "{ctx}: write of absent MSR");
        }
        Expect::Rw { reset, mask } => {
            assert_eq!(p.rdmsr(i), Ok(reset), "{ctx}: reset");
            let all = p.wrmsr(i, u64::MAX);
            if mask == u64::MAX {
                assert_eq!(all, Ok(()), "{ctx}: all ones");
                assert_eq!(p.rdmsr(i), Ok(u64::MAX), "{ctx}");
            } else {
                assert!(all.is_err(), "{ctx}: all ones sets reserved bits");
                assert_eq!(p.rdmsr(i), Ok(reset), "{ctx}: #GP changed the MSR");
            }
            assert_eq!(p.wrmsr(i, mask), Ok(()), "{ctx}: writable mask");
            assert_eq!(p.rdmsr(i), Ok(mask), "{ctx}: read back mask");
            for _ in 0..8 {
                let r = rng.next() & mask;
                assert_eq!(p.wrmsr(i, r), Ok(()), "{ctx}: {r:#x}");
                assert_eq!(p.rdmsr(i), Ok(r), "{ctx}: read back {r:#x}");
            }
            for b in (0..64).filter(|b| mask >> b & 1 == 0) {
                assert!(p.wrmsr(i, 1 << b).is_err(), "{ctx}: reserved bit {b}");
            }
        }
        Expect::LegacyPmc { width_mask } => {
            assert_eq!(p.rdmsr(i), Ok(0), "{ctx}: reset");
            assert_eq!(p.wrmsr(i, u64::MAX), Ok(()));
            assert_eq!(p.rdmsr(i), Ok(width_mask), "{ctx}: all ones");
            for _ in 0..8 {
                let r = rng.next();
                assert_eq!(p.wrmsr(i, r), Ok(()));
                assert_eq!(p.rdmsr(i), Ok(sext32(r) & width_mask), "{ctx}: {r:#x}");
                if m.fw_write {
                    assert_eq!(
                        p.rdmsr(i + 0x400),
                        Ok(sext32(r) & width_mask),
                        "{ctx}: A_PMC"
                    );
                }
            }
            assert_eq!(p.rdpmc(i - 0xC1), Ok(p.rdmsr(i).unwrap()), "{ctx}: rdpmc");
        }
        Expect::Ro(v) => {
            assert_eq!(p.rdmsr(i), Ok(v), "{ctx}: value");
            assert!(p.wrmsr(i, v).is_err(), "{ctx}: write to read-only");
            assert!(p.wrmsr(i, 0).is_err(), "{ctx}: write to read-only");
            assert_eq!(p.rdmsr(i), Ok(v));
        }
        Expect::StatusReset { mask } => {
            assert_eq!(p.rdmsr(i), Ok(0), "{ctx}: reads 0");
            if m.pmu_version >= 4 {
                let set = mask & !(1 << 63);
                p.wrmsr(IA32_PERF_GLOBAL_STATUS_SET, set).unwrap();
                assert_eq!(p.rdmsr(IA32_PERF_GLOBAL_STATUS), Ok(set));
            }
            assert_eq!(p.wrmsr(i, mask), Ok(()), "{ctx}: mask");
            assert_eq!(
                p.rdmsr(IA32_PERF_GLOBAL_STATUS),
                Ok(0),
                "{ctx}: status cleared"
            );
            assert_eq!(p.wrmsr(i, rng.next() & mask), Ok(()));
            for b in (0..64).filter(|b| mask >> b & 1 == 0) {
                assert!(p.wrmsr(i, 1 << b).is_err(), "{ctx}: reserved bit {b}");
            }
        }
        Expect::StatusSet { mask } => {
            assert_eq!(p.rdmsr(i), Ok(0), "{ctx}: reads 0");
            let r = rng.next() & mask;
            assert_eq!(p.wrmsr(i, r), Ok(()));
            assert_eq!(p.rdmsr(IA32_PERF_GLOBAL_STATUS), Ok(r), "{ctx}: status set");
            assert_eq!(p.wrmsr(i, mask), Ok(()));
            assert_eq!(p.rdmsr(IA32_PERF_GLOBAL_STATUS), Ok(mask));
            for b in (0..64).filter(|b| mask >> b & 1 == 0) {
                assert!(p.wrmsr(i, 1 << b).is_err(), "{ctx}: reserved bit {b}");
            }
        }
        Expect::Misc { reset, ro } => {
            let reset = reset & !0x1000
                | if m.pebs_format == vpmu::model::PebsFormat::None {
                    0x1000
                } else {
                    0
                };
            assert_eq!(p.rdmsr(i), Ok(reset), "{ctx}: reset");
            assert_eq!(p.wrmsr(i, u64::MAX), Ok(()));
            assert_eq!(
                p.rdmsr(i),
                Ok(!ro | (reset & ro)),
                "{ctx}: PMU bits read-only"
            );
            assert_eq!(p.wrmsr(i, 0), Ok(()));
            assert_eq!(p.rdmsr(i), Ok(reset & ro), "{ctx}");
        }
        Expect::Canonical => {
            assert_eq!(p.rdmsr(i), Ok(0), "{ctx}: reset");
            for good in [0xFFFF_FE00_0000_1000u64, 0x0000_7FFF_FFFF_FFF8] {
                assert_eq!(p.wrmsr(i, good), Ok(()), "{ctx}: {good:#x}");
                assert_eq!(p.rdmsr(i), Ok(good));
            }
            assert!(
                p.wrmsr(i, 0x0000_8000_0000_0000).is_err(),
                "{ctx}: non-canonical"
            );
            assert!(p.wrmsr(i, u64::MAX >> 1).is_err(), "{ctx}: non-canonical");
            assert_eq!(p.rdmsr(i), Ok(0x0000_7FFF_FFFF_FFF8));
        }
    }
}

#[test]
fn every_msr_of_every_preset() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for name in PRESET_NAMES {
        let m = CpuModel::preset(name).unwrap();
        let ranges = vpmu::trapped_msrs(&m);
        assert!(ranges.len() <= 14, "{name}: {} ranges", ranges.len());
        let vp = Vpmu::new(m.clone());
        let mut present = 0;
        for r in &ranges {
            for i in r.clone() {
                assert!(vp.handles(i), "{name}: handles({i:#x})");
                check_index(&m, i, &mut rng);
                present += usize::from(!matches!(expect(&m, i), Expect::Absent));
            }
        }
        // Every MSR the table expects lies inside the trapped ranges.
        let expected = (0..=0xFFFu32).filter(|&i| !matches!(expect(&m, i), Expect::Absent));
        for i in expected {
            assert!(
                ranges.iter().any(|r| r.contains(&i)),
                "{name}: {i:#x} not trapped"
            );
        }
        assert!(present > 20, "{name}: only {present} MSRs");
        assert!(!vp.handles(0x10), "{name}: TSC trapped");
    }
}

#[test]
fn absent_counters_gp_and_rdpmc() {
    let c2 = CpuModel::preset("core2").unwrap();
    let mut p = Vpmu::new(c2);
    assert!(p.rdmsr(IA32_PMC0 + 2).is_err());
    assert!(p.wrmsr(IA32_PERFEVTSEL0 + 2, 0).is_err());
    assert!(p.rdmsr(IA32_FIXED_CTR0 + 3).is_err());
    assert!(p.rdpmc(2).is_err());
    assert!(p.rdpmc(RDPMC_FIXED | 3).is_err());
    assert!(p.rdpmc(RDPMC_FAST).is_err());
    p.wrmsr(IA32_FIXED_CTR0 + 1, 0xFF_1234_5678).unwrap();
    assert_eq!(p.rdpmc(RDPMC_FIXED | 1), Ok(0xFF_1234_5678));
    assert!(
        p.wrmsr(IA32_FIXED_CTR0 + 1, 1 << 40).is_err(),
        "beyond the 40-bit width"
    );

    let mut nb = Vpmu::new(CpuModel::preset("netburst").unwrap());
    nb.wrmsr(MSR_IQ_COUNTER4, 0xAB_1234_5678).unwrap();
    assert_eq!(nb.rdpmc(16), Ok(0xAB_1234_5678));
    assert_eq!(nb.rdpmc(16 | RDPMC_FAST), Ok(0x1234_5678));
    assert!(nb.rdpmc(18).is_err());
    assert!(nb.rdmsr(IA32_PERF_GLOBAL_STATUS).is_err());
    assert!(nb.rdmsr(IA32_PERF_CAPABILITIES).is_err());
}
