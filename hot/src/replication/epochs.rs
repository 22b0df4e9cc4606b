//! The leader-epoch history of a partition (Kafka's `leader-epoch-checkpoint`): for every
//! leader epoch, the first offset written in it. It answers OffsetsForLeaderEpoch and tells a
//! follower (or a deposed leader) where its log diverges from the new leader's, so that it
//! truncates there before fetching (KIP-101, KIP-279). Pure logic plus a text codec.

/// One epoch and the first offset its leader wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEntry {
    pub epoch: i32,
    pub start_offset: u64,
}

/// Why a checkpoint file cannot be used; the log rebuilds the history from batch headers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("leader-epoch checkpoint is invalid: {0}")]
pub struct CheckpointError(String);

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaderEpochCache {
    /// Epochs strictly increasing, start offsets never decreasing.
    entries: Vec<EpochEntry>,
}

impl LeaderEpochCache {
    pub fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    pub fn latest(&self) -> Option<EpochEntry> {
        self.entries.last().copied()
    }

    /// Records that `epoch` starts at `start_offset` (a leader taking over, or a follower
    /// appending the first batch of a new epoch). An older or equal epoch is ignored; an
    /// entry that starts at or after `start_offset` is replaced, as its data is gone.
    pub fn assign(&mut self, epoch: i32, start_offset: u64) {
        if self.latest().is_some_and(|l| l.epoch >= epoch) {
            return;
        }
        self.entries.retain(|e| e.start_offset < start_offset);
        self.entries.push(EpochEntry {
            epoch,
            start_offset,
        });
    }

    /// OffsetsForLeaderEpoch: the largest epoch `<= requested` this log knows, and the offset
    /// where it ended (the start of the next epoch, or `log_end` for the latest). When
    /// `requested` is older than every epoch here, `requested` itself and where this history
    /// starts, as Kafka answers: whatever the asker holds of that epoch past that point is not
    /// here. `None` only for an empty history (Kafka's UNDEFINED_EPOCH answer).
    pub fn end_offset_for(&self, requested: i32, log_end: u64) -> Option<(i32, u64)> {
        let i = self.entries.partition_point(|e| e.epoch <= requested);
        if i == 0 {
            return self.entries.first().map(|e| (requested, e.start_offset));
        }
        let found = self.entries[i - 1];
        let end = self
            .entries
            .get(i)
            .map_or(log_end, |next| next.start_offset);
        Some((found.epoch, end))
    }

    /// Forgets epochs that start at or after `end` (the log was truncated there).
    pub fn truncate_from_end(&mut self, end: u64) {
        self.entries.retain(|e| e.start_offset < end);
    }

    /// Moves the history's start to `start` (retention removed older segments): the epoch
    /// that covers `start` now starts there.
    pub fn truncate_from_start(&mut self, start: u64) {
        let covering = self.entries.iter().rposition(|e| e.start_offset <= start);
        if let Some(i) = covering {
            self.entries.drain(..i);
            self.entries[0].start_offset = start;
        }
    }

    /// Kafka's checkpoint text: a version line, a count line, then `epoch offset` lines.
    pub fn encode(&self) -> String {
        let mut out = format!("0\n{}\n", self.entries.len());
        for e in &self.entries {
            out.push_str(&format!("{} {}\n", e.epoch, e.start_offset));
        }
        out
    }

    pub fn decode(text: &str) -> Result<Self, CheckpointError> {
        let bad = |m: &str| CheckpointError(m.to_string());
        let mut lines = text.lines();
        if lines.next() != Some("0") {
            return Err(bad("unknown version"));
        }
        let count: usize = lines
            .next()
            .and_then(|l| l.parse().ok())
            .ok_or_else(|| bad("no entry count"))?;
        let mut cache = LeaderEpochCache::default();
        for _ in 0..count {
            let line = lines
                .next()
                .ok_or_else(|| bad("fewer entries than counted"))?;
            let (e, o) = line
                .split_once(' ')
                .ok_or_else(|| bad("entry is not 'epoch offset'"))?;
            let entry = EpochEntry {
                epoch: e.parse().map_err(|_| bad("epoch is not a number"))?,
                start_offset: o.parse().map_err(|_| bad("offset is not a number"))?,
            };
            if cache
                .latest()
                .is_some_and(|l| l.epoch >= entry.epoch || l.start_offset > entry.start_offset)
            {
                return Err(bad("entries out of order"));
            }
            cache.entries.push(entry);
        }
        Ok(cache)
    }
}

/// One round of a follower's truncation (KIP-101, KIP-279): where to cut after asking the
/// leader about the latest local epoch, and whether to ask again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TruncationRound {
    pub truncate_to: u64,
    /// The leader answered an epoch this replica does not have: after the cut (to where this
    /// replica's older epochs end) it must ask again about its new latest epoch.
    pub again: bool,
}

/// Decides one truncation round from the leader's answer: its largest epoch not above the one
/// asked and where that epoch ends there (`None`: the leader's history is empty, and the
/// follower falls back to its high watermark).
///
/// - This replica has the answered epoch: both logs agree up to the smaller of the two ends
///   of that epoch; cut there, done.
/// - It does not (it led, or copied, an epoch the leader never saw, and lacks the one the
///   leader answered): cut to where its own largest older epoch ends and ask again. Each such
///   round removes this replica's latest epoch, so the rounds end.
/// - Every local epoch is newer than the answer: nothing here is in the leader's history;
///   cut to where the local history starts.
pub fn truncation_round(
    local: &LeaderEpochCache,
    local_end: u64,
    high_watermark: u64,
    leader_answer: Option<(i32, u64)>,
) -> TruncationRound {
    let done = |to: u64| TruncationRound {
        truncate_to: to.min(local_end),
        again: false,
    };
    let Some((leader_epoch, leader_end)) = leader_answer else {
        return done(high_watermark);
    };
    let i = local.entries.partition_point(|e| e.epoch <= leader_epoch);
    let Some(floor) = i.checked_sub(1).map(|i| local.entries[i]) else {
        let start = local.entries.first().map_or(local_end, |e| e.start_offset);
        return done(start.min(leader_end));
    };
    let floor_end = local
        .entries
        .get(i)
        .map_or(local_end, |next| next.start_offset);
    if floor.epoch == leader_epoch {
        done(floor_end.min(leader_end))
    } else {
        TruncationRound {
            truncate_to: floor_end.min(local_end),
            again: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(pairs: &[(i32, u64)]) -> LeaderEpochCache {
        let mut c = LeaderEpochCache::default();
        for (e, o) in pairs {
            c.assign(*e, *o);
        }
        c
    }

    #[test]
    fn end_offsets_per_epoch() {
        let c = cache(&[(0, 0), (2, 10), (5, 25)]);
        assert_eq!(c.end_offset_for(0, 40), Some((0, 10)));
        assert_eq!(
            c.end_offset_for(1, 40),
            Some((0, 10)),
            "an unknown epoch answers with the one below"
        );
        assert_eq!(c.end_offset_for(2, 40), Some((2, 25)));
        assert_eq!(
            c.end_offset_for(9, 40),
            Some((5, 40)),
            "the latest epoch ends at the log end"
        );
        assert_eq!(
            cache(&[(3, 7)]).end_offset_for(2, 40),
            Some((2, 7)),
            "older than every epoch: the asked epoch ends where this history starts"
        );
        assert_eq!(LeaderEpochCache::default().end_offset_for(2, 40), None);
    }

    #[test]
    fn assign_replaces_epochs_whose_data_is_gone_and_ignores_old_ones() {
        let mut c = cache(&[(0, 0), (1, 10)]);
        c.assign(1, 50);
        assert_eq!(
            c.latest(),
            Some(EpochEntry {
                epoch: 1,
                start_offset: 10
            })
        );
        c.assign(3, 5); // a new leader took over at 5: epoch 1 never really started at 10
        assert_eq!(
            c.entries(),
            &[
                EpochEntry {
                    epoch: 0,
                    start_offset: 0
                },
                EpochEntry {
                    epoch: 3,
                    start_offset: 5
                }
            ]
        );
    }

    #[test]
    fn truncation_and_retention_trim_the_history() {
        let mut c = cache(&[(0, 0), (2, 10), (5, 25)]);
        c.truncate_from_end(25);
        assert_eq!(c.latest().unwrap().epoch, 2);
        c.truncate_from_start(12);
        assert_eq!(
            c.entries(),
            &[EpochEntry {
                epoch: 2,
                start_offset: 12
            }]
        );
    }

    #[test]
    fn checkpoint_round_trips_and_garbage_is_refused() {
        let c = cache(&[(0, 0), (2, 10), (5, 25)]);
        assert_eq!(LeaderEpochCache::decode(&c.encode()).unwrap(), c);
        assert!(LeaderEpochCache::decode("0\n2\n1 5\n").is_err());
        assert!(LeaderEpochCache::decode("0\n2\n3 5\n2 9\n").is_err());
        assert!(LeaderEpochCache::decode("7\n0\n").is_err());
        assert!(LeaderEpochCache::decode("").is_err());
    }

    /// A log of (epoch of each offset) to test divergence end to end.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Log(Vec<i32>);

    impl Log {
        fn epochs(&self) -> LeaderEpochCache {
            let mut c = LeaderEpochCache::default();
            for (o, e) in self.0.iter().enumerate() {
                c.assign(*e, o as u64);
            }
            c
        }
        fn end(&self) -> u64 {
            self.0.len() as u64
        }
        /// Follower catch-up: truncate at the divergence point (as many rounds as it takes),
        /// then copy the leader's tail.
        fn follow(&mut self, leader: &Log) {
            loop {
                let mine = self.epochs();
                let Some(asked) = mine.latest().map(|l| l.epoch) else {
                    break;
                };
                let answer = leader.epochs().end_offset_for(asked, leader.end());
                let round = truncation_round(&mine, self.end(), 0, answer);
                self.0.truncate(round.truncate_to as usize);
                if !round.again {
                    break;
                }
            }
            let cut = self.0.len();
            self.0.extend_from_slice(&leader.0[cut..]);
        }
    }

    /// KIP-101 scenario 1: the old leader A had offsets 0..2 (epoch 0) but only 0..1 were
    /// replicated; B became leader (epoch 1) and wrote offset 1. A must drop its offset 1 and
    /// take B's, instead of keeping its own and diverging (the HW-based truncation bug).
    #[test]
    fn kip101_deposed_leader_truncates_to_the_new_leaders_epoch_start() {
        let mut a = Log(vec![0, 0]);
        let b = Log(vec![0, 1]);
        a.follow(&b);
        assert_eq!(a, b);
    }

    /// KIP-101 scenario 2: both replicas crash; B restarts first and leads epoch 1 with
    /// different data at the same offsets A holds from epoch 0. They must converge on B's.
    #[test]
    fn kip101_replicas_with_different_data_at_the_same_offsets_converge() {
        let mut a = Log(vec![0, 0, 0, 0]);
        let b = Log(vec![0, 0, 1, 1, 1]);
        a.follow(&b);
        assert_eq!(a, b);
    }

    /// KIP-279: a follower whose latest epoch the leader never had (it led briefly, wrote,
    /// and was deposed) keeps only what the leader's older epoch covers.
    #[test]
    fn kip279_follower_with_an_epoch_the_leader_never_saw() {
        let mut a = Log(vec![0, 0, 2, 2, 2]); // A led epoch 2, unreplicated
        let b = Log(vec![0, 0, 0, 3, 3]); // B had more of epoch 0, then led epoch 3
        a.follow(&b);
        assert_eq!(a, b);
    }

    /// Issue 14, defect 4: the follower led epoch 2 (which the leader never saw) after
    /// epoch 0; the leader had epoch 1 from offset 3. Cutting once, to where the leader's
    /// epoch 1 ends (4), kept offset 3 of epoch 0, which the leader holds in epoch 1. This
    /// replica lacks epoch 1: it cuts where its epoch 0 ends (5) and asks about epoch 0,
    /// which cuts to 3.
    #[test]
    fn kip279_truncation_repeats_until_the_epochs_agree() {
        let mut a = Log(vec![0, 0, 0, 0, 0, 2, 2]);
        let b = Log(vec![0, 0, 0, 1, 3, 3]);
        a.follow(&b);
        assert_eq!(a, b);
        let before = Log(vec![0, 0, 0, 0, 0, 2, 2]).epochs();
        assert_eq!(b.epochs().end_offset_for(2, b.end()), Some((1, 4)));
        let first = truncation_round(&before, 7, 0, Some((1, 4)));
        assert_eq!(
            first,
            TruncationRound {
                truncate_to: 5,
                again: true
            },
            "no epoch 1 here: cut where epoch 0 ends here, ask again"
        );
        let second = truncation_round(&Log(vec![0; 5]).epochs(), 5, 0, Some((0, 3)));
        assert_eq!(
            second,
            TruncationRound {
                truncate_to: 3,
                again: false
            }
        );
    }

    /// Found by the simulation (seed 1868 with unclean election): a new leader whose history
    /// starts at epoch 1 answered "no such epoch" to a follower asking about epoch 0, and the
    /// follower kept its epoch-0 records up to its high watermark, diverging from the leader.
    #[test]
    fn a_follower_older_than_the_leaders_history_truncates_to_its_start() {
        let mut old_leader = Log(vec![0, 0, 0, 0, 0]);
        let mut leader = Log(vec![]);
        let mut history = LeaderEpochCache::default();
        history.assign(1, 0); // elected at epoch 1 with an empty log, nothing written yet
        let answer = history.end_offset_for(0, leader.end());
        assert_eq!(answer, Some((0, 0)));
        let round = truncation_round(&old_leader.epochs(), old_leader.end(), 5, answer);
        assert_eq!((round.truncate_to, round.again), (0, false));
        old_leader.0.truncate(round.truncate_to as usize);
        leader.0.extend([1, 1]);
        old_leader.follow(&leader);
        assert_eq!(old_leader, leader);
    }

    /// Review finding: a replica that became leader of an idle partition (an epoch entry at
    /// its log end, no record in it) and lost the leadership asks about that epoch; the new
    /// leader never had it. The rounds must end (the empty epoch is dropped), not repeat the
    /// same question forever.
    #[test]
    fn truncation_rounds_end_when_the_latest_epoch_is_empty() {
        let mut local = cache(&[(1, 0), (4, 100)]);
        let leader = cache(&[(1, 0), (2, 60), (5, 70)]);
        let mut end = 100;
        let mut rounds = 0;
        loop {
            rounds += 1;
            assert!(rounds < 10, "truncation does not end");
            let asked = local.latest().expect("history").epoch;
            let answer = leader.end_offset_for(asked, 80);
            let round = truncation_round(&local, end, 0, answer);
            end = end.min(round.truncate_to);
            local.truncate_from_end(round.truncate_to);
            if !round.again {
                break;
            }
        }
        assert_eq!(end, 60, "epoch 1 ends at 60 on the leader");
    }

    #[test]
    fn a_follower_that_is_only_behind_truncates_nothing() {
        let mut a = Log(vec![0, 0, 1]);
        let b = Log(vec![0, 0, 1, 1, 2, 2]);
        a.follow(&b);
        assert_eq!(a, b);
        let mut empty = Log(vec![]);
        empty.follow(&b);
        assert_eq!(empty, b);
    }

    fn climb(start: i32, steps: &[u8]) -> Vec<i32> {
        let mut e = start;
        steps
            .iter()
            .map(|s| {
                e += i32::from(*s % 3 == 0);
                e
            })
            .collect()
    }

    proptest::proptest! {
        /// Whatever a follower appended after the last offset it shares with the leader (in
        /// epochs the leader then superseded), following the leader makes the logs equal.
        #[test]
        fn followers_converge_on_the_leader(
            prefix in proptest::collection::vec(proptest::prelude::any::<u8>(), 1..20),
            follower in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..20),
            leader in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..20),
        ) {
            let p = climb(0, &prefix);
            let last = *p.last().unwrap();
            let f = climb(last, &follower);
            let top = f.iter().copied().max().unwrap_or(last);
            let l = climb(top + 1, &leader);
            let mut follower_log = Log([p.clone(), f].concat());
            let leader_log = Log(if l.is_empty() { p } else { [p, vec![top + 1], l].concat() });
            follower_log.follow(&leader_log);
            proptest::prop_assert_eq!(follower_log, leader_log);
        }
    }
}
