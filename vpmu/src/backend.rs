//! The counting-backend interface: the vPMU tells a backend what each enabled counter counts
//! ([`CounterProgram`]); the backend reports counts, each report carrying the guest state at
//! the moment it was taken so an overflow inside it can be sampled. Real backends (host perf,
//! instruction-stepping emulation) live in the VMM; [`InMemoryBackend`] is the deterministic
//! one for tests, fuzzing and replay.

use thiserror::Error;

use crate::counter::{CounterId, CounterProgram, Event};
use crate::state::{EventInfo, GuestState};

/// Why a backend failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BackendError {
    /// A counter could not be programmed.
    #[error("backend cannot count {id:?}: {why}")]
    Program {
        /// The counter.
        id: CounterId,
        /// Why.
        why: String,
    },
    /// Counts could not be collected.
    #[error("backend cannot collect counts: {0}")]
    Collect(String),
}

/// Counts taken at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountReport {
    /// Events counted per counter since the previous report.
    pub deltas: Vec<(CounterId, u64)>,
    /// Guest state when the last of these events happened (registers after the instruction).
    pub state: GuestState,
    /// What the backend knows about the instruction of the last event.
    pub event: EventInfo,
}

/// A source of counts.
pub trait CountingBackend {
    /// Replaces what is counted with `programs` (every enabled counter; an absent counter must
    /// stop counting). Called whenever the vPMU's generation changes.
    fn program(&mut self, programs: &[CounterProgram]) -> Result<(), BackendError>;
    /// Reports taken since the previous call, oldest first.
    fn collect(&mut self) -> Result<Vec<CountReport>, BackendError>;
}

/// A deterministic backend: the caller states which events retire, at which privilege level
/// and with what state; every programmed counter whose event and USR/OS filter match counts
/// them. It neither splits a batch at an overflow nor evaluates EDGE/INV/CMASK (the counts
/// are exact per batch; the vPMU carries the post-wrap remainder).
#[derive(Debug, Clone, Default)]
pub struct InMemoryBackend {
    programs: Vec<CounterProgram>,
    pending: Vec<CountReport>,
    program_calls: u64,
}

impl InMemoryBackend {
    /// An idle backend.
    pub fn new() -> Self {
        Self::default()
    }

    /// The counters currently programmed.
    pub fn programs(&self) -> &[CounterProgram] {
        &self.programs
    }

    /// How often [`CountingBackend::program`] was called.
    pub fn program_calls(&self) -> u64 {
        self.program_calls
    }

    /// `count` occurrences of `event` at privilege `state.cpl`, the last one leaving `state`.
    /// Queues a report unless no counter counts them.
    pub fn retire(&mut self, event: Event, count: u64, state: GuestState, info: EventInfo) {
        let deltas: Vec<(CounterId, u64)> = self
            .programs
            .iter()
            .filter(|p| p.event == event && p.counts_at(state.cpl))
            .map(|p| (p.id, count))
            .collect();
        if !deltas.is_empty() && count > 0 {
            self.pending.push(CountReport {
                deltas,
                state,
                event: info,
            });
        }
    }
}

impl CountingBackend for InMemoryBackend {
    fn program(&mut self, programs: &[CounterProgram]) -> Result<(), BackendError> {
        self.programs = programs.to_vec();
        self.program_calls += 1;
        Ok(())
    }

    fn collect(&mut self) -> Result<Vec<CountReport>, BackendError> {
        Ok(std::mem::take(&mut self.pending))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prog(id: CounterId, event: Event, usr: bool, os: bool) -> CounterProgram {
        CounterProgram::plain(id, event, usr, os, 100)
    }

    #[test]
    fn counts_match_event_and_privilege() {
        let mut b = InMemoryBackend::new();
        b.program(&[
            prog(CounterId::Gp(0), Event::InstructionsRetired, true, false),
            prog(CounterId::Gp(1), Event::InstructionsRetired, false, true),
            prog(CounterId::Fixed(1), Event::CoreCycles, true, true),
        ])
        .unwrap();
        let user = GuestState {
            cpl: 3,
            ..Default::default()
        };
        b.retire(Event::InstructionsRetired, 5, user, EventInfo::default());
        b.retire(Event::BranchMisses, 5, user, EventInfo::default());
        let kernel = GuestState::default();
        b.retire(Event::InstructionsRetired, 7, kernel, EventInfo::default());
        let r = b.collect().unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].deltas, vec![(CounterId::Gp(0), 5)]);
        assert_eq!(r[1].deltas, vec![(CounterId::Gp(1), 7)]);
        assert!(b.collect().unwrap().is_empty());
        assert_eq!(b.program_calls(), 1);
        b.program(&[]).unwrap();
        b.retire(Event::InstructionsRetired, 5, user, EventInfo::default());
        assert!(b.collect().unwrap().is_empty());
    }
}
