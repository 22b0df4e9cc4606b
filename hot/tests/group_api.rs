//! The consumer group APIs over the Kafka listener, in process: every served version of
//! each, and the error codes Kafka clients rely on (unknown members, stale generations,
//! commits of partitions a member was not given, the internal topic's protections).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_delete_request::{
    OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ApiKey, ConsumerGroupDescribeRequest, ConsumerGroupHeartbeatRequest,
    ConsumerProtocolAssignment, CreateTopicsRequest, DeleteGroupsRequest, DeleteTopicsRequest,
    DescribeGroupsRequest, FindCoordinatorRequest, GroupId, HeartbeatRequest, JoinGroupRequest,
    LeaveGroupRequest, ListGroupsRequest, OffsetCommitRequest, OffsetDeleteRequest,
    OffsetFetchRequest, ProduceRequest, SyncGroupRequest, TopicName,
};
use kafka_protocol::protocol::{Encodable, StrBytes};
use strata_client::{Admin, Connection};
use strata_core::batch::build::{batch, ProducerIds, Rec};
use strata_hot::broker::{Broker, BrokerConfig, SystemClock};
use strata_hot::kafka::SUPPORTED_APIS;
use tokio::sync::watch;

struct TestBroker {
    addr: String,
    _stop: watch::Sender<bool>,
    _broker: Arc<Broker>,
    _dir: tempfile::TempDir,
}

async fn start() -> TestBroker {
    let dir = tempfile::tempdir().unwrap();
    let groups = strata_hot::group::manager::GroupsConfig {
        offsets_partitions: 5,
        ..common::broker_config(dir.path()).groups
    };
    let broker = Broker::open(
        BrokerConfig {
            default_partitions: 2,
            groups,
            ..common::broker_config(dir.path())
        },
        Arc::new(SystemClock),
        None,
    )
    .await
    .unwrap();
    let (addr, stop) = common::serve_kafka(broker.clone()).await;
    let mut admin = Admin::connect(&addr).await.unwrap();
    admin
        .create_topic("orders", Some(4), None, &BTreeMap::new())
        .await
        .unwrap();
    TestBroker {
        addr,
        _stop: stop,
        _broker: broker,
        _dir: dir,
    }
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn gid(v: &str) -> GroupId {
    GroupId(s(v))
}

/// A ConsumerGroupHeartbeat joining `group` (epoch 0) subscribed to `orders`.
fn consumer_join(group: &str, member: &str) -> ConsumerGroupHeartbeatRequest {
    ConsumerGroupHeartbeatRequest::default()
        .with_group_id(gid(group))
        .with_member_id(s(member))
        .with_member_epoch(0)
        .with_rebalance_timeout_ms(30_000)
        .with_subscribed_topic_names(Some(vec![TopicName(s("orders"))]))
        .with_topic_partitions(Some(Vec::new()))
}

/// A consumer-protocol assignment (version 0) of `partitions` of "orders".
fn assignment(partitions: &[i32]) -> Bytes {
    let a = ConsumerProtocolAssignment::default().with_assigned_partitions(vec![
        TopicPartition::default()
            .with_topic(TopicName(s("orders")))
            .with_partitions(partitions.to_vec()),
    ]);
    let mut buf = BytesMut::new();
    buf.put_i16(0);
    a.encode(&mut buf, 0).unwrap();
    buf.freeze()
}

fn join_request(group: &str, member: &str) -> JoinGroupRequest {
    JoinGroupRequest::default()
        .with_group_id(gid(group))
        .with_session_timeout_ms(10_000)
        .with_rebalance_timeout_ms(10_000)
        .with_member_id(s(member))
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![JoinGroupRequestProtocol::default()
            .with_name(s("range"))
            .with_metadata(Bytes::from_static(
                b"\0\0\0\0\0\x01\0\x06orders\0\0\0\0",
            ))])
}

/// FindCoordinator, as clients start: creates the offsets topic and waits for its load,
/// retrying COORDINATOR_NOT_AVAILABLE as clients do.
async fn find(conn: &mut Connection, group: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = conn
            .send(&FindCoordinatorRequest::default().with_key(s(group)), 3)
            .await
            .unwrap();
        if r.error_code == 15 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        assert_eq!((r.error_code, r.node_id.0), (0, 0), "{:?}", r.error_message);
        return;
    }
}

/// Joins `group` alone and syncs with `partitions` assigned: (member id, generation).
async fn joined(conn: &mut Connection, group: &str, partitions: &[i32]) -> (String, i32) {
    find(conn, group).await;
    let first = conn.send(&join_request(group, ""), 5).await.unwrap();
    assert_eq!(first.error_code, 79, "a new member first gets its id");
    let member = first.member_id.to_string();
    let r = conn.send(&join_request(group, &member), 5).await.unwrap();
    assert_eq!(r.error_code, 0);
    assert_eq!(r.leader.as_str(), member, "the only member leads");
    let sync = conn
        .send(
            &SyncGroupRequest::default()
                .with_group_id(gid(group))
                .with_generation_id(r.generation_id)
                .with_member_id(s(&member))
                .with_assignments(vec![SyncGroupRequestAssignment::default()
                    .with_member_id(s(&member))
                    .with_assignment(assignment(partitions))]),
            3,
        )
        .await
        .unwrap();
    assert_eq!(sync.error_code, 0);
    assert_eq!(sync.assignment, assignment(partitions));
    (member, r.generation_id)
}

fn commit_request(
    group: &str,
    member: &str,
    generation: i32,
    offsets: &[(i32, i64)],
) -> OffsetCommitRequest {
    OffsetCommitRequest::default()
        .with_group_id(gid(group))
        .with_generation_id_or_member_epoch(generation)
        .with_member_id(s(member))
        .with_retention_time_ms(-1)
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(s("orders")))
            .with_partitions(
                offsets
                    .iter()
                    .map(|(p, o)| {
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(*p)
                            .with_committed_offset(*o)
                            .with_committed_leader_epoch(-1)
                            .with_committed_metadata(Some(s("m")))
                    })
                    .collect(),
            )])
}

async fn commit(
    conn: &mut Connection,
    group: &str,
    member: &str,
    generation: i32,
    offsets: &[(i32, i64)],
) -> Vec<i16> {
    let r = conn
        .send(&commit_request(group, member, generation, offsets), 8)
        .await
        .unwrap();
    r.topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
        .collect()
}

/// Committed offsets of "orders" partitions 0..4 (-1: none), via OffsetFetch v5.
async fn fetched(conn: &mut Connection, group: &str) -> Vec<i64> {
    let r = conn
        .send(
            &OffsetFetchRequest::default()
                .with_group_id(gid(group))
                .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                    .with_name(TopicName(s("orders")))
                    .with_partition_indexes(vec![0, 1, 2, 3])])),
            5,
        )
        .await
        .unwrap();
    assert_eq!(r.error_code, 0);
    r.topics[0]
        .partitions
        .iter()
        .map(|p| p.committed_offset)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_group_api_answers_at_every_served_version() {
    let b = start().await;
    let mut conn = Connection::connect(&b.addr).await.unwrap();
    // The first FindCoordinator creates the offsets topic (clients retry until it exists).
    find(&mut conn, "warm-up").await;
    let group_apis = [
        ApiKey::FindCoordinator,
        ApiKey::JoinGroup,
        ApiKey::SyncGroup,
        ApiKey::Heartbeat,
        ApiKey::LeaveGroup,
        ApiKey::OffsetCommit,
        ApiKey::OffsetFetch,
        ApiKey::ListGroups,
        ApiKey::DescribeGroups,
        ApiKey::DeleteGroups,
        ApiKey::OffsetDelete,
        ApiKey::ConsumerGroupHeartbeat,
        ApiKey::ConsumerGroupDescribe,
    ];
    for &(key, min, max) in SUPPORTED_APIS
        .iter()
        .filter(|(k, _, _)| group_apis.contains(k))
    {
        for v in min..=max {
            let g = format!("sweep-{key:?}-{v}");
            match key {
                ApiKey::FindCoordinator => {
                    let req = if v >= 4 {
                        FindCoordinatorRequest::default().with_coordinator_keys(vec![s(&g)])
                    } else {
                        FindCoordinatorRequest::default().with_key(s(&g))
                    };
                    let r = conn.send(&req, v).await.unwrap();
                    let (code, node, port) = if v >= 4 {
                        let c = &r.coordinators[0];
                        (c.error_code, c.node_id.0, c.port)
                    } else {
                        (r.error_code, r.node_id.0, r.port)
                    };
                    assert_eq!((code, node), (0, 0), "v{v}");
                    assert_eq!(port.to_string(), b.addr.rsplit(':').next().unwrap());
                }
                ApiKey::JoinGroup => {
                    let mut r = conn.send(&join_request(&g, ""), v).await.unwrap();
                    if v >= 4 {
                        assert_eq!(r.error_code, 79, "v{v}");
                        let member = r.member_id.to_string();
                        r = conn.send(&join_request(&g, &member), v).await.unwrap();
                    }
                    assert_eq!((r.error_code, r.generation_id), (0, 1), "v{v}");
                    assert_eq!(r.members.len(), 1, "v{v}: the leader gets the members");
                    assert_eq!(r.protocol_name.as_deref(), Some("range"), "v{v}");
                }
                ApiKey::SyncGroup => {
                    let first = conn.send(&join_request(&g, ""), 5).await.unwrap();
                    let member = first.member_id.to_string();
                    let j = conn.send(&join_request(&g, &member), 5).await.unwrap();
                    let r = conn
                        .send(
                            &SyncGroupRequest::default()
                                .with_group_id(gid(&g))
                                .with_generation_id(j.generation_id)
                                .with_member_id(s(&member))
                                .with_protocol_type(Some(s("consumer")))
                                .with_protocol_name(Some(s("range")))
                                .with_assignments(vec![SyncGroupRequestAssignment::default()
                                    .with_member_id(s(&member))
                                    .with_assignment(assignment(&[0]))]),
                            v,
                        )
                        .await
                        .unwrap();
                    assert_eq!(r.error_code, 0, "v{v}");
                    assert_eq!(r.assignment, assignment(&[0]), "v{v}");
                }
                ApiKey::Heartbeat => {
                    let (member, generation) = joined(&mut conn, &g, &[0]).await;
                    let r = conn
                        .send(
                            &HeartbeatRequest::default()
                                .with_group_id(gid(&g))
                                .with_generation_id(generation)
                                .with_member_id(s(&member)),
                            v,
                        )
                        .await
                        .unwrap();
                    assert_eq!(r.error_code, 0, "v{v}");
                }
                ApiKey::LeaveGroup => {
                    let (member, _) = joined(&mut conn, &g, &[0]).await;
                    let r = conn
                        .send(
                            &if v >= 3 {
                                LeaveGroupRequest::default()
                                    .with_group_id(gid(&g))
                                    .with_members(vec![
                                        MemberIdentity::default().with_member_id(s(&member))
                                    ])
                            } else {
                                LeaveGroupRequest::default()
                                    .with_group_id(gid(&g))
                                    .with_member_id(s(&member))
                            },
                            v,
                        )
                        .await
                        .unwrap();
                    assert_eq!(r.error_code, 0, "v{v}");
                    if v >= 3 {
                        assert_eq!(r.members[0].error_code, 0, "v{v}");
                    }
                }
                ApiKey::OffsetCommit => {
                    let (member, generation) = joined(&mut conn, &g, &[0, 1]).await;
                    let r = conn
                        .send(
                            &commit_request(&g, &member, generation, &[(0, 5), (1, 7)]),
                            v,
                        )
                        .await
                        .unwrap();
                    assert!(
                        r.topics[0].partitions.iter().all(|p| p.error_code == 0),
                        "v{v}: {r:?}"
                    );
                    assert_eq!(fetched(&mut conn, &g).await, vec![5, 7, -1, -1], "v{v}");
                }
                ApiKey::OffsetFetch => {
                    assert_eq!(commit(&mut conn, &g, "", -1, &[(2, 42)]).await, vec![0]);
                    let r = conn
                        .send(
                            &if v >= 8 {
                                OffsetFetchRequest::default().with_groups(vec![
                                    OffsetFetchRequestGroup::default()
                                        .with_group_id(gid(&g))
                                        .with_topics(Some(vec![
                                            OffsetFetchRequestTopics::default()
                                                .with_name(TopicName(s("orders")))
                                                .with_partition_indexes(vec![1, 2]),
                                        ])),
                                ])
                            } else {
                                OffsetFetchRequest::default()
                                    .with_group_id(gid(&g))
                                    .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                                        .with_name(TopicName(s("orders")))
                                        .with_partition_indexes(vec![1, 2])]))
                            },
                            v,
                        )
                        .await
                        .unwrap();
                    let offsets: Vec<i64> = if v >= 8 {
                        r.groups[0].topics[0]
                            .partitions
                            .iter()
                            .map(|p| p.committed_offset)
                            .collect()
                    } else {
                        r.topics[0]
                            .partitions
                            .iter()
                            .map(|p| p.committed_offset)
                            .collect()
                    };
                    assert_eq!(offsets, vec![-1, 42], "v{v}");
                }
                ApiKey::ListGroups => {
                    joined(&mut conn, &g, &[0]).await;
                    let r = conn
                        .send(
                            &ListGroupsRequest::default().with_states_filter(if v >= 4 {
                                vec![s("Stable")]
                            } else {
                                vec![]
                            }),
                            v,
                        )
                        .await
                        .unwrap();
                    assert_eq!(r.error_code, 0, "v{v}");
                    let listed = r.groups.iter().find(|x| x.group_id.as_str() == g);
                    let listed = listed.unwrap_or_else(|| panic!("v{v}: {g} not listed"));
                    assert_eq!(listed.protocol_type.as_str(), "consumer");
                    if v >= 4 {
                        assert!(r.groups.iter().all(|x| x.group_state.as_str() == "Stable"));
                    }
                }
                ApiKey::DescribeGroups => {
                    let (member, _) = joined(&mut conn, &g, &[3]).await;
                    let r = conn
                        .send(
                            &DescribeGroupsRequest::default()
                                .with_groups(vec![gid(&g), gid("never-seen")]),
                            v,
                        )
                        .await
                        .unwrap();
                    let d = &r.groups[0];
                    assert_eq!(
                        (d.error_code, d.group_state.as_str()),
                        (0, "Stable"),
                        "v{v}"
                    );
                    assert_eq!(d.protocol_data.as_str(), "range");
                    assert_eq!(d.members[0].member_id.as_str(), member);
                    assert_eq!(d.members[0].member_assignment, assignment(&[3]));
                    assert_eq!(r.groups[1].group_state.as_str(), "Dead");
                }
                ApiKey::DeleteGroups => {
                    assert_eq!(commit(&mut conn, &g, "", -1, &[(0, 1)]).await, vec![0]);
                    let busy = format!("{g}-busy");
                    joined(&mut conn, &busy, &[0]).await;
                    let r = conn
                        .send(
                            &DeleteGroupsRequest::default().with_groups_names(vec![
                                gid(&g),
                                gid(&busy),
                                gid("never-seen"),
                            ]),
                            v,
                        )
                        .await
                        .unwrap();
                    let codes: Vec<i16> = r.results.iter().map(|x| x.error_code).collect();
                    assert_eq!(
                        codes,
                        vec![0, 68, 69],
                        "v{v}: deleted, NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND"
                    );
                    assert_eq!(fetched(&mut conn, &g).await, vec![-1; 4], "v{v}");
                }
                ApiKey::ConsumerGroupDescribe => {
                    let r = conn.send(&consumer_join(&g, "described"), 1).await.unwrap();
                    assert_eq!(r.error_code, 0, "v{v}: {:?}", r.error_message);
                    let d = conn
                        .send(
                            &ConsumerGroupDescribeRequest::default()
                                .with_group_ids(vec![gid(&g), gid("never-heard-of")]),
                            v,
                        )
                        .await
                        .unwrap();
                    let (group, unknown) = (&d.groups[0], &d.groups[1]);
                    assert_eq!(
                        (group.error_code, group.group_state.as_str()),
                        (0, "Stable"),
                        "v{v}"
                    );
                    assert_eq!(group.assignor_name.as_str(), "uniform", "v{v}");
                    let m = &group.members[0];
                    assert_eq!(
                        (m.member_id.as_str(), m.member_epoch),
                        ("described", r.member_epoch)
                    );
                    let given = &m.assignment.topic_partitions[0];
                    assert_eq!(
                        (given.topic_name.0.as_str(), given.partitions.len()),
                        ("orders", 4)
                    );
                    assert_eq!(m.target_assignment, m.assignment, "v{v}");
                    // a group the consumer protocol does not know: clients ask DescribeGroups
                    assert_eq!(unknown.error_code, 69, "v{v}: GROUP_ID_NOT_FOUND");
                }
                ApiKey::ConsumerGroupHeartbeat => {
                    // v0: the coordinator names the member; v1 (KIP-1082): the client does
                    let named = if v == 0 { "" } else { "client-made-id" };
                    let r = conn.send(&consumer_join(&g, named), v).await.unwrap();
                    assert_eq!(r.error_code, 0, "v{v}: {:?}", r.error_message);
                    let member = r.member_id.expect("the member id").to_string();
                    assert!(!member.is_empty() && (v == 0 || member == named), "v{v}");
                    assert!(
                        r.member_epoch > 0 && r.heartbeat_interval_ms == 5_000,
                        "v{v}"
                    );
                    let given = &r.assignment.expect("a joining member's assignment");
                    assert_eq!(given.topic_partitions[0].partitions.len(), 4, "v{v}");
                    // OffsetCommit v9: the generation is the member epoch
                    let epoch = r.member_epoch;
                    for (at, code) in [(epoch, 0), (epoch - 1, 113)] {
                        let c = conn
                            .send(&commit_request(&g, &member, at, &[(0, 5)]), 9)
                            .await
                            .unwrap();
                        assert_eq!(
                            c.topics[0].partitions[0].error_code, code,
                            "v{v} epoch {at}"
                        );
                    }
                    // a classic JoinGroup joins it as a classic member only with a consumer
                    // protocol subscription (Kafka 4.0); other metadata is refused
                    let j = conn
                        .send(
                            &JoinGroupRequest::default()
                                .with_group_id(gid(&g))
                                .with_session_timeout_ms(10_000)
                                .with_rebalance_timeout_ms(10_000)
                                .with_protocol_type(s("consumer"))
                                .with_protocols(vec![JoinGroupRequestProtocol::default()
                                    .with_name(s("range"))
                                    .with_metadata(Bytes::new())]),
                            5,
                        )
                        .await
                        .unwrap();
                    assert_eq!(j.error_code, 23, "v{v}: INCONSISTENT_GROUP_PROTOCOL");
                    // nor does DescribeGroups describe it, as Kafka 4.0 answers
                    let d = conn
                        .send(
                            &DescribeGroupsRequest::default().with_groups(vec![gid(&g)]),
                            5,
                        )
                        .await
                        .unwrap();
                    assert_eq!(d.groups[0].error_code, 69, "v{v}: GROUP_ID_NOT_FOUND");
                    // leaving empties the group
                    let l = conn
                        .send(
                            &ConsumerGroupHeartbeatRequest::default()
                                .with_group_id(gid(&g))
                                .with_member_id(s(&member))
                                .with_member_epoch(-1),
                            v,
                        )
                        .await
                        .unwrap();
                    assert_eq!((l.error_code, l.member_epoch), (0, -1), "v{v}");
                }
                ApiKey::OffsetDelete => {
                    assert_eq!(
                        commit(&mut conn, &g, "", -1, &[(0, 1), (1, 2)]).await,
                        vec![0, 0]
                    );
                    let req = OffsetDeleteRequest::default()
                        .with_group_id(gid(&g))
                        .with_topics(vec![OffsetDeleteRequestTopic::default()
                            .with_name(TopicName(s("orders")))
                            .with_partitions(vec![
                                OffsetDeleteRequestPartition::default().with_partition_index(0)
                            ])]);
                    let r = conn.send(&req, v).await.unwrap();
                    assert_eq!(
                        (r.error_code, r.topics[0].partitions[0].error_code),
                        (0, 0),
                        "v{v}"
                    );
                    assert_eq!(fetched(&mut conn, &g).await, vec![-1, 2, -1, -1], "v{v}");
                    // a group whose member consumes "orders" keeps those offsets
                    let busy = format!("{g}-busy");
                    joined(&mut conn, &busy, &[0]).await;
                    let r = conn
                        .send(&req.clone().with_group_id(gid(&busy)), v)
                        .await
                        .unwrap();
                    assert_eq!(
                        (r.error_code, r.topics[0].partitions[0].error_code),
                        (0, 86),
                        "v{v}: GROUP_SUBSCRIBED_TO_TOPIC"
                    );
                    let r = conn
                        .send(&req.with_group_id(gid("never-seen")), v)
                        .await
                        .unwrap();
                    assert_eq!(r.error_code, 69, "v{v}: GROUP_ID_NOT_FOUND");
                }
                other => unreachable!("{other:?}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_requests_are_refused_with_kafkas_codes_and_commits_are_all_or_nothing() {
    let b = start().await;
    let mut conn = Connection::connect(&b.addr).await.unwrap();
    let (member, generation) = joined(&mut conn, "settlement", &[0, 1]).await;

    // Unknown member ids and stale generations.
    let hb = |member: &str, generation: i32| {
        HeartbeatRequest::default()
            .with_group_id(gid("settlement"))
            .with_generation_id(generation)
            .with_member_id(s(member))
    };
    let r = conn.send(&hb("ghost", generation), 4).await.unwrap();
    assert_eq!(r.error_code, 25, "UNKNOWN_MEMBER_ID");
    let r = conn.send(&hb(&member, generation - 1), 4).await.unwrap();
    assert_eq!(r.error_code, 22, "ILLEGAL_GENERATION");
    assert_eq!(
        commit(&mut conn, "settlement", "ghost", generation, &[(0, 1)]).await,
        vec![25]
    );
    assert_eq!(
        commit(&mut conn, "settlement", &member, generation + 1, &[(0, 1)]).await,
        vec![22]
    );

    // A partition the member was not given refuses the whole commit: nothing is written.
    assert_eq!(
        commit(
            &mut conn,
            "settlement",
            &member,
            generation,
            &[(0, 10), (2, 10)]
        )
        .await,
        vec![22, 22]
    );
    // So does a partition that does not exist.
    let mut bad = commit_request("settlement", &member, generation, &[(0, 10)]);
    bad.topics.push(
        OffsetCommitRequestTopic::default()
            .with_name(TopicName(s("no-such-topic")))
            .with_partitions(vec![OffsetCommitRequestPartition::default()
                .with_partition_index(0)
                .with_committed_offset(1)]),
    );
    let r = conn.send(&bad, 8).await.unwrap();
    assert!(r
        .topics
        .iter()
        .flat_map(|t| &t.partitions)
        .all(|p| p.error_code == 3));
    assert_eq!(fetched(&mut conn, "settlement").await, vec![-1; 4]);

    // The member's own partitions commit.
    assert_eq!(
        commit(
            &mut conn,
            "settlement",
            &member,
            generation,
            &[(0, 10), (1, 11)]
        )
        .await,
        vec![0, 0]
    );
    assert_eq!(fetched(&mut conn, "settlement").await, vec![10, 11, -1, -1]);

    // A member that left is fenced: its commits are refused.
    conn.send(
        &LeaveGroupRequest::default()
            .with_group_id(gid("settlement"))
            .with_member_id(s(&member)),
        1,
    )
    .await
    .unwrap();
    assert_eq!(
        commit(&mut conn, "settlement", &member, generation, &[(0, 99)]).await,
        vec![25]
    );
    assert_eq!(fetched(&mut conn, "settlement").await, vec![10, 11, -1, -1]);

    // The internal topic: clients cannot create, write or delete it.
    let r = conn
        .send(
            &CreateTopicsRequest::default().with_topics(vec![CreatableTopic::default()
                .with_name(TopicName(s("__consumer_offsets")))
                .with_num_partitions(1)
                .with_replication_factor(1)]),
            7,
        )
        .await
        .unwrap();
    assert_eq!(r.topics[0].error_code, 42, "INVALID_REQUEST");
    let rec = Bytes::from(batch(
        0,
        ProducerIds::NONE,
        &[Rec {
            key: Some(b"k"),
            value: Some(b"v"),
            timestamp_delta: 0,
        }],
    ));
    let r = conn
        .send(
            &ProduceRequest::default()
                .with_acks(-1)
                .with_timeout_ms(1000)
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(TopicName(s("__consumer_offsets")))
                    .with_partition_data(vec![PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(rec))])]),
            9,
        )
        .await
        .unwrap();
    assert_eq!(r.responses[0].partition_responses[0].error_code, 17);
    let r = conn
        .send(
            &DeleteTopicsRequest::default().with_topics(vec![
                DeleteTopicState::default().with_name(Some(TopicName(s("__consumer_offsets"))))
            ]),
            6,
        )
        .await
        .unwrap();
    assert_eq!(r.responses[0].error_code, 17, "INVALID_TOPIC_EXCEPTION");
}

/// The coordinator of `group` once its partition is loaded (within 10 s).
async fn loaded(
    groups: &strata_hot::group::manager::GroupManager,
    group: &str,
) -> Arc<strata_hot::group::coordinator::Coordinator> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match groups.coordinator(group) {
            Ok(c) => return c,
            Err(code) if std::time::Instant::now() > deadline => {
                panic!("the coordinator of {group} did not load: error {code}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_offsets_and_groups_survive_a_broker_restart() {
    let dir = tempfile::tempdir().unwrap();
    let open = || async {
        let groups = strata_hot::group::manager::GroupsConfig {
            offsets_partitions: 3,
            // Small segments and frequent snapshots, so the restart replays a trimmed log.
            offsets_snapshot_records: 100,
            offsets_segment_bytes: 2048,
            ..common::broker_config(dir.path()).groups
        };
        Broker::open(
            BrokerConfig {
                default_partitions: 2,
                groups,
                ..common::broker_config(dir.path())
            },
            Arc::new(SystemClock),
            None,
        )
        .await
        .unwrap()
    };
    let broker = open().await;
    broker
        .create_topic(
            strata_hot::broker::NewTopic {
                name: "orders".into(),
                partitions: Some(4),
                ..Default::default()
            },
            false,
        )
        .await
        .unwrap();
    let groups = broker.groups().clone();
    for g in ["audit", "reporting"] {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match groups.find(g).await {
                Ok(node) => break assert_eq!(node, 0),
                Err(15) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(code) => panic!("FindCoordinator {g}: error {code}"),
            }
        }
    }
    // The coordinator loads in the background once the topic exists.
    let c = loaded(&groups, "audit").await;
    let commits = |o: i64| {
        vec![strata_hot::group::coordinator::Commit {
            topic: "orders".into(),
            partition: 1,
            offset: o,
            leader_epoch: 0,
            metadata: String::new(),
        }]
    };
    for o in 1..=500 {
        assert_eq!(c.commit("audit", "", -1, commits(o)).await, 0);
    }
    // Snapshots deleted the superseded segments of the group's offsets partition.
    let index = strata_hot::group::records::partition_for_group("audit", 3) as usize;
    let offsets = broker.topic("__consumer_offsets").unwrap();
    let partition = offsets.partitions[index].clone().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while partition.progress().log_start < 300 {
        assert!(
            std::time::Instant::now() < deadline,
            "no snapshot trimmed the log: {:?}",
            partition.progress()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop((c, groups, partition, offsets));
    broker.shutdown();
    drop(broker);

    let broker = open().await;
    let groups = broker.groups().clone();
    let c = loaded(&groups, "audit").await;
    let got = c.fetch("audit", &[("orders".into(), 1), ("orders".into(), 0)]);
    assert_eq!(got[0].as_ref().map(|o| o.offset), Some(500));
    assert!(got[1].is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_incarnation_of_a_static_member_is_fenced() {
    let b = start().await;
    let mut conn = Connection::connect(&b.addr).await.unwrap();
    find(&mut conn, "custody").await;
    let static_join = |member: &str| {
        join_request("custody", member).with_group_instance_id(Some(s("custody-host-1")))
    };
    let first = conn.send(&static_join(""), 5).await.unwrap();
    assert_eq!(first.error_code, 0, "a static member needs no second join");
    let old = first.member_id.to_string();
    let sync = conn
        .send(
            &SyncGroupRequest::default()
                .with_group_id(gid("custody"))
                .with_generation_id(first.generation_id)
                .with_member_id(s(&old))
                .with_group_instance_id(Some(s("custody-host-1")))
                .with_assignments(vec![SyncGroupRequestAssignment::default()
                    .with_member_id(s(&old))
                    .with_assignment(assignment(&[0, 1]))]),
            3,
        )
        .await
        .unwrap();
    assert_eq!(sync.error_code, 0);
    // The process restarts: same instance id, no member id. It takes the old place back,
    // in the same generation (no rebalance).
    let again = conn.send(&static_join(""), 5).await.unwrap();
    assert_eq!(again.error_code, 0);
    assert_ne!(again.member_id.as_str(), old);
    assert_eq!(again.generation_id, first.generation_id, "no rebalance");
    // The old incarnation is fenced everywhere.
    let hb = conn
        .send(
            &HeartbeatRequest::default()
                .with_group_id(gid("custody"))
                .with_generation_id(first.generation_id)
                .with_member_id(s(&old))
                .with_group_instance_id(Some(s("custody-host-1"))),
            3,
        )
        .await
        .unwrap();
    assert_eq!(hb.error_code, 82, "FENCED_INSTANCE_ID");
    let refused = conn
        .send(
            &commit_request("custody", &old, first.generation_id, &[(0, 5)])
                .with_group_instance_id(Some(s("custody-host-1"))),
            8,
        )
        .await
        .unwrap();
    assert_eq!(refused.topics[0].partitions[0].error_code, 82);
    assert_eq!(fetched(&mut conn, "custody").await, vec![-1; 4]);
    // The new incarnation commits its (inherited) partitions.
    let new = again.member_id.to_string();
    assert_eq!(
        commit(
            &mut conn,
            "custody",
            &new,
            again.generation_id,
            &[(0, 5), (1, 6)]
        )
        .await,
        vec![0, 0]
    );
}
