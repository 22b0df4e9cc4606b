//! The laggard scenario, played by a quarter of the runs (four brokers, one RF=4 partition):
//! the window of KAFKA-7128, which three replicas cannot reach. There, a new leader's ISR is
//! either itself alone, and it then commits its own log end at once, or the two others, and
//! then no replica lacks an acknowledged record. With four:
//!
//! 1. An in-sync follower, the laggard, crashes and stays down; the controllers fence it and
//!    the other three go on (the HW, held back by it until then, jumps).
//! 2. Right after the producer gets an acknowledgement for a record the laggard lacks, the
//!    leader crashes. Followers learn the HW from their next fetch, so its successor may lead
//!    with a HW below that record, with an ISR of itself and the fourth replica, whose log end
//!    it does not know until that replica fetches.
//! 3. The laggard restarts and fetches from the new leader.
//! 4. Once it joins the ISR, the rest of the ISR crashes together (a rack), so the laggard is
//!    elected. It must hold every acknowledged record: a leader that admits a follower at its
//!    stale HW rather than at its epoch's start fails "no acknowledged record is missing".
//!
//! Each step is a fault a real cluster can meet; the scenario only picks when. While it plays,
//! the run's other crashes (flapping leaders included) and isolations wait, so that they do
//! not end it early.

use std::fmt::Write as _;

use crate::rng::Rng;
use crate::World;

/// Where the scenario stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// An in-sync follower crashes at this time (ms), once the ISR is full.
    Before {
        at: i64,
    },
    /// The laggard is down and waits for the leader to acknowledge a record it lacks.
    Down {
        laggard: i32,
    },
    /// The leader is about to fail; the laggard restarts at `back_at` (ms).
    LeaderFails {
        laggard: i32,
        back_at: i64,
    },
    /// The laggard fetches from the new leader; when it joins the ISR, the rest fails.
    Back {
        laggard: i32,
    },
    Done,
}

pub struct Laggard {
    stage: Stage,
    /// The scenario gives up at this time (ms) if it has not played out (a run whose
    /// producer stalls, say), and the run's other faults resume.
    until: i64,
}

/// The longest the scenario holds back the run's other crashes (ms).
const MAX_MS: i64 = 12_000;

impl Laggard {
    pub fn new(rng: &mut Rng) -> Self {
        let at = 200 + rng.below(3_000) as i64;
        Laggard {
            stage: Stage::Before { at },
            until: at + MAX_MS,
        }
    }
}

impl World {
    fn laggard_stage(&self) -> Stage {
        self.laggard.as_ref().map_or(Stage::Done, |l| l.stage)
    }

    fn set_laggard_stage(&mut self, stage: Stage) {
        if let Some(l) = self.laggard.as_mut() {
            l.stage = stage;
        }
    }

    /// Whether the scenario is playing (the run's own crashes and isolations wait).
    pub(crate) fn laggard_playing(&self) -> bool {
        self.laggard_stage() != Stage::Done
    }

    /// Whether `b` is the laggard, kept down until the scenario restarts it.
    pub(crate) fn laggard_held_down(&self, b: i32) -> bool {
        match self.laggard_stage() {
            Stage::Down { laggard } | Stage::LeaderFails { laggard, .. } => laggard == b,
            _ => false,
        }
    }

    /// Steps 1 and 3, when their time comes.
    pub(crate) fn laggard_step(&mut self) {
        let Some(until) = self.laggard.as_ref().map(|l| l.until) else {
            return;
        };
        let stage = self.laggard_stage();
        if stage != Stage::Done && self.now > until {
            trace!(self, "laggard scenario gives up at {stage:?}");
            self.set_laggard_stage(Stage::Done);
            return;
        }
        match stage {
            Stage::Before { at } if self.now >= at => {
                let p = self.partition().clone();
                if p.isr.len() < self.brokers.len() {
                    return;
                }
                let followers: Vec<i32> = p
                    .isr
                    .iter()
                    .copied()
                    .filter(|r| Some(*r) != p.leader && self.replicas[r].alive)
                    .collect();
                if followers.is_empty() {
                    return;
                }
                let laggard = followers[self.rng.below(followers.len() as u64) as usize];
                trace!(self, "laggard scenario: b{laggard} falls behind");
                self.crash(laggard);
                self.set_laggard_stage(Stage::Down { laggard });
            }
            Stage::LeaderFails { laggard, back_at } if self.now >= back_at => {
                if !self.replicas[&laggard].alive {
                    self.restart(laggard);
                }
                self.set_laggard_stage(Stage::Back { laggard });
            }
            _ => {}
        }
    }

    /// Step 2: the producer got an acknowledgement for the record at `offset`.
    pub(crate) fn laggard_on_ack(&mut self, offset: u64) {
        let Stage::Down { laggard } = self.laggard_stage() else {
            return;
        };
        let p = self.partition();
        let others_in_sync = !p.isr.contains(&laggard) && p.isr.len() + 1 == self.brokers.len();
        let Some(leader) = p.leader else {
            return;
        };
        if !others_in_sync || offset < self.replicas[&laggard].end() {
            return;
        }
        let at = self.now + self.rng.below(50) as i64;
        let back_at = at + self.rng.below(800) as i64;
        self.doomed.entry(leader).or_insert(at);
        trace!(
            self,
            "laggard scenario: leader b{leader} fails at {at}ms, right after an ack at {offset} that b{laggard} lacks; b{laggard} restarts at {back_at}ms"
        );
        self.set_laggard_stage(Stage::LeaderFails { laggard, back_at });
    }

    /// Step 4: the controllers committed an ISR change; `before` is the ISR it replaced.
    pub(crate) fn laggard_on_isr_change(&mut self, before: &[i32]) {
        let Stage::Back { laggard } = self.laggard_stage() else {
            return;
        };
        let isr = self.partition().isr.clone();
        if !isr.contains(&laggard) || before.contains(&laggard) {
            return;
        }
        for r in isr.iter().filter(|r| **r != laggard) {
            let at = self.now + self.rng.below(300) as i64;
            self.doomed.entry(*r).or_insert(at);
        }
        self.stats.laggard_rejoins += 1;
        trace!(
            self,
            "laggard scenario: b{laggard} rejoined the ISR {isr:?}; the rest of it fails together"
        );
        self.set_laggard_stage(Stage::Done);
    }
}
