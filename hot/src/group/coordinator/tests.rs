use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use super::*;

struct TestClock(AtomicI64);

impl Clock for TestClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// The partition as a list of committed records from offset `base`; can be made to fail.
#[derive(Default)]
struct MemoryLog {
    records: Mutex<Vec<(Bytes, Option<Bytes>)>>,
    base: std::sync::atomic::AtomicU64,
    failing: AtomicBool,
}

#[tonic::async_trait]
impl OffsetsLog for MemoryLog {
    async fn append(&self, records: Vec<(Bytes, Option<Bytes>)>) -> Result<(), String> {
        if self.failing.load(Ordering::SeqCst) {
            return Err("the partition's ISR is below min.insync.replicas".into());
        }
        self.records.lock().unwrap().extend(records);
        Ok(())
    }

    fn end_offset(&self) -> Option<u64> {
        Some(self.base.load(Ordering::SeqCst) + self.records.lock().unwrap().len() as u64)
    }

    fn trim_before(&self, offset: u64) {
        let mut records = self.records.lock().unwrap();
        let base = self.base.load(Ordering::SeqCst);
        let cut = (offset.saturating_sub(base) as usize).min(records.len());
        records.drain(..cut);
        self.base.store(base + cut as u64, Ordering::SeqCst);
    }
}

impl MemoryLog {
    fn replay(&self) -> Replayed {
        let mut r = Replayed::default();
        let base = self.base.load(Ordering::SeqCst) as i64;
        for (i, (k, v)) in self.records.lock().unwrap().iter().enumerate() {
            r.apply(base + i as i64, k.clone(), v.clone());
        }
        r
    }
}

const CONFIG: GroupConfig = GroupConfig {
    min_session_timeout_ms: 1_000,
    max_session_timeout_ms: 60_000,
    max_rebalances_per_member: 5,
    flap_window_ms: 60_000,
    min_backoff_ms: 1_000,
    max_backoff_ms: 8_000,
    max_size: 1_000,
    initial_rebalance_delay_ms: 0,
    migration: crate::group::consumer::MigrationPolicy::Bidirectional,
};

fn join(member: &str, client: &str) -> Join {
    Join {
        member_id: member.to_string(),
        instance_id: None,
        client_id: client.to_string(),
        client_host: "/127.0.0.1".to_string(),
        protocol_type: "consumer".to_string(),
        protocols: vec![("range".to_string(), Bytes::from_static(b"orders"))],
        session_timeout_ms: 10_000,
        rebalance_timeout_ms: 20_000,
        require_known_member_id: false,
    }
}

fn coordinator() -> (Arc<Coordinator>, Arc<MemoryLog>, Arc<TestClock>) {
    let log = Arc::new(MemoryLog::default());
    let clock = Arc::new(TestClock(AtomicI64::new(1_000)));
    (
        Coordinator::new(CONFIG, clock.clone(), log.clone()),
        log,
        clock,
    )
}

fn commit(topic: &str, partition: i32, offset: i64) -> Commit {
    Commit {
        topic: topic.into(),
        partition,
        offset,
        leader_epoch: 0,
        metadata: String::new(),
    }
}

/// A alone, then B joins and both end in generation 2 with assignments.
async fn two_members(c: &Arc<Coordinator>) -> (String, String) {
    let a = c.join("g", join("", "a")).await;
    assert_eq!((a.error, a.generation), (codes::NONE, 1));
    let a_id = a.member_id.clone();
    let r = c
        .sync("g", &a_id, 1, vec![(a_id.clone(), Bytes::from("0-5"))])
        .await;
    assert_eq!(r.assignment, Bytes::from("0-5"));

    let b_join = {
        let c = c.clone();
        tokio::spawn(async move { c.join("g", join("", "b")).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!b_join.is_finished(), "b waits for a to rejoin");
    assert_eq!(c.heartbeat("g", &a_id, 1), codes::REBALANCE_IN_PROGRESS);
    let a = c.join("g", join(&a_id, "a")).await;
    let b = b_join.await.unwrap();
    assert_eq!((a.generation, b.generation), (2, 2));
    assert_eq!(a.members.len(), 2, "a leads and sees both");
    let b_id = b.member_id.clone();
    let b_sync = {
        let (c, b_id) = (c.clone(), b_id.clone());
        tokio::spawn(async move { c.sync("g", &b_id, 2, vec![]).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!b_sync.is_finished(), "b waits for the leader's assignment");
    let r = c
        .sync(
            "g",
            &a_id,
            2,
            vec![
                (a_id.clone(), Bytes::from("0-2")),
                (b_id.clone(), Bytes::from("3-5")),
            ],
        )
        .await;
    assert_eq!(r.assignment, Bytes::from("0-2"));
    assert_eq!(b_sync.await.unwrap().assignment, Bytes::from("3-5"));
    (a_id, b_id)
}

#[tokio::test]
async fn members_rebalance_through_pending_requests_and_each_generation_is_persisted() {
    let (c, log, _) = coordinator();
    two_members(&c).await;
    let replayed = log.replay();
    assert_eq!(replayed.groups["g"].generation, 2);
    assert_eq!(replayed.groups["g"].members.len(), 2);
}

#[tokio::test]
async fn commits_are_durable_before_they_are_answered_and_refused_ones_change_nothing() {
    let (c, log, _) = coordinator();
    let (a, b) = two_members(&c).await;
    let before = log.records.lock().unwrap().len();
    assert_eq!(
        c.commit(
            "g",
            &a,
            2,
            vec![commit("orders", 0, 10), commit("orders", 1, 20)]
        )
        .await,
        codes::NONE
    );
    assert_eq!(log.records.lock().unwrap().len(), before + 2);
    let got = c.fetch(
        "g",
        &[
            ("orders".into(), 0),
            ("orders".into(), 1),
            ("orders".into(), 2),
        ],
    );
    assert_eq!(got[0].as_ref().map(|o| o.offset), Some(10));
    assert_eq!(got[1].as_ref().map(|o| o.offset), Some(20));
    assert_eq!(got[2], None);

    // a stale generation, an unknown member: refused, nothing written
    assert_eq!(
        c.commit("g", &b, 1, vec![commit("orders", 0, 99)]).await,
        codes::ILLEGAL_GENERATION
    );
    assert_eq!(
        c.commit("g", "ghost", 2, vec![commit("orders", 0, 99)])
            .await,
        codes::UNKNOWN_MEMBER_ID
    );
    // the log refuses (ISR too small): the client hears so, nothing changes
    log.failing.store(true, Ordering::SeqCst);
    assert_eq!(
        c.commit(
            "g",
            &a,
            2,
            vec![commit("orders", 0, 50), commit("orders", 1, 60)]
        )
        .await,
        codes::COORDINATOR_NOT_AVAILABLE
    );
    log.failing.store(false, Ordering::SeqCst);
    assert_eq!(log.records.lock().unwrap().len(), before + 2);
    let got = c.fetch("g", &[("orders".into(), 0), ("orders".into(), 1)]);
    assert_eq!(
        (
            got[0].as_ref().unwrap().offset,
            got[1].as_ref().unwrap().offset
        ),
        (10, 20),
        "never half-applied"
    );
    // a group without members takes commits with generation -1 (admin tools, simple consumers)
    assert_eq!(
        c.commit("tools", "", -1, vec![commit("orders", 0, 5)])
            .await,
        codes::NONE
    );
}

#[tokio::test]
async fn a_new_coordinator_rebuilds_offsets_and_members_from_the_partition() {
    let (c, log, clock) = coordinator();
    let (a, b) = two_members(&c).await;
    c.commit("g", &a, 2, vec![commit("orders", 0, 10)]).await;
    c.commit("g", &b, 2, vec![commit("orders", 3, 30)]).await;
    drop(c);

    // leadership of the partition moved: the new coordinator replays it
    let c2 = Coordinator::load(CONFIG, clock.clone(), log.clone(), log.replay());
    let got = c2.fetch("g", &[("orders".into(), 0), ("orders".into(), 3)]);
    assert_eq!(got[0].as_ref().unwrap().offset, 10);
    assert_eq!(got[1].as_ref().unwrap().offset, 30);
    let (state, generation, members) = c2.group_state("g").unwrap();
    assert_eq!(
        (state, generation, members.len()),
        (GroupState::Stable, 2, 2)
    );
    // members go on heartbeating and committing without a rebalance
    assert_eq!(c2.heartbeat("g", &a, 2), codes::NONE);
    assert_eq!(
        c2.commit("g", &b, 2, vec![commit("orders", 3, 31)]).await,
        codes::NONE
    );
    // a member that died with the old coordinator times out here too
    clock.0.fetch_add(10_001, Ordering::SeqCst);
    c2.heartbeat("g", &a, 2);
    c2.tick();
    let (state, _, members) = c2.group_state("g").unwrap();
    assert_eq!(state, GroupState::PreparingRebalance);
    assert_eq!(members, vec![a]);
}

#[tokio::test]
async fn a_member_leaving_answers_the_others_pending_requests() {
    let (c, _, _) = coordinator();
    let (a, b) = two_members(&c).await;
    assert_eq!(c.leave("g", &b, None), codes::NONE);
    assert_eq!(c.heartbeat("g", &a, 2), codes::REBALANCE_IN_PROGRESS);
    let r = c.join("g", join(&a, "a")).await;
    assert_eq!(
        (r.error, r.generation, r.members.len()),
        (codes::NONE, 3, 1)
    );
    assert_eq!(c.leave("g", "ghost", None), codes::UNKNOWN_MEMBER_ID);
}

#[tokio::test]
async fn each_join_gets_its_own_reply_whatever_the_member_order() {
    let (c, _, _) = coordinator();
    // "z..." sorts after "b...": the join that completes the rebalance is not the first reply
    let z = c.join("g", join("", "z")).await;
    c.sync("g", &z.member_id, 1, vec![]).await;
    let b_join = {
        let c = c.clone();
        tokio::spawn(async move { c.join("g", join("", "b")).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let z2 = c.join("g", join(&z.member_id, "z")).await;
    let b = b_join.await.unwrap();
    assert_eq!(z2.member_id, z.member_id);
    assert!(b.member_id.starts_with('b'));
    assert_ne!(b.member_id, z2.member_id);
    assert_eq!((z2.generation, b.generation), (2, 2));
}

#[tokio::test]
async fn a_snapshot_keeps_the_live_state_and_deletes_what_it_supersedes() {
    let (c, log, _) = coordinator();
    c.set_snapshot_min_records(100);
    let (a, b) = two_members(&c).await;
    let generation = c.group_state("g").unwrap().1;
    for round in 0..200 {
        assert_eq!(
            c.commit("g", &a, generation, vec![commit("orders", 0, round)])
                .await,
            0
        );
        assert_eq!(
            c.commit("g", &b, generation, vec![commit("orders", 1, round * 2)])
                .await,
            0
        );
        assert_eq!(
            c.commit("other", "", -1, vec![commit("audit", 3, round)])
                .await,
            0
        );
    }
    assert_eq!(
        c.commit("gone", "", -1, vec![commit("orders", 2, 7)]).await,
        0
    );
    assert_eq!(c.delete("gone").await, 0);
    let before = log.replay();
    let written = log.records.lock().unwrap().len();
    assert!(written > 600);

    // The timer starts it once enough was written; it runs in the background.
    c.tick();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while log.records.lock().unwrap().len() >= written {
        assert!(std::time::Instant::now() < deadline, "no snapshot");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    while c.snapshotting.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // What is left replays to the same offsets and groups: 3 offsets and 1 group record.
    let after = log.replay();
    assert_eq!(after.offsets, before.offsets);
    assert_eq!(after.groups, before.groups);
    assert!(!after.offsets.contains_key("gone"));
    assert_eq!(log.records.lock().unwrap().len(), 4);
    assert!(log.base.load(Ordering::SeqCst) >= written as u64);
    // Writes go on after it, and a new coordinator from the trimmed log sees them.
    assert_eq!(
        c.commit("g", &a, generation, vec![commit("orders", 0, 1_000)])
            .await,
        0
    );
    let fresh = Coordinator::load(
        CONFIG,
        Arc::new(TestClock(AtomicI64::new(2_000))),
        log.clone(),
        log.replay(),
    );
    let got = fresh.fetch("g", &[("orders".into(), 0), ("orders".into(), 1)]);
    assert_eq!(got[0].as_ref().map(|o| o.offset), Some(1_000));
    assert_eq!(got[1].as_ref().map(|o| o.offset), Some(398));
    assert_eq!(
        fresh.group_state("g").map(|g| g.2.len()),
        Some(2),
        "members kept"
    );
}

/// OffsetDelete (KIP-496): an empty group's offsets go; an active consumer group keeps the
/// offsets of topics it subscribes to (GROUP_SUBSCRIBED_TO_TOPIC) and loses the others;
/// deletions are tombstones in the partition, so a new coordinator does not bring them back.
#[tokio::test]
async fn offsets_are_deleted_unless_the_active_group_consumes_their_topic() {
    let (c, log, clock) = coordinator();
    // a group with offsets and no members (as after its consumers stopped)
    let commits = vec![
        commit("orders", 0, 5),
        commit("orders", 1, 7),
        commit("audit", 0, 3),
    ];
    assert_eq!(c.commit("idle", "", -1, commits).await, codes::NONE);
    let r = c
        .delete_offsets("idle", vec![p("orders", 0), p("never-committed", 0)])
        .await
        .unwrap();
    assert_eq!(
        r,
        vec![
            (p("orders", 0), codes::NONE),
            (p("never-committed", 0), codes::NONE)
        ]
    );
    let got = c.fetch("idle", &[p("orders", 0), p("orders", 1), p("audit", 0)]);
    assert!(got[0].is_none(), "orders-0 deleted");
    assert_eq!(
        (
            got[1].as_ref().unwrap().offset,
            got[2].as_ref().unwrap().offset
        ),
        (7, 3)
    );
    assert_eq!(
        c.delete_offsets("nobody", vec![p("orders", 0)]).await,
        Err(GROUP_ID_NOT_FOUND)
    );

    // an active consumer group subscribed to "orders"
    let mut j = join("", "a");
    j.protocols = vec![(
        "range".into(),
        crate::group::native::encode_subscription(&["orders".to_string()]),
    )];
    let a = c.join("live", j).await;
    assert_eq!((a.error, a.generation), (codes::NONE, 1));
    let a_id = a.member_id.clone();
    let assignment = strata_client::groups::encode_assignment(&[p("orders", 1), p("audit", 0)]);
    c.sync("live", &a_id, 1, vec![(a_id.clone(), assignment)])
        .await;
    let commits = vec![commit("orders", 1, 9), commit("audit", 0, 4)];
    assert_eq!(c.commit("live", &a_id, 1, commits).await, codes::NONE);
    let r = c
        .delete_offsets("live", vec![p("orders", 1), p("audit", 0)])
        .await
        .unwrap();
    assert_eq!(
        r,
        vec![
            (p("orders", 1), GROUP_SUBSCRIBED_TO_TOPIC),
            (p("audit", 0), codes::NONE)
        ]
    );
    let got = c.fetch("live", &[p("orders", 1), p("audit", 0)]);
    assert_eq!(
        got[0].as_ref().unwrap().offset,
        9,
        "a consumed topic's offset stays"
    );
    assert!(got[1].is_none());

    // an active group whose subscriptions cannot be read is not touched at all
    let (c2, _, _) = coordinator();
    let a = c2.join("opaque", join("", "a")).await; // metadata b"orders", not a subscription
    assert_eq!(a.error, codes::NONE);
    assert_eq!(
        c2.delete_offsets("opaque", vec![p("orders", 0)]).await,
        Err(NON_EMPTY_GROUP)
    );

    // the deletions are in the partition: a new coordinator replays them
    drop(c);
    let c3 = Coordinator::load(CONFIG, clock.clone(), log.clone(), log.replay());
    let got = c3.fetch("idle", &[p("orders", 0), p("orders", 1)]);
    assert!(got[0].is_none(), "a deleted offset came back after replay");
    assert_eq!(got[1].as_ref().unwrap().offset, 7);
    assert!(c3.fetch("live", &[p("audit", 0)])[0].is_none());
}

fn p(topic: &str, partition: i32) -> (String, i32) {
    (topic.to_string(), partition)
}

fn consumer_join(member: &str) -> consumer::Heartbeat {
    consumer::Heartbeat {
        member_id: member.into(),
        member_epoch: 0,
        rebalance_timeout_ms: 30_000,
        subscribed_topic_names: Some(vec!["orders".into()]),
        owned: Some(consumer::Assignment::new()),
        ..consumer::Heartbeat::default()
    }
}

fn consumer_beat(r: &HeartbeatReply, owned: &consumer::Assignment) -> consumer::Heartbeat {
    consumer::Heartbeat {
        member_id: r.member_id.clone(),
        member_epoch: r.member_epoch,
        owned: Some(owned.clone()),
        ..consumer::Heartbeat::default()
    }
}

#[tokio::test]
async fn a_consumer_protocol_group_survives_a_coordinator_failover() {
    let (c, log, clock) = coordinator();
    let topics: consumer::Topics = [("orders".to_string(), (uuid::Uuid::from_u128(7), 4))].into();
    let client = consumer::Client::default();
    let config = ConsumerGroupConfig::default();
    let hb = |c: &Arc<Coordinator>, h| {
        let (c, topics, client) = (c.clone(), topics.clone(), client.clone());
        async move {
            c.consumer_heartbeat("cg", h, &client, &topics, config)
                .await
        }
    };
    let a = hb(&c, consumer_join("a")).await;
    let mut owned_a = a.assignment.clone().unwrap();
    let b = hb(&c, consumer_join("b")).await;
    // a gives half up, then b takes it
    let a2 = hb(&c, consumer_beat(&a, &owned_a)).await;
    owned_a = a2.assignment.clone().unwrap();
    let a3 = hb(&c, consumer_beat(&a2, &owned_a)).await;
    let b2 = hb(&c, consumer_beat(&b, &consumer::Assignment::new())).await;
    let owned_b = b2.assignment.clone().unwrap();
    assert_eq!(
        (
            owned_a.values().map(|p| p.len()).sum::<usize>(),
            owned_b.values().map(|p| p.len()).sum::<usize>()
        ),
        (2, 2)
    );
    c.close();
    drop(c);

    // the partition's leadership moved: the new coordinator knows the members and epochs
    let c2 = Coordinator::load(CONFIG, clock.clone(), log.clone(), log.replay());
    let a4 = hb(&c2, consumer_beat(&a3, &owned_a)).await;
    assert_eq!(
        (a4.error, a4.member_epoch),
        (codes::NONE, a3.member_epoch),
        "{a4:?}"
    );
    assert_eq!(a4.assignment.as_ref(), Some(&owned_a));
    let b3 = hb(&c2, consumer_beat(&b2, &owned_b)).await;
    assert_eq!(
        (b3.error, b3.assignment.as_ref()),
        (codes::NONE, Some(&owned_b))
    );
    // commits at the member epoch go on
    let e = b3.member_epoch;
    assert_eq!(
        c2.commit("cg", "b", e, vec![commit("orders", 0, 5)]).await,
        codes::NONE
    );
    // a member gone with the old coordinator is removed after its session here
    clock.0.fetch_add(40_000, Ordering::SeqCst);
    hb(&c2, consumer_beat(&b3, &owned_b)).await;
    clock.0.fetch_add(6_000, Ordering::SeqCst);
    c2.tick();
    let view = c2.describe_consumer_group("cg").expect("b is still there");
    assert!(
        view.members.iter().all(|(m, _)| m.id == "b"),
        "a was removed"
    );
    let b4 = hb(&c2, consumer_beat(&b3, &owned_b)).await;
    assert_eq!(
        b4.assignment
            .map(|a| a.values().map(|p| p.len()).sum::<usize>()),
        Some(4)
    );
    // the last member leaving: the group has offsets, so it stays a consumer group, Empty
    // (as in Kafka), also for a third coordinator
    let leave = |member: &str| consumer::Heartbeat {
        member_id: member.into(),
        member_epoch: consumer::LEAVE_EPOCH,
        ..consumer::Heartbeat::default()
    };
    hb(&c2, leave("b")).await;
    // a group that never committed is forgotten when its last member leaves
    let x = hb(&c2, consumer_join("x")).await;
    assert_eq!(x.error, codes::NONE);
    hb(&c2, leave("x")).await;
    assert_eq!(c2.list_consumer_groups(), vec![("cg".to_string(), "Empty")]);
    c2.close();
    drop(c2);
    let c3 = Coordinator::load(CONFIG, clock.clone(), log.clone(), log.replay());
    assert_eq!(c3.list_consumer_groups(), vec![("cg".to_string(), "Empty")]);
    assert!(c3.describe_consumer_group("cg").unwrap().members.is_empty());
    assert!(c3.describe("cg").is_none(), "not a classic group");
    assert_eq!(
        c3.fetch("cg", &[p("orders", 0)])[0]
            .as_ref()
            .unwrap()
            .offset,
        5
    );
    // a classic member joining takes the id over (Kafka converts an empty consumer group)
    let j = c3.join("cg", join("", "classic")).await;
    assert_ne!(j.error, codes::INCONSISTENT_GROUP_PROTOCOL, "{j:?}");
    assert!(c3.list_consumer_groups().is_empty());
    c3.close();
    drop(c3);
    let c4 = Coordinator::load(CONFIG, clock, log.clone(), log.replay());
    assert!(
        c4.list_consumer_groups().is_empty(),
        "the conversion is durable"
    );
    assert_eq!(
        c4.fetch("cg", &[p("orders", 0)])[0]
            .as_ref()
            .unwrap()
            .offset,
        5
    );
}

#[tokio::test]
async fn an_empty_consumer_group_is_deleted_with_its_offsets() {
    let (c, log, clock) = coordinator();
    let topics: consumer::Topics = [("orders".to_string(), (uuid::Uuid::from_u128(7), 2))].into();
    let r = c
        .consumer_heartbeat(
            "cg",
            consumer_join("a"),
            &consumer::Client::default(),
            &topics,
            ConsumerGroupConfig::default(),
        )
        .await;
    assert_eq!(
        c.commit("cg", "a", r.member_epoch, vec![commit("orders", 1, 9)])
            .await,
        codes::NONE
    );
    assert_eq!(c.delete("cg").await, NON_EMPTY_GROUP);
    let leave = consumer::Heartbeat {
        member_id: "a".into(),
        member_epoch: consumer::LEAVE_EPOCH,
        ..consumer::Heartbeat::default()
    };
    c.consumer_heartbeat(
        "cg",
        leave,
        &consumer::Client::default(),
        &topics,
        ConsumerGroupConfig::default(),
    )
    .await;
    assert_eq!(c.list_consumer_groups().len(), 1);
    assert_eq!(c.delete("cg").await, codes::NONE);
    assert!(c.list_consumer_groups().is_empty());
    assert_eq!(c.delete("cg").await, GROUP_ID_NOT_FOUND);
    let c2 = Coordinator::load(CONFIG, clock, log.clone(), log.replay());
    assert!(c2.list_consumer_groups().is_empty());
    assert!(c2.fetch("cg", &[p("orders", 1)])[0].is_none());
}

/// A consumer-protocol subscription (v1) of `topics`, owning `owned`.
fn subscription(topics: &[&str], owned: &[(String, i32)]) -> Bytes {
    use bytes::BufMut;
    use kafka_protocol::messages::consumer_protocol_subscription::TopicPartition;
    use kafka_protocol::messages::{ConsumerProtocolSubscription, TopicName};
    use kafka_protocol::protocol::{Encodable, StrBytes};
    let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (t, p) in owned {
        by_topic.entry(t).or_default().push(*p);
    }
    let sub = ConsumerProtocolSubscription::default()
        .with_topics(
            topics
                .iter()
                .map(|t| StrBytes::from_string(t.to_string()))
                .collect(),
        )
        .with_owned_partitions(
            by_topic
                .into_iter()
                .map(|(t, ps)| {
                    TopicPartition::default()
                        .with_topic(TopicName(StrBytes::from_string(t.to_string())))
                        .with_partitions(ps)
                })
                .collect(),
        );
    let mut buf = bytes::BytesMut::new();
    buf.put_i16(1);
    sub.encode(&mut buf, 1).expect("v1 encodes");
    buf.freeze()
}

fn classic_join(member: &str, owned: &[(String, i32)]) -> Join {
    Join {
        protocols: vec![
            (
                "cooperative-sticky".into(),
                subscription(&["orders"], owned),
            ),
            ("range".into(), subscription(&["orders"], owned)),
        ],
        ..join(member, "classic")
    }
}

fn named(assignment: &Bytes) -> Vec<(String, i32)> {
    let mut v = strata_client::groups::assigned_partitions(assignment).unwrap();
    v.sort();
    v
}

/// The consumer member's assignment, by topic name (topic id 7 is "orders").
fn by_name(a: &consumer::Assignment) -> Vec<(String, i32)> {
    a.values()
        .flatten()
        .map(|p| ("orders".to_string(), *p))
        .collect()
}

#[tokio::test]
async fn a_group_with_members_moves_to_the_consumer_protocol_and_back() {
    let (c, log, clock) = coordinator();
    let topics: consumer::Topics = [("orders".to_string(), (uuid::Uuid::from_u128(7), 4))].into();
    let config = ConsumerGroupConfig::default();
    let all: Vec<(String, i32)> = (0..4).map(|i| p("orders", i)).collect();
    // a classic group: a owns every partition in generation 1
    let a = c
        .join_with("mg", classic_join("", &[]), &topics, config)
        .await;
    assert_eq!((a.error, a.generation), (codes::NONE, 1));
    let a_id = a.member_id.clone();
    let r = c
        .sync(
            "mg",
            &a_id,
            1,
            vec![(a_id.clone(), strata_client::groups::encode_assignment(&all))],
        )
        .await;
    assert_eq!(named(&r.assignment), all);
    assert_eq!(
        c.commit("mg", &a_id, 1, vec![commit("orders", 0, 3)]).await,
        0
    );

    // a consumer-protocol member joins: the group is upgraded, and gets nothing a holds
    let hb = |h| {
        let (c, topics) = (c.clone(), topics.clone());
        async move {
            c.consumer_heartbeat("mg", h, &consumer::Client::default(), &topics, config)
                .await
        }
    };
    let n = hb(consumer_join("n")).await;
    assert_eq!(n.error, codes::NONE, "{n:?}");
    assert_eq!(n.assignment, Some(consumer::Assignment::new()));
    assert!(c.describe("mg").is_none(), "no longer a classic group");
    assert_eq!(c.list_consumer_groups().len(), 1);
    assert_eq!(
        c.fetch("mg", &[p("orders", 0)])[0].as_ref().unwrap().offset,
        3
    );

    // a is told to rejoin; it keeps half and must give the rest up
    assert_eq!(c.heartbeat("mg", &a_id, 1), codes::REBALANCE_IN_PROGRESS);
    let j = c
        .join_with("mg", classic_join(&a_id, &all), &topics, config)
        .await;
    assert_eq!(
        (j.error, j.generation, j.leader.as_str()),
        (0, 1, ""),
        "{j:?}"
    );
    assert!(j.members.is_empty());
    let kept = named(&c.sync("mg", &a_id, 1, vec![]).await.assignment);
    assert_eq!(kept.len(), 2);
    let n = hb(consumer_beat(&n, &consumer::Assignment::new())).await;
    assert_eq!(
        n.assignment,
        Some(consumer::Assignment::new()),
        "nothing is free yet"
    );
    assert_eq!(c.heartbeat("mg", &a_id, 1), codes::REBALANCE_IN_PROGRESS);
    // it gave the rest up: it reaches the group's epoch, and n gets what a gave up
    let j = c
        .join_with("mg", classic_join(&a_id, &kept), &topics, config)
        .await;
    assert_eq!(j.error, codes::NONE);
    let epoch = j.generation;
    assert!(epoch > 1);
    assert_eq!(
        named(&c.sync("mg", &a_id, epoch, vec![]).await.assignment),
        kept
    );
    assert_eq!(c.heartbeat("mg", &a_id, epoch), codes::NONE);
    let n = hb(consumer_beat(&n, &consumer::Assignment::new())).await;
    let n_owns = by_name(n.assignment.as_ref().unwrap());
    assert_eq!(n_owns.len(), 2);
    assert!(
        n_owns.iter().all(|p| !kept.contains(p)),
        "never owned twice"
    );
    // commits: a classic member's generation is its epoch
    assert_eq!(
        c.commit("mg", &a_id, 1, vec![commit("orders", 0, 4)]).await,
        codes::ILLEGAL_GENERATION
    );
    assert_eq!(
        c.commit("mg", &a_id, epoch, vec![commit(&kept[0].0, kept[0].1, 4)])
            .await,
        codes::NONE
    );

    // a failover keeps the mixed group as it is
    c.close();
    drop(c);
    let c = Coordinator::load(CONFIG, clock.clone(), log.clone(), log.replay());
    assert!(c.describe("mg").is_none());
    assert_eq!(c.heartbeat("mg", &a_id, epoch), codes::NONE);

    // the consumer-protocol member leaves: the group goes back to classic and rebalances
    let leave = consumer::Heartbeat {
        member_id: "n".into(),
        member_epoch: consumer::LEAVE_EPOCH,
        ..consumer::Heartbeat::default()
    };
    let r = c
        .consumer_heartbeat("mg", leave, &consumer::Client::default(), &topics, config)
        .await;
    assert_eq!(r.error, codes::NONE);
    assert!(c.list_consumer_groups().is_empty());
    let view = c.describe("mg").expect("a classic group again");
    assert_eq!(
        (view.state, view.protocol_type.as_str(), view.members.len()),
        (GroupState::PreparingRebalance, "consumer", 1)
    );
    assert!(view.generation >= epoch);
    assert_eq!(
        c.heartbeat("mg", &a_id, view.generation),
        codes::REBALANCE_IN_PROGRESS
    );
    let j = c
        .join_with("mg", classic_join(&a_id, &kept), &topics, config)
        .await;
    assert_eq!((j.error, j.leader.as_str()), (codes::NONE, a_id.as_str()));
    assert_eq!(j.generation, view.generation + 1);
    let r = c
        .sync(
            "mg",
            &a_id,
            j.generation,
            vec![(a_id.clone(), strata_client::groups::encode_assignment(&all))],
        )
        .await;
    assert_eq!(named(&r.assignment), all);
    // durable both ways: a new coordinator finds a classic group only
    c.close();
    drop(c);
    let c = Coordinator::load(CONFIG, clock, log.clone(), log.replay());
    assert!(c.list_consumer_groups().is_empty());
    assert_eq!(c.describe("mg").unwrap().state, GroupState::Stable);
    assert_eq!(c.heartbeat("mg", &a_id, j.generation), codes::NONE);
    assert_eq!(
        c.fetch("mg", &[kept[0].clone()])[0]
            .as_ref()
            .unwrap()
            .offset,
        4
    );
}

#[tokio::test]
async fn a_classic_member_of_a_consumer_group_is_fenced_by_its_session() {
    let (c, _log, clock) = coordinator();
    let topics: consumer::Topics = [("orders".to_string(), (uuid::Uuid::from_u128(7), 4))].into();
    let config = ConsumerGroupConfig::default();
    let hb = |h| {
        let (c, topics) = (c.clone(), topics.clone());
        async move {
            c.consumer_heartbeat("mg", h, &consumer::Client::default(), &topics, config)
                .await
        }
    };
    let n = hb(consumer_join("n")).await;
    let n_owned = n.assignment.clone().unwrap();
    assert_eq!(by_name(&n_owned).len(), 4);
    // a classic consumer joins the consumer group (v4+: it first gets its id)
    let first = c
        .join_with(
            "mg",
            Join {
                require_known_member_id: true,
                ..classic_join("", &[])
            },
            &topics,
            config,
        )
        .await;
    assert_eq!(first.error, codes::MEMBER_ID_REQUIRED);
    let id = first.member_id.clone();
    let j = c
        .join_with("mg", classic_join(&id, &[]), &topics, config)
        .await;
    assert_eq!(j.error, codes::NONE, "{j:?}");
    assert_eq!(j.protocol_name.as_deref(), Some("cooperative-sticky"));
    // nothing until n gives half up
    assert!(named(&c.sync("mg", &id, j.generation, vec![]).await.assignment).is_empty());
    let n = hb(consumer_beat(&n, &n_owned)).await;
    let n_owned = n.assignment.clone().unwrap();
    assert_eq!(by_name(&n_owned).len(), 2);
    let n = hb(consumer_beat(&n, &n_owned)).await;
    assert_eq!(
        c.heartbeat("mg", &id, j.generation),
        codes::REBALANCE_IN_PROGRESS
    );
    let j = c
        .join_with("mg", classic_join(&id, &[]), &topics, config)
        .await;
    let mine = named(&c.sync("mg", &id, j.generation, vec![]).await.assignment);
    assert_eq!(mine.len(), 2);
    assert!(mine.iter().all(|p| !by_name(&n_owned).contains(p)));
    // it stops heartbeating: removed after its own session (10 s), and n gets it all back
    clock.0.fetch_add(8_000, Ordering::SeqCst);
    hb(consumer_beat(&n, &n_owned)).await;
    clock.0.fetch_add(3_000, Ordering::SeqCst);
    c.tick();
    assert_eq!(
        c.heartbeat("mg", &id, j.generation),
        codes::UNKNOWN_MEMBER_ID
    );
    let n = hb(consumer_beat(&n, &n_owned)).await;
    assert_eq!(by_name(n.assignment.as_ref().unwrap()).len(), 4);
    // the consumer group stays one: its only member speaks the consumer protocol
    assert_eq!(c.list_consumer_groups().len(), 1);
}
