//! One group on KIP-848's consumer protocol (ConsumerGroupHeartbeat): the coordinator
//! assigns partitions itself and walks each member to its target assignment one heartbeat
//! at a time. Pure logic with an injected clock: heartbeats and ticks in, answers out.
//!
//! - The group epoch grows whenever membership, a subscription or a subscribed topic's
//!   partition count changes; a new target assignment is computed for it (a sticky,
//!   balanced assignor: Kafka's `uniform`, or `range` when a member asks for it).
//! - A member reaches a new epoch only once it gave up every partition its target moved
//!   away (it is told its assignment without them and reports what it still owns); a
//!   partition is handed to its new owner only once no other member holds it. So no
//!   partition is ever owned by two members at once.
//! - Each member must heartbeat within the session timeout and finish a revocation within
//!   its rebalance timeout, or it is removed and its partitions are freed.
//! - Epochs fence zombies: a heartbeat at an older epoch is FENCED_MEMBER_EPOCH (the
//!   member rejoins with epoch 0), an unknown member is UNKNOWN_MEMBER_ID.
//!
//! The coordinator writes the group's state ([`ConsumerGroup::encode`]: epochs, members,
//! subscriptions, assignments; not the timers) to `__consumer_offsets` whenever it changes,
//! so a new coordinator after a failover goes on where the old one stopped
//! ([`ConsumerGroup::decode`]), and members keep their partitions.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Kafka's error codes the consumer protocol answers with.
pub mod codes {
    pub const NONE: i16 = 0;
    pub const INVALID_REQUEST: i16 = 42;
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    pub const GROUP_MAX_SIZE_REACHED: i16 = 81;
    pub const FENCED_INSTANCE_ID: i16 = 82;
    pub const UNRELEASED_INSTANCE_ID: i16 = 111;
    pub const FENCED_MEMBER_EPOCH: i16 = 110;
    pub const UNSUPPORTED_ASSIGNOR: i16 = 112;
    pub const INVALID_REGULAR_EXPRESSION: i16 = 130;
}

/// Member epoch -1: the member leaves the group.
pub const LEAVE_EPOCH: i32 = -1;
/// Member epoch -2: a static member leaves for now (its instance keeps its place).
pub const STATIC_LEAVE_EPOCH: i32 = -2;

/// Longest subscription regex taken (it is compiled and matched against every topic).
pub const MAX_REGEX_BYTES: usize = 1024;

/// Partitions by topic id.
pub type Assignment = BTreeMap<Uuid, BTreeSet<i32>>;

/// The topics a group can be assigned: name -> (id, partition count).
pub type Topics = BTreeMap<String, (Uuid, u32)>;

/// Limits of the coordinator and the group's own configs (KIP-848 group configs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerGroupConfig {
    pub session_timeout_ms: i64,
    pub heartbeat_interval_ms: i32,
    pub max_size: usize,
}

impl Default for ConsumerGroupConfig {
    fn default() -> Self {
        ConsumerGroupConfig {
            session_timeout_ms: 45_000,
            heartbeat_interval_ms: 5_000,
            max_size: 1_000,
        }
    }
}

/// The broker's defaults and bounds for consumer-protocol groups (Kafka's
/// `group.consumer.{,min.,max.}session.timeout.ms` and `...heartbeat.interval.ms`): a
/// group's own `consumer.*` configs must fall within them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerProtocolConfig {
    pub session_timeout_ms: i64,
    pub min_session_timeout_ms: i64,
    pub max_session_timeout_ms: i64,
    pub heartbeat_interval_ms: i64,
    pub min_heartbeat_interval_ms: i64,
    pub max_heartbeat_interval_ms: i64,
}

impl Default for ConsumerProtocolConfig {
    fn default() -> Self {
        ConsumerProtocolConfig {
            session_timeout_ms: 45_000,
            min_session_timeout_ms: 45_000,
            max_session_timeout_ms: 60_000,
            heartbeat_interval_ms: 5_000,
            min_heartbeat_interval_ms: 5_000,
            max_heartbeat_interval_ms: 15_000,
        }
    }
}

impl ConsumerProtocolConfig {
    /// The bounds (broker config name, min, max) of a group config, if it is one.
    fn bounds(&self, name: &str) -> Option<(&'static str, i64, &'static str, i64)> {
        match name {
            "consumer.session.timeout.ms" => Some((
                "group.consumer.min.session.timeout.ms",
                self.min_session_timeout_ms,
                "group.consumer.max.session.timeout.ms",
                self.max_session_timeout_ms,
            )),
            "consumer.heartbeat.interval.ms" => Some((
                "group.consumer.min.heartbeat.interval.ms",
                self.min_heartbeat_interval_ms,
                "group.consumer.max.heartbeat.interval.ms",
                self.max_heartbeat_interval_ms,
            )),
            _ => None,
        }
    }

    /// The broker's default for a group config.
    pub fn default_of(&self, name: &str) -> Option<i64> {
        match name {
            "consumer.session.timeout.ms" => Some(self.session_timeout_ms),
            "consumer.heartbeat.interval.ms" => Some(self.heartbeat_interval_ms),
            _ => None,
        }
    }

    /// Whether a group config's value is within this broker's bounds (Kafka's message).
    pub fn check(&self, name: &str, value: &str) -> Result<(), String> {
        let Some((min_name, min, max_name, max)) = self.bounds(name) else {
            return Ok(());
        };
        let v: i64 = value.trim().parse().map_err(|_| {
            format!("Invalid value {value} for configuration {name}: Not a number of type INT")
        })?;
        if v < min {
            return Err(format!(
                "{name} must be greater than or equal to {min_name} ({min})"
            ));
        }
        if v > max {
            return Err(format!(
                "{name} must be less than or equal to {max_name} ({max})"
            ));
        }
        Ok(())
    }

    /// A group's configs: its own values (kept within the bounds, which may have changed
    /// since they were set), else the broker's defaults.
    pub fn for_group(
        &self,
        layer: &BTreeMap<String, String>,
        max_size: usize,
    ) -> ConsumerGroupConfig {
        let value = |name: &str| -> i64 {
            let (_, min, _, max) = self.bounds(name).expect("a group config");
            layer
                .get(name)
                .and_then(|v| v.trim().parse::<i64>().ok())
                .map_or_else(
                    || self.default_of(name).expect("a group config"),
                    |v| v.clamp(min, max),
                )
        };
        ConsumerGroupConfig {
            session_timeout_ms: value("consumer.session.timeout.ms"),
            heartbeat_interval_ms: value("consumer.heartbeat.interval.ms").min(i32::MAX as i64)
                as i32,
            max_size,
        }
    }
}

/// The server-side assignors a member may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Assignor {
    Uniform,
    Range,
}

impl Assignor {
    pub fn from_name(name: &str) -> Option<Assignor> {
        match name {
            "uniform" => Some(Assignor::Uniform),
            "range" => Some(Assignor::Range),
            _ => None,
        }
    }
}

/// A ConsumerGroupHeartbeat, with the fields a member left null as `None` (unchanged).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Heartbeat {
    pub member_id: String,
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub subscribed_topic_names: Option<Vec<String>>,
    pub subscribed_topic_regex: Option<String>,
    pub server_assignor: Option<String>,
    /// What the member owns now (`None`: unchanged since its last heartbeat).
    pub owned: Option<Assignment>,
}

/// The answer to a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatReply {
    pub error: i16,
    pub message: Option<String>,
    pub member_id: String,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    /// The member's assignment, when it changed or the member sent what it owns.
    pub assignment: Option<Assignment>,
}

/// Where a member is on its way to its target assignment (Kafka's member states).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberState {
    Stable,
    /// It must give up partitions first.
    UnrevokedPartitions,
    /// At the group's epoch, waiting for partitions other members still hold.
    UnreleasedPartitions,
}

impl MemberState {
    pub fn name(self) -> &'static str {
        match self {
            MemberState::Stable => "stable",
            MemberState::UnrevokedPartitions => "unrevoked_partitions",
            MemberState::UnreleasedPartitions => "unreleased_partitions",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub epoch: i32,
    pub previous_epoch: i32,
    pub state: MemberState,
    pub rebalance_timeout_ms: i64,
    pub topic_names: Vec<String>,
    pub regex: Option<String>,
    pub assignor: Option<Assignor>,
    /// What it is told it owns.
    pub assigned: Assignment,
    /// What it must give up before its next epoch.
    pub revoking: Assignment,
    /// Timers are not stored: a restored member gets a new session and rebalance timeout.
    #[serde(skip)]
    pub last_heard_ms: i64,
    /// When it must have given up `revoking`.
    #[serde(skip)]
    pub revoke_by_ms: Option<i64>,
    /// A static member that left for now (epoch -2): kept until its session times out.
    pub away: bool,
    /// The assignment last sent, to tell when to send it again.
    #[serde(skip)]
    sent: Option<Assignment>,
    /// Set for a member speaking the classic protocol (JoinGroup, SyncGroup, Heartbeat) in
    /// this group: one taken over when the group was upgraded, or one that joined since
    /// (Kafka 4.0's online migration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classic: Option<ClassicMember>,
}

/// What a classic member keeps that consumer-protocol members do not have.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassicMember {
    /// Its own session timeout (from its JoinGroup), not the group's.
    pub session_timeout_ms: i64,
    /// Its JoinGroup protocols (name, metadata) in its order of preference.
    pub protocols: Vec<(String, Vec<u8>)>,
}

/// A classic JoinGroup (protocol type "consumer") to a consumer-protocol group, or a member
/// of a classic group being upgraded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassicJoin {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client: Client,
    pub session_timeout_ms: i64,
    pub rebalance_timeout_ms: i64,
    /// (name, metadata): each metadata is a ConsumerProtocolSubscription.
    pub protocols: Vec<(String, Bytes)>,
}

/// How groups may move between the classic and the consumer protocol while they have
/// members (Kafka's `group.consumer.migration.policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MigrationPolicy {
    /// Both ways (Kafka 4.0's default).
    #[default]
    Bidirectional,
    /// Classic groups become consumer groups when a consumer-protocol member joins.
    Upgrade,
    /// Consumer groups become classic when their last consumer-protocol member leaves.
    Downgrade,
    Disabled,
}

impl MigrationPolicy {
    pub fn from_name(name: &str) -> Option<MigrationPolicy> {
        match name.to_ascii_lowercase().as_str() {
            "bidirectional" => Some(MigrationPolicy::Bidirectional),
            "upgrade" => Some(MigrationPolicy::Upgrade),
            "downgrade" => Some(MigrationPolicy::Downgrade),
            "disabled" => Some(MigrationPolicy::Disabled),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            MigrationPolicy::Bidirectional => "bidirectional",
            MigrationPolicy::Upgrade => "upgrade",
            MigrationPolicy::Downgrade => "downgrade",
            MigrationPolicy::Disabled => "disabled",
        }
    }

    pub fn upgrades(self) -> bool {
        matches!(
            self,
            MigrationPolicy::Bidirectional | MigrationPolicy::Upgrade
        )
    }

    pub fn downgrades(self) -> bool {
        matches!(
            self,
            MigrationPolicy::Bidirectional | MigrationPolicy::Downgrade
        )
    }
}

/// Partitions by topic name.
pub type Named = Vec<(String, i32)>;

/// A consumer-protocol subscription's topics and owned partitions (v1+); `None` when the
/// bytes are not one.
pub fn read_subscription(metadata: &[u8]) -> Option<(Vec<String>, Named)> {
    strata_client::groups::read_subscription(metadata)
}

/// Partitions named by topic, by topic id (topics not in `topics` left out).
fn by_id(named: &[(String, i32)], topics: &Topics) -> Assignment {
    let mut out = Assignment::new();
    for (t, p) in named {
        if let Some((id, _)) = topics.get(t) {
            add(&mut out, *id, *p);
        }
    }
    out
}

/// The group as DescribeGroups / ConsumerGroupDescribe and ListGroups see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroupView {
    pub state: &'static str,
    pub epoch: i32,
    pub assignment_epoch: i32,
    pub assignor: &'static str,
    pub members: Vec<(Member, Assignment)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerGroup {
    id: String,
    epoch: i32,
    assignment_epoch: i32,
    members: BTreeMap<String, Member>,
    /// The target assignment of `assignment_epoch`, by member.
    target: BTreeMap<String, Assignment>,
    /// The subscribed topics with their partition counts when the target was computed.
    subscribed: BTreeMap<String, (Uuid, u32)>,
    /// Members' regexes and the topics they matched when last resolved. As in Kafka, a
    /// regex is resolved after the heartbeat that brings it is answered, so its topics are
    /// assigned from the next heartbeat on (literal names at once).
    #[serde(default)]
    resolved: BTreeMap<String, BTreeSet<String>>,
}

/// Who sent a heartbeat (kept for the operator's view).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Client {
    pub id: String,
    pub host: String,
}

fn count(a: &Assignment) -> usize {
    a.values().map(BTreeSet::len).sum()
}

fn minus(a: &Assignment, b: &Assignment) -> Assignment {
    let mut out = Assignment::new();
    for (t, ps) in a {
        let rest: BTreeSet<i32> = match b.get(t) {
            Some(bs) => ps.difference(bs).copied().collect(),
            None => ps.clone(),
        };
        if !rest.is_empty() {
            out.insert(*t, rest);
        }
    }
    out
}

fn intersect(a: &Assignment, b: &Assignment) -> Assignment {
    let mut out = Assignment::new();
    for (t, ps) in a {
        if let Some(bs) = b.get(t) {
            let both: BTreeSet<i32> = ps.intersection(bs).copied().collect();
            if !both.is_empty() {
                out.insert(*t, both);
            }
        }
    }
    out
}

fn holds(a: &Assignment, topic: &Uuid, partition: i32) -> bool {
    a.get(topic).is_some_and(|ps| ps.contains(&partition))
}

fn add(a: &mut Assignment, topic: Uuid, partition: i32) {
    a.entry(topic).or_default().insert(partition);
}

fn reply(error: i16, message: impl Into<String>, member_id: &str, epoch: i32) -> HeartbeatReply {
    HeartbeatReply {
        error,
        message: Some(message.into()),
        member_id: member_id.to_string(),
        member_epoch: epoch,
        heartbeat_interval_ms: 0,
        assignment: None,
    }
}

impl ConsumerGroup {
    pub fn new(id: &str) -> ConsumerGroup {
        ConsumerGroup {
            id: id.to_string(),
            epoch: 0,
            assignment_epoch: 0,
            members: BTreeMap::new(),
            target: BTreeMap::new(),
            subscribed: BTreeMap::new(),
            resolved: BTreeMap::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The group's state as a `__consumer_offsets` record value (timers left out).
    pub fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).expect("a group serializes"))
    }

    /// A group from its record value, its members' timers starting at `now`: each gets a
    /// whole session, and a member giving partitions up its whole rebalance timeout.
    pub fn decode(value: &[u8], now: i64) -> Result<ConsumerGroup, String> {
        let mut g: ConsumerGroup = serde_json::from_slice(value)
            .map_err(|e| format!("undecodable consumer group: {e}"))?;
        for m in g.members.values_mut() {
            m.last_heard_ms = now;
            if m.state == MemberState::UnrevokedPartitions {
                m.revoke_by_ms = Some(now + m.rebalance_timeout_ms);
            }
        }
        Ok(g)
    }

    pub fn has_member(&self, id: &str) -> bool {
        self.members.contains_key(id)
    }

    /// A member's epoch, for OffsetCommit / OffsetFetch (`None`: not a member).
    pub fn member_epoch(&self, id: &str) -> Option<i32> {
        self.members.get(id).map(|m| m.epoch)
    }

    /// Kafka's group states for this protocol.
    pub fn state(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else if self.assignment_epoch < self.epoch {
            "Assigning"
        } else if self
            .members
            .values()
            .any(|m| m.epoch != self.assignment_epoch || m.state != MemberState::Stable)
        {
            "Reconciling"
        } else {
            "Stable"
        }
    }

    pub fn view(&self) -> ConsumerGroupView {
        ConsumerGroupView {
            state: self.state(),
            epoch: self.epoch,
            assignment_epoch: self.assignment_epoch,
            assignor: match self.preferred_assignor() {
                Assignor::Uniform => "uniform",
                Assignor::Range => "range",
            },
            members: self
                .members
                .values()
                .map(|m| {
                    (
                        m.clone(),
                        self.target.get(&m.id).cloned().unwrap_or_default(),
                    )
                })
                .collect(),
        }
    }

    /// The assignor most members ask for (ties and none: uniform).
    fn preferred_assignor(&self) -> Assignor {
        let range = self
            .members
            .values()
            .filter(|m| m.assignor == Some(Assignor::Range))
            .count();
        let uniform = self
            .members
            .values()
            .filter(|m| m.assignor == Some(Assignor::Uniform))
            .count();
        if range > uniform {
            Assignor::Range
        } else {
            Assignor::Uniform
        }
    }

    /// One heartbeat from a member. `topics`: every topic the cluster has now.
    pub fn heartbeat(
        &mut self,
        hb: Heartbeat,
        client: &Client,
        topics: &Topics,
        config: ConsumerGroupConfig,
        now: i64,
    ) -> HeartbeatReply {
        if let Err(r) = Self::check(&hb) {
            return r;
        }
        match hb.member_epoch {
            LEAVE_EPOCH | STATIC_LEAVE_EPOCH => return self.leave(&hb, now),
            0 => {
                if let Err(r) = self.join(&hb, client, config, now) {
                    return r;
                }
            }
            epoch => {
                let Some(m) = self.members.get(&hb.member_id) else {
                    return reply(
                        codes::UNKNOWN_MEMBER_ID,
                        format!("member {} is not in group {}", hb.member_id, self.id),
                        &hb.member_id,
                        epoch,
                    );
                };
                let owned_ok = hb
                    .owned
                    .as_ref()
                    .is_some_and(|o| minus(o, &m.assigned).is_empty());
                if epoch != m.epoch && !(epoch == m.previous_epoch && owned_ok) {
                    return reply(
                        codes::FENCED_MEMBER_EPOCH,
                        format!(
                            "member epoch {epoch} is stale (the member is at {}); rejoin with epoch 0",
                            m.epoch
                        ),
                        &hb.member_id,
                        epoch,
                    );
                }
            }
        }
        let id = hb.member_id.clone();
        let changed = {
            let m = self.members.get_mut(&id).expect("joined or checked above");
            m.last_heard_ms = now;
            m.away = false;
            m.client_id.clone_from(&client.id);
            m.client_host.clone_from(&client.host);
            if hb.rebalance_timeout_ms > 0 {
                m.rebalance_timeout_ms = hb.rebalance_timeout_ms as i64;
            }
            if let Some(r) = &hb.rack_id {
                m.rack_id = Some(r.clone());
            }
            let mut changed = false;
            if let Some(names) = hb.subscribed_topic_names {
                let mut names = names;
                names.sort();
                names.dedup();
                changed |= names != m.topic_names;
                m.topic_names = names;
            }
            if let Some(regex) = hb.subscribed_topic_regex {
                let regex = (!regex.is_empty()).then_some(regex);
                changed |= regex != m.regex;
                m.regex = regex;
            }
            if let Some(a) = &hb.server_assignor {
                let assignor = Assignor::from_name(a);
                changed |= assignor != m.assignor;
                m.assignor = assignor;
            }
            changed
        };
        self.retarget(changed, topics);
        self.reconcile(&id, hb.owned.as_ref(), now);
        let m = self.members.get_mut(&id).expect("still a member");
        let full = hb.owned.is_some() || hb.member_epoch == 0;
        let assignment = (full || m.sent.as_ref() != Some(&m.assigned)).then(|| {
            m.sent = Some(m.assigned.clone());
            m.assigned.clone()
        });
        let reply = HeartbeatReply {
            error: codes::NONE,
            message: None,
            member_id: id,
            member_epoch: m.epoch,
            heartbeat_interval_ms: config.heartbeat_interval_ms,
            assignment,
        };
        self.resolve_regexes(topics);
        reply
    }

    /// Resolves every regex a member subscribes with against the topics there are now
    /// (and forgets the ones no member uses); the next heartbeat assigns what changed.
    fn resolve_regexes(&mut self, topics: &Topics) {
        let used: BTreeSet<&String> = self
            .members
            .values()
            .filter_map(|m| m.regex.as_ref())
            .collect();
        self.resolved.retain(|r, _| used.contains(r));
        for regex in used {
            let matched = match regex::Regex::new(regex) {
                Ok(r) => topics.keys().filter(|t| r.is_match(t)).cloned().collect(),
                Err(_) => BTreeSet::new(),
            };
            if self.resolved.get(regex) != Some(&matched) {
                self.resolved.insert(regex.clone(), matched);
            }
        }
    }

    /// Request checks that need no state (Kafka's INVALID_REQUEST cases).
    fn check(hb: &Heartbeat) -> Result<(), HeartbeatReply> {
        let bad = |why: &str| {
            Err(reply(
                codes::INVALID_REQUEST,
                why,
                &hb.member_id,
                hb.member_epoch,
            ))
        };
        if hb.member_id.is_empty() || hb.member_id.len() > 255 {
            return bad(
                "a member id of 1 to 255 bytes is required (the client makes it, KIP-1082)",
            );
        }
        if hb.member_epoch < STATIC_LEAVE_EPOCH {
            return bad("the member epoch is invalid");
        }
        if hb.member_epoch == STATIC_LEAVE_EPOCH && hb.instance_id.is_none() {
            return bad("epoch -2 (a static member leaving) needs an instance id");
        }
        if hb.member_epoch == 0 {
            if hb.rebalance_timeout_ms <= 0 {
                return bad("joining needs a positive rebalance timeout");
            }
            if hb.subscribed_topic_names.is_none() && hb.subscribed_topic_regex.is_none() {
                return bad("joining needs subscribed topic names or a regex");
            }
        }
        if let Some(regex) = &hb.subscribed_topic_regex {
            if regex.len() > MAX_REGEX_BYTES {
                return Err(reply(
                    codes::INVALID_REGULAR_EXPRESSION,
                    format!("the subscription regex is longer than {MAX_REGEX_BYTES} bytes"),
                    &hb.member_id,
                    hb.member_epoch,
                ));
            }
            if !regex.is_empty() && regex::Regex::new(regex).is_err() {
                return Err(reply(
                    codes::INVALID_REGULAR_EXPRESSION,
                    format!("'{regex}' is not a valid regular expression"),
                    &hb.member_id,
                    hb.member_epoch,
                ));
            }
        }
        if let Some(a) = &hb.server_assignor {
            if Assignor::from_name(a).is_none() {
                return Err(reply(
                    codes::UNSUPPORTED_ASSIGNOR,
                    format!("assignor '{a}' is not served (uniform, range)"),
                    &hb.member_id,
                    hb.member_epoch,
                ));
            }
        }
        Ok(())
    }

    fn join(
        &mut self,
        hb: &Heartbeat,
        client: &Client,
        config: ConsumerGroupConfig,
        now: i64,
    ) -> Result<(), HeartbeatReply> {
        // A static member coming back takes its instance's place (and assignment).
        if let Some(instance) = &hb.instance_id {
            let old = self
                .members
                .values()
                .find(|m| m.instance_id.as_deref() == Some(instance.as_str()))
                .map(|m| (m.id.clone(), m.away));
            if let Some((old_id, away)) = old {
                if old_id != hb.member_id {
                    if !away {
                        return Err(reply(
                            codes::UNRELEASED_INSTANCE_ID,
                            format!("instance {instance} is still held by member {old_id}"),
                            &hb.member_id,
                            0,
                        ));
                    }
                    self.take_place(&old_id, &hb.member_id);
                    return Ok(());
                }
            }
        }
        if let Some(m) = self.members.get_mut(&hb.member_id) {
            // The same member joining again (it lost its state): it starts over, owning
            // nothing, at the group's epoch.
            m.assigned.clear();
            m.revoking.clear();
            m.revoke_by_ms = None;
            m.epoch = 0;
            m.sent = None;
            return Ok(());
        }
        if self.members.len() >= config.max_size {
            return Err(reply(
                codes::GROUP_MAX_SIZE_REACHED,
                format!("group {} has {} members already", self.id, config.max_size),
                &hb.member_id,
                0,
            ));
        }
        let mut m = Member::new(
            &hb.member_id,
            hb.instance_id.clone(),
            client,
            i64::from(hb.rebalance_timeout_ms),
            now,
        );
        m.rack_id.clone_from(&hb.rack_id);
        self.members.insert(hb.member_id.clone(), m);
        self.epoch += 1;
        Ok(())
    }

    fn leave(&mut self, hb: &Heartbeat, now: i64) -> HeartbeatReply {
        let Some(m) = self.members.get_mut(&hb.member_id) else {
            return reply(
                codes::UNKNOWN_MEMBER_ID,
                format!("member {} is not in group {}", hb.member_id, self.id),
                &hb.member_id,
                hb.member_epoch,
            );
        };
        if hb.member_epoch == STATIC_LEAVE_EPOCH {
            // It gives its partitions up, but keeps its place until its session ends.
            m.away = true;
            m.last_heard_ms = now;
        } else {
            self.remove(&hb.member_id);
        }
        HeartbeatReply {
            error: codes::NONE,
            message: None,
            member_id: hb.member_id.clone(),
            member_epoch: hb.member_epoch,
            heartbeat_interval_ms: 0,
            assignment: None,
        }
    }

    /// A static member's new incarnation (`new_id`) takes the place of `old_id`: its
    /// partitions, target and epoch.
    fn take_place(&mut self, old_id: &str, new_id: &str) {
        let Some(mut m) = self.members.remove(old_id) else {
            return;
        };
        let target = self.target.remove(old_id);
        m.id = new_id.to_string();
        m.sent = None;
        self.members.insert(m.id.clone(), m);
        if let Some(t) = target {
            self.target.insert(new_id.to_string(), t);
        }
    }

    /// A new epoch when a member's subscription `changed`, or the subscribed topics did,
    /// and the target assignment of it.
    fn retarget(&mut self, changed: bool, topics: &Topics) {
        if changed {
            self.epoch += 1;
        }
        self.refresh_subscriptions(topics);
        if self.assignment_epoch < self.epoch {
            self.compute_target(topics);
        }
    }

    /// Drops a member: its partitions are free, and the group moves to a new epoch.
    fn remove(&mut self, id: &str) {
        if self.members.remove(id).is_some() {
            self.target.remove(id);
            self.epoch += 1;
        }
    }

    /// The topics a member subscribes to, by name, among those that exist: its literal
    /// names, and what its regex matched when last resolved.
    fn subscription(&self, m: &Member, topics: &Topics) -> BTreeSet<String> {
        let matched = m.regex.as_ref().and_then(|r| self.resolved.get(r));
        topics
            .keys()
            .filter(|t| {
                m.topic_names.iter().any(|n| n == *t) || matched.is_some_and(|ts| ts.contains(*t))
            })
            .cloned()
            .collect()
    }

    /// Bumps the epoch when the subscribed topics (or their partition counts) changed.
    fn refresh_subscriptions(&mut self, topics: &Topics) {
        let mut now = BTreeMap::new();
        for m in self.members.values() {
            for t in self.subscription(m, topics) {
                now.insert(t.clone(), topics[&t]);
            }
        }
        if now != self.subscribed {
            self.subscribed = now;
            self.epoch += 1;
        }
    }

    /// The target assignment of the current epoch: balanced over the members subscribed to
    /// each partition, keeping partitions where they are whenever balance allows.
    fn compute_target(&mut self, topics: &Topics) {
        let subs: BTreeMap<String, BTreeSet<String>> = self
            .members
            .values()
            .map(|m| (m.id.clone(), self.subscription(m, topics)))
            .collect();
        let target = match self.preferred_assignor() {
            Assignor::Uniform => uniform(&subs, topics, &self.target),
            Assignor::Range => range(&subs, topics),
        };
        self.target = target;
        self.assignment_epoch = self.epoch;
    }

    /// Whether a member other than `me` holds the partition (assigned or still revoking).
    fn held_by_other(&self, me: &str, topic: &Uuid, partition: i32) -> bool {
        self.members.values().any(|m| {
            m.id != me
                && (holds(&m.assigned, topic, partition) || holds(&m.revoking, topic, partition))
        })
    }

    /// Moves a member one step toward its target assignment (Kafka's
    /// CurrentAssignmentBuilder). `owned`: what the member says it owns (`None`: as before).
    fn reconcile(&mut self, id: &str, owned: Option<&Assignment>, now: i64) {
        let m = &self.members[id];
        match m.state {
            // it must confirm it gave the partitions up; without its owned partitions we
            // cannot tell, and wait
            MemberState::UnrevokedPartitions
                if owned.is_none_or(|o| !intersect(o, &m.revoking).is_empty()) => {}
            MemberState::Stable if m.epoch == self.assignment_epoch => {}
            _ => self.next_assignment(id, now),
        }
    }

    fn next_assignment(&mut self, id: &str, now: i64) {
        let target = self.target.get(id).cloned().unwrap_or_default();
        let current = self.members[id].assigned.clone();
        let kept = intersect(&current, &target);
        let revoking = minus(&current, &target);
        let mut assigning = Assignment::new();
        let mut unreleased = false;
        for (t, ps) in minus(&target, &current) {
            for p in ps {
                if self.held_by_other(id, &t, p) {
                    unreleased = true;
                } else {
                    add(&mut assigning, t, p);
                }
            }
        }
        let assignment_epoch = self.assignment_epoch;
        let m = self.members.get_mut(id).expect("a member");
        if !revoking.is_empty() {
            // it gives these up first, at its current epoch
            m.assigned = kept;
            m.revoking = revoking;
            m.state = MemberState::UnrevokedPartitions;
            m.revoke_by_ms = Some(now + m.rebalance_timeout_ms);
            return;
        }
        if m.epoch != assignment_epoch {
            m.previous_epoch = m.epoch;
            m.epoch = assignment_epoch;
        }
        m.revoking.clear();
        m.revoke_by_ms = None;
        m.assigned = kept;
        for (t, ps) in assigning {
            m.assigned.entry(t).or_default().extend(ps);
        }
        m.state = if unreleased {
            MemberState::UnreleasedPartitions
        } else {
            MemberState::Stable
        };
    }

    /// Removes members past their session timeout, and members that did not give up their
    /// partitions within their rebalance timeout. Returns the ids removed.
    pub fn tick(&mut self, config: ConsumerGroupConfig, now: i64) -> Vec<String> {
        let gone: Vec<String> = self
            .members
            .values()
            .filter(|m| {
                let session = m
                    .classic
                    .as_ref()
                    .map_or(config.session_timeout_ms, |c| c.session_timeout_ms);
                now - m.last_heard_ms > session || m.revoke_by_ms.is_some_and(|t| now > t)
            })
            .map(|m| m.id.clone())
            .collect();
        for id in &gone {
            self.remove(id);
        }
        gone
    }

    /// A classic group's members taken over by this protocol (the online upgrade, when a
    /// consumer-protocol member joins a classic group with members): each keeps what it
    /// owns (`owned`, by topic name) at an epoch equal to the classic generation, and that
    /// is the target until the joining member's heartbeat moves the group on. No partition
    /// moves until its owner gave it up.
    pub fn from_classic(
        id: &str,
        generation: i32,
        members: Vec<(ClassicJoin, Vec<(String, i32)>)>,
        topics: &Topics,
        now: i64,
    ) -> ConsumerGroup {
        let mut g = ConsumerGroup::new(id);
        g.epoch = generation;
        g.assignment_epoch = generation;
        for (j, owned) in members {
            let mut names = j
                .protocols
                .first()
                .and_then(|(_, md)| read_subscription(md))
                .map(|(t, _)| t)
                .unwrap_or_default();
            names.sort();
            names.dedup();
            let mut m = classic_member(&j, now);
            m.epoch = generation;
            m.previous_epoch = generation;
            m.topic_names = names;
            m.assigned = by_id(&owned, topics);
            g.target.insert(m.id.clone(), m.assigned.clone());
            g.members.insert(m.id.clone(), m);
        }
        g
    }

    /// A classic JoinGroup to this group (Kafka 4.0: a classic member of a consumer group).
    /// The member is reconciled as a heartbeat would be, what it owns read from its
    /// subscription; returns its epoch (the JoinGroup's generation) and protocol name, or
    /// (Kafka's error, why).
    pub fn classic_join(
        &mut self,
        j: ClassicJoin,
        topics: &Topics,
        config: ConsumerGroupConfig,
        now: i64,
    ) -> Result<(i32, String), (i16, String)> {
        let Some((mut names, owned)) = j
            .protocols
            .first()
            .and_then(|(_, md)| read_subscription(md))
        else {
            return Err((
                INCONSISTENT_GROUP_PROTOCOL,
                "the member's metadata is not a consumer protocol subscription".into(),
            ));
        };
        names.sort();
        names.dedup();
        if self
            .members
            .get(&j.member_id)
            .is_some_and(|m| m.classic.is_none())
        {
            return Err((
                codes::UNKNOWN_MEMBER_ID,
                format!("member {} uses the consumer protocol", j.member_id),
            ));
        }
        // a static member coming back takes its instance's place (and assignment)
        if let Some(instance) = &j.instance_id {
            let old = self
                .members
                .values()
                .find(|m| {
                    m.instance_id.as_deref() == Some(instance.as_str()) && m.id != j.member_id
                })
                .map(|m| (m.id.clone(), m.classic.is_some() || m.away));
            if let Some((old_id, replaceable)) = old {
                if !replaceable {
                    return Err((
                        codes::UNRELEASED_INSTANCE_ID,
                        format!("instance {instance} is still held by member {old_id}"),
                    ));
                }
                self.take_place(&old_id, &j.member_id);
            }
        }
        if !self.members.contains_key(&j.member_id) {
            if self.members.len() >= config.max_size {
                return Err((
                    codes::GROUP_MAX_SIZE_REACHED,
                    format!("group {} has {} members already", self.id, config.max_size),
                ));
            }
            self.members
                .insert(j.member_id.clone(), classic_member(&j, now));
            self.epoch += 1;
        }
        let id = j.member_id.clone();
        let protocol = j.protocols[0].0.clone();
        let changed = {
            let fresh = classic_member(&j, now);
            let m = self.members.get_mut(&id).expect("a member");
            m.last_heard_ms = now;
            m.away = false;
            m.client_id = fresh.client_id;
            m.client_host = fresh.client_host;
            m.rebalance_timeout_ms = fresh.rebalance_timeout_ms;
            m.classic = fresh.classic;
            m.instance_id = j.instance_id.clone();
            let changed = names != m.topic_names;
            m.topic_names = names;
            changed
        };
        self.retarget(changed, topics);
        let owned = by_id(&owned, topics);
        self.reconcile(&id, Some(&owned), now);
        if self.members[&id].state == MemberState::UnrevokedPartitions {
            // what it owns (in this very request) may show it gave them up already
            self.reconcile(&id, Some(&owned), now);
        }
        let m = self.members.get_mut(&id).expect("a member");
        if m.state != MemberState::UnrevokedPartitions {
            m.revoke_by_ms = None;
        }
        Ok((m.epoch, protocol))
    }

    /// A classic SyncGroup: the member's partitions (by topic name) without those it must
    /// give up, and its protocol name; or Kafka's error.
    pub fn classic_sync(
        &mut self,
        member: &str,
        generation: i32,
        now: i64,
    ) -> Result<(String, Named), i16> {
        let Some(m) = self.members.get_mut(member).filter(|m| m.classic.is_some()) else {
            return Err(codes::UNKNOWN_MEMBER_ID);
        };
        if generation != m.epoch {
            return Err(ILLEGAL_GENERATION);
        }
        m.last_heard_ms = now;
        let protocol = m
            .classic
            .as_ref()
            .and_then(|c| c.protocols.first())
            .map(|(n, _)| n.clone())
            .unwrap_or_default();
        let assigned = m.assigned.clone();
        Ok((protocol, self.named(&assigned)))
    }

    /// An assignment by topic name (the subscribed topics name every partition a member
    /// is given).
    fn named(&self, a: &Assignment) -> Named {
        let names: BTreeMap<Uuid, &String> = self
            .subscribed
            .iter()
            .map(|(n, (id, _))| (*id, n))
            .collect();
        a.iter()
            .filter_map(|(t, ps)| names.get(t).map(|n| (*n, ps)))
            .flat_map(|(n, ps)| ps.iter().map(move |p| (n.clone(), *p)))
            .collect()
    }

    /// A classic Heartbeat: REBALANCE_IN_PROGRESS when the member must rejoin to move
    /// toward its target (give partitions up, or take new ones), with its rebalance timeout
    /// to do so.
    pub fn classic_heartbeat(&mut self, member: &str, generation: i32, now: i64) -> i16 {
        let Some(m) = self.members.get(member).filter(|m| m.classic.is_some()) else {
            return codes::UNKNOWN_MEMBER_ID;
        };
        if generation != m.epoch {
            return ILLEGAL_GENERATION;
        }
        if self.assignment_epoch < self.epoch {
            // membership changed (a member left or timed out) since the target was made
            let topics = self.subscribed.clone();
            self.refresh_subscriptions(&topics);
            self.compute_target(&topics);
        }
        let rejoin = self.classic_must_rejoin(member);
        let m = self.members.get_mut(member).expect("checked above");
        m.last_heard_ms = now;
        if !rejoin {
            return codes::NONE;
        }
        if m.revoke_by_ms.is_none() {
            m.revoke_by_ms = Some(now + m.rebalance_timeout_ms);
        }
        REBALANCE_IN_PROGRESS
    }

    fn classic_must_rejoin(&self, id: &str) -> bool {
        let m = &self.members[id];
        match m.state {
            MemberState::UnrevokedPartitions => true,
            _ if m.epoch < self.assignment_epoch => true,
            MemberState::UnreleasedPartitions => {
                let target = self.target.get(id).cloned().unwrap_or_default();
                minus(&target, &m.assigned)
                    .iter()
                    .any(|(t, ps)| ps.iter().any(|p| !self.held_by_other(id, t, *p)))
            }
            MemberState::Stable => false,
        }
    }

    /// A classic LeaveGroup.
    pub fn classic_leave(&mut self, member: &str) -> i16 {
        match self.members.get(member) {
            Some(m) if m.classic.is_some() => {
                self.remove(member);
                codes::NONE
            }
            _ => codes::UNKNOWN_MEMBER_ID,
        }
    }

    /// Whether every member speaks the classic protocol (the group is then downgraded).
    pub fn only_classic(&self) -> bool {
        !self.members.is_empty() && self.members.values().all(|m| m.classic.is_some())
    }

    /// The classic group this one becomes when its last consumer-protocol member left and
    /// classic members remain (the online downgrade): at a generation equal to the group
    /// epoch, each member with its target assignment, to be rebalanced at once.
    pub fn to_classic(&self, now: i64) -> super::records::StoredGroup {
        fn protocols(m: &Member) -> Option<&Vec<(String, Vec<u8>)>> {
            m.classic.as_ref().map(|c| &c.protocols)
        }
        // the first protocol of the first member that every member offers
        let first = self.members.values().next().and_then(protocols);
        let protocol = first.as_ref().and_then(|ps| {
            ps.iter()
                .find(|(n, _)| {
                    self.members
                        .values()
                        .all(|m| protocols(m).is_some_and(|o| o.iter().any(|(x, _)| x == n)))
                })
                .or(ps.first())
                .map(|(n, _)| n.clone())
        });
        super::records::StoredGroup {
            protocol_type: "consumer".into(),
            generation: self.epoch,
            protocol: protocol.clone(),
            leader: self.members.keys().next().cloned(),
            state_timestamp: now,
            members: self
                .members
                .values()
                .map(|m| {
                    let target = self.target.get(&m.id).unwrap_or(&m.assigned);
                    let named = self.named(target);
                    let subscription = protocols(m)
                        .and_then(|ps| {
                            ps.iter()
                                .find(|(n, _)| Some(n) == protocol.as_ref())
                                .or(ps.first())
                                .map(|(_, md)| Bytes::from(md.clone()))
                        })
                        .unwrap_or_default();
                    super::records::StoredMember {
                        member_id: m.id.clone(),
                        instance_id: m.instance_id.clone(),
                        client_id: m.client_id.clone(),
                        client_host: m.client_host.clone(),
                        rebalance_timeout_ms: m.rebalance_timeout_ms.min(i32::MAX as i64) as i32,
                        session_timeout_ms: m
                            .classic
                            .as_ref()
                            .map_or(45_000, |c| c.session_timeout_ms.min(i32::MAX as i64) as i32),
                        subscription,
                        assignment: strata_client::groups::encode_assignment(&named),
                    }
                })
                .collect(),
        }
    }

    /// The topics its members subscribe to now (OffsetDelete keeps their offsets).
    pub fn subscribed_topics(&self) -> BTreeSet<String> {
        self.subscribed.keys().cloned().collect()
    }

    /// Members' ids, for DescribeGroups and deletions.
    pub fn member_ids(&self) -> Vec<String> {
        self.members.keys().cloned().collect()
    }

    /// Whether `member` may commit these partitions' offsets at `epoch` (None: yes;
    /// Some(code): Kafka's refusal).
    pub fn may_commit(&self, member: &str, epoch: i32) -> Option<i16> {
        match self.members.get(member) {
            None => Some(codes::UNKNOWN_MEMBER_ID),
            // a classic member's generation is its epoch, refused as a classic group would
            Some(m) if m.epoch != epoch && m.classic.is_some() => Some(ILLEGAL_GENERATION),
            Some(m) if m.epoch != epoch => Some(STALE_MEMBER_EPOCH),
            Some(_) => None,
        }
    }
}

/// Kafka's STALE_MEMBER_EPOCH: an OffsetCommit at an epoch the member left behind.
pub const STALE_MEMBER_EPOCH: i16 = 113;
/// Kafka's ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS and INCONSISTENT_GROUP_PROTOCOL
/// (answers to classic members).
pub const ILLEGAL_GENERATION: i16 = 22;
pub const REBALANCE_IN_PROGRESS: i16 = 27;
pub const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;

/// A new classic member of a consumer-protocol group, at epoch 0 and owning nothing.
fn classic_member(j: &ClassicJoin, now: i64) -> Member {
    let mut m = Member::new(
        &j.member_id,
        j.instance_id.clone(),
        &j.client,
        j.rebalance_timeout_ms,
        now,
    );
    m.classic = Some(ClassicMember {
        session_timeout_ms: j.session_timeout_ms,
        protocols: j
            .protocols
            .iter()
            .map(|(n, md)| (n.clone(), md.to_vec()))
            .collect(),
    });
    m
}

impl Member {
    /// A new member at epoch 0, owning nothing.
    fn new(
        id: &str,
        instance_id: Option<String>,
        client: &Client,
        rebalance_timeout_ms: i64,
        now: i64,
    ) -> Member {
        Member {
            id: id.to_string(),
            instance_id,
            rack_id: None,
            client_id: client.id.clone(),
            client_host: client.host.clone(),
            epoch: 0,
            previous_epoch: 0,
            state: MemberState::Stable,
            rebalance_timeout_ms: rebalance_timeout_ms.max(1),
            topic_names: Vec::new(),
            regex: None,
            assignor: None,
            assigned: Assignment::new(),
            revoking: Assignment::new(),
            last_heard_ms: now,
            revoke_by_ms: None,
            away: false,
            sent: None,
            classic: None,
        }
    }
}

/// Every partition of the topics, by (topic name, id).
fn partitions_of(names: &BTreeSet<String>, topics: &Topics) -> Vec<(String, Uuid, i32)> {
    names
        .iter()
        .filter_map(|n| topics.get(n).map(|(id, count)| (n, *id, *count)))
        .flat_map(|(n, id, count)| (0..count as i32).map(move |p| (n.clone(), id, p)))
        .collect()
}

/// An empty assignment for each subscribed member.
fn nothing_for_each(subs: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, Assignment> {
    subs.keys()
        .map(|m| (m.clone(), Assignment::new()))
        .collect()
}

/// Kafka's `uniform` assignor, sticky: each partition goes to one of the members subscribed
/// to its topic, as evenly as their subscriptions allow; a partition stays with its
/// previous owner while that owner is below its fair share.
fn uniform(
    subs: &BTreeMap<String, BTreeSet<String>>,
    topics: &Topics,
    previous: &BTreeMap<String, Assignment>,
) -> BTreeMap<String, Assignment> {
    let mut out = nothing_for_each(subs);
    let all: BTreeSet<String> = subs.values().flatten().cloned().collect();
    let parts = partitions_of(&all, topics);
    let eligible = |topic: &str| -> Vec<&String> {
        subs.iter()
            .filter(|(_, s)| s.contains(topic))
            .map(|(m, _)| m)
            .collect()
    };
    // Fair shares: `base` each, one more for `extra` of the members.
    let members = subs.len().max(1);
    let (base, mut extra) = (parts.len() / members, parts.len() % members);
    let mut unassigned = Vec::new();
    for (name, id, p) in &parts {
        let keeper = previous
            .iter()
            .find(|(m, a)| holds(a, id, *p) && subs.get(*m).is_some_and(|s| s.contains(name)))
            .map(|(m, _)| m.clone());
        let room = keeper.as_ref().is_some_and(|m| {
            let n = count(&out[m]);
            n < base || (n == base && extra > 0)
        });
        match keeper {
            Some(m) if room => {
                if count(&out[&m]) == base {
                    extra -= 1;
                }
                add(out.get_mut(&m).expect("a member"), *id, *p);
            }
            _ => unassigned.push((name.clone(), *id, *p)),
        }
    }
    for (name, id, p) in unassigned {
        let best = eligible(&name)
            .into_iter()
            .min_by_key(|m| (count(&out[*m]), (*m).clone()));
        if let Some(m) = best {
            let m = m.clone();
            add(out.get_mut(&m).expect("a member"), id, p);
        }
    }
    out
}

/// Kafka's `range` assignor: each topic's partitions in ranges over its subscribers, in
/// member id order.
fn range(
    subs: &BTreeMap<String, BTreeSet<String>>,
    topics: &Topics,
) -> BTreeMap<String, Assignment> {
    let mut out = nothing_for_each(subs);
    let all: BTreeSet<String> = subs.values().flatten().cloned().collect();
    for name in &all {
        let Some((id, partitions)) = topics.get(name) else {
            continue;
        };
        let members: Vec<&String> = subs
            .iter()
            .filter(|(_, s)| s.contains(name))
            .map(|(m, _)| m)
            .collect();
        let n = members.len() as u32;
        let (each, extra) = (partitions / n, partitions % n);
        let mut next = 0;
        for (i, m) in members.iter().enumerate() {
            let take = each + u32::from((i as u32) < extra);
            for p in next..next + take {
                add(out.get_mut(*m).expect("a member"), *id, p as i32);
            }
            next += take;
        }
    }
    out
}

#[cfg(test)]
mod tests;
