//! A shared cell for the single-threaded guest runtime.
//!
//! Only the BSP runs runtime code (APs park before touching any of it), so the only concurrency
//! is an exception or interrupt handler interrupting the code it runs on. Values that a handler
//! and the interrupted code both touch are accessed with volatile copies, never references.

use core::cell::UnsafeCell;

/// A value shared between the BSP's normal flow and its trap handlers.
pub struct Racy<T>(UnsafeCell<T>);

// SAFETY: one CPU uses the runtime state (APs never touch it); accesses are whole-value volatile
// copies, so an interrupting handler sees either the old or the new value of a field it reads.
unsafe impl<T> Sync for Racy<T> {}

impl<T> Racy<T> {
    /// A cell holding `v`.
    pub const fn new(v: T) -> Self {
        Self(UnsafeCell::new(v))
    }

    /// Raw pointer to the value, for assembly (or stacks) that use it in place.
    pub fn as_ptr(&self) -> *mut T {
        self.0.get()
    }
}

impl<T: Copy> Racy<T> {
    /// Copy the value out.
    pub fn get(&self) -> T {
        // SAFETY: the pointer comes from a live UnsafeCell; volatile whole-value read (see type docs).
        unsafe { self.0.get().read_volatile() }
    }

    /// Replace the value.
    pub fn set(&self, v: T) {
        // SAFETY: as in `get`.
        unsafe { self.0.get().write_volatile(v) }
    }
}
