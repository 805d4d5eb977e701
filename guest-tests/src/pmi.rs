//! Performance-monitoring interrupts. The vmm delivers a counter overflow through LVTPC: either a
//! fixed vector ([`PMI_VECTOR`], what [`lvtpc_fixed`] programs) or an NMI (vector 2, LVTPC delivery
//! mode NMI, as Linux uses). Both paths count and call the pluggable hook; the fixed-vector path
//! also sends EOI. Like hardware, the hook must unmask LVTPC itself if it wants further PMIs.

use crate::idt::TrapFrame;
use crate::lapic;
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// Fixed vector the runtime uses for PMIs.
pub const PMI_VECTOR: u8 = 0xf0;

/// A PMI hook: runs in the handler (CPL0, IF=0) with the interrupted frame.
pub type PmiHook = fn(&mut TrapFrame);

static PMI_COUNT: AtomicU64 = AtomicU64::new(0);
static NMI_COUNT: AtomicU64 = AtomicU64::new(0);
static HOOK: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());

/// LVTPC value for fixed delivery on [`PMI_VECTOR`], unmasked.
pub fn lvtpc_fixed() -> u32 {
    u32::from(PMI_VECTOR)
}

/// LVTPC value for NMI delivery, unmasked.
pub fn lvtpc_nmi() -> u32 {
    lapic::DELIVERY_NMI
}

/// Install (Some) or remove (None) the hook.
pub fn set_hook(hook: Option<PmiHook>) {
    let p = hook.map_or(core::ptr::null_mut(), |h| h as *mut ());
    HOOK.store(p, Ordering::SeqCst);
}

/// PMIs seen on the fixed vector plus NMIs (either may carry a PMI).
pub fn pmi_count() -> u64 {
    PMI_COUNT.load(Ordering::SeqCst) + NMI_COUNT.load(Ordering::SeqCst)
}

/// PMIs seen on the fixed vector.
pub fn fixed_count() -> u64 {
    PMI_COUNT.load(Ordering::SeqCst)
}

/// NMIs seen.
pub fn nmi_count() -> u64 {
    NMI_COUNT.load(Ordering::SeqCst)
}

fn call_hook(frame: &mut TrapFrame) {
    let p = HOOK.load(Ordering::SeqCst);
    if !p.is_null() {
        // SAFETY: HOOK only ever holds null or a `PmiHook` stored by `set_hook`.
        let hook = unsafe { core::mem::transmute::<*mut (), PmiHook>(p) };
        hook(frame);
    }
}

/// Handler for the fixed PMI vector.
pub(crate) fn on_pmi(frame: &mut TrapFrame) {
    PMI_COUNT.fetch_add(1, Ordering::SeqCst);
    call_hook(frame);
    lapic::eoi();
}

/// Handler for NMI (no EOI: NMIs are not in-service in the APIC).
pub(crate) fn on_nmi(frame: &mut TrapFrame) {
    NMI_COUNT.fetch_add(1, Ordering::SeqCst);
    call_hook(frame);
}
