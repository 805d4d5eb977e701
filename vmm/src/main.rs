//! `vmm`: a KVM-based VMM whose virtual PMU lives in user space and writes Intel PEBS records in
//! software. See README.md.
mod backend;
mod boot;
mod cli;
mod cpuid;
mod devices;
mod exits;
mod guest;

mod msr_filter;
mod pmi;
mod pmu;
mod vcpu;
mod vm;

use clap::Parser;

use crate::cli::{Cli, Command, ReplayArgs};
use crate::exits::StopReason;
use crate::vcpu::VcpuStop;
use crate::vm::RunEnd;

fn main() {
    // Bad flags exit with status 1 like every other user mistake (clap's default is 2); help
    // and version still exit 0.
    let cli = Cli::try_parse().unwrap_or_else(|e| {
        let code = if e.use_stderr() { 1 } else { 0 };
        let _ = e.print();
        std::process::exit(code);
    });
    let args = match cli.command {
        Command::Run(args) => args,
        Command::Replay(r) => std::process::exit(replay(&r)),
    };
    if let Err(e) = args.validate() {
        eprintln!("vmm: {e}");
        std::process::exit(1);
    }
    match vm::run(&args) {
        Ok(end) => {
            report(&end);
            std::process::exit(vm::exit_status(&end));
        }
        Err(e) => {
            eprintln!("vmm: {e}");
            std::process::exit(1);
        }
    }
}

/// `vmm replay`: 0 when the trace replays, 1 with the first divergence or a bad input.
fn replay(r: &ReplayArgs) -> i32 {
    let text = match std::fs::read_to_string(&r.trace) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("vmm: cannot read trace {}: {e}", r.trace.display());
            return 1;
        }
    };
    let model = match r
        .cpu_model
        .as_deref()
        .map(vpmu::model::CpuModel::load)
        .transpose()
    {
        Ok(m) => m,
        Err(e) => {
            eprintln!("vmm: --cpu-model: {e}");
            return 1;
        }
    };
    match vpmu::trace::replay_text(&text, model) {
        Ok(stats) => {
            println!("replayed {}: {stats}", r.trace.display());
            0
        }
        Err(e) => {
            eprintln!("vmm: replay of {} diverged: {e}", r.trace.display());
            1
        }
    }
}

fn report(end: &RunEnd) {
    if let RunEnd::Stopped(VcpuStop {
        index,
        pebs_dump: Some(dump),
        ..
    }) = end
    {
        print!("vmm: vCPU {index} PEBS buffer: {dump}");
    }
    match end {
        RunEnd::Stopped(s) => match &s.reason {
            StopReason::GuestExit(_) if !s.pmu_summary.is_empty() => {
                eprintln!("vmm: vCPU {} PMU: {}", s.index, s.pmu_summary);
            }
            StopReason::GuestExit(_) => {}
            r => {
                let what = match r {
                    StopReason::TripleFault => "triple fault (KVM_EXIT_SHUTDOWN)".to_string(),
                    StopReason::InternalError => {
                        "KVM internal error (the host could not emulate an instruction)".to_string()
                    }
                    StopReason::FailEntry(code) => format!("VM entry failed, reason {code:#x}"),
                    StopReason::SystemEvent(t) => format!("system event type {t}"),
                    StopReason::Unhandled(m) => m.clone(),
                    StopReason::GuestExit(_) => unreachable!(),
                };
                eprintln!("vmm: vCPU {} stopped: {what}\n{}", s.index, s.registers);
            }
        },
        RunEnd::TimedOut(secs) => {
            eprintln!("vmm: guest did not exit within --timeout {secs} s; stopped it")
        }
        RunEnd::Interrupted => eprintln!("vmm: interrupted; guest stopped"),
    }
}
