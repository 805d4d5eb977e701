//! A PEBS record of any format, as the union of every format's fields (`None` where the format
//! lacks one), and its human-readable form.

use std::fmt;

use crate::model::PebsFormat;
use crate::state::{Gprs, LbrEntry};

/// One decoded (or about to be encoded) PEBS record.
///
/// Legacy formats (NetBurst, 0-3) always carry `gprs`; `gprs.rip` is the record's IP field
/// (trap-like: after the instruction). Adaptive formats carry `gprs`, memory fields, `xmm` and
/// `lbr` only when `record_format` names the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PebsRecord {
    /// Record format.
    pub format: PebsFormat,
    /// RFLAGS, IP and general-purpose registers.
    pub gprs: Option<Gprs>,
    /// IA32_PERF_GLOBAL_STATUS before the assist (formats 1 and 2, offset 0x90).
    pub global_status: Option<u64>,
    /// Applicable counters, GLOBAL_STATUS bit layout (format 3 offset 0x90; adaptive basic).
    pub applicable: Option<u64>,
    /// Data linear address (formats 1-3; adaptive memory-info group).
    pub data_addr: Option<u64>,
    /// Data source encoding (formats 1-3; adaptive memory-info "aux").
    pub data_source: Option<u64>,
    /// Load latency in core cycles (formats 1-3; adaptive memory-info).
    pub latency: Option<u64>,
    /// Eventing IP (format 2+ `real_ip`; adaptive basic `ip`).
    pub eventing_ip: Option<u64>,
    /// TSX tuning / abort information (format 2-3; adaptive memory-info).
    pub tsx_tuning: Option<u64>,
    /// TSC at the assist (format 3; adaptive basic).
    pub tsc: Option<u64>,
    /// Adaptive basic-group "Record Format" bits 47:0 (MSR_PEBS_DATA_CFG as applied).
    pub record_format: Option<u64>,
    /// XMM0-15 (adaptive XMM group).
    pub xmm: Option<[u128; 16]>,
    /// LBR entries, newest first (adaptive LBR group).
    pub lbr: Option<Vec<LbrEntry>>,
}

impl PebsRecord {
    /// A record of `format` with no fields.
    pub fn empty(format: PebsFormat) -> Self {
        Self {
            format,
            gprs: None,
            global_status: None,
            applicable: None,
            data_addr: None,
            data_source: None,
            latency: None,
            eventing_ip: None,
            tsx_tuning: None,
            tsc: None,
            record_format: None,
            xmm: None,
            lbr: None,
        }
    }

    /// The record's IP field (legacy `ip`; adaptive GPR-group `ip`).
    pub fn ip(&self) -> Option<u64> {
        self.gprs.map(|g| g.rip)
    }
}

fn format_name(f: PebsFormat) -> &'static str {
    match f {
        PebsFormat::None => "none",
        PebsFormat::Netburst => "netburst",
        PebsFormat::Fmt0 => "fmt0",
        PebsFormat::Fmt1 => "fmt1",
        PebsFormat::Fmt2 => "fmt2",
        PebsFormat::Fmt3 => "fmt3",
        PebsFormat::Fmt4 => "fmt4",
        PebsFormat::Fmt5 => "fmt5",
    }
}

impl fmt::Display for PebsRecord {
    /// First line: format, IPs, status and memory fields; then registers, XMM and LBR lines.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PEBS {}", format_name(self.format))?;
        let opt = |f: &mut fmt::Formatter<'_>, name: &str, v: Option<u64>| match v {
            Some(v) => write!(f, " {name}={v:#x}"),
            None => Ok(()),
        };
        opt(f, "cfg", self.record_format)?;
        opt(f, "ip", self.ip())?;
        opt(f, "eventing_ip", self.eventing_ip)?;
        opt(f, "status", self.global_status)?;
        opt(f, "applicable", self.applicable)?;
        opt(f, "dla", self.data_addr)?;
        opt(f, "dse", self.data_source)?;
        if let Some(l) = self.latency {
            write!(f, " lat={l}")?;
        }
        opt(f, "tsx", self.tsx_tuning)?;
        if let Some(t) = self.tsc {
            write!(f, " tsc={t}")?;
        }
        if let Some(g) = &self.gprs {
            write!(
                f,
                "\n  rflags={:#x} rax={:#x} rbx={:#x} rcx={:#x} rdx={:#x} rsi={:#x} rdi={:#x} \
                 rbp={:#x} rsp={:#x}",
                g.rflags, g.rax, g.rbx, g.rcx, g.rdx, g.rsi, g.rdi, g.rbp, g.rsp
            )?;
            write!(
                f,
                "\n  r8={:#x} r9={:#x} r10={:#x} r11={:#x} r12={:#x} r13={:#x} r14={:#x} r15={:#x}",
                g.r8, g.r9, g.r10, g.r11, g.r12, g.r13, g.r14, g.r15
            )?;
        }
        if let Some(x) = &self.xmm {
            for (i, v) in x.iter().enumerate() {
                write!(f, "\n  xmm{i}={v:#034x}")?;
            }
        }
        if let Some(l) = &self.lbr {
            for (i, e) in l.iter().enumerate() {
                write!(
                    f,
                    "\n  lbr[{i}] from={:#x} to={:#x} info={:#x}",
                    e.from, e.to, e.info
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_lists_present_fields_only() {
        let mut r = PebsRecord::empty(PebsFormat::Fmt3);
        r.gprs = Some(Gprs {
            rip: 0x401000,
            rax: 7,
            ..Gprs::default()
        });
        r.applicable = Some(1);
        r.tsc = Some(42);
        let s = r.to_string();
        assert!(
            s.starts_with("PEBS fmt3 ip=0x401000 applicable=0x1 tsc=42"),
            "{s}"
        );
        assert!(s.contains("rax=0x7"));
        assert!(!s.contains("dla"));
        assert!(!s.contains("xmm"));
    }
}
