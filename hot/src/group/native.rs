//! Native (gRPC) group members: a JoinGroup that also does the SyncGroup, with the
//! partitions assigned by the coordinator's broker (range, round-robin or sticky) when the
//! joining member is the group's leader. Members speak Kafka's consumer protocol inside
//! (subscription and assignment bytes), so native and Kafka members share one group, one
//! coordinator and the same committed offsets, and Kafka tools describe them alike.

use std::collections::{BTreeMap, BTreeSet};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::ConsumerProtocolSubscription;
use kafka_protocol::protocol::{Encodable, StrBytes};
use strata_client::groups::{assigned_partitions, encode_assignment};

use super::assign::{assign, Subscriber, ASSIGNORS};
use super::state::Join;
use crate::broker::Broker;

/// Kafka's INVALID_REQUEST and UNKNOWN_TOPIC_OR_PARTITION.
const INVALID_REQUEST: i16 = 42;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

/// A native member's join.
#[derive(Debug, Clone)]
pub struct NativeJoin {
    pub group: String,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub topics: Vec<String>,
    pub assignor: String,
    pub session_timeout_ms: i64,
    pub rebalance_timeout_ms: i64,
    pub client_id: String,
    pub client_host: String,
}

/// Its answer: who it is, in which generation, and its partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NativeJoined {
    pub member_id: String,
    pub generation: i32,
    pub assignment: Vec<(String, i32)>,
}

/// A consumer-protocol subscription (version 0) of `topics`.
pub(crate) fn encode_subscription(topics: &[String]) -> Bytes {
    let sub = ConsumerProtocolSubscription::default().with_topics(
        topics
            .iter()
            .map(|t| StrBytes::from_string(t.clone()))
            .collect(),
    );
    let mut buf = BytesMut::new();
    buf.put_i16(0);
    sub.encode(&mut buf, 0).expect("version 0 encodes");
    buf.freeze()
}

fn subscribed_topics(metadata: &Bytes) -> BTreeSet<String> {
    strata_client::groups::subscription_topics(metadata).unwrap_or_default()
}

/// The consumer protocol's configs of `group` (KIP-848 group configs, else the broker's
/// defaults) and the broker's group size limit.
pub fn consumer_group_config(broker: &Broker, group: &str) -> super::consumer::ConsumerGroupConfig {
    use strata_controller::metadata::dynamic::ConfigScope;
    let layer = broker.dynamic_layer(&ConfigScope::Group(group.to_string()));
    let groups = &broker.config().groups;
    groups.consumer.for_group(&layer, groups.group.max_size)
}

/// Joins (and syncs) a native member; `Err((Kafka error code, message))`.
pub async fn join(broker: &Broker, j: NativeJoin) -> Result<NativeJoined, (i16, String)> {
    if !ASSIGNORS.contains(&j.assignor.as_str()) {
        return Err((
            INVALID_REQUEST,
            format!(
                "unknown assignor '{}'; use one of {}",
                j.assignor,
                ASSIGNORS.join(", ")
            ),
        ));
    }
    if j.topics.is_empty() {
        return Err((INVALID_REQUEST, "subscribe to at least one topic".into()));
    }
    if let Some(t) = j.topics.iter().find(|t| broker.topic(t).is_none()) {
        return Err((
            UNKNOWN_TOPIC_OR_PARTITION,
            format!("topic '{t}' does not exist"),
        ));
    }
    if let Some(why) = super::invalid_group_id(&j.group) {
        return Err((super::manager::INVALID_GROUP_ID, why));
    }
    let c = broker.groups().coordinator(&j.group).map_err(|code| {
        (
            code,
            format!("this broker does not coordinate group '{}'", j.group),
        )
    })?;
    // what the broker may assign it when the group is a consumer-protocol one
    let topics: super::consumer::Topics = j
        .topics
        .iter()
        .filter_map(|t| {
            broker
                .topic(t)
                .map(|x| (t.clone(), (x.spec.id, x.spec.partitions)))
        })
        .collect();
    let reply = c
        .join_with(
            &j.group,
            Join {
                member_id: j.member_id.clone(),
                instance_id: j.instance_id.clone(),
                client_id: j.client_id.clone(),
                client_host: j.client_host.clone(),
                protocol_type: "consumer".into(),
                protocols: vec![(j.assignor.clone(), encode_subscription(&j.topics))],
                session_timeout_ms: j.session_timeout_ms,
                rebalance_timeout_ms: j.rebalance_timeout_ms,
                require_known_member_id: false,
            },
            &topics,
            consumer_group_config(broker, &j.group),
        )
        .await;
    if reply.error != 0 {
        return Err((reply.error, "join refused".into()));
    }
    let me = reply.member_id.clone();
    let assignments = if reply.leader == me {
        // This member leads: the broker assigns for the whole group.
        let view = c.describe(&j.group);
        let owned = |id: &str| {
            view.as_ref()
                .and_then(|v| v.members.iter().find(|m| m.member_id == id))
                .and_then(|m| assigned_partitions(&m.owned))
                .unwrap_or_default()
        };
        let subscribers: Vec<Subscriber> = reply
            .members
            .iter()
            .map(|m| Subscriber {
                member_id: m.member_id.clone(),
                topics: subscribed_topics(&m.metadata),
                owned: owned(&m.member_id),
            })
            .collect();
        let partitions: BTreeMap<String, i32> = subscribers
            .iter()
            .flat_map(|s| s.topics.iter())
            .filter_map(|t| {
                broker
                    .topic(t)
                    .map(|topic| (t.clone(), topic.spec.partitions as i32))
            })
            .collect();
        let protocol = reply.protocol_name.clone().unwrap_or_default();
        let plan = assign(&protocol, &subscribers, &partitions).ok_or_else(|| {
            (
                INVALID_REQUEST,
                format!("the group chose assignor '{protocol}', which the broker cannot run"),
            )
        })?;
        plan.into_iter()
            .map(|(id, parts)| (id, encode_assignment(&parts)))
            .collect()
    } else {
        Vec::new()
    };
    let synced = c.sync(&j.group, &me, reply.generation, assignments).await;
    if synced.error != 0 {
        return Err((synced.error, "sync refused; join again".into()));
    }
    let assignment = assigned_partitions(&synced.assignment).unwrap_or_default();
    Ok(NativeJoined {
        member_id: me,
        generation: reply.generation,
        assignment,
    })
}
