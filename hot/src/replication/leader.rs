//! The leader's view of a partition's replicas: each follower's log end offset (learned from
//! its fetch offset), the high watermark, and when to propose ISR changes to the controller.
//! Pure logic with an injected clock: events in, decisions out.
//!
//! Rules (docs/replication.md):
//! - HW = min LEO over the ISR, where the leader's LEO is its durable end; while an ISR
//!   expansion is pending, the HW is taken over the larger set; the HW never moves back.
//! - A follower that has not caught up to the leader's LEO for `lag_max_ms` is proposed for
//!   removal; one whose LEO reached both the HW and the start of this leader's epoch is
//!   proposed for re-addition (a new leader's HW may be stale, KAFKA-7128), on a fetch made
//!   after it left the ISR (its old incarnation's log may be gone). A change counts only once
//!   the controller committed it (with the partition epoch as CAS token).
//! - A proposal whose fate is unknown (no answer, or a refusal that says the partition moved
//!   on, as when the controller committed it and failed over before answering) stays pending,
//!   and the HW keeps counting its members, until the metadata shows the outcome.
//! - acks=all is refused before append when the committed ISR is smaller than
//!   `min.insync.replicas`.

use std::collections::BTreeMap;

pub type BrokerId = i32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Follower {
    /// The registration (broker epoch) of the process whose fetches these are: a fetch of an
    /// older one is ignored, and a newer one starts afresh.
    broker_epoch: u64,
    leo: u64,
    /// Whether it fetched since this broker became leader (its LEO is known).
    fetched: bool,
    /// Last time the follower was caught up with the leader (ms): its fetch reached the
    /// leader's log end as it was at that time.
    caught_up_ms: i64,
    /// The leader's log end and the time when the previous fetch was answered: a follower
    /// whose next fetch starts there was caught up at that time (Kafka's rule, so a follower
    /// under steady load still counts as caught up).
    prev_fetch_leader_end: u64,
    prev_fetch_ms: i64,
    /// Last time it fetched at all (ms).
    last_fetch_ms: i64,
}

/// What the leader knows of one follower, for metrics and operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerStatus {
    pub id: BrokerId,
    pub in_sync: bool,
    /// Records the follower is behind the leader's log end.
    pub lag_records: u64,
    /// Milliseconds since it was last caught up.
    pub lag_ms: i64,
    /// Milliseconds since its last fetch.
    pub silent_ms: i64,
}

/// The controller's view of a partition this broker now leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub me: BrokerId,
    pub replicas: Vec<BrokerId>,
    pub isr: Vec<BrokerId>,
    pub partition_epoch: i32,
}

/// The topic's replication settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// `min.insync.replicas`.
    pub min_insync_replicas: usize,
    /// `replica.lag.time.max.ms`.
    pub replica_lag_max_ms: i64,
}

/// An ISR change to propose to the controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsrProposal {
    pub isr: Vec<BrokerId>,
    /// The partition epoch the proposal is based on (the controller's CAS token).
    pub partition_epoch: i32,
    /// The members it adds, each with the registration (broker epoch) its catching-up fetches
    /// came from: the controllers refuse the change if that broker registered again since
    /// (a restart, perhaps on an empty disk), as Kafka does since KIP-903.
    pub joining: Vec<(BrokerId, u64)>,
}

/// How the controllers answered a proposal that was not committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IsrRefusal {
    /// The change itself was refused (an invalid ISR): nothing was committed.
    Rejected,
    /// No answer, or a refusal that may follow a commit (a stale partition epoch after a
    /// controller failover, a leader epoch that moved on): the change may be in the metadata.
    Unknown,
}

/// A proposal sent to the controllers and not yet settled by the metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pending {
    proposal: IsrProposal,
    /// Sent and not answered yet; false after an unknown outcome, when it may be re-sent.
    in_flight: bool,
}

/// Why a produce with acks=all is refused before append.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{isr} in-sync replicas, but min.insync.replicas is {min}")]
pub struct NotEnoughReplicas {
    pub isr: usize,
    pub min: usize,
}

#[derive(Debug, Clone)]
pub struct LeaderState {
    me: BrokerId,
    replicas: Vec<BrokerId>,
    isr: Vec<BrokerId>,
    partition_epoch: i32,
    pending: Option<Pending>,
    followers: BTreeMap<BrokerId, Follower>,
    /// This leader's log end when it took over: the first offset of its epoch. A follower
    /// joins the ISR only once it has everything before it.
    epoch_start: u64,
    leader_end: u64,
    hw: u64,
    min_isr: usize,
    lag_max_ms: i64,
    /// After a refused proposal, no new one before this time (ms).
    retry_after_ms: i64,
}

/// How long after a refused ISR proposal the next one (or the same again) may be made.
const RETRY_AFTER_REFUSAL_MS: i64 = 1_000;

impl LeaderState {
    /// A broker becoming leader with the controller's view of the partition, its log end
    /// (`epoch_start`), its durable end (`leader_end`) and the HW it knows. Followers start
    /// as caught up at `now` with an unknown LEO until they fetch.
    pub fn new(
        assignment: Assignment,
        epoch_start: u64,
        leader_end: u64,
        hw: u64,
        policy: Policy,
        now_ms: i64,
    ) -> Self {
        let Assignment {
            me,
            replicas,
            isr,
            partition_epoch,
        } = assignment;
        let followers = replicas
            .iter()
            .filter(|r| **r != me)
            .map(|r| {
                (
                    *r,
                    Follower {
                        broker_epoch: 0,
                        leo: 0,
                        fetched: false,
                        caught_up_ms: now_ms,
                        prev_fetch_leader_end: u64::MAX,
                        prev_fetch_ms: now_ms,
                        last_fetch_ms: now_ms,
                    },
                )
            })
            .collect();
        let mut state = LeaderState {
            me,
            replicas,
            isr,
            partition_epoch,
            pending: None,
            followers,
            epoch_start,
            leader_end,
            hw,
            min_isr: policy.min_insync_replicas,
            lag_max_ms: policy.replica_lag_max_ms,
            retry_after_ms: i64::MIN,
        };
        // A leader alone in the ISR commits what it has at once.
        state.advance_hw();
        state
    }

    pub fn set_policy(&mut self, policy: Policy) {
        self.min_isr = policy.min_insync_replicas;
        self.lag_max_ms = policy.replica_lag_max_ms;
    }

    pub fn partition_epoch(&self) -> i32 {
        self.partition_epoch
    }

    pub fn replicas(&self) -> &[BrokerId] {
        &self.replicas
    }

    /// The leader's own broker id.
    pub fn me(&self) -> BrokerId {
        self.me
    }

    /// Whether the committed ISR is smaller than `min.insync.replicas`.
    pub fn under_min_isr(&self) -> bool {
        self.isr.len() < self.min_isr
    }

    /// Each follower's state as of `now_ms`, given the leader's log end.
    pub fn followers(&self, log_end: u64, now_ms: i64) -> Vec<FollowerStatus> {
        self.followers
            .iter()
            .map(|(id, f)| FollowerStatus {
                id: *id,
                in_sync: self.isr.contains(id),
                lag_records: log_end.saturating_sub(f.leo),
                lag_ms: now_ms - f.caught_up_ms,
                silent_ms: now_ms - f.last_fetch_ms,
            })
            .collect()
    }

    pub fn high_watermark(&self) -> u64 {
        self.hw
    }

    pub fn isr(&self) -> &[BrokerId] {
        &self.isr
    }

    /// The committed ISR plus any member a pending change would add.
    fn maximal_isr(&self) -> Vec<BrokerId> {
        let mut set = self.isr.clone();
        if let Some(p) = &self.pending {
            for r in &p.proposal.isr {
                if !set.contains(r) {
                    set.push(*r);
                }
            }
        }
        set
    }

    fn leo_of(&self, r: BrokerId) -> u64 {
        if r == self.me {
            self.leader_end
        } else {
            self.followers.get(&r).map_or(0, |f| f.leo)
        }
    }

    /// Recomputes the HW; returns it when it moved.
    fn advance_hw(&mut self) -> Option<u64> {
        let candidate = self
            .maximal_isr()
            .into_iter()
            .map(|r| self.leo_of(r))
            .min()
            .unwrap_or(self.leader_end);
        (candidate > self.hw).then(|| {
            self.hw = candidate;
            candidate
        })
    }

    /// The leader's own log became durable up to `end`.
    pub fn on_leader_durable(&mut self, end: u64) -> Option<u64> {
        self.leader_end = self.leader_end.max(end);
        self.advance_hw()
    }

    /// A follower's process registered as `broker_epoch` fetched from `fetch_offset`, so
    /// everything before it is in its log; `log_end` is the leader's log end as this fetch is
    /// answered.
    pub fn on_follower_fetch(
        &mut self,
        follower: BrokerId,
        broker_epoch: u64,
        fetch_offset: u64,
        log_end: u64,
        now_ms: i64,
    ) -> Option<u64> {
        let f = self.followers.get_mut(&follower)?;
        if broker_epoch < f.broker_epoch {
            return None; // sent by a process that has since registered again
        }
        if broker_epoch > f.broker_epoch {
            // a new process: nothing its predecessor fetched describes its log
            f.broker_epoch = broker_epoch;
            f.prev_fetch_leader_end = u64::MAX;
        }
        f.leo = fetch_offset;
        f.fetched = true;
        f.last_fetch_ms = now_ms;
        if fetch_offset >= log_end {
            f.caught_up_ms = now_ms;
        } else if fetch_offset >= f.prev_fetch_leader_end {
            f.caught_up_ms = f.caught_up_ms.max(f.prev_fetch_ms);
        }
        f.prev_fetch_leader_end = log_end;
        f.prev_fetch_ms = now_ms;
        self.advance_hw()
    }

    /// Checks an acks=all produce before append.
    pub fn check_acks_all(&self) -> Result<(), NotEnoughReplicas> {
        if self.isr.len() < self.min_isr {
            return Err(NotEnoughReplicas {
                isr: self.isr.len(),
                min: self.min_isr,
            });
        }
        Ok(())
    }

    /// The ISR change to propose now, if any (one at a time): drop lagging followers first,
    /// else add caught-up ones. A pending change whose outcome is unknown is proposed again
    /// (the same change at the same partition epoch) until the metadata settles it.
    pub fn tick(&mut self, now_ms: i64) -> Option<IsrProposal> {
        if now_ms < self.retry_after_ms {
            return None;
        }
        if let Some(p) = &mut self.pending {
            if p.in_flight {
                return None;
            }
            p.in_flight = true;
            return Some(p.proposal.clone());
        }
        let lagging: Vec<BrokerId> = self
            .isr
            .iter()
            .copied()
            .filter(|r| *r != self.me)
            .filter(|r| {
                self.followers
                    .get(r)
                    .is_some_and(|f| now_ms - f.caught_up_ms > self.lag_max_ms)
            })
            .collect();
        let proposal = if !lagging.is_empty() {
            let isr = self.isr.iter().copied().filter(|r| !lagging.contains(r));
            (isr.collect::<Vec<_>>(), Vec::new())
        } else {
            let joining: Vec<BrokerId> = self
                .replicas
                .iter()
                .copied()
                .filter(|r| !self.isr.contains(r))
                .filter(|r| {
                    // Caught up to the HW and to this epoch's start (a new leader's HW may be
                    // behind what the old leader committed), and still fetching: a replica
                    // that died after catching up must not rejoin on its old fetch.
                    let floor = self.hw.max(self.epoch_start);
                    self.followers.get(r).is_some_and(|f| {
                        f.fetched && f.leo >= floor && now_ms - f.last_fetch_ms <= self.lag_max_ms
                    })
                })
                .collect();
            if joining.is_empty() {
                return None;
            }
            let mut isr = self.isr.clone();
            isr.extend(&joining);
            let epochs = joining
                .iter()
                .map(|r| (*r, self.followers.get(r).map_or(0, |f| f.broker_epoch)))
                .collect();
            (isr, epochs)
        };
        let (isr, joining) = proposal;
        let p = IsrProposal {
            isr,
            partition_epoch: self.partition_epoch,
            joining,
        };
        self.pending = Some(Pending {
            proposal: p.clone(),
            in_flight: true,
        });
        Some(p)
    }

    /// The controller committed an ISR (ours or one it decided), at `partition_epoch`.
    /// A follower it removes must fetch again before it can rejoin. An ISR not newer than the one held (metadata arriving after the controller's answer) is
    /// ignored.
    pub fn on_isr_committed(&mut self, isr: Vec<BrokerId>, partition_epoch: i32) -> Option<u64> {
        if partition_epoch <= self.partition_epoch {
            return None;
        }
        // A follower that leaves the ISR rejoins only on what it fetches from now on: the
        // controllers may have removed it because its old incarnation was fenced (a restart,
        // perhaps on an empty disk), and its last fetch speaks for a log that may be gone.
        for (id, f) in &mut self.followers {
            if self.isr.contains(id) && !isr.contains(id) {
                f.fetched = false;
                f.leo = 0;
            }
        }
        self.isr = isr;
        self.partition_epoch = partition_epoch;
        self.pending = None;
        self.advance_hw()
    }

    /// The pending proposal was not committed, as far as this answer tells. A rejected one
    /// is dropped; one whose fate is unknown stays pending (the HW still counts a member it
    /// adds, since the controllers may already list it in the ISR) and is proposed again
    /// after a pause, until the metadata shows a newer partition epoch.
    /// `proposed_at` is the partition epoch of the proposal answered: a late answer to an
    /// earlier proposal leaves the one pending now alone.
    pub fn on_isr_refused(&mut self, why: IsrRefusal, proposed_at: i32, now_ms: i64) {
        if self
            .pending
            .as_ref()
            .is_some_and(|p| p.proposal.partition_epoch != proposed_at)
        {
            return;
        }
        match why {
            IsrRefusal::Rejected => self.pending = None,
            IsrRefusal::Unknown => {
                if let Some(p) = &mut self.pending {
                    p.in_flight = false;
                }
            }
        }
        self.retry_after_ms = now_ms + RETRY_AFTER_REFUSAL_MS;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Leader 1 with followers 2 and 3, all in sync, min.insync.replicas 2, lag 10 s.
    const POLICY: Policy = Policy {
        min_insync_replicas: 2,
        replica_lag_max_ms: 10_000,
    };

    fn assignment(isr: Vec<BrokerId>, partition_epoch: i32) -> Assignment {
        Assignment {
            me: 1,
            replicas: vec![1, 2, 3],
            isr,
            partition_epoch,
        }
    }

    fn three() -> LeaderState {
        LeaderState::new(assignment(vec![1, 2, 3], 0), 0, 0, 0, POLICY, 0)
    }

    #[test]
    fn hw_is_the_minimum_over_the_isr_and_never_moves_back() {
        let mut s = three();
        assert_eq!(s.on_leader_durable(10), None, "followers are still at 0");
        assert_eq!(s.on_follower_fetch(2, 1, 10, 10, 1), None);
        assert_eq!(s.on_follower_fetch(3, 1, 7, 10, 1), Some(7));
        assert_eq!(s.on_follower_fetch(3, 1, 10, 10, 2), Some(10));
        // a follower reporting an older offset (a retried fetch) does not lower the HW
        assert_eq!(s.on_follower_fetch(2, 1, 5, 10, 3), None);
        assert_eq!(s.high_watermark(), 10);
    }

    #[test]
    fn a_lagging_follower_is_proposed_for_removal_and_the_hw_moves_once_committed() {
        let mut s = three();
        s.on_leader_durable(100);
        s.on_follower_fetch(2, 1, 100, 100, 1_000);
        s.on_follower_fetch(3, 1, 40, 100, 1_000);
        assert_eq!(s.high_watermark(), 40);
        assert_eq!(s.tick(5_000), None, "not lagging long enough");
        let p = s.tick(10_001).expect("follower 3 lags");
        assert_eq!(
            p,
            IsrProposal {
                isr: vec![1, 2],
                partition_epoch: 0,
                joining: vec![],
            }
        );
        // pending shrink: the HW still waits for 3 (the committed ISR has it)
        assert_eq!(s.on_follower_fetch(2, 1, 100, 100, 10_002), None);
        assert_eq!(s.tick(10_003), None, "one change at a time");
        assert_eq!(s.on_isr_committed(vec![1, 2], 1), Some(100));
        assert_eq!(s.check_acks_all(), Ok(()));
    }

    #[test]
    fn min_insync_replicas_refuses_acks_all_below_it() {
        let mut s = three();
        s.on_isr_committed(vec![1], 3);
        assert_eq!(
            s.check_acks_all(),
            Err(NotEnoughReplicas { isr: 1, min: 2 })
        );
    }

    #[test]
    fn a_caught_up_follower_is_re_added_and_the_hw_uses_the_larger_set_while_pending() {
        let mut s = LeaderState::new(assignment(vec![1, 2], 4), 50, 50, 50, POLICY, 0);
        s.on_follower_fetch(2, 1, 50, 50, 1);
        s.on_follower_fetch(3, 1, 30, 50, 1);
        assert_eq!(s.tick(2), None, "3 has not reached the HW");
        s.on_follower_fetch(3, 1, 50, 50, 3);
        let p = s.tick(4).expect("3 caught up");
        assert_eq!(
            p,
            IsrProposal {
                isr: vec![1, 2, 3],
                partition_epoch: 4,
                joining: vec![(3, 1)],
            }
        );
        // while the expansion is pending, new writes wait for 3 as well
        s.on_leader_durable(60);
        s.on_follower_fetch(2, 1, 60, 60, 5);
        assert_eq!(
            s.high_watermark(),
            50,
            "the pending member 3 is still at 50"
        );
        assert_eq!(s.on_follower_fetch(3, 1, 60, 60, 6), Some(60));
        s.on_isr_committed(vec![1, 2, 3], 5);
        assert_eq!(s.isr(), &[1, 2, 3]);
    }

    #[test]
    fn a_follower_the_controllers_fenced_rejoins_only_on_a_fetch_made_after_it() {
        // Follower 2 was caught up at 100, then killed and restarted on an empty disk: the
        // controllers fenced its old incarnation and took it out of the ISR. The leader's
        // last word from it (offset 100, a moment ago) is about a log that no longer exists.
        let mut s = three();
        s.on_leader_durable(100);
        s.on_follower_fetch(2, 1, 100, 100, 1_000);
        s.on_follower_fetch(3, 1, 100, 100, 1_000);
        assert_eq!(s.on_isr_committed(vec![1, 3], 1), None);
        assert_eq!(s.tick(1_100), None, "no fetch since it left the ISR");
        // its new incarnation fetches from 0: still not caught up
        s.on_follower_fetch(2, 2, 0, 100, 1_200);
        assert_eq!(s.tick(1_300), None, "the new incarnation has nothing yet");
        s.on_follower_fetch(2, 2, 100, 100, 1_400);
        assert_eq!(
            s.tick(1_500),
            Some(IsrProposal {
                isr: vec![1, 3, 2],
                partition_epoch: 1,
                joining: vec![(2, 2)],
            }),
            "caught up again, as its registration 2"
        );
    }

    #[test]
    fn a_late_fetch_of_an_old_incarnation_is_ignored() {
        let mut s = three();
        s.on_leader_durable(100);
        s.on_follower_fetch(3, 1, 100, 100, 1_000);
        s.on_follower_fetch(2, 2, 0, 100, 1_000);
        // a fetch its previous process sent before it died arrives now
        assert_eq!(s.on_follower_fetch(2, 1, 100, 100, 1_100), None);
        assert_eq!(s.high_watermark(), 0, "2 is at 0");
        s.on_isr_committed(vec![1, 3], 1);
        assert_eq!(s.on_follower_fetch(2, 1, 100, 100, 1_200), None);
        assert_eq!(
            s.tick(1_300),
            None,
            "only registration 2 speaks for broker 2"
        );
    }

    #[test]
    fn a_follower_always_one_fetch_behind_under_load_stays_in_sync() {
        let mut s = three();
        // The leader's log grows by 10 between fetches; each fetch starts where the previous
        // answer ended, so the follower is never at the current end, but it is caught up.
        for round in 0..100u64 {
            let now = round as i64 * 1_000;
            s.on_leader_durable(round * 10 + 10);
            s.on_follower_fetch(2, 1, round * 10, round * 10 + 10, now);
            s.on_follower_fetch(3, 1, round * 10, round * 10 + 10, now);
            assert_eq!(s.tick(now), None, "round {round}: nobody lags");
        }
        // Follower 3 stops making progress: it is proposed for removal after the lag time.
        let mut removed = None;
        for round in 100..200u64 {
            let now = round as i64 * 1_000;
            s.on_leader_durable(round * 10 + 10);
            s.on_follower_fetch(2, 1, round * 10, round * 10 + 10, now);
            s.on_follower_fetch(3, 1, 990, round * 10 + 10, now);
            if let Some(p) = s.tick(now) {
                removed = Some((round, p.isr));
                break;
            }
        }
        let (round, isr) = removed.expect("the stuck follower is proposed for removal");
        assert_eq!(isr, vec![1, 2]);
        // last caught up at round 98 (its round-99 fetch started where round 98 ended)
        assert_eq!(round, 109, "removed once the lag time passed");
        let status = s.followers(2_000, round as i64 * 1_000);
        assert!(status.iter().any(|f| f.id == 3 && f.lag_records == 1_010));
    }

    #[test]
    fn a_follower_that_stopped_fetching_is_not_re_added() {
        let mut s = LeaderState::new(assignment(vec![1, 2], 4), 50, 50, 50, POLICY, 0);
        s.on_follower_fetch(2, 1, 50, 50, 1);
        s.on_follower_fetch(3, 1, 50, 50, 1); // caught up, then it dies
        s.on_follower_fetch(2, 1, 50, 50, 20_000);
        assert_eq!(s.tick(20_000), None);
        s.on_follower_fetch(3, 1, 50, 50, 20_001); // it is back
        assert_eq!(s.tick(20_002).map(|p| p.isr), Some(vec![1, 2, 3]));
    }

    #[test]
    fn an_isr_older_than_the_one_held_is_ignored() {
        let mut s = three();
        s.on_isr_committed(vec![1, 2], 5);
        assert_eq!(s.on_isr_committed(vec![1, 2, 3], 4), None);
        assert_eq!(s.isr(), &[1, 2]);
        assert_eq!(s.partition_epoch(), 5);
    }

    #[test]
    fn a_leader_alone_in_the_isr_commits_its_own_end() {
        let s = LeaderState::new(assignment(vec![1], 2), 30, 30, 0, POLICY, 0);
        assert_eq!(s.high_watermark(), 30);
        assert!(s.under_min_isr());
    }

    #[test]
    fn a_rejected_proposal_can_be_made_again() {
        let mut s = three();
        s.on_leader_durable(10);
        assert!(s.tick(20_000).is_some());
        s.on_isr_refused(IsrRefusal::Rejected, 0, 20_001);
        assert!(s.tick(20_002).is_none(), "not at once");
        assert!(s.tick(21_001).is_some());
    }

    /// Issue 14, defect 1: the controller commits "add 3" and fails over before answering;
    /// the retry is refused with a stale partition epoch. The leader must keep counting 3 in
    /// the HW until the metadata settles it, or it acknowledges writes 3 lacks while the
    /// controllers may elect 3.
    #[test]
    fn an_expansion_whose_answer_was_lost_keeps_counting_the_new_member() {
        let mut s = LeaderState::new(assignment(vec![1, 2], 4), 50, 50, 50, POLICY, 0);
        s.on_follower_fetch(2, 1, 50, 50, 1);
        s.on_follower_fetch(3, 1, 50, 50, 1);
        let p = s.tick(2).expect("3 caught up");
        assert_eq!(p.isr, vec![1, 2, 3]);
        // committed at partition epoch 5 by a controller that died; the retry is refused
        s.on_isr_refused(IsrRefusal::Unknown, 4, 3);
        s.on_leader_durable(60);
        s.on_follower_fetch(2, 1, 60, 60, 4);
        assert_eq!(
            s.high_watermark(),
            50,
            "the HW must wait for 3, which the controllers may list in the ISR"
        );
        assert_eq!(
            s.tick(4),
            None,
            "no other change while the outcome is unknown"
        );
        assert_eq!(
            s.tick(2_000).map(|p| (p.isr, p.partition_epoch)),
            Some((vec![1, 2, 3], 4)),
            "the same change is proposed again"
        );
        // the metadata shows it committed
        assert_eq!(s.on_isr_committed(vec![1, 2, 3], 5), None);
        assert_eq!(s.on_follower_fetch(3, 1, 60, 60, 2_001), Some(60));
        assert_eq!(s.tick(2_002), None);
    }

    /// Review finding: a late refusal of an earlier proposal must not settle the pending one.
    #[test]
    fn a_late_answer_to_an_older_proposal_leaves_the_pending_one_alone() {
        let mut s = LeaderState::new(assignment(vec![1, 2], 4), 50, 50, 50, POLICY, 0);
        s.on_follower_fetch(2, 1, 50, 50, 1);
        s.on_follower_fetch(3, 1, 50, 50, 1);
        s.tick(2).expect("3 caught up");
        // the metadata moved to partition epoch 5 (another change); 3 is proposed again there
        s.on_isr_committed(vec![1, 2], 5);
        assert_eq!(s.tick(3).map(|p| p.partition_epoch), Some(5));
        // the first proposal's refusal arrives late
        s.on_isr_refused(IsrRefusal::Rejected, 4, 4);
        s.on_leader_durable(60);
        s.on_follower_fetch(2, 1, 60, 60, 5);
        assert_eq!(
            s.high_watermark(),
            50,
            "the pending expansion still counts 3"
        );
    }

    /// Issue 14, defect 3 (KAFKA-7128): a new leader's HW can be behind what the old leader
    /// committed; a follower that reached that stale HW but not this epoch's start must not
    /// join the ISR, or electing it later loses committed records.
    #[test]
    fn a_follower_joins_only_once_it_reached_the_leaders_epoch_start() {
        // a new leader at log end 100 with a stale HW of 40; 2 (in the ISR) is still at 40,
        // 3 (out of it) at 70
        let mut s = LeaderState::new(assignment(vec![1, 2], 4), 100, 100, 40, POLICY, 0);
        s.on_follower_fetch(2, 1, 40, 100, 1);
        s.on_follower_fetch(3, 1, 70, 100, 1);
        assert_eq!(s.high_watermark(), 40);
        assert_eq!(
            s.tick(2),
            None,
            "3 reached the stale HW 40 but not the epoch start 100"
        );
        s.on_follower_fetch(3, 1, 100, 100, 3);
        assert_eq!(s.tick(4).map(|p| p.isr), Some(vec![1, 2, 3]));
    }
}
