//! The cold tier in the simulation: one partition manifest (the real `Manifest` and
//! `RemoteSegment`) and the records each remote segment holds. A leader claims the manifest at
//! its epoch (an older epoch is refused from then on), keeps only the part its own epoch
//! history shares (`strata_cold::manifest::consistent_end`, as `broker/tier.rs` does), and
//! uploads segments of its log below its HW. The glue mirrors `claim_manifest` and the
//! uploader; object-store I/O is not modelled (a put either happens or not).

use std::collections::{BTreeMap, HashMap};

use strata_cold::manifest::{consistent_end, Lineage, Manifest, RemoteSegment};

use crate::replica::{Rec, Replica};
use crate::rng::Rng;

#[derive(Default)]
pub struct ColdTier {
    manifest: Manifest,
    /// What each segment (by key) holds.
    records: BTreeMap<String, Vec<Rec>>,
    /// Each segment's `.epochs` companion: the uploading log's epoch history.
    epochs: HashMap<String, Vec<(i32, u64)>>,
    /// Broker -> the leader epoch it claimed the manifest at.
    claimed: BTreeMap<i32, i32>,
    next_key: u64,
}

fn lineage_of(r: &Replica) -> Lineage {
    Lineage {
        epochs: r
            .epochs
            .entries()
            .iter()
            .map(|e| (e.epoch, e.start_offset))
            .collect(),
        log_start: 0,
        log_end: r.end(),
    }
}

impl ColdTier {
    /// One round of `broker/tier.rs` on replica `r` (leading, per its own view): claim the
    /// manifest at its epoch if not yet, else upload the next segment below its HW. Returns a
    /// trace line when something happened.
    pub fn act(&mut self, r: &Replica, rng: &mut Rng) -> Option<String> {
        let epoch = r.leader_epoch()?;
        if !r.alive {
            return None;
        }
        if self.manifest.leader_epoch > epoch {
            return None; // deposed: every update of ours is refused now
        }
        if self.claimed.get(&r.id) != Some(&epoch) {
            self.manifest.leader_epoch = epoch;
            self.claimed.insert(r.id, epoch);
            let shared = consistent_end(&self.manifest, &self.epochs, &lineage_of(r));
            let before = self.manifest.end_offset();
            if shared < before {
                self.manifest.segments.retain(|s| s.end_offset <= shared);
            }
            return Some(format!(
                "claims the cold tier at epoch {epoch}: manifest end {before} -> {}",
                self.manifest.end_offset()
            ));
        }
        let base = self.manifest.end_offset();
        let end = r.hw.min(base + 1 + rng.below(4));
        if end <= base || end > r.end() {
            return None;
        }
        self.next_key += 1;
        let key = format!("segment-{}", self.next_key);
        self.records
            .insert(key.clone(), r.log[base as usize..end as usize].to_vec());
        self.epochs.insert(key.clone(), lineage_of(r).epochs);
        self.manifest.segments.push(RemoteSegment {
            base_offset: base,
            end_offset: end,
            min_timestamp: 0,
            max_timestamp: 0,
            size_bytes: end - base,
            leader_epoch: epoch,
            key,
            compacted: None,
            aborted: Vec::new(),
        });
        Some(format!("uploads [{base}, {end}) at epoch {epoch}"))
    }

    /// The manifest's records are the leader's records at the same offsets, once the leader
    /// claimed it.
    pub fn check_prefix_of(&self, l: &Replica) -> Result<(), String> {
        let Some(epoch) = l.leader_epoch() else {
            return Ok(());
        };
        if self.claimed.get(&l.id) != Some(&epoch) {
            return Ok(());
        }
        for s in &self.manifest.segments {
            let held = &self.records[&s.key];
            let mine = l.log.get(s.base_offset as usize..s.end_offset as usize);
            if mine != Some(held.as_slice()) {
                return Err(format!(
                    "the cold tier's segment [{}, {}) (uploaded at epoch {}) is not leader b{}'s log there: {held:?} vs {mine:?}",
                    s.base_offset, s.end_offset, s.leader_epoch, l.id
                ));
            }
        }
        Ok(())
    }
}
