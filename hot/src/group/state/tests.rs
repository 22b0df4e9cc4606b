use super::*;

const CONFIG: GroupConfig = GroupConfig {
    min_session_timeout_ms: 1_000,
    max_session_timeout_ms: 60_000,
    max_rebalances_per_member: 3,
    flap_window_ms: 60_000,
    min_backoff_ms: 1_000,
    max_backoff_ms: 8_000,
    max_size: 100,
    initial_rebalance_delay_ms: 0,
    migration: crate::group::consumer::MigrationPolicy::Bidirectional,
};
const SESSION: i64 = 10_000;
const REBALANCE: i64 = 30_000;

fn join(member: &str, instance: Option<&str>, client: &str) -> Join {
    Join {
        member_id: member.to_string(),
        instance_id: instance.map(str::to_string),
        client_id: client.to_string(),
        client_host: "10.0.0.1".to_string(),
        protocol_type: "consumer".to_string(),
        protocols: vec![
            ("range".to_string(), Bytes::from(format!("{client}-range"))),
            (
                "roundrobin".to_string(),
                Bytes::from(format!("{client}-rr")),
            ),
        ],
        session_timeout_ms: SESSION,
        rebalance_timeout_ms: REBALANCE,
        require_known_member_id: false,
    }
}

fn joined(replies: &Replies, member: &str) -> JoinReply {
    replies
        .iter()
        .find_map(|(m, r)| match r {
            Reply::Join(j) if m == member => Some(j.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no join reply for {member} in {replies:?}"))
}

fn synced(replies: &Replies, member: &str) -> SyncReply {
    replies
        .iter()
        .find_map(|(m, r)| match r {
            Reply::Sync(s) if m == member => Some(s.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no sync reply for {member} in {replies:?}"))
}

/// A new dynamic member joins alone; returns its id.
fn first_join(g: &mut Group, client: &str, now: i64) -> String {
    let r = g.join(join("", None, client), now);
    r.last().map(|(m, _)| m.clone()).expect("a reply")
}

/// Members A and B in a stable group; returns (a, b, generation).
fn stable_pair(g: &mut Group) -> (String, String) {
    let a = first_join(g, "a", 0);
    g.sync(&a, 1, vec![(a.clone(), Bytes::from("a:0-5"))], 0);
    let r = g.join(join("", None, "b"), 1);
    assert!(r.is_empty(), "b waits for a to rejoin");
    let b = g.member_ids().into_iter().find(|m| *m != a).unwrap();
    let r = g.join(join(&a, None, "a"), 2);
    assert_eq!(joined(&r, &a).generation, 2);
    let leader = joined(&r, &a).leader.clone();
    let assignments = vec![
        (a.clone(), Bytes::from("a:0-2")),
        (b.clone(), Bytes::from("b:3-5")),
    ];
    g.sync(&b, 2, vec![], 3);
    let r = g.sync(&leader, 2, assignments, 3);
    assert_eq!(g.state(), GroupState::Stable);
    assert_eq!(synced(&r, &b).assignment, Bytes::from("b:3-5"));
    (a, b)
}

#[test]
fn members_join_sync_and_the_group_becomes_stable() {
    let mut g = Group::new("settlement", CONFIG);
    assert_eq!(g.state(), GroupState::Empty);
    let a = first_join(&mut g, "a", 0);
    assert_eq!(g.state(), GroupState::CompletingRebalance);
    assert_eq!(g.generation(), 1);
    let r = g.sync(&a, 1, vec![(a.clone(), Bytes::from("all"))], 1);
    assert_eq!(synced(&r, &a).assignment, Bytes::from("all"));
    assert_eq!(g.state(), GroupState::Stable);

    // b joins: a is told to rejoin; b's join waits for it
    let r = g.join(join("", None, "b"), 2);
    assert!(r.is_empty());
    assert_eq!(g.state(), GroupState::PreparingRebalance);
    assert_eq!(g.heartbeat(&a, 1, 3), codes::REBALANCE_IN_PROGRESS);
    let r = g.join(join(&a, None, "a"), 4);
    assert_eq!(r.len(), 2, "both joins are answered together");
    let ja = joined(&r, &a);
    assert_eq!(
        (ja.generation, ja.protocol_name.as_deref()),
        (2, Some("range"))
    );
    assert_eq!(ja.leader, a, "the leader stays");
    assert_eq!(
        ja.members.len(),
        2,
        "the leader gets every member's metadata"
    );
    let b = r.iter().map(|(m, _)| m.clone()).find(|m| *m != a).unwrap();
    assert!(joined(&r, &b).members.is_empty());

    // b's sync waits for the leader's assignment
    assert!(g.sync(&b, 2, vec![], 5).is_empty());
    let r = g.sync(
        &a,
        2,
        vec![
            (a.clone(), Bytes::from("0-2")),
            (b.clone(), Bytes::from("3-5")),
        ],
        6,
    );
    assert_eq!(synced(&r, &a).assignment, Bytes::from("0-2"));
    assert_eq!(synced(&r, &b).assignment, Bytes::from("3-5"));
    assert_eq!(g.state(), GroupState::Stable);
    assert_eq!(g.heartbeat(&b, 2, 7), codes::NONE);
}

#[test]
fn the_protocol_is_the_one_all_members_support_best() {
    let mut g = Group::new("g", CONFIG);
    let a = first_join(&mut g, "a", 0);
    g.sync(&a, 1, vec![], 0);
    let mut jb = join("", None, "b");
    jb.protocols.reverse(); // b prefers roundrobin
    jb.protocols.push(("sticky".into(), Bytes::new()));
    g.join(jb, 1);
    let r = g.join(join(&a, None, "a"), 2);
    // range: 0 + 1, roundrobin: 1 + 0: a tie, broken by name
    assert_eq!(joined(&r, &a).protocol_name.as_deref(), Some("range"));
    let mut jc = join("", None, "c");
    jc.protocols = vec![("sticky".into(), Bytes::new())];
    let r = g.join(jc, 3);
    assert_eq!(r.len(), 1);
    assert_eq!(
        r[0].1,
        join_error("", codes::INCONSISTENT_GROUP_PROTOCOL),
        "no protocol in common with the group"
    );
}

#[test]
fn a_silent_member_is_removed_after_its_session_timeout() {
    let mut g = Group::new("g", CONFIG);
    let (a, b) = stable_pair(&mut g);
    g.heartbeat(&a, 2, 5_000);
    assert!(g.tick(SESSION + 2).is_empty());
    assert_eq!(
        g.member_ids().len(),
        2,
        "b's session runs from its sync at 3"
    );
    assert!(g.tick(SESSION + 5).is_empty());
    assert_eq!(g.member_ids().len(), 1, "b never heartbeated: gone");
    assert_eq!(g.state(), GroupState::PreparingRebalance);
    assert_eq!(g.heartbeat(&b, 2, SESSION + 6), codes::UNKNOWN_MEMBER_ID);
    let r = g.join(join(&a, None, "a"), SESSION + 7);
    assert_eq!(joined(&r, &a).generation, 3);
    assert_eq!(joined(&r, &a).members.len(), 1);
}

#[test]
fn a_rebalance_ends_at_its_timeout_without_the_members_that_did_not_rejoin() {
    let mut g = Group::new("g", CONFIG);
    let (a, b) = stable_pair(&mut g);
    let r = g.join(join("", None, "c"), 10);
    assert!(r.is_empty());
    g.join(join(&a, None, "a"), 20);
    // b keeps heartbeating but never rejoins
    for t in (1_000..REBALANCE).step_by(1_000) {
        assert_eq!(g.heartbeat(&b, 2, t), codes::REBALANCE_IN_PROGRESS);
        assert!(g.tick(t).is_empty());
    }
    assert_eq!(g.next_deadline(), Some(10 + REBALANCE));
    let r = g.tick(10 + REBALANCE);
    assert_eq!(r.len(), 2, "a and c are answered");
    assert_eq!(joined(&r, &a).generation, 3);
    assert_eq!(g.member_ids().len(), 2);
    assert_eq!(g.heartbeat(&b, 3, 10 + REBALANCE), codes::UNKNOWN_MEMBER_ID);
}

#[test]
fn a_leader_that_never_sends_the_assignment_makes_the_group_rebalance_without_it() {
    let mut g = Group::new("g", CONFIG);
    let (a, b) = stable_pair(&mut g);
    g.join(join("", None, "c"), 100);
    let r = g.join(join(&a, None, "a"), 101);
    assert!(r.is_empty(), "b has not rejoined yet");
    let r = g.join(join(&b, None, "b"), 102);
    let c = r
        .iter()
        .map(|(m, _)| m.clone())
        .find(|m| *m != a && *m != b)
        .unwrap();
    assert_eq!(g.state(), GroupState::CompletingRebalance);
    assert_eq!(joined(&r, &a).leader, a);
    // b and c sync and wait; the leader a heartbeats but never syncs
    assert!(g.sync(&b, 3, vec![], 103).is_empty());
    assert!(g.sync(&c, 3, vec![], 103).is_empty());
    for t in (5_000..102 + REBALANCE).step_by(5_000) {
        for m in [&a, &b, &c] {
            assert_eq!(g.heartbeat(m, 3, t), codes::NONE);
        }
        assert!(g.tick(t).is_empty());
    }
    let r = g.tick(102 + REBALANCE);
    assert_eq!(synced(&r, &b).error, codes::REBALANCE_IN_PROGRESS);
    assert_eq!(synced(&r, &c).error, codes::REBALANCE_IN_PROGRESS);
    assert_eq!(g.state(), GroupState::PreparingRebalance);
    assert!(
        !g.member_ids().contains(&a),
        "the leader that never synced is out"
    );
    g.join(join(&b, None, "b"), 102 + REBALANCE + 1);
    let r = g.join(join(&c, None, "c"), 102 + REBALANCE + 2);
    assert_eq!(joined(&r, &b).generation, 4);
    assert_ne!(joined(&r, &b).leader, a);
}

/// Every member rejoins (until the join phase completes: those already waiting are
/// answered then) and the leader hands out empty assignments: the group is stable.
fn settle(g: &mut Group, now: i64) {
    for id in g.member_ids() {
        if g.state() != GroupState::PreparingRebalance {
            break;
        }
        let client = id.split('-').next().unwrap().to_string();
        g.join(join(&id, None, &client), now);
    }
    let generation = g.generation();
    for id in g.member_ids() {
        g.sync(&id, generation, vec![], now);
    }
    assert_eq!(g.state(), GroupState::Stable);
}

#[test]
fn a_group_growing_from_one_host_is_not_throttled() {
    // Many consumers with the same client id on one host (librdkafka's default client.id)
    // join one after another: a scale-up, not a flapping member.
    let mut g = Group::new("g", CONFIG);
    stable_pair(&mut g);
    for round in 0..3 * CONFIG.max_rebalances_per_member {
        let r = g.join(join("", None, "worker"), 100 + round as i64);
        assert!(
            r.iter()
                .all(|(_, reply)| !matches!(reply, Reply::Join(j) if j.throttle_ms > 0)),
            "round {round} throttled: {r:?}"
        );
        settle(&mut g, 101 + round as i64);
    }
    assert_eq!(
        g.member_ids().len(),
        2 + 3 * CONFIG.max_rebalances_per_member
    );
    assert!(g.backoff_of("worker@10.0.0.1", 1_000).is_none());
}

#[test]
fn a_member_that_keeps_forcing_rebalances_is_turned_away_with_growing_backoff() {
    let mut g = Group::new("g", CONFIG);
    let (a, _b) = stable_pair(&mut g);
    let mut now = 1_000;
    let flappy = |g: &Group| g.member_ids().into_iter().find(|m| m.starts_with("flappy"));
    // it joins and leaves over and over; each join after the first forces a rebalance
    // that counts against it (it is a client coming back)
    for round in 0..=CONFIG.max_rebalances_per_member {
        let r = g.join(join("", None, "flappy"), now);
        assert!(r.is_empty(), "round {round}: waits for the others");
        settle(&mut g, now + 1);
        let id = flappy(&g).unwrap();
        g.leave(&id, None, now + 2);
        settle(&mut g, now + 3);
        now += 100;
    }
    assert!(g.backoff_of("flappy@10.0.0.1", now).is_none());
    // one more forced rebalance is one too many: from then on it is turned away for a while
    g.join(join("", None, "flappy"), now);
    settle(&mut g, now + 1);
    let backoff = g
        .backoff_of("flappy@10.0.0.1", now + 1)
        .expect("turned away");
    assert_eq!(backoff, CONFIG.min_backoff_ms - 1);
    let id = flappy(&g).unwrap();
    g.leave(&id, None, now + 2);
    settle(&mut g, now + 3);
    let r = g.join(join("", None, "flappy"), now + 10);
    match &r[..] {
        [(_, Reply::Join(j))] => {
            assert_eq!(j.error, codes::REBALANCE_IN_PROGRESS);
            assert_eq!(j.throttle_ms, CONFIG.min_backoff_ms - 10);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        g.state(),
        GroupState::Stable,
        "turning it away forced nothing"
    );
    // the others' rejoins during those rebalances did not count against them
    assert!(g.backoff_of("a@10.0.0.1", now).is_none());
    assert!(g.member_ids().contains(&a));
    // after the backoff it may join again; flapping on doubles the backoff
    now += CONFIG.min_backoff_ms + 1;
    for _ in 0..=CONFIG.max_rebalances_per_member {
        assert!(g.join(join("", None, "flappy"), now).is_empty());
        settle(&mut g, now + 1);
        let id = flappy(&g).unwrap();
        g.leave(&id, None, now + 2);
        settle(&mut g, now + 3);
        now += 100;
    }
    assert!(g.backoff_of("flappy@10.0.0.1", now - 97).unwrap() > CONFIG.min_backoff_ms);
}

#[test]
fn a_restarted_static_member_takes_its_place_back_without_a_rebalance() {
    let mut g = Group::new("g", CONFIG);
    let a = first_join(&mut g, "a", 0);
    assert!(g.join(join("", Some("b-host"), "b"), 1).is_empty());
    let r = g.join(join(&a, None, "a"), 2);
    let b_old = r.iter().map(|(m, _)| m.clone()).find(|m| *m != a).unwrap();
    g.sync(&b_old, 2, vec![], 3);
    g.sync(
        &a,
        2,
        vec![
            (a.clone(), Bytes::from("0-2")),
            (b_old.clone(), Bytes::from("3-5")),
        ],
        3,
    );
    assert_eq!(g.state(), GroupState::Stable);

    // b restarts (new process, no member id) with the same instance id
    let r = g.join(join("", Some("b-host"), "b"), 1_000);
    assert_eq!(g.state(), GroupState::Stable, "no rebalance");
    assert_eq!(g.generation(), 2);
    let (b_new, reply) = match &r[..] {
        [(m, Reply::Join(j))] => (m.clone(), j.clone()),
        other => panic!("{other:?}"),
    };
    assert_ne!(b_new, b_old);
    assert_eq!((reply.error, reply.generation), (codes::NONE, 2));
    let r = g.sync(&b_new, 2, vec![], 1_001);
    assert_eq!(
        synced(&r, &b_new).assignment,
        Bytes::from("3-5"),
        "its old partitions"
    );
    // the old incarnation is fenced
    assert_eq!(g.heartbeat(&b_old, 2, 1_002), codes::UNKNOWN_MEMBER_ID);
    let r = g.join(join(&b_old, Some("b-host"), "b"), 1_003);
    assert_eq!(r[0].1, join_error(&b_old, codes::FENCED_INSTANCE_ID));
    // a static member leaving by instance id
    let (code, _) = g.leave("", Some("b-host"), 1_004);
    assert_eq!(code, codes::NONE);
    assert_eq!(g.state(), GroupState::PreparingRebalance);
}

#[test]
fn a_new_member_gets_its_id_first_when_the_client_asks_for_it() {
    let mut g = Group::new("g", CONFIG);
    let mut j = join("", None, "a");
    j.require_known_member_id = true;
    let r = g.join(j.clone(), 0);
    let (id, reply) = match &r[..] {
        [(m, Reply::Join(j))] => (m.clone(), j.clone()),
        other => panic!("{other:?}"),
    };
    assert_eq!(reply.error, codes::MEMBER_ID_REQUIRED);
    assert_eq!(reply.member_id, id);
    assert_eq!(g.state(), GroupState::Empty, "no ghost member");
    j.member_id = id.clone();
    let r = g.join(j, 1);
    assert_eq!(joined(&r, &id).error, codes::NONE);
    assert_eq!(g.member_ids(), vec![id]);
}

#[test]
fn stale_generations_unknown_members_and_bad_timeouts_are_refused() {
    let mut g = Group::new("g", CONFIG);
    let (a, _) = stable_pair(&mut g);
    assert_eq!(g.heartbeat(&a, 1, 10), codes::ILLEGAL_GENERATION);
    assert_eq!(g.heartbeat("nobody", 2, 10), codes::UNKNOWN_MEMBER_ID);
    let r = g.sync(&a, 7, vec![], 10);
    assert_eq!(synced(&r, &a).error, codes::ILLEGAL_GENERATION);
    let r = g.sync("nobody", 2, vec![], 10);
    assert_eq!(synced(&r, "nobody").error, codes::UNKNOWN_MEMBER_ID);
    let r = g.join(join("nobody", None, "x"), 10);
    assert_eq!(r[0].1, join_error("nobody", codes::UNKNOWN_MEMBER_ID));
    let mut short = join("", None, "x");
    short.session_timeout_ms = 10;
    assert_eq!(
        g.join(short, 10)[0].1,
        join_error("", codes::INVALID_SESSION_TIMEOUT)
    );
    assert_eq!(g.leave("nobody", None, 10).0, codes::UNKNOWN_MEMBER_ID);
    assert_eq!(g.state(), GroupState::Stable, "refusals change nothing");
}

#[test]
fn the_last_member_leaving_empties_the_group_and_a_dead_group_answers_everyone() {
    let mut g = Group::new("g", CONFIG);
    let (a, b) = stable_pair(&mut g);
    g.leave(&a, None, 10);
    assert_eq!(g.state(), GroupState::PreparingRebalance);
    let r = g.join(join(&b, None, "b"), 11);
    assert_eq!(joined(&r, &b).leader, b, "a new leader");
    g.leave(&b, None, 12);
    assert_eq!(g.state(), GroupState::Empty);
    assert_eq!(g.next_deadline(), None);

    let c = first_join(&mut g, "c", 20);
    assert!(g.sync(&c, g.generation(), vec![], 21).is_empty() || g.state() == GroupState::Stable);
    g.join(join("", None, "d"), 22);
    let r = g.kill();
    assert!(r.iter().any(
        |(_, reply)| matches!(reply, Reply::Join(j) if j.error == codes::COORDINATOR_NOT_AVAILABLE)
    ));
    assert_eq!(g.state(), GroupState::Dead);
    let r = g.join(join("", None, "e"), 23);
    assert_eq!(r[0].1, join_error("", codes::COORDINATOR_NOT_AVAILABLE));
}

#[test]
fn a_join_past_group_max_size_is_refused_and_a_known_member_still_rejoins() {
    let mut g = Group::new(
        "g",
        GroupConfig {
            max_size: 3,
            ..CONFIG
        },
    );
    let (a, _b) = stable_pair(&mut g);
    g.join(join("", None, "c"), 10);
    assert_eq!(g.member_ids().len(), 3);
    // a fourth member: GROUP_MAX_SIZE_REACHED, not added, nothing rebalanced for it
    let r = g.join(join("", None, "d"), 11);
    assert_eq!(r.len(), 1, "{r:?}");
    assert!(
        matches!(&r[0].1, Reply::Join(j) if j.error == codes::GROUP_MAX_SIZE_REACHED),
        "{r:?}"
    );
    assert_eq!(g.member_ids().len(), 3);
    // KIP-394's second join of an id handed out before the group filled up: refused too
    let mut second = join("d-1-99", None, "d");
    second.require_known_member_id = true;
    let r = g.join(second, 12);
    assert!(
        matches!(&r[0].1, Reply::Join(j) if j.error == codes::GROUP_MAX_SIZE_REACHED),
        "{r:?}"
    );
    // a member already in the group rejoins as usual
    g.join(join(&a, None, "a"), 13);
    assert!(g.member_ids().contains(&a));
    assert_eq!(g.member_ids().len(), 3);
}

/// Kafka's `group.initial.rebalance.delay.ms`: consumers started together get one
/// generation, not one each (librdkafka's 0102 and 0113 count rebalances).
#[test]
fn a_group_that_was_empty_waits_the_initial_delay_for_more_members() {
    let delay = 3_000;
    let mut g = Group::new(
        "g",
        GroupConfig {
            initial_rebalance_delay_ms: delay,
            ..CONFIG
        },
    );
    let r = g.join(join("", None, "a"), 0);
    assert!(r.is_empty(), "the first member waits out the delay: {r:?}");
    assert_eq!(g.state(), GroupState::PreparingRebalance);
    assert_eq!(g.next_deadline(), Some(delay));
    // a second member 1 s later: the window moves on by the delay once the first ends
    assert!(g.join(join("", None, "b"), 1_000).is_empty());
    assert!(g.tick(delay - 1).is_empty());
    let r = g.tick(delay);
    assert!(
        r.is_empty(),
        "a member came during the delay: another round: {r:?}"
    );
    assert_eq!(g.next_deadline(), Some(2 * delay));
    // nobody else came: one generation with both members
    let r = g.tick(2 * delay);
    assert_eq!(r.len(), 2, "{r:?}");
    let ids = g.member_ids();
    for id in &ids {
        assert_eq!(joined(&r, id).generation, 1);
    }
    assert_eq!(g.generation(), 1);
    assert_eq!(g.state(), GroupState::CompletingRebalance);
    // a later rebalance of the non-empty group is not delayed
    let leader = g.leader().unwrap().to_string();
    for id in &ids {
        g.sync(id, 1, vec![], 2 * delay + 1);
    }
    g.sync(&leader, 1, vec![], 2 * delay + 1);
    assert_eq!(g.state(), GroupState::Stable);
    assert!(g.join(join("", None, "c"), 2 * delay + 10).is_empty());
    let mut r = Replies::new();
    for id in &ids {
        r.extend(g.join(
            join(id, None, if *id == ids[0] { "a" } else { "b" }),
            2 * delay + 20,
        ));
    }
    assert_eq!(
        g.generation(),
        2,
        "completed as soon as every member rejoined: {r:?}"
    );
}

#[test]
fn the_initial_delay_is_bounded_by_the_rebalance_timeout() {
    let mut g = Group::new(
        "g",
        GroupConfig {
            initial_rebalance_delay_ms: 10_000,
            ..CONFIG
        },
    );
    // a member joins every 9 s: without the bound the group would wait for ever
    let mut now = 0;
    g.join(join("", None, "m0"), now);
    let mut k = 1;
    while g.generation() == 0 {
        now += 1_000;
        assert!(now <= REBALANCE + 10_000, "no generation after {now} ms");
        if now % 9_000 == 0 {
            g.join(join("", None, &format!("m{k}")), now);
            k += 1;
        }
        g.tick(now);
    }
    assert!(
        now <= REBALANCE,
        "first generation at {now} ms, past the rebalance timeout"
    );
}

#[test]
fn an_empty_group_keeps_its_protocol_type() {
    let mut g = Group::new("g", CONFIG);
    let a = first_join(&mut g, "a", 0);
    g.sync(&a, 1, vec![(a.clone(), Bytes::from("a:0-5"))], 0);
    g.leave(&a, None, 1);
    assert_eq!(g.state(), GroupState::Empty);
    assert_eq!(
        g.view().protocol_type,
        "consumer",
        "ListGroups would call it a simple group"
    );
}

#[test]
fn by_default_no_member_is_turned_away_for_rebalancing_often() {
    let mut g = Group::new(
        "g",
        GroupConfig {
            initial_rebalance_delay_ms: 0,
            ..GroupConfig::default()
        },
    );
    let mut now = 0;
    for round in 0..20 {
        let r = g.join(join("", None, "flappy"), now);
        assert!(
            r.iter()
                .all(|(_, reply)| !matches!(reply, Reply::Join(j) if j.error != codes::NONE)),
            "round {round}: {r:?}"
        );
        settle(&mut g, now + 1);
        let id = g.member_ids()[0].clone();
        g.leave(&id, None, now + 2);
        now += 100;
    }
    assert!(g.backoff_of("flappy@10.0.0.1", now).is_none());
}
