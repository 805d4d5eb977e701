//! Initial register state of each vCPU for the loaded kernel format.
//!
//! Call after `set_cpuid2` (KVM checks EFER.LME against the guest CPUID on some hosts) and,
//! with an in-kernel irqchip, after the vCPU is created. [`setup_vcpu`] writes regs, sregs and
//! FPU state; for [`KernelFormat::Elf64`] it also marks APs runnable (with an in-kernel LAPIC
//! they would otherwise wait for INIT/SIPI). For the other formats APs are left untouched.

use kvm_bindings::{
    KVM_MP_STATE_RUNNABLE, kvm_dtable, kvm_fpu, kvm_mp_state, kvm_regs, kvm_segment, kvm_sregs,
};
use kvm_ioctls::VcpuFd;

use super::multiboot::BOOTLOADER_MAGIC;
use super::paging::{GDT_ADDR, GDT_ELF64, GDT_LINUX64, GDT_PROTECTED32, PML4_ADDR};
use super::{BootError, BootInfo, KernelFormat};

/// CR0.PE.
pub const CR0_PE: u64 = 1 << 0;
/// CR0.MP.
pub const CR0_MP: u64 = 1 << 1;
/// CR0.ET.
pub const CR0_ET: u64 = 1 << 4;
/// CR0.NE.
pub const CR0_NE: u64 = 1 << 5;
/// CR0.PG.
pub const CR0_PG: u64 = 1 << 31;
/// CR4.PAE.
pub const CR4_PAE: u64 = 1 << 5;
/// CR4.OSFXSR.
pub const CR4_OSFXSR: u64 = 1 << 9;
/// CR4.OSXMMEXCPT.
pub const CR4_OSXMMEXCPT: u64 = 1 << 10;
/// EFER.LME.
pub const EFER_LME: u64 = 1 << 8;
/// EFER.LMA.
pub const EFER_LMA: u64 = 1 << 10;
/// RFLAGS bit 1 (reserved, always 1).
pub const RFLAGS_RESERVED: u64 = 1 << 1;
/// x87 control word after FNINIT.
pub const FCW_DEFAULT: u16 = 0x37F;
/// MXCSR reset value (all exceptions masked).
pub const MXCSR_DEFAULT: u32 = 0x1F80;

/// CR0 for long-mode entry: 0x8000_0033.
pub const CR0_LONG: u64 = CR0_PG | CR0_NE | CR0_ET | CR0_MP | CR0_PE;
/// CR4 for long-mode entry: 0x620.
pub const CR4_LONG: u64 = CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT;
/// CR0 for 32-bit protected-mode entry (paging off).
pub const CR0_PROTECTED: u64 = CR0_ET | CR0_PE;

const SEG_TYPE_CODE_XR_ACCESSED: u8 = 0xB;
const SEG_TYPE_DATA_RW_ACCESSED: u8 = 0x3;
const SEG_TYPE_TSS32_BUSY: u8 = 0xB;

fn flat_segment(selector: u16, type_: u8, long: bool) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xFFFF_FFFF,
        selector,
        type_,
        present: 1,
        dpl: 0,
        // D must be 0 when L is 1.
        db: u8::from(!long),
        s: 1,
        l: u8::from(long),
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

fn gdt_limit(entries: usize) -> u16 {
    u16::try_from(entries * 8 - 1).unwrap_or(u16::MAX)
}

fn kvm_err(what: &'static str, index: u8) -> impl FnOnce(kvm_ioctls::Error) -> BootError {
    move |source| BootError::Kvm {
        what,
        index,
        source,
    }
}

/// Long mode at CPL0 with the identity page tables at 0x9000.
fn long_mode(sregs: &mut kvm_sregs, code: u16, data: u16, gdt_entries: usize) {
    let data_seg = flat_segment(data, SEG_TYPE_DATA_RW_ACCESSED, false);
    sregs.cs = flat_segment(code, SEG_TYPE_CODE_XR_ACCESSED, true);
    sregs.ds = data_seg;
    sregs.es = data_seg;
    sregs.fs = data_seg;
    sregs.gs = data_seg;
    sregs.ss = data_seg;
    sregs.gdt = kvm_dtable {
        base: GDT_ADDR,
        limit: gdt_limit(gdt_entries),
        ..Default::default()
    };
    sregs.idt = kvm_dtable::default();
    sregs.cr0 = CR0_LONG;
    sregs.cr3 = PML4_ADDR;
    sregs.cr4 = CR4_LONG;
    sregs.efer = EFER_LME | EFER_LMA;
}

/// 32-bit flat protected mode, paging off, GDT [`GDT_PROTECTED32`] (0x08 code, 0x10 data,
/// 0x18 TSS).
fn protected_mode(sregs: &mut kvm_sregs) {
    let data_seg = flat_segment(0x10, SEG_TYPE_DATA_RW_ACCESSED, false);
    sregs.cs = flat_segment(0x08, SEG_TYPE_CODE_XR_ACCESSED, false);
    sregs.ds = data_seg;
    sregs.es = data_seg;
    sregs.fs = data_seg;
    sregs.gs = data_seg;
    sregs.ss = data_seg;
    sregs.tr = kvm_segment {
        base: 0,
        limit: 0x67,
        selector: 0x18,
        type_: SEG_TYPE_TSS32_BUSY,
        present: 1,
        s: 0,
        ..Default::default()
    };
    sregs.gdt = kvm_dtable {
        base: GDT_ADDR,
        limit: gdt_limit(GDT_PROTECTED32.len()),
        ..Default::default()
    };
    sregs.idt = kvm_dtable::default();
    sregs.cr0 = CR0_PROTECTED;
    sregs.cr3 = 0;
    sregs.cr4 = 0;
    sregs.efer = 0;
}

/// Byte offset of MXCSR in the legacy FXSAVE area at the start of `kvm_xsave`.
const XSAVE_MXCSR_WORD: usize = 24 / 4;
/// Low word of XSTATE_BV in the XSAVE header (byte 512).
const XSAVE_XSTATE_BV_WORD: usize = 512 / 4;
/// XSTATE_BV bit 1: SSE state present.
const XFEATURE_MASK_SSE: u32 = 1 << 1;

/// KVM_SET_FPU ignores `mxcsr` (and KVM_GET_FPU reports 0; see kvm_arch_vcpu_ioctl_set_fpu),
/// so MXCSR goes through the XSAVE image. A fresh vCPU already holds 0x1f80: only write it if
/// it differs.
fn set_mxcsr(vcpu: &VcpuFd, index: u8) -> Result<(), BootError> {
    let mut xsave = vcpu.get_xsave().map_err(kvm_err("KVM_GET_XSAVE", index))?;
    if xsave.region[XSAVE_MXCSR_WORD] == MXCSR_DEFAULT {
        return Ok(());
    }
    xsave.region[XSAVE_MXCSR_WORD] = MXCSR_DEFAULT;
    // The kernel loads MXCSR from the image only if XSTATE_BV has SSE or AVX set
    // (copy_uabi_to_xstate); SSE state = the (unchanged) XMM registers + MXCSR.
    xsave.region[XSAVE_XSTATE_BV_WORD] |= XFEATURE_MASK_SSE;
    // SAFETY: `xsave` is the 4 KiB image KVM_GET_XSAVE just filled. KVM_SET_XSAVE reads more
    // than 4 KiB only if the process enabled dynamic XSTATE features (AMX) for guests with
    // arch_prctl(ARCH_REQ_XCOMP_GUEST_PERM), which this VMM never does.
    unsafe { vcpu.set_xsave(&xsave) }.map_err(kvm_err("KVM_SET_XSAVE", index))
}

/// Set the entry state of vCPU `index` for the kernel described by `info`.
pub fn setup_vcpu(vcpu: &VcpuFd, index: u8, info: &BootInfo) -> Result<(), BootError> {
    let is_bsp = index == 0;
    if !is_bsp && info.format != KernelFormat::Elf64 {
        // Multiboot and Linux start their APs themselves with INIT/SIPI.
        return Ok(());
    }
    let mut sregs = vcpu.get_sregs().map_err(kvm_err("KVM_GET_SREGS", index))?;
    let mut regs = kvm_regs {
        rflags: RFLAGS_RESERVED,
        rip: info.entry,
        ..Default::default()
    };
    match info.format {
        KernelFormat::Elf64 => {
            long_mode(&mut sregs, 0x08, 0x10, GDT_ELF64.len());
            regs.rdi = u64::from(index);
            regs.rsi = info.mem_size;
            regs.rdx = info.boot_data;
        }
        KernelFormat::BzImage => {
            // __BOOT_CS / __BOOT_DS of the Linux boot protocol.
            long_mode(&mut sregs, 0x10, 0x18, GDT_LINUX64.len());
            regs.rsi = info.boot_data;
        }
        KernelFormat::Multiboot => {
            protected_mode(&mut sregs);
            regs.rax = u64::from(BOOTLOADER_MAGIC);
            regs.rbx = info.boot_data;
        }
        KernelFormat::PvhVmlinux => {
            protected_mode(&mut sregs);
            regs.rbx = info.boot_data;
        }
    }
    vcpu.set_sregs(&sregs)
        .map_err(kvm_err("KVM_SET_SREGS", index))?;
    vcpu.set_regs(&regs)
        .map_err(kvm_err("KVM_SET_REGS", index))?;
    let fpu = kvm_fpu {
        fcw: FCW_DEFAULT,
        mxcsr: MXCSR_DEFAULT,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).map_err(kvm_err("KVM_SET_FPU", index))?;
    set_mxcsr(vcpu, index)?;
    if info.format == KernelFormat::Elf64 && !is_bsp {
        vcpu.set_mp_state(kvm_mp_state {
            mp_state: KVM_MP_STATE_RUNNABLE,
        })
        .map_err(kvm_err("KVM_SET_MP_STATE", index))?;
    }
    Ok(())
}
