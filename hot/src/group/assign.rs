//! Server-side partition assignors for native (gRPC) group members: range, round-robin and
//! sticky, with Kafka's semantics. Pure functions: members' subscriptions and the topics'
//! partition counts in, each member's partitions out.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A member as the assignor sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscriber {
    pub member_id: String,
    pub topics: BTreeSet<String>,
    /// What it owned before this rebalance (used by the sticky assignor).
    pub owned: Vec<(String, i32)>,
}

/// The assignors served, by the protocol names Kafka's clients use.
pub const ASSIGNORS: &[&str] = &["range", "roundrobin", "sticky"];

pub type Assignment = BTreeMap<String, Vec<(String, i32)>>;

/// Assigns the partitions of every subscribed topic (`partitions`: topic -> count) to
/// `members` with the named assignor; `None` for an unknown assignor.
pub fn assign(
    assignor: &str,
    members: &[Subscriber],
    partitions: &BTreeMap<String, i32>,
) -> Option<Assignment> {
    let mut out: Assignment = members
        .iter()
        .map(|m| (m.member_id.clone(), Vec::new()))
        .collect();
    match assignor {
        "range" => range(members, partitions, &mut out),
        "roundrobin" => round_robin(members, partitions, &mut out),
        "sticky" => sticky(members, partitions, &mut out),
        _ => return None,
    }
    for v in out.values_mut() {
        v.sort();
    }
    Some(out)
}

fn subscribers<'a>(members: &'a [Subscriber], topic: &str) -> Vec<&'a Subscriber> {
    let mut v: Vec<&Subscriber> = members
        .iter()
        .filter(|m| m.topics.contains(topic))
        .collect();
    v.sort_by(|a, b| a.member_id.cmp(&b.member_id));
    v
}

/// Kafka's RangeAssignor: per topic, members in id order get contiguous ranges; the first
/// `partitions % members` get one more.
fn range(members: &[Subscriber], partitions: &BTreeMap<String, i32>, out: &mut Assignment) {
    for (topic, &count) in partitions {
        let subs = subscribers(members, topic);
        if subs.is_empty() {
            continue;
        }
        let (each, extra) = (count / subs.len() as i32, count % subs.len() as i32);
        let mut next = 0;
        for (i, m) in subs.iter().enumerate() {
            let n = each + i32::from((i as i32) < extra);
            let list = out
                .get_mut(&m.member_id)
                .expect("every member has an entry");
            list.extend((next..next + n).map(|p| (topic.clone(), p)));
            next += n;
        }
    }
}

/// Kafka's RoundRobinAssignor: every (topic, partition) in order, dealt to the members in
/// id order, skipping members not subscribed to the topic.
fn round_robin(members: &[Subscriber], partitions: &BTreeMap<String, i32>, out: &mut Assignment) {
    let mut sorted: Vec<&Subscriber> = members.iter().collect();
    sorted.sort_by(|a, b| a.member_id.cmp(&b.member_id));
    if sorted.is_empty() {
        return;
    }
    let mut i = 0usize;
    for (topic, &count) in partitions {
        if !sorted.iter().any(|m| m.topics.contains(topic)) {
            continue;
        }
        for p in 0..count {
            while !sorted[i % sorted.len()].topics.contains(topic) {
                i += 1;
            }
            let m = sorted[i % sorted.len()];
            out.get_mut(&m.member_id)
                .expect("every member has an entry")
                .push((topic.clone(), p));
            i += 1;
        }
    }
}

/// A sticky assignment: members keep what they owned (while subscribed, and up to a fair
/// share), the rest goes to the least-loaded subscribed member. Balanced within one
/// partition when all members subscribe to the same topics, as Kafka's StickyAssignor.
fn sticky(members: &[Subscriber], partitions: &BTreeMap<String, i32>, out: &mut Assignment) {
    let total: usize = partitions
        .iter()
        .filter(|(t, _)| members.iter().any(|m| m.topics.contains(*t)))
        .map(|(_, c)| *c as usize)
        .sum();
    if members.is_empty() {
        return;
    }
    let cap = total.div_ceil(members.len());
    let mut taken: HashMap<(String, i32), String> = HashMap::new();
    let mut sorted: Vec<&Subscriber> = members.iter().collect();
    sorted.sort_by(|a, b| a.member_id.cmp(&b.member_id));
    for m in &sorted {
        for (t, p) in &m.owned {
            let exists = partitions.get(t).is_some_and(|c| *p >= 0 && p < c);
            let list = out.get_mut(&m.member_id).expect("entry");
            if exists
                && m.topics.contains(t)
                && !taken.contains_key(&(t.clone(), *p))
                && list.len() < cap
            {
                taken.insert((t.clone(), *p), m.member_id.clone());
                list.push((t.clone(), *p));
            }
        }
    }
    for (topic, &count) in partitions {
        for p in 0..count {
            if taken.contains_key(&(topic.clone(), p)) {
                continue;
            }
            let least = sorted
                .iter()
                .filter(|m| m.topics.contains(topic))
                .min_by_key(|m| (out[&m.member_id].len(), m.member_id.clone()));
            if let Some(m) = least {
                out.get_mut(&m.member_id)
                    .expect("entry")
                    .push((topic.clone(), p));
                taken.insert((topic.clone(), p), m.member_id.clone());
            }
        }
    }
    // Owned partitions kept beyond what balance allows move from the fullest to the
    // emptiest member (only possible when subscriptions differ).
    loop {
        let (Some(max), Some(min)) = (
            sorted.iter().max_by_key(|m| out[&m.member_id].len()),
            sorted.iter().min_by_key(|m| out[&m.member_id].len()),
        ) else {
            return;
        };
        if out[&max.member_id].len() <= out[&min.member_id].len() + 1 {
            return;
        }
        let movable = out[&max.member_id]
            .iter()
            .position(|(t, _)| min.topics.contains(t));
        let Some(i) = movable else { return };
        let tp = out.get_mut(&max.member_id).expect("entry").remove(i);
        out.get_mut(&min.member_id).expect("entry").push(tp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(ids: &[&str], topics: &[&str]) -> Vec<Subscriber> {
        ids.iter()
            .map(|id| Subscriber {
                member_id: id.to_string(),
                topics: topics.iter().map(|t| t.to_string()).collect(),
                owned: Vec::new(),
            })
            .collect()
    }

    fn counts(a: &Assignment) -> Vec<usize> {
        a.values().map(Vec::len).collect()
    }

    fn all(a: &Assignment) -> Vec<(String, i32)> {
        let mut v: Vec<_> = a.values().flatten().cloned().collect();
        v.sort();
        v
    }

    fn topics(spec: &[(&str, i32)]) -> BTreeMap<String, i32> {
        spec.iter().map(|(t, c)| (t.to_string(), *c)).collect()
    }

    #[test]
    fn every_assignor_covers_each_partition_exactly_once() {
        let parts = topics(&[("a", 7), ("b", 5)]);
        let expected: Vec<(String, i32)> = parts
            .iter()
            .flat_map(|(t, c)| (0..*c).map(move |p| (t.clone(), p)))
            .collect();
        for name in ASSIGNORS {
            for n in 1..=13 {
                let ids: Vec<String> = (0..n).map(|i| format!("m{i:02}")).collect();
                let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
                let a = assign(name, &members(&refs, &["a", "b"]), &parts).unwrap();
                assert_eq!(all(&a), expected, "{name} with {n} members");
            }
        }
        assert!(assign("cooperative-sticky", &[], &parts).is_none());
    }

    #[test]
    fn range_gives_contiguous_ranges_per_topic_and_round_robin_deals() {
        let parts = topics(&[("t", 7)]);
        let a = assign("range", &members(&["x", "y", "z"], &["t"]), &parts).unwrap();
        let t = |v: &[i32]| v.iter().map(|p| ("t".to_string(), *p)).collect::<Vec<_>>();
        assert_eq!(a["x"], t(&[0, 1, 2]));
        assert_eq!(a["y"], t(&[3, 4]));
        assert_eq!(a["z"], t(&[5, 6]));
        let r = assign("roundrobin", &members(&["x", "y", "z"], &["t"]), &parts).unwrap();
        assert_eq!(r["x"], t(&[0, 3, 6]));
        assert_eq!(r["y"], t(&[1, 4]));
        assert_eq!(counts(&r), vec![3, 2, 2]);
    }

    #[test]
    fn members_only_get_topics_they_subscribe_to() {
        let parts = topics(&[("a", 4), ("b", 4)]);
        let mut m = members(&["p", "q"], &["a"]);
        m[1].topics.insert("b".into());
        for name in ASSIGNORS {
            let a = assign(name, &m, &parts).unwrap();
            assert!(a["p"].iter().all(|(t, _)| t == "a"), "{name}: {a:?}");
            assert_eq!(all(&a).len(), 8, "{name}");
        }
    }

    #[test]
    fn sticky_keeps_what_members_owned_and_stays_balanced() {
        let parts = topics(&[("t", 12)]);
        let first = assign("sticky", &members(&["a", "b", "c"], &["t"]), &parts).unwrap();
        assert_eq!(counts(&first), vec![4, 4, 4]);
        // d joins: a, b, c each give up one partition and keep the other three.
        let mut next = members(&["a", "b", "c", "d"], &["t"]);
        for m in &mut next {
            m.owned = first.get(&m.member_id).cloned().unwrap_or_default();
        }
        let second = assign("sticky", &next, &parts).unwrap();
        assert_eq!(counts(&second), vec![3, 3, 3, 3]);
        for id in ["a", "b", "c"] {
            let kept = second[id].iter().filter(|p| first[id].contains(p)).count();
            assert_eq!(kept, 3, "{id} kept {kept}");
        }
        // b leaves: a, c, d keep all they had and share b's.
        let mut third: Vec<Subscriber> = next.into_iter().filter(|m| m.member_id != "b").collect();
        for m in &mut third {
            m.owned = second[&m.member_id].clone();
        }
        let after = assign("sticky", &third, &parts).unwrap();
        assert_eq!(counts(&after), vec![4, 4, 4]);
        for id in ["a", "c", "d"] {
            assert!(
                second[id].iter().all(|p| after[id].contains(p)),
                "{id} lost a partition"
            );
        }
    }
}
