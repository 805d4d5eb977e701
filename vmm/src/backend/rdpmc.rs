//! RDPMC emulation. Guest RDPMC raises #GP on this kind of host with no exit to user space, and
//! Linux reads its counters with RDPMC, so the VMM answers it itself:
//! - in precise mode the decoder sees RDPMC before it executes and the backend emulates it;
//! - in every mode a hardware breakpoint sits on the guest's #GP handler (IDT vector 13). When
//!   it fires, the exception frame tells where the fault came from; a faulting RDPMC with a
//!   valid index (and CPL 0 or CR4.PCE) is emulated and the guest resumes after it as if the
//!   #GP never happened; anything else runs the guest's handler.
//!
//! Limits: the breakpoint is re-armed when IDTR or gate 13 changes, checked at every PMU MSR
//! trap and every debug exit, so a guest that moves its IDT and executes RDPMC with no PMU MSR
//! access in between takes the #GP. A #GP handler reached through a task gate, or an IDT that
//! is not mapped, disables the intercept until the IDT changes again.

use kvm_bindings::{kvm_regs, kvm_segment};

/// #GP.
pub const GP_VECTOR: u64 = 13;
/// CR4.PCE: RDPMC allowed at CPL > 0.
pub const CR4_PCE: u64 = 1 << 8;
/// RDPMC opcode.
pub const RDPMC_OPCODE: [u8; 2] = [0x0f, 0x33];

/// The target of a 64-bit IDT gate, if it is a present interrupt or trap gate.
pub fn gate_handler(gate: &[u8; 16]) -> Option<u64> {
    let attr = gate[5];
    let present = attr & 0x80 != 0;
    let kind = attr & 0x0f;
    // 0xE interrupt gate, 0xF trap gate (64-bit).
    if !present || !(kind == 0xe || kind == 0xf) {
        return None;
    }
    let lo = u64::from(u16::from_le_bytes([gate[0], gate[1]]));
    let mid = u64::from(u16::from_le_bytes([gate[6], gate[7]]));
    let hi = u64::from(u32::from_le_bytes([gate[8], gate[9], gate[10], gate[11]]));
    Some(lo | (mid << 16) | (hi << 32))
}

/// Whether RDPMC may execute at `cpl` under `cr4` (SDM RDPMC: CPL 0 or CR4.PCE).
pub fn allowed(cpl: u8, cr4: u64) -> bool {
    cpl == 0 || cr4 & CR4_PCE != 0
}

/// The 64-bit exception frame the CPU pushed for #GP (which has an error code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpFrame {
    /// Error code.
    pub error: u64,
    /// Faulting RIP.
    pub rip: u64,
    /// CS selector at the fault.
    pub cs: u64,
    /// RFLAGS at the fault.
    pub rflags: u64,
    /// RSP at the fault.
    pub rsp: u64,
    /// SS selector at the fault.
    pub ss: u64,
}

impl GpFrame {
    /// Parses the six quadwords at RSP on handler entry.
    pub fn parse(q: &[u64; 6]) -> Self {
        Self {
            error: q[0],
            rip: q[1],
            cs: q[2],
            rflags: q[3],
            rsp: q[4],
            ss: q[5],
        }
    }

    /// CPL of the faulting code.
    pub fn cpl(&self) -> u8 {
        (self.cs & 3) as u8
    }
}

/// Registers after emulating RDPMC at the frame's RIP with `value`, returning to the faulting
/// context as IRETQ would (RSP, RFLAGS, RIP after the 2-byte instruction).
pub fn resume_regs(mut regs: kvm_regs, frame: &GpFrame, value: u64) -> kvm_regs {
    regs.rax = value & 0xffff_ffff;
    regs.rdx = value >> 32;
    regs.rip = frame.rip.wrapping_add(2);
    regs.rsp = frame.rsp;
    regs.rflags = frame.rflags;
    regs
}

/// A KVM segment from a GDT descriptor (for returning to CPL 3 without the guest's IRETQ).
pub fn segment_from_descriptor(selector: u16, desc: u64) -> kvm_segment {
    let base = ((desc >> 16) & 0xff_ffff) | (((desc >> 56) & 0xff) << 24);
    let limit_raw = (desc & 0xffff) | (((desc >> 48) & 0xf) << 16);
    let g = ((desc >> 55) & 1) as u8;
    let limit = if g == 1 {
        (limit_raw << 12) | 0xfff
    } else {
        limit_raw
    };
    kvm_segment {
        base,
        limit: u32::try_from(limit).unwrap_or(u32::MAX),
        selector,
        type_: ((desc >> 40) & 0xf) as u8,
        present: ((desc >> 47) & 1) as u8,
        dpl: ((desc >> 45) & 3) as u8,
        db: ((desc >> 54) & 1) as u8,
        s: ((desc >> 44) & 1) as u8,
        l: ((desc >> 53) & 1) as u8,
        g,
        avl: ((desc >> 52) & 1) as u8,
        unusable: 0,
        padding: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates() {
        // Handler 0xffff_8000_1234_5678, selector 8, present interrupt gate.
        let mut g = [0u8; 16];
        g[0..2].copy_from_slice(&0x5678u16.to_le_bytes());
        g[2..4].copy_from_slice(&8u16.to_le_bytes());
        g[5] = 0x8e;
        g[6..8].copy_from_slice(&0x1234u16.to_le_bytes());
        g[8..12].copy_from_slice(&0xffff_8000u32.to_le_bytes());
        assert_eq!(gate_handler(&g), Some(0xffff_8000_1234_5678));
        g[5] = 0x8f;
        assert!(gate_handler(&g).is_some());
        g[5] = 0x0e; // not present
        assert_eq!(gate_handler(&g), None);
        g[5] = 0x85; // task gate
        assert_eq!(gate_handler(&g), None);
    }

    #[test]
    fn privilege() {
        assert!(allowed(0, 0));
        assert!(!allowed(3, 0));
        assert!(allowed(3, CR4_PCE));
    }

    #[test]
    fn resume_after_rdpmc() {
        let f = GpFrame::parse(&[0, 0x1000, 0x23, 0x202, 0x8000, 0x1b]);
        assert_eq!(f.cpl(), 3);
        let r = resume_regs(
            kvm_regs {
                rsp: 0x7000,
                rip: 0x5000,
                ..Default::default()
            },
            &f,
            0x1_2345_6789,
        );
        assert_eq!(
            (r.rax, r.rdx, r.rip, r.rsp, r.rflags),
            (0x2345_6789, 1, 0x1002, 0x8000, 0x202)
        );
    }

    #[test]
    fn descriptors() {
        let cs = segment_from_descriptor(0x23, 0x00af_fb00_0000_ffff);
        assert_eq!(
            (cs.l, cs.dpl, cs.type_, cs.present, cs.s, cs.g),
            (1, 3, 0xb, 1, 1, 1)
        );
        assert_eq!(cs.limit, 0xffff_ffff);
        let ds = segment_from_descriptor(0x1b, 0x00cf_f300_0000_ffff);
        assert_eq!((ds.db, ds.dpl, ds.type_), (1, 3, 3));
    }
}
