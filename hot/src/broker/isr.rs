//! The leader's ISR upkeep (cluster mode): every tick, each partition this broker leads is
//! asked for an ISR change (a follower lagging longer than `replica.lag.time.max.ms` leaves,
//! a caught-up one rejoins); a change goes to the controllers with the partition epoch and
//! counts once they committed it. Followers silent for much longer are reported dead.

use std::collections::HashSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::Broker;
use crate::cluster::ClusterLink;
use crate::replication::leader::IsrRefusal;

const TICK: Duration = Duration::from_millis(250);

pub(super) async fn run(broker: Weak<Broker>, link: Arc<ClusterLink>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Followers already reported dead, so the alert is logged once per episode.
    let mut reported: HashSet<(String, i32, i32)> = HashSet::new();
    loop {
        tick.tick().await;
        let Some(b) = broker.upgrade() else { return };
        let now = b.now_ms();
        let dead_after = b.replica_lag_ms().saturating_mul(4);
        for topic in b.topics() {
            for p in topic.local() {
                if let Some((_, _, followers)) = p.leader_view(now) {
                    for f in followers {
                        let key = (topic.spec.name.clone(), p.index, f.id);
                        if f.silent_ms > dead_after && !f.in_sync {
                            if reported.insert(key) {
                                tracing::error!(topic = %topic.spec.name, partition = p.index, replica = f.id, silent_ms = f.silent_ms, lag_records = f.lag_records, "replica has not fetched for a long time; it is dead or cut off and the partition is under-replicated");
                            }
                        } else {
                            reported.remove(&key);
                        }
                    }
                }
                let Some((proposal, epoch)) = p.isr_proposal(now) else {
                    continue;
                };
                let (p, link, b) = (p.clone(), link.clone(), b.clone());
                let name = topic.spec.name.clone();
                tokio::spawn(async move {
                    let before = p.leader_view(b.now_ms()).map(|(_, isr, _)| isr.len());
                    let answer = link
                        .alter_isr(
                            &name,
                            p.index as u32,
                            epoch,
                            proposal.partition_epoch,
                            proposal.isr.clone(),
                            &proposal.joining,
                        )
                        .await;
                    match answer {
                        Ok(r) => {
                            let grew = before.is_some_and(|n| r.isr.len() > n);
                            if grew {
                                b.metrics().isr_expands.fetch_add(1, Relaxed);
                            } else {
                                b.metrics().isr_shrinks.fetch_add(1, Relaxed);
                            }
                            tracing::info!(topic = %name, partition = p.index, isr = ?r.isr, partition_epoch = r.partition_epoch, "ISR change committed");
                            p.isr_answer(
                                epoch,
                                proposal.partition_epoch,
                                Ok((r.isr, r.partition_epoch)),
                                b.now_ms(),
                            );
                        }
                        Err(e) => {
                            // Only an invalid ISR is known not to be committed; any other
                            // failure (a stale partition epoch after a controller failover, no
                            // answer) may follow a commit, so the change stays pending until
                            // the metadata shows its outcome.
                            let why = if e.code() == tonic::Code::InvalidArgument {
                                IsrRefusal::Rejected
                            } else {
                                IsrRefusal::Unknown
                            };
                            tracing::info!(topic = %name, partition = p.index, isr = ?proposal.isr, error = %e.message(), outcome = ?why, "ISR change not confirmed; waiting for the metadata to show it");
                            p.isr_answer(epoch, proposal.partition_epoch, Err(why), b.now_ms());
                        }
                    }
                });
            }
        }
    }
}
