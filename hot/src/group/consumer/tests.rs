use super::*;

const T1: Uuid = Uuid::from_u128(1);
const T2: Uuid = Uuid::from_u128(2);

fn topics(partitions: u32) -> Topics {
    let mut t = Topics::new();
    t.insert("orders".into(), (T1, partitions));
    t.insert("refunds".into(), (T2, 2));
    t
}

fn config() -> ConsumerGroupConfig {
    ConsumerGroupConfig {
        session_timeout_ms: 45_000,
        heartbeat_interval_ms: 5_000,
        max_size: 10,
    }
}

fn join(id: &str, names: &[&str]) -> Heartbeat {
    Heartbeat {
        member_id: id.into(),
        member_epoch: 0,
        rebalance_timeout_ms: 30_000,
        subscribed_topic_names: Some(names.iter().map(|s| s.to_string()).collect()),
        owned: Some(Assignment::new()),
        ..Heartbeat::default()
    }
}

/// A well-behaved member's next heartbeat: its epoch and everything it was told it owns.
fn beat(g: &ConsumerGroup, id: &str) -> Heartbeat {
    let m = &g.members[id];
    Heartbeat {
        member_id: id.into(),
        member_epoch: m.epoch,
        owned: Some(m.assigned.clone()),
        ..Heartbeat::default()
    }
}

fn step(g: &mut ConsumerGroup, id: &str, t: &Topics, now: i64) -> HeartbeatReply {
    let h = beat(g, id);
    hb(g, h, t, now)
}

fn hb(g: &mut ConsumerGroup, h: Heartbeat, t: &Topics, now: i64) -> HeartbeatReply {
    let r = g.heartbeat(h, &Client::default(), t, config(), now);
    assert_single_owner(g);
    r
}

/// No partition is ever held (assigned or still being revoked) by two members.
fn assert_single_owner(g: &ConsumerGroup) {
    let mut seen = BTreeSet::new();
    for m in g.members.values() {
        for (t, ps) in m.assigned.iter().chain(m.revoking.iter()) {
            for p in ps {
                assert!(
                    seen.insert((*t, *p)),
                    "{t}-{p} held twice: {:#?}",
                    g.members
                );
            }
        }
    }
}

fn parts(a: &Assignment) -> usize {
    count(a)
}

#[test]
fn a_lone_member_gets_every_partition_it_subscribes_to() {
    let t = topics(4);
    let mut g = ConsumerGroup::new("g");
    let r = hb(&mut g, join("m1", &["orders"]), &t, 0);
    assert_eq!(r.error, codes::NONE, "{r:?}");
    assert!(r.member_epoch > 0);
    assert_eq!(r.heartbeat_interval_ms, 5_000);
    let a = r
        .assignment
        .expect("a joining member is told its assignment");
    assert_eq!(a, Assignment::from([(T1, (0..4).collect())]));
    assert_eq!(g.state(), "Stable");
    // an unchanged assignment is not sent again on a light heartbeat
    let mut light = beat(&g, "m1");
    light.owned = None;
    assert_eq!(hb(&mut g, light, &t, 10).assignment, None);
}

#[test]
fn a_partition_moves_only_after_its_owner_gave_it_up() {
    let t = topics(4);
    let mut g = ConsumerGroup::new("g");
    hb(&mut g, join("m1", &["orders"]), &t, 0);
    let e1 = g.members["m1"].epoch;
    // m2 joins: its share is still m1's, so it gets nothing yet
    let r2 = hb(&mut g, join("m2", &["orders"]), &t, 1);
    assert_eq!(r2.assignment, Some(Assignment::new()));
    assert_eq!(g.members["m2"].state, MemberState::UnreleasedPartitions);
    // m1 is told to keep two partitions, at its old epoch
    let r1 = step(&mut g, "m1", &t, 2);
    assert_eq!(r1.member_epoch, e1);
    let kept = r1.assignment.expect("the smaller assignment");
    assert_eq!(parts(&kept), 2);
    assert_eq!(g.members["m1"].state, MemberState::UnrevokedPartitions);
    // a heartbeat that still reports the revoked partitions changes nothing
    let mut stale = beat(&g, "m1");
    stale.owned = Some(Assignment::from([(T1, (0..4).collect())]));
    hb(&mut g, stale, &t, 3);
    assert_eq!(g.members["m1"].state, MemberState::UnrevokedPartitions);
    // m2 still waits (a full heartbeat is always answered with the assignment)
    assert_eq!(
        step(&mut g, "m2", &t, 4).assignment,
        Some(Assignment::new())
    );
    // m1 confirms: it moves to the new epoch, and m2 then gets the rest
    let r1 = step(&mut g, "m1", &t, 5);
    assert!(r1.member_epoch > e1);
    let r2 = step(&mut g, "m2", &t, 6);
    assert_eq!(parts(&r2.assignment.expect("now free")), 2);
    assert_eq!(g.state(), "Stable");
}

#[test]
fn stale_and_unknown_members_are_fenced() {
    let t = topics(4);
    let mut g = ConsumerGroup::new("g");
    hb(&mut g, join("m1", &["orders"]), &t, 0);
    let mut old = beat(&g, "m1");
    old.member_epoch -= 1;
    old.owned = Some(Assignment::from([(T1, (0..8).collect())]));
    assert_eq!(hb(&mut g, old, &t, 1).error, codes::FENCED_MEMBER_EPOCH);
    let mut stranger = beat(&g, "m1");
    stranger.member_id = "m9".into();
    assert_eq!(hb(&mut g, stranger, &t, 2).error, codes::UNKNOWN_MEMBER_ID);
}

#[test]
fn the_previous_epoch_is_taken_when_the_member_owns_no_more_than_its_assignment() {
    // its last answer was lost: it heartbeats at the epoch before
    let t = topics(4);
    let mut g = ConsumerGroup::new("g");
    hb(&mut g, join("m1", &["orders"]), &t, 0);
    hb(&mut g, join("m2", &["orders"]), &t, 1);
    step(&mut g, "m1", &t, 2);
    step(&mut g, "m1", &t, 3); // m1 now at the new epoch
    let m1 = &g.members["m1"];
    let retry = Heartbeat {
        member_id: "m1".into(),
        member_epoch: m1.previous_epoch,
        owned: Some(m1.assigned.clone()),
        ..Heartbeat::default()
    };
    assert_eq!(hb(&mut g, retry, &t, 4).error, codes::NONE);
}

#[test]
fn a_silent_member_is_removed_after_its_session_and_its_partitions_move() {
    let t = topics(4);
    let mut g = ConsumerGroup::new("g");
    hb(&mut g, join("m1", &["orders"]), &t, 0);
    hb(&mut g, join("m2", &["orders"]), &t, 0);
    for now in 1..4 {
        step(&mut g, "m1", &t, now);
        step(&mut g, "m2", &t, now);
    }
    assert_eq!(parts(&g.members["m2"].assigned), 2);
    // m2 goes quiet
    assert!(g.tick(config(), 40_000).is_empty());
    step(&mut g, "m1", &t, 40_000);
    assert_eq!(g.tick(config(), 45_010), vec!["m2".to_string()]);
    let r = step(&mut g, "m1", &t, 45_020);
    assert_eq!(parts(&r.assignment.expect("m2's partitions")), 4);
}

#[test]
fn a_member_that_never_gives_up_its_partitions_is_removed_after_its_rebalance_timeout() {
    let t = topics(4);
    let mut g = ConsumerGroup::new("g");
    hb(&mut g, join("m1", &["orders"]), &t, 0);
    hb(&mut g, join("m2", &["orders"]), &t, 0);
    step(&mut g, "m1", &t, 1); // told to revoke two
                               // it keeps heartbeating as if it still owned them
    let owning_all = |g: &ConsumerGroup| Heartbeat {
        owned: Some(Assignment::from([(T1, (0..4).collect())])),
        ..beat(g, "m1")
    };
    for now in [10_000, 20_000, 30_000] {
        let h = owning_all(&g);
        hb(&mut g, h, &t, now);
        step(&mut g, "m2", &t, now);
    }
    assert_eq!(g.tick(config(), 30_002), vec!["m1".to_string()]);
    let r = step(&mut g, "m2", &t, 30_003);
    assert_eq!(parts(&r.assignment.expect("everything")), 4);
}

#[test]
fn leaving_frees_the_partitions_at_once() {
    let t = topics(4);
    let mut g = ConsumerGroup::new("g");
    hb(&mut g, join("m1", &["orders"]), &t, 0);
    hb(&mut g, join("m2", &["orders"]), &t, 0);
    for now in 1..4 {
        step(&mut g, "m1", &t, now);
        step(&mut g, "m2", &t, now);
    }
    let leave = Heartbeat {
        member_epoch: LEAVE_EPOCH,
        ..beat(&g, "m2")
    };
    let r = hb(&mut g, leave, &t, 5);
    assert_eq!((r.error, r.member_epoch), (codes::NONE, LEAVE_EPOCH));
    let r = step(&mut g, "m1", &t, 6);
    assert_eq!(parts(&r.assignment.expect("all of them")), 4);
}

#[test]
fn a_static_member_comes_back_to_its_partitions_without_a_new_epoch() {
    let t = topics(4);
    let mut g = ConsumerGroup::new("g");
    let with_instance = |id: &str, instance: &str| Heartbeat {
        instance_id: Some(instance.into()),
        ..join(id, &["orders"])
    };
    hb(&mut g, with_instance("a1", "pod-a"), &t, 0);
    hb(&mut g, with_instance("b1", "pod-b"), &t, 0);
    for now in 1..4 {
        step(&mut g, "a1", &t, now);
        step(&mut g, "b1", &t, now);
    }
    let mine = g.members["b1"].assigned.clone();
    let epoch = g.epoch;
    let away = Heartbeat {
        member_epoch: STATIC_LEAVE_EPOCH,
        instance_id: Some("pod-b".into()),
        ..beat(&g, "b1")
    };
    hb(&mut g, away, &t, 5);
    // another process cannot take the instance while it is held...
    hb(&mut g, with_instance("b2", "pod-b"), &t, 6);
    assert_eq!(g.epoch, epoch, "no rebalance for a static member's restart");
    let h = beat(&g, "b2");
    let r = g.heartbeat(h, &Client::default(), &t, config(), 7);
    assert_eq!(
        r.assignment
            .unwrap_or_else(|| g.members["b2"].assigned.clone()),
        mine
    );
    assert!(!g.has_member("b1"));
    // ...but a second one while the first is live is refused
    let r = hb(&mut g, with_instance("b3", "pod-b"), &t, 8);
    assert_eq!(r.error, codes::UNRELEASED_INSTANCE_ID);
}

#[test]
fn a_regex_subscription_follows_the_topics_that_match() {
    let mut t = topics(2);
    let mut g = ConsumerGroup::new("g");
    let h = Heartbeat {
        subscribed_topic_names: Some(vec!["refunds".into()]),
        subscribed_topic_regex: Some("^ord.*".into()),
        ..join("m1", &[])
    };
    // as in Kafka: literal names at once, the regex's topics from the next heartbeat on
    let r = hb(&mut g, h, &t, 0);
    assert_eq!(
        r.assignment,
        Some(Assignment::from([(T2, BTreeSet::from([0, 1]))]))
    );
    let r = step(&mut g, "m1", &t, 1);
    assert_eq!(
        r.assignment,
        Some(Assignment::from([
            (T1, BTreeSet::from([0, 1])),
            (T2, BTreeSet::from([0, 1]))
        ]))
    );
    // a new matching topic, and more partitions: a new epoch and assignment, the new
    // topic once the regex was resolved again
    t.insert("orders-eu".into(), (Uuid::from_u128(3), 1));
    t.insert("orders".into(), (T1, 3));
    let epoch = g.epoch;
    let r = step(&mut g, "m1", &t, 2);
    assert!(g.epoch > epoch);
    assert_eq!(parts(&r.assignment.expect("grown")), 5);
    let r = step(&mut g, "m1", &t, 3);
    assert_eq!(parts(&r.assignment.expect("the new topic")), 6);
    // a regex no member uses any more is forgotten
    let h = Heartbeat {
        subscribed_topic_regex: Some(String::new()),
        ..beat(&g, "m1")
    };
    hb(&mut g, h, &t, 4);
    assert!(g.resolved.is_empty());
}

#[test]
fn bad_requests_are_refused_with_kafkas_codes() {
    let t = topics(2);
    let mut g = ConsumerGroup::new("g");
    let cases = [
        (join("", &["orders"]), codes::INVALID_REQUEST),
        (
            Heartbeat {
                rebalance_timeout_ms: 0,
                ..join("m1", &["orders"])
            },
            codes::INVALID_REQUEST,
        ),
        (
            Heartbeat {
                subscribed_topic_names: None,
                ..join("m1", &[])
            },
            codes::INVALID_REQUEST,
        ),
        (
            Heartbeat {
                subscribed_topic_regex: Some("(unclosed".into()),
                ..join("m1", &["orders"])
            },
            codes::INVALID_REGULAR_EXPRESSION,
        ),
        (
            Heartbeat {
                server_assignor: Some("sticky-ish".into()),
                ..join("m1", &["orders"])
            },
            codes::UNSUPPORTED_ASSIGNOR,
        ),
        (
            Heartbeat {
                member_epoch: STATIC_LEAVE_EPOCH,
                ..join("m1", &["orders"])
            },
            codes::INVALID_REQUEST,
        ),
    ];
    for (h, code) in cases {
        assert_eq!(hb(&mut g, h.clone(), &t, 0).error, code, "{h:?}");
    }
    assert!(g.is_empty(), "a refused join adds no member");
}

#[test]
fn range_puts_each_topics_partitions_in_ranges() {
    let t = topics(5);
    let mut g = ConsumerGroup::new("g");
    let ranged = |id: &str| Heartbeat {
        server_assignor: Some("range".into()),
        ..join(id, &["orders", "refunds"])
    };
    hb(&mut g, ranged("a"), &t, 0);
    hb(&mut g, ranged("b"), &t, 0);
    for now in 1..5 {
        step(&mut g, "a", &t, now);
        step(&mut g, "b", &t, now);
    }
    assert_eq!(g.view().assignor, "range");
    assert_eq!(g.members["a"].assigned[&T1], BTreeSet::from([0, 1, 2]));
    assert_eq!(g.members["b"].assigned[&T1], BTreeSet::from([3, 4]));
    assert_eq!(g.members["a"].assigned[&T2], BTreeSet::from([0]));
}

#[test]
fn offsets_are_committed_at_the_members_own_epoch() {
    let t = topics(2);
    let mut g = ConsumerGroup::new("g");
    hb(&mut g, join("m1", &["orders"]), &t, 0);
    let epoch = g.members["m1"].epoch;
    assert_eq!(g.may_commit("m1", epoch), None);
    assert_eq!(g.may_commit("m1", epoch - 1), Some(STALE_MEMBER_EPOCH));
    assert_eq!(g.may_commit("m2", epoch), Some(codes::UNKNOWN_MEMBER_ID));
}

/// Random joins, leaves, crashes and heartbeats of well-behaved members: no partition is
/// ever held twice (checked after every step), and once everyone heartbeats for a while,
/// every partition has exactly one owner and shares differ by at most one.
#[test]
fn random_membership_changes_keep_single_ownership_and_converge() {
    for seed in 0..200u64 {
        let mut rng = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut next = |n: u64| {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (rng >> 33) % n
        };
        let t = topics(1 + next(12) as u32);
        let mut g = ConsumerGroup::new("g");
        let mut now = 0i64;
        let mut ids = 0;
        for _ in 0..60 {
            now += 100;
            let live: Vec<String> = g.member_ids();
            match next(6) {
                0 if live.len() < 6 => {
                    ids += 1;
                    hb(
                        &mut g,
                        join(&format!("m{ids}"), &["orders", "refunds"]),
                        &t,
                        now,
                    );
                }
                1 if !live.is_empty() => {
                    let id = &live[next(live.len() as u64) as usize];
                    let leave = Heartbeat {
                        member_epoch: LEAVE_EPOCH,
                        ..beat(&g, id)
                    };
                    hb(&mut g, leave, &t, now);
                }
                2 if !live.is_empty() => {
                    // a crash: silent past its session
                    let id = live[next(live.len() as u64) as usize].clone();
                    let others: Vec<String> = live.iter().filter(|m| **m != id).cloned().collect();
                    now += 46_000;
                    for m in &others {
                        g.members.get_mut(m).expect("live").last_heard_ms = now;
                    }
                    g.tick(config(), now);
                    assert_single_owner(&g);
                }
                _ if !live.is_empty() => {
                    let id = &live[next(live.len() as u64) as usize];
                    step(&mut g, id, &t, now);
                }
                _ => {}
            }
        }
        // everyone heartbeats until nothing changes
        for _ in 0..6 {
            now += 100;
            for id in g.member_ids() {
                step(&mut g, &id, &t, now);
            }
        }
        if g.is_empty() {
            continue;
        }
        assert_eq!(g.state(), "Stable", "seed {seed}: {:#?}", g.members);
        let total: usize = g.members.values().map(|m| parts(&m.assigned)).sum();
        let all: usize = t.values().map(|(_, n)| *n as usize).sum();
        assert_eq!(total, all, "seed {seed}: every partition owned once");
        let shares: Vec<usize> = g.members.values().map(|m| parts(&m.assigned)).collect();
        let (lo, hi) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
        assert!(hi - lo <= 1, "seed {seed}: shares {shares:?}");
    }
}
