//! Emulated platform devices and the port-I/O / MMIO dispatcher that routes exits to them.

pub mod bus;
pub mod fw_cfg;
pub mod serial;
