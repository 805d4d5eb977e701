//! The isa-debug-exit device at port 0xf4: the vmm exits with status `(code << 1) | 1`.

use crate::port::outl;

/// Port of the exit device.
pub const EXIT_PORT: u16 = 0xf4;

/// Stop the VM with `code` (0 = all tests passed, 1 = a test failed).
pub fn exit(code: u32) -> ! {
    outl(EXIT_PORT, code);
    // Only reached if the vmm ignored the write; HLT with IF=0 parks the vCPU for good.
    loop {
        crate::cpu::cli_hlt();
    }
}
