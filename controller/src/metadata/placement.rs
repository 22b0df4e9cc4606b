//! Replica placement: which brokers hold each partition of a new topic, and in which order
//! (the first replica is the preferred leader).
//!
//! Deterministic for a given input, so every controller replica applying the same metadata
//! log entry computes the same assignment. Follows Kafka's scheme: brokers are ordered so
//! that racks alternate; partition `p`'s first replica is broker `(start + p) mod n`, and the
//! followers are spread with a shift that grows every `n` partitions, so leaders and
//! followers both spread evenly.

use std::collections::{BTreeMap, BTreeSet};

use super::BrokerId;

/// A broker that can take replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: BrokerId,
    pub rack: Option<String>,
}

/// Why a topic cannot be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("replication factor {rf} is larger than the {available} brokers available")]
    NotEnoughBrokers { rf: usize, available: usize },
    #[error("replication factor must be at least 1")]
    ZeroReplicationFactor,
}

/// Orders brokers so that consecutive ones are on different racks where possible:
/// racks sorted by name, brokers by id within a rack, then taken round-robin across racks.
fn rack_alternated(candidates: &[Candidate]) -> Vec<BrokerId> {
    let mut by_rack: BTreeMap<Option<&str>, Vec<BrokerId>> = BTreeMap::new();
    for c in candidates {
        by_rack.entry(c.rack.as_deref()).or_default().push(c.id);
    }
    for ids in by_rack.values_mut() {
        ids.sort_unstable();
    }
    let mut out = Vec::with_capacity(candidates.len());
    let mut round = 0;
    while out.len() < candidates.len() {
        for ids in by_rack.values() {
            if let Some(id) = ids.get(round) {
                out.push(*id);
            }
        }
        round += 1;
    }
    out
}

/// Assigns `partitions` partitions (numbered from `first_partition`) with `rf` replicas each
/// over `candidates`. `start` rotates where the first partition's leader goes, so that many
/// topics spread their leaders too (the caller passes a counter kept in the metadata).
pub fn assign(
    candidates: &[Candidate],
    first_partition: u32,
    partitions: u32,
    rf: usize,
    start: usize,
) -> Result<Vec<Vec<BrokerId>>, PlacementError> {
    if rf == 0 {
        return Err(PlacementError::ZeroReplicationFactor);
    }
    if rf > candidates.len() {
        return Err(PlacementError::NotEnoughBrokers {
            rf,
            available: candidates.len(),
        });
    }
    let brokers = rack_alternated(candidates);
    let n = brokers.len();
    let rack_of: BTreeMap<BrokerId, Option<&str>> = candidates
        .iter()
        .map(|c| (c.id, c.rack.as_deref()))
        .collect();
    let rack_count = rack_of.values().collect::<BTreeSet<_>>().len();
    let mut out = Vec::with_capacity(partitions as usize);
    for p in first_partition..first_partition + partitions {
        let p = p as usize;
        let first = (start + p) % n;
        let mut replicas = vec![brokers[first]];
        let mut racks_used = BTreeSet::from([rack_of[&brokers[first]]]);
        if n > 1 {
            let shift = (start + p / n) % (n - 1);
            for j in 0..rf - 1 {
                let preferred = (shift + j) % (n - 1);
                // From the preferred follower slot on, the first broker not yet chosen whose
                // rack is not yet used (while unused racks remain).
                let chosen = (0..n - 1)
                    .map(|k| brokers[(first + 1 + (preferred + k) % (n - 1)) % n])
                    .find(|id| {
                        !replicas.contains(id)
                            && (racks_used.len() >= rack_count
                                || !racks_used.contains(&rack_of[id]))
                    })
                    .expect("rf <= brokers, so a free broker remains");
                racks_used.insert(rack_of[&chosen]);
                replicas.push(chosen);
            }
        }
        out.push(replicas);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    fn brokers(racks: &[Option<&str>]) -> Vec<Candidate> {
        racks
            .iter()
            .enumerate()
            .map(|(i, r)| Candidate {
                id: i as BrokerId + 1,
                rack: r.map(str::to_string),
            })
            .collect()
    }

    #[test]
    fn leaders_and_replicas_spread_evenly() {
        let b = brokers(&[None, None, None]);
        let a = assign(&b, 0, 12, 3, 0).unwrap();
        let mut leaders: HashMap<BrokerId, usize> = HashMap::new();
        let mut replicas: HashMap<BrokerId, usize> = HashMap::new();
        for r in &a {
            assert_eq!(r.len(), 3);
            assert_eq!(
                r.iter().collect::<HashSet<_>>().len(),
                3,
                "replicas must be distinct: {r:?}"
            );
            *leaders.entry(r[0]).or_default() += 1;
            for id in r {
                *replicas.entry(*id).or_default() += 1;
            }
        }
        assert_eq!(leaders.values().copied().collect::<Vec<_>>(), vec![4, 4, 4]);
        assert!(replicas.values().all(|&c| c == 12));
    }

    #[test]
    fn placement_is_deterministic_and_start_rotates_leaders() {
        let b = brokers(&[None, None, None, None]);
        assert_eq!(
            assign(&b, 0, 8, 2, 3).unwrap(),
            assign(&b, 0, 8, 2, 3).unwrap()
        );
        let a0 = assign(&b, 0, 1, 1, 0).unwrap();
        let a1 = assign(&b, 0, 1, 1, 1).unwrap();
        assert_ne!(a0[0][0], a1[0][0]);
    }

    #[test]
    fn replicas_of_a_partition_land_on_different_racks() {
        let b = brokers(&[
            Some("a"),
            Some("a"),
            Some("b"),
            Some("b"),
            Some("c"),
            Some("c"),
        ]);
        let rack_of = |id: BrokerId| b.iter().find(|c| c.id == id).unwrap().rack.clone();
        for r in assign(&b, 0, 30, 3, 0).unwrap() {
            let racks: HashSet<_> = r.iter().map(|id| rack_of(*id)).collect();
            assert_eq!(racks.len(), 3, "partition {r:?} does not span 3 racks");
        }
    }

    #[test]
    fn too_few_brokers_is_refused() {
        let b = brokers(&[None, None]);
        assert_eq!(
            assign(&b, 0, 1, 3, 0),
            Err(PlacementError::NotEnoughBrokers {
                rf: 3,
                available: 2
            })
        );
        assert_eq!(
            assign(&b, 0, 1, 0, 0),
            Err(PlacementError::ZeroReplicationFactor)
        );
    }

    #[test]
    fn added_partitions_continue_the_pattern() {
        let b = brokers(&[None, None, None]);
        let all = assign(&b, 0, 6, 2, 1).unwrap();
        let tail = assign(&b, 4, 2, 2, 1).unwrap();
        assert_eq!(&all[4..], &tail[..]);
    }
}
