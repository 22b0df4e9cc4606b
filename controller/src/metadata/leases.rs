//! Broker liveness on the active controller: heartbeats extend a lease; a lease that runs
//! out becomes a `FenceBroker` proposal.
//!
//! Leases are not in the metadata log (heartbeats would flood it); only their outcome, a
//! fencing, is. A controller that becomes leader grants every registered broker a full lease
//! first, so a controller failover never fences a healthy broker. Time is passed in.

use std::collections::BTreeMap;

use super::{BrokerId, ClusterMetadata};

/// Why a heartbeat was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeartbeatError {
    #[error("broker {0} is not registered; register first")]
    UnknownBroker(BrokerId),
    #[error(
        "broker {id} epoch {got} is stale (current {current}); a newer incarnation registered"
    )]
    StaleEpoch {
        id: BrokerId,
        current: u64,
        got: u64,
    },
}

#[derive(Debug, Clone)]
pub struct Leases {
    lease_ms: i64,
    /// broker -> (epoch, lease deadline in ms)
    deadlines: BTreeMap<BrokerId, (u64, i64)>,
}

impl Leases {
    pub fn new(lease_ms: i64) -> Self {
        Leases {
            lease_ms,
            deadlines: BTreeMap::new(),
        }
    }

    /// Starts fresh leases for every registered broker (on becoming the active controller).
    pub fn grant_all(&mut self, metadata: &ClusterMetadata, now_ms: i64) {
        self.deadlines = metadata
            .brokers
            .values()
            .map(|b| (b.id, (b.epoch, now_ms + self.lease_ms)))
            .collect();
    }

    /// Extends a broker's lease. Returns true when the broker is fenced and should be
    /// unfenced (it is alive again).
    pub fn heartbeat(
        &mut self,
        metadata: &ClusterMetadata,
        id: BrokerId,
        epoch: u64,
        now_ms: i64,
    ) -> Result<bool, HeartbeatError> {
        let b = metadata
            .brokers
            .get(&id)
            .ok_or(HeartbeatError::UnknownBroker(id))?;
        if b.epoch != epoch {
            return Err(HeartbeatError::StaleEpoch {
                id,
                current: b.epoch,
                got: epoch,
            });
        }
        self.deadlines.insert(id, (epoch, now_ms + self.lease_ms));
        Ok(b.fenced)
    }

    /// Live brokers whose lease ran out: (id, epoch) pairs to fence. A live broker this
    /// controller has no lease for (its registration was applied while another controller
    /// led) gets a fresh one rather than a fencing.
    pub fn expired(&mut self, metadata: &ClusterMetadata, now_ms: i64) -> Vec<(BrokerId, u64)> {
        let mut out = Vec::new();
        for b in metadata.brokers.values().filter(|b| !b.fenced) {
            match self.deadlines.get(&b.id) {
                Some((epoch, deadline)) if *epoch == b.epoch => {
                    if *deadline <= now_ms {
                        out.push((b.id, b.epoch));
                    }
                }
                _ => {
                    self.deadlines
                        .insert(b.id, (b.epoch, now_ms + self.lease_ms));
                }
            }
        }
        out
    }

    /// Starts a lease for a broker that just registered.
    pub fn registered(&mut self, id: BrokerId, epoch: u64, now_ms: i64) {
        self.deadlines.insert(id, (epoch, now_ms + self.lease_ms));
    }
}
