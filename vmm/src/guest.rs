//! The guest as vpmu sees it: physical memory over the VMM's mmap'ed RAM, and the CPU state
//! read from KVM at an overflow.

use kvm_bindings::{Msrs, kvm_msr_entry, kvm_regs, kvm_sregs};
use kvm_ioctls::VcpuFd;
use thiserror::Error;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vpmu::mem::{GuestMemory, MemError};
use vpmu::state::{Gprs, PagingRegs};

/// IA32_TIME_STAMP_COUNTER.
const IA32_TSC: u32 = 0x10;

/// Reading the guest state failed.
#[derive(Debug, Error)]
pub enum GuestStateError {
    /// A KVM_GET_* ioctl failed.
    #[error("{what} failed: {err}")]
    Kvm {
        /// Which call.
        what: &'static str,
        /// The error.
        err: kvm_ioctls::Error,
    },
}

/// Guest RAM for vpmu: every access must lie inside one RAM region, else it fails whole.
pub struct Ram<'a>(pub &'a GuestMemoryMmap<()>);

impl GuestMemory for Ram<'_> {
    fn read_phys(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.0
            .read_slice(buf, GuestAddress(gpa))
            .map_err(|_| MemError::NotRam {
                gpa,
                len: buf.len(),
            })
    }
    fn write_phys(&mut self, gpa: u64, data: &[u8]) -> Result<(), MemError> {
        // write_slice may copy a prefix before failing at a hole; check the whole range first
        // so nothing is written unless all of it is RAM.
        if !fits(self.0, gpa, data.len()) {
            return Err(MemError::NotRam {
                gpa,
                len: data.len(),
            });
        }
        self.0
            .write_slice(data, GuestAddress(gpa))
            .map_err(|_| MemError::NotRam {
                gpa,
                len: data.len(),
            })
    }
}

/// Whether [gpa, gpa+len) is entirely guest RAM.
fn fits(mem: &GuestMemoryMmap<()>, gpa: u64, len: usize) -> bool {
    let Some(end) = u64::try_from(len).ok().and_then(|l| gpa.checked_add(l)) else {
        return false;
    };
    if len == 0 {
        return mem.address_in_range(GuestAddress(gpa));
    }
    let mut a = gpa;
    while a < end {
        let Some(region) = mem.find_region(GuestAddress(a)) else {
            return false;
        };
        let region_end = region.start_addr().0 + region.len();
        a = region_end.min(end);
    }
    true
}

/// Converts KVM registers to vpmu's.
pub fn gprs(r: &kvm_regs) -> Gprs {
    Gprs {
        rax: r.rax,
        rbx: r.rbx,
        rcx: r.rcx,
        rdx: r.rdx,
        rsi: r.rsi,
        rdi: r.rdi,
        rbp: r.rbp,
        rsp: r.rsp,
        r8: r.r8,
        r9: r.r9,
        r10: r.r10,
        r11: r.r11,
        r12: r.r12,
        r13: r.r13,
        r14: r.r14,
        r15: r.r15,
        rip: r.rip,
        rflags: r.rflags,
    }
}

/// The paging controls from KVM special registers.
pub fn paging(s: &kvm_sregs) -> PagingRegs {
    PagingRegs {
        cr0: s.cr0,
        cr3: s.cr3,
        cr4: s.cr4,
        efer: s.efer,
    }
}

/// CPL: the DPL of SS (SDM 5.5; CS.DPL differs for conforming code).
pub fn cpl(s: &kvm_sregs) -> u8 {
    s.ss.dpl & 3
}

/// The guest's TSC.
pub fn read_tsc(vcpu: &VcpuFd) -> Result<u64, GuestStateError> {
    let mut msrs = Msrs::from_entries(&[kvm_msr_entry {
        index: IA32_TSC,
        ..Default::default()
    }])
    .map_err(|_| GuestStateError::Kvm {
        what: "KVM_GET_MSRS (TSC)",
        err: kvm_ioctls::Error::new(libc::ENOMEM),
    })?;
    vcpu.get_msrs(&mut msrs)
        .map_err(|err| GuestStateError::Kvm {
            what: "KVM_GET_MSRS (TSC)",
            err,
        })?;
    Ok(msrs.as_slice()[0].data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ram_refuses_accesses_outside() {
        let m = GuestMemoryMmap::<()>::from_ranges(&[
            (GuestAddress(0), 0x2000),
            (GuestAddress(0x4000), 0x1000),
        ])
        .unwrap();
        let mut ram = Ram(&m);
        ram.write_u64(0x1ff8, 7).unwrap();
        assert_eq!(ram.read_u64(0x1ff8).unwrap(), 7);
        // Straddles the hole at 0x2000: refused whole, nothing written.
        assert!(ram.write_phys(0x1ffc, &[1; 8]).is_err());
        assert_eq!(ram.read_u64(0x1ff8).unwrap(), 7);
        assert!(ram.write_u64(0x3000, 1).is_err());
        assert!(ram.write_u64(0x4ff8, 1).is_ok());
        assert!(ram.write_u64(0x4ffc, 1).is_err());
        assert!(ram.write_u64(u64::MAX - 3, 1).is_err());
    }
}
