//! Start-up probe: can KVM guest debug single-step CPL3 code on this host? (On PVM-based KVM
//! it cannot: single-step exits stop at a return to CPL3.) A throwaway VM runs three NOPs at
//! CPL3 under single-step; the answer decides whether the precise backend counts CPL3.

use kvm_bindings::{
    KVM_GUESTDBG_ENABLE, KVM_GUESTDBG_SINGLESTEP, kvm_guest_debug, kvm_userspace_memory_region,
};
use kvm_ioctls::{Kvm, VcpuExit};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

const MEM_SIZE: usize = 0x10000;
const PML4: u64 = 0x1000;
const PDPT: u64 = 0x2000;
const PD: u64 = 0x3000;
const CODE: u64 = 0x4000;
/// P | RW | US, and PS for the 2 MiB leaf.
const PTE_TABLE: u64 = 0x7;
const PTE_LARGE: u64 = 0x87;
/// nop; nop; nop; out 0xf4, al
const PROBE_CODE: [u8; 5] = [0x90, 0x90, 0x90, 0xe6, 0xf4];

/// Runs the probe; any failure to set it up counts as "no" (the conservative answer).
pub fn cpl3_single_step_works(kvm: &Kvm) -> bool {
    probe(kvm).unwrap_or(false)
}

fn probe(kvm: &Kvm) -> Option<bool> {
    let vm = kvm.create_vm().ok()?;
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).ok()?;
    mem.write_obj(PDPT | PTE_TABLE, GuestAddress(PML4)).ok()?;
    mem.write_obj(PD | PTE_TABLE, GuestAddress(PDPT)).ok()?;
    mem.write_obj(PTE_LARGE, GuestAddress(PD)).ok()?;
    mem.write_slice(&PROBE_CODE, GuestAddress(CODE)).ok()?;
    let host = mem.get_host_address(GuestAddress(0)).ok()?;
    let region = kvm_userspace_memory_region {
        slot: 0,
        guest_phys_addr: 0,
        memory_size: MEM_SIZE as u64,
        userspace_addr: host as u64,
        flags: 0,
    };
    // SAFETY: `mem` maps MEM_SIZE bytes at `host` and outlives the VM (both drop at the end of
    // this function, the VM first).
    unsafe { vm.set_user_memory_region(region) }.ok()?;
    let mut vcpu = vm.create_vcpu(0).ok()?;
    let cpuid = kvm
        .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .ok()?;
    vcpu.set_cpuid2(&cpuid).ok()?;
    let mut s = vcpu.get_sregs().ok()?;
    s.cr3 = PML4;
    s.cr4 = 0x20; // PAE
    s.cr0 = 0x8000_0031; // PG | NE | ET | PE
    s.efer = 0x500; // LME | LMA
    s.cs.selector = 0x33;
    s.cs.base = 0;
    s.cs.limit = 0xffff_ffff;
    s.cs.type_ = 0xb;
    s.cs.s = 1;
    s.cs.dpl = 3;
    s.cs.present = 1;
    s.cs.l = 1;
    s.cs.db = 0;
    s.cs.g = 1;
    let mut data = s.cs;
    data.selector = 0x2b;
    data.type_ = 0x3;
    data.l = 0;
    data.db = 1;
    s.ss = data;
    s.ds = data;
    s.es = data;
    vcpu.set_sregs(&s).ok()?;
    let mut r = vcpu.get_regs().ok()?;
    r.rip = CODE;
    r.rflags = 0x3002; // IOPL 3 so the OUT works at CPL3
    r.rsp = 0x8000;
    vcpu.set_regs(&r).ok()?;
    let dbg = kvm_guest_debug {
        control: KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_SINGLESTEP,
        ..Default::default()
    };
    vcpu.set_guest_debug(&dbg).ok()?;
    let mut steps = 0;
    for _ in 0..16 {
        match vcpu.run().ok()? {
            VcpuExit::Debug(_) => steps += 1,
            VcpuExit::IoOut(..) => break,
            _ => return Some(false),
        }
    }
    Some(steps >= PROBE_CODE.len() - 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_answers() {
        let Ok(kvm) = Kvm::new() else { return };
        // PVM-based KVM cannot single-step CPL3; VMX/SVM KVM can.
        let pvm = std::path::Path::new("/sys/module/kvm_pvm").exists();
        assert_eq!(cpl3_single_step_works(&kvm), !pvm);
    }
}
