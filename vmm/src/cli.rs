//! Command-line interface: `vmm run ...`. Parsing helpers are pure and unit-tested.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use thiserror::Error;

/// A command-line value that parsed as a string but means nothing.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CliError {
    /// `--mem` was not a size.
    #[error(
        "--mem {0:?} is not a size: write a number with an optional K, M or G suffix, e.g. --mem 256M"
    )]
    BadMemSize(String),
    /// `--mem` was below the minimum the boot formats need.
    #[error("--mem {got} is too small: give at least {min} bytes (e.g. --mem 16M)")]
    MemTooSmall {
        /// What the user asked for.
        got: u64,
        /// The minimum.
        min: u64,
    },
    /// `--mem` was beyond what this VMM maps.
    #[error("--mem {got} is too large: at most {max} bytes (64G) can be given to a guest")]
    MemTooLarge {
        /// What the user asked for.
        got: u64,
        /// The maximum.
        max: u64,
    },
    /// `--vcpus` was 0 or too many.
    #[error("--vcpus {0} is out of range: give 1 to 64")]
    BadVcpus(u8),
}

/// A KVM-based VMM whose virtual PMU lives in user space and writes Intel PEBS records in software.
#[derive(Debug, Parser)]
#[command(name = "vmm", version, about, long_about = None, args_override_self = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Boot a guest: a 64-bit ELF test program, a multiboot v1 kernel (kvm-unit-tests style),
    /// or Linux (bzImage or PVH vmlinux). The guest's serial console goes to stdout; a write of
    /// V to port 0xf4 ends the run with exit status (V << 1) | 1.
    Run(RunArgs),
    /// Re-execute a trace recorded with `vmm run --trace-msr` against the virtual PMU, without
    /// KVM, and report the first divergence (exit status 1) or the statistics (0).
    Replay(ReplayArgs),
}

/// `vmm replay` arguments.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The trace file.
    #[arg(value_name = "FILE")]
    pub trace: PathBuf,
    /// Replay against this CPU model instead of the one in the trace header.
    #[arg(long, value_name = "NAME|FILE")]
    pub cpu_model: Option<String>,
}

/// Counting backend for the guest's performance counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PmuBackend {
    /// Count exactly in software by single-stepping the guest while counters are enabled.
    Precise,
    /// Map guest counters onto host perf events.
    Perf,
    /// Hardware events where the host has a PMU, else the host clock.
    Auto,
    /// No counting: PMU MSRs still behave, counters stay where the guest wrote them.
    Off,
}

/// Where the guest's serial console goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SerialOut {
    /// This process's stdout.
    Stdout,
    /// A file (created or truncated).
    File(PathBuf),
}

/// `vmm run` arguments.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Guest kernel: ELF64 test program, ELF32 multiboot kernel, bzImage or PVH vmlinux.
    #[arg(long, value_name = "PATH")]
    pub kernel: PathBuf,
    /// Initial ramdisk for Linux guests.
    #[arg(long, value_name = "PATH")]
    pub initrd: Option<PathBuf>,
    /// Kernel command line (Linux, multiboot). For Linux, console=ttyS0 is added if absent.
    #[arg(long, value_name = "STR", default_value = "")]
    pub cmdline: String,
    /// Guest RAM, with an optional K, M or G suffix.
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = parse_mem_size)]
    pub mem: u64,
    /// Number of vCPUs; each has its own virtual PMU.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub vcpus: u8,
    /// CPU model the guest sees: a preset name (netburst, core2, nehalem, haswell, skylake,
    /// icelake-server, sapphire-rapids) or a path to a model TOML file.
    #[arg(long, value_name = "NAME|FILE", default_value = "skylake")]
    pub cpu_model: String,
    /// How guest counters count.
    #[arg(long, value_enum, default_value_t = PmuBackend::Auto)]
    pub pmu_backend: PmuBackend,
    /// Stop a guest that has not exited after this many seconds (0: never).
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    pub timeout: u64,
    /// Precise backend: single-step every instruction instead of running straight-line blocks
    /// between breakpoints (for measuring what block stepping gains).
    #[arg(long)]
    pub no_block_stepping: bool,
    /// At exit, decode the guest's PEBS buffer (IA32_DS_AREA) with vpmu's decoder and print
    /// every record.
    #[arg(long)]
    pub dump_pebs: bool,
    /// Record every PMU MSR trap, count, overflow and PMI to FILE (vCPU 0; vCPU N writes
    /// FILE.N) in the line format of vpmu/src/trace.rs, for `vmm replay`.
    #[arg(long, value_name = "FILE")]
    pub trace_msr: Option<PathBuf>,
    /// Serial console destination: `stdout` or a file path.
    #[arg(long, value_name = "stdout|FILE", default_value = "stdout", value_parser = parse_serial)]
    pub serial: SerialOut,
}

/// Smallest guest RAM accepted: boot structures live below 64 KiB and programs load at 1 MiB.
pub const MIN_MEM: u64 = 2 << 20;
/// Largest guest RAM accepted.
pub const MAX_MEM: u64 = 64 << 30;

/// Parses `256M`, `1G`, `65536`, `512k` into bytes, within [MIN_MEM, MAX_MEM].
pub fn parse_mem_size(s: &str) -> Result<u64, CliError> {
    let bad = || CliError::BadMemSize(s.to_string());
    let t = s.trim();
    let (digits, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                _ => return Err(bad()),
            };
            (&t[..i], shift)
        }
        Some(_) => (t, 0),
        None => return Err(bad()),
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let bytes = n.checked_mul(1u64 << shift).ok_or(CliError::MemTooLarge {
        got: u64::MAX,
        max: MAX_MEM,
    })?;
    if bytes < MIN_MEM {
        return Err(CliError::MemTooSmall {
            got: bytes,
            min: MIN_MEM,
        });
    }
    if bytes > MAX_MEM {
        return Err(CliError::MemTooLarge {
            got: bytes,
            max: MAX_MEM,
        });
    }
    Ok(bytes)
}

fn parse_serial(s: &str) -> Result<SerialOut, String> {
    match s {
        "stdout" => Ok(SerialOut::Stdout),
        "" => Err("--serial needs `stdout` or a file path".to_string()),
        p => Ok(SerialOut::File(PathBuf::from(p))),
    }
}

impl RunArgs {
    /// Checks what clap cannot.
    pub fn validate(&self) -> Result<(), CliError> {
        if self.vcpus == 0 || self.vcpus > 64 {
            return Err(CliError::BadVcpus(self.vcpus));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_sizes() {
        assert_eq!(parse_mem_size("256M"), Ok(256 << 20));
        assert_eq!(parse_mem_size("1g"), Ok(1 << 30));
        assert_eq!(parse_mem_size("4096k"), Ok(4 << 20));
        assert_eq!(parse_mem_size("3145728"), Ok(3 << 20));
        assert_eq!(
            parse_mem_size("12X"),
            Err(CliError::BadMemSize("12X".into()))
        );
        assert_eq!(parse_mem_size(""), Err(CliError::BadMemSize(String::new())));
        assert_eq!(parse_mem_size("M"), Err(CliError::BadMemSize("M".into())));
        assert_eq!(
            parse_mem_size("1M"),
            Err(CliError::MemTooSmall {
                got: 1 << 20,
                min: MIN_MEM
            })
        );
        assert!(matches!(
            parse_mem_size("65G"),
            Err(CliError::MemTooLarge { .. })
        ));
        assert!(matches!(
            parse_mem_size("99999999999999999G"),
            Err(CliError::MemTooLarge { .. })
        ));
    }

    #[test]
    fn cli_parses_run() {
        let cli = Cli::try_parse_from([
            "vmm",
            "run",
            "--kernel",
            "k",
            "--mem",
            "128M",
            "--vcpus",
            "2",
            "--pmu-backend",
            "precise",
            "--serial",
            "/tmp/x",
        ])
        .unwrap();
        let Command::Run(a) = cli.command else {
            panic!("run")
        };
        assert_eq!(a.mem, 128 << 20);
        assert_eq!(a.vcpus, 2);
        assert_eq!(a.pmu_backend, PmuBackend::Precise);
        assert_eq!(a.serial, SerialOut::File("/tmp/x".into()));
        assert!(a.validate().is_ok());
        let cli = Cli::try_parse_from(["vmm", "run", "--kernel", "k", "--vcpus", "0"]).unwrap();
        let Command::Run(a) = cli.command else {
            panic!("run")
        };
        assert_eq!(a.validate(), Err(CliError::BadVcpus(0)));
    }
}
