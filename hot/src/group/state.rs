//! One consumer group's membership, as Kafka's classic group protocol defines it, with a
//! timeout out of every state. Pure logic with an injected clock: requests and ticks in,
//! replies out. The coordinator keeps the pending JoinGroup / SyncGroup requests and hands
//! each reply to the member it names.
//!
//! States: Empty (no members), PreparingRebalance (waiting for members to (re)join, bounded
//! by the rebalance timeout), CompletingRebalance (waiting for the leader's assignment,
//! bounded by the rebalance timeout), Stable, Dead (the group was deleted or moved).
//! A member that stops heartbeating is removed after its session timeout. A member whose
//! joins keep forcing rebalances is turned away with a growing backoff. A static member
//! (`group.instance.id`) that restarts takes its old place without a rebalance.

use std::collections::{BTreeMap, HashMap, VecDeque};

use bytes::Bytes;

/// Kafka's error codes for group requests.
pub mod codes {
    pub const NONE: i16 = 0;
    pub const ILLEGAL_GENERATION: i16 = 22;
    pub const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    pub const INVALID_SESSION_TIMEOUT: i16 = 26;
    pub const REBALANCE_IN_PROGRESS: i16 = 27;
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    pub const MEMBER_ID_REQUIRED: i16 = 79;
    pub const FENCED_INSTANCE_ID: i16 = 82;
    pub const GROUP_MAX_SIZE_REACHED: i16 = 81;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
    Dead,
}

/// Limits the coordinator applies to every group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupConfig {
    /// `group.min.session.timeout.ms` / `group.max.session.timeout.ms`.
    pub min_session_timeout_ms: i64,
    pub max_session_timeout_ms: i64,
    /// A member whose joins forced more rebalances than this within `flap_window_ms` is
    /// turned away for a backoff that doubles each time (up to `max_backoff_ms`). 0 (the
    /// default): never; Kafka has no such rule, and a well-behaved client that changes its
    /// subscription often must not be turned away.
    pub max_rebalances_per_member: usize,
    pub flap_window_ms: i64,
    pub min_backoff_ms: i64,
    pub max_backoff_ms: i64,
    /// Members one group may have (`group.max.size`); a join past it gets
    /// GROUP_MAX_SIZE_REACHED.
    pub max_size: usize,
    /// `group.initial.rebalance.delay.ms`: a group that was empty waits this long for more
    /// members before its first generation, and as long again (within the rebalance
    /// timeout) whenever another member joined meanwhile, so consumers started together
    /// get one generation instead of one each.
    pub initial_rebalance_delay_ms: i64,
    /// Whether groups with members move between the classic and the consumer protocol
    /// (`group.consumer.migration.policy`).
    pub migration: super::consumer::MigrationPolicy,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            min_session_timeout_ms: 6_000,
            max_session_timeout_ms: 1_800_000,
            max_rebalances_per_member: 0,
            flap_window_ms: 300_000,
            min_backoff_ms: 1_000,
            max_backoff_ms: 60_000,
            max_size: 1_000,
            initial_rebalance_delay_ms: 3_000,
            migration: super::consumer::MigrationPolicy::Bidirectional,
        }
    }
}

/// A JoinGroup request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Join {
    /// Empty for a member joining for the first time.
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub protocol_type: String,
    /// (protocol name, member metadata) in the member's order of preference.
    pub protocols: Vec<(String, Bytes)>,
    pub session_timeout_ms: i64,
    pub rebalance_timeout_ms: i64,
    /// JoinGroup v4+: a new member first gets its id back with MEMBER_ID_REQUIRED (KIP-394).
    pub require_known_member_id: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinedMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub metadata: Bytes,
}

/// A JoinGroup answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinReply {
    pub error: i16,
    pub generation: i32,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// Every member with its metadata, for the leader only.
    pub members: Vec<JoinedMember>,
    /// How long the client should wait before trying again (a flapping member's backoff).
    pub throttle_ms: i64,
}

/// A SyncGroup answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncReply {
    pub error: i16,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

/// A reply to a member's pending request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Join(JoinReply),
    Sync(SyncReply),
}

/// Replies to deliver now, each to the member (id) whose pending request it answers.
pub type Replies = Vec<(String, Reply)>;

#[derive(Debug, Clone)]
struct Member {
    instance_id: Option<String>,
    client_id: String,
    client_host: String,
    protocols: Vec<(String, Bytes)>,
    session_timeout_ms: i64,
    rebalance_timeout_ms: i64,
    last_heartbeat_ms: i64,
    awaiting_join: bool,
    awaiting_sync: bool,
    assignment: Bytes,
    /// The assignment of the generation before (kept for commits of partitions being
    /// given up, which a cooperative member makes after its new assignment).
    previous_assignment: Bytes,
    /// It rejoined with a changed subscription (so the rebalance it forces is its own doing).
    changed: bool,
}

impl Member {
    /// Who this member is across restarts, for flap tracking.
    fn client_key(&self) -> String {
        self.instance_id
            .clone()
            .unwrap_or_else(|| format!("{}@{}", self.client_id, self.client_host))
    }
}

fn join_client_key(j: &Join) -> String {
    j.instance_id
        .clone()
        .unwrap_or_else(|| format!("{}@{}", j.client_id, j.client_host))
}

/// The first rebalance of a group that was empty (Kafka's InitialDelayedJoin): it completes
/// only at the group's deadline, which moves on by the delay while members keep coming.
#[derive(Debug, Clone, Copy)]
struct InitialJoin {
    /// What is left of the rebalance timeout for further delays.
    remaining_ms: i64,
    /// A member joined since the deadline was set.
    member_added: bool,
}

/// Recent rebalances a client forced, and its current backoff.
#[derive(Debug, Clone, Default)]
struct Flaps {
    at: VecDeque<i64>,
    backoff_ms: i64,
    banned_until: i64,
}

#[derive(Debug, Clone)]
pub struct Group {
    pub id: String,
    config: GroupConfig,
    state: GroupState,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    members: BTreeMap<String, Member>,
    /// Static members: instance id -> current member id.
    statics: HashMap<String, String>,
    /// When the current PreparingRebalance / CompletingRebalance must end.
    deadline: Option<i64>,
    flaps: HashMap<String, Flaps>,
    /// When a member of each client key last left or was removed: a new member with that
    /// key forcing a rebalance soon after is the same client coming back (a crash loop).
    departed: HashMap<String, i64>,
    next_member: u64,
    /// The member the latest join request was taken in as.
    last_joined: Option<String>,
    /// Set while the first rebalance after Empty waits for more members.
    initial_join: Option<InitialJoin>,
}

fn join_error(member_id: &str, error: i16) -> Reply {
    Reply::Join(JoinReply {
        error,
        generation: -1,
        protocol_name: None,
        leader: String::new(),
        member_id: member_id.to_string(),
        members: Vec::new(),
        throttle_ms: 0,
    })
}

fn sync_error(error: i16) -> Reply {
    Reply::Sync(SyncReply {
        error,
        protocol_name: None,
        assignment: Bytes::new(),
    })
}

/// What DescribeGroups shows of a member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    /// The member's metadata for the group's chosen protocol.
    pub metadata: Bytes,
    pub assignment: Bytes,
    /// What it owned before the rebalance under way (its assignment when none is).
    pub owned: Bytes,
}

/// What DescribeGroups shows of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupView {
    pub state: GroupState,
    pub protocol_type: String,
    pub protocol: String,
    pub generation: i32,
    pub members: Vec<MemberView>,
}

impl GroupState {
    /// Kafka's name for the state, as DescribeGroups and ListGroups give it.
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
        }
    }
}

impl Group {
    pub fn new(id: impl Into<String>, config: GroupConfig) -> Group {
        Group {
            id: id.into(),
            config,
            state: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            statics: HashMap::new(),
            deadline: None,
            flaps: HashMap::new(),
            departed: HashMap::new(),
            next_member: 0,
            last_joined: None,
            initial_join: None,
        }
    }

    pub fn state(&self) -> GroupState {
        self.state
    }

    pub fn generation(&self) -> i32 {
        self.generation
    }

    pub fn leader(&self) -> Option<&str> {
        self.leader.as_deref()
    }

    pub fn protocol(&self) -> Option<&str> {
        self.protocol.as_deref()
    }

    pub fn member_ids(&self) -> Vec<String> {
        self.members.keys().cloned().collect()
    }

    /// The earliest time `tick` has something to do (a session or rebalance timeout).
    pub fn next_deadline(&self) -> Option<i64> {
        let sessions = self
            .members
            .values()
            .filter(|m| !m.awaiting_join)
            .map(|m| m.last_heartbeat_ms + m.session_timeout_ms);
        sessions.chain(self.deadline).min()
    }

    fn new_member_id(&mut self, client_id: &str) -> String {
        self.next_member += 1;
        format!("{client_id}-{}-{}", self.generation, self.next_member)
    }

    /// A JoinGroup request, like [`Group::join`], also saying which member id the request
    /// was taken in as (`None`: refused). Its reply is among the replies when it was
    /// answered at once; otherwise it comes with a later call.
    pub fn join_waiting(&mut self, j: Join, now: i64) -> (Option<String>, Replies) {
        self.last_joined = None;
        let replies = self.join(j, now);
        (self.last_joined.take(), replies)
    }

    /// A JoinGroup request. The replies may include this member's (at once) and, when this
    /// join completes the rebalance, every waiting member's.
    pub fn join(&mut self, j: Join, now: i64) -> Replies {
        let who = if j.member_id.is_empty() {
            j.instance_id.clone().unwrap_or_default()
        } else {
            j.member_id.clone()
        };
        if self.state == GroupState::Dead {
            return vec![(
                who,
                join_error(&j.member_id, codes::COORDINATOR_NOT_AVAILABLE),
            )];
        }
        if j.session_timeout_ms < self.config.min_session_timeout_ms
            || j.session_timeout_ms > self.config.max_session_timeout_ms
        {
            return vec![(
                who,
                join_error(&j.member_id, codes::INVALID_SESSION_TIMEOUT),
            )];
        }
        let compatible = match &self.protocol_type {
            _ if self.members.is_empty() => true,
            Some(t) => *t == j.protocol_type && self.supports_any(&j.protocols),
            None => true,
        };
        if !compatible || j.protocols.is_empty() {
            return vec![(
                who,
                join_error(&j.member_id, codes::INCONSISTENT_GROUP_PROTOCOL),
            )];
        }
        let key = join_client_key(&j);
        if let Some(f) = self.flaps.get(&key) {
            if now < f.banned_until {
                let mut reply = join_error(&j.member_id, codes::REBALANCE_IN_PROGRESS);
                if let Reply::Join(r) = &mut reply {
                    r.throttle_ms = f.banned_until - now;
                }
                return vec![(who, reply)];
            }
        }

        // A static member coming back (same instance id, new or same member id).
        if let Some(instance) = &j.instance_id {
            if let Some(old_id) = self.statics.get(instance).cloned() {
                if !j.member_id.is_empty() && j.member_id != old_id {
                    return vec![(
                        j.member_id.clone(),
                        join_error(&j.member_id, codes::FENCED_INSTANCE_ID),
                    )];
                }
                if j.member_id.is_empty() {
                    return self.replace_static_member(&old_id, j, now);
                }
            }
        }

        if j.member_id.is_empty() {
            if self.members.len() >= self.config.max_size {
                return vec![(who, join_error("", codes::GROUP_MAX_SIZE_REACHED))];
            }
            let id = self.new_member_id(&j.client_id);
            if j.require_known_member_id && j.instance_id.is_none() {
                // KIP-394: the member must come back with this id, so a lost answer does not
                // leave a ghost member behind.
                return vec![(id.clone(), join_error(&id, codes::MEMBER_ID_REQUIRED))];
            }
            return self.add_member(id, j, now);
        }
        match self.members.get(&j.member_id) {
            None => {
                // A known id from a member we no longer have (KIP-394's second join comes here).
                if j.require_known_member_id && j.instance_id.is_none() {
                    if self.members.len() >= self.config.max_size {
                        return vec![(
                            j.member_id.clone(),
                            join_error(&j.member_id, codes::GROUP_MAX_SIZE_REACHED),
                        )];
                    }
                    let id = j.member_id.clone();
                    return self.add_member(id, j, now);
                }
                vec![(
                    j.member_id.clone(),
                    join_error(&j.member_id, codes::UNKNOWN_MEMBER_ID),
                )]
            }
            Some(m) => {
                let unchanged = m.protocols == j.protocols;
                let id = j.member_id.clone();
                if self.state == GroupState::Stable
                    && unchanged
                    && self.leader.as_deref() != Some(id.as_str())
                {
                    // A follower re-joining with the same metadata: nothing to rebalance.
                    self.last_joined = Some(id.clone());
                    return vec![(id.clone(), Reply::Join(self.join_reply(&id)))];
                }
                self.update_member(&id, j, now);
                let mut replies = self.prepare_rebalance(now, Some(&id));
                replies.extend(self.maybe_complete_join(now));
                replies
            }
        }
    }

    fn supports_any(&self, protocols: &[(String, Bytes)]) -> bool {
        protocols.iter().any(|(name, _)| {
            self.members
                .values()
                .all(|m| m.protocols.iter().any(|(n, _)| n == name))
        })
    }

    fn add_member(&mut self, id: String, j: Join, now: i64) -> Replies {
        self.last_joined = Some(id.clone());
        if let Some(instance) = &j.instance_id {
            self.statics.insert(instance.clone(), id.clone());
        }
        if self.members.is_empty() {
            self.protocol_type = Some(j.protocol_type.clone());
        }
        if let Some(initial) = &mut self.initial_join {
            initial.member_added = true;
        }
        self.members.insert(
            id.clone(),
            Member {
                instance_id: j.instance_id,
                client_id: j.client_id,
                client_host: j.client_host,
                protocols: j.protocols,
                session_timeout_ms: j.session_timeout_ms,
                rebalance_timeout_ms: j.rebalance_timeout_ms,
                last_heartbeat_ms: now,
                awaiting_join: true,
                awaiting_sync: false,
                assignment: Bytes::new(),
                previous_assignment: Bytes::new(),
                changed: false,
            },
        );
        let mut replies = self.prepare_rebalance(now, Some(&id));
        replies.extend(self.maybe_complete_join(now));
        replies
    }

    fn update_member(&mut self, id: &str, j: Join, now: i64) {
        self.last_joined = Some(id.to_string());
        if let Some(m) = self.members.get_mut(id) {
            m.changed = m.protocols != j.protocols;
            m.protocols = j.protocols;
            m.session_timeout_ms = j.session_timeout_ms;
            m.rebalance_timeout_ms = j.rebalance_timeout_ms;
            m.last_heartbeat_ms = now;
            m.awaiting_join = true;
        }
    }

    /// A restarted static member takes over its old member's place. In a stable group with
    /// the same protocols it gets the current generation (and, at SyncGroup, its old
    /// assignment) without a rebalance.
    fn replace_static_member(&mut self, old_id: &str, j: Join, now: i64) -> Replies {
        let mut replies = Replies::new();
        let Some(mut m) = self.members.remove(old_id) else {
            let id = self.new_member_id(&j.client_id);
            return self.add_member(id, j, now);
        };
        // The old incarnation's pending requests are answered: it is fenced.
        if m.awaiting_join {
            replies.push((
                old_id.to_string(),
                join_error(old_id, codes::FENCED_INSTANCE_ID),
            ));
        }
        if m.awaiting_sync {
            replies.push((old_id.to_string(), sync_error(codes::FENCED_INSTANCE_ID)));
        }
        let new_id = self.new_member_id(&j.client_id);
        let unchanged = m.protocols == j.protocols;
        m.client_id = j.client_id.clone();
        m.client_host = j.client_host.clone();
        m.last_heartbeat_ms = now;
        m.awaiting_sync = false;
        if let Some(instance) = &j.instance_id {
            self.statics.insert(instance.clone(), new_id.clone());
        }
        if self.leader.as_deref() == Some(old_id) {
            self.leader = Some(new_id.clone());
        }
        self.members.insert(new_id.clone(), m);
        self.last_joined = Some(new_id.clone());
        if self.state == GroupState::Stable && unchanged {
            replies.push((new_id.clone(), Reply::Join(self.join_reply(&new_id))));
            return replies;
        }
        self.update_member(&new_id, j, now);
        replies.extend(self.prepare_rebalance(now, Some(&new_id)));
        replies.extend(self.maybe_complete_join(now));
        replies
    }

    /// Moves to PreparingRebalance (if not already), recording who forced it. Members
    /// waiting for an assignment that is now void are told to rejoin.
    fn prepare_rebalance(&mut self, now: i64, forced_by: Option<&str>) -> Replies {
        if self.state == GroupState::PreparingRebalance {
            return Replies::new();
        }
        // A rebalance counts against a client when it comes back soon after it left, or
        // rejoins with a changed subscription; a group growing counts against nobody.
        let window = self.config.flap_window_ms;
        if let Some(m) = forced_by.and_then(|id| self.members.get(id)) {
            let key = m.client_key();
            let returning = self.departed.get(&key).is_some_and(|t| now - t <= window);
            if m.changed || returning {
                self.record_flap(key, now);
            }
        }
        let mut replies = Replies::new();
        for (id, m) in self.members.iter_mut() {
            if m.awaiting_sync {
                m.awaiting_sync = false;
                replies.push((id.clone(), sync_error(codes::REBALANCE_IN_PROGRESS)));
            }
        }
        let delay = self.config.initial_rebalance_delay_ms;
        if self.state == GroupState::Empty && delay > 0 {
            let timeout = self.rebalance_deadline(now) - now;
            self.initial_join = Some(InitialJoin {
                remaining_ms: (timeout - delay).max(0),
                member_added: false,
            });
            self.deadline = Some(now + delay);
        } else {
            self.deadline = Some(self.rebalance_deadline(now));
        }
        self.state = GroupState::PreparingRebalance;
        replies
    }

    /// The initial delay is over at `now`: another round of it if members came meanwhile
    /// and the rebalance timeout leaves room, else the join completes with whoever joined.
    fn initial_delay_over(&mut self, initial: InitialJoin, now: i64) -> Replies {
        if initial.member_added && initial.remaining_ms > 0 {
            let delay = self
                .config
                .initial_rebalance_delay_ms
                .min(initial.remaining_ms);
            self.initial_join = Some(InitialJoin {
                remaining_ms: initial.remaining_ms - delay,
                member_added: false,
            });
            self.deadline = Some(now + delay);
            return Replies::new();
        }
        self.initial_join = None;
        self.complete_join(now)
    }

    /// When a rebalance phase started at `now` must end: the longest rebalance timeout of
    /// the members, as in Kafka.
    fn rebalance_deadline(&self, now: i64) -> i64 {
        let timeout = self
            .members
            .values()
            .map(|m| m.rebalance_timeout_ms)
            .max()
            .unwrap_or(0);
        now + timeout
    }

    fn record_flap(&mut self, key: String, now: i64) {
        let (window, max) = (
            self.config.flap_window_ms,
            self.config.max_rebalances_per_member,
        );
        if max == 0 {
            return; // not asked for
        }
        let (min_backoff, max_backoff) = (self.config.min_backoff_ms, self.config.max_backoff_ms);
        let f = self.flaps.entry(key).or_default();
        while f.at.front().is_some_and(|t| now - t > window) {
            f.at.pop_front();
        }
        f.at.push_back(now);
        if f.at.len() > max {
            f.backoff_ms = if f.backoff_ms == 0 {
                min_backoff
            } else {
                (f.backoff_ms * 2).min(max_backoff)
            };
            f.banned_until = now + f.backoff_ms;
            f.at.clear();
        }
    }

    /// Whether a member is being turned away (for tests and describe).
    pub fn backoff_of(&self, client_key: &str, now: i64) -> Option<i64> {
        self.flaps
            .get(client_key)
            .filter(|f| now < f.banned_until)
            .map(|f| f.banned_until - now)
    }

    /// Completes the join phase once every member has rejoined: new generation, protocol
    /// chosen, leader picked; every waiting member is answered.
    fn maybe_complete_join(&mut self, now: i64) -> Replies {
        if self.state != GroupState::PreparingRebalance
            || self.initial_join.is_some()
            || self.members.values().any(|m| !m.awaiting_join)
        {
            return Replies::new();
        }
        self.complete_join(now)
    }

    fn complete_join(&mut self, now: i64) -> Replies {
        // Members that did not rejoin in time are gone.
        let missing: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| !m.awaiting_join)
            .map(|(id, _)| id.clone())
            .collect();
        for id in missing {
            self.remove_member(&id, now);
        }
        if self.members.is_empty() {
            self.become_empty();
            return Replies::new();
        }
        self.generation += 1;
        self.protocol = self.choose_protocol();
        if self
            .leader
            .as_ref()
            .is_none_or(|l| !self.members.contains_key(l))
        {
            self.leader = self.members.keys().next().cloned();
        }
        self.state = GroupState::CompletingRebalance;
        self.deadline = Some(self.rebalance_deadline(now));
        let ids: Vec<String> = self.members.keys().cloned().collect();
        let mut replies = Replies::new();
        for id in ids {
            if let Some(m) = self.members.get_mut(&id) {
                m.awaiting_join = false;
                m.last_heartbeat_ms = now;
                if !m.assignment.is_empty() {
                    m.previous_assignment = std::mem::take(&mut m.assignment);
                }
            }
            replies.push((id.clone(), Reply::Join(self.join_reply(&id))));
        }
        replies
    }

    /// The protocol every member supports that ranks best over the members' preferences
    /// (the sum of positions), ties broken by name, as Kafka's vote does.
    fn choose_protocol(&self) -> Option<String> {
        let first = self.members.values().next()?;
        first
            .protocols
            .iter()
            .map(|(name, _)| name)
            .filter(|name| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(n, _)| n == *name))
            })
            .min_by_key(|name| {
                let rank: usize = self
                    .members
                    .values()
                    .map(|m| {
                        m.protocols
                            .iter()
                            .position(|(n, _)| n == *name)
                            .unwrap_or(0)
                    })
                    .sum();
                (rank, (*name).clone())
            })
            .cloned()
    }

    fn join_reply(&self, id: &str) -> JoinReply {
        let leader = self.leader.clone().unwrap_or_default();
        let protocol = self.protocol.clone();
        let members = if leader == id {
            self.members
                .iter()
                .map(|(mid, m)| JoinedMember {
                    member_id: mid.clone(),
                    instance_id: m.instance_id.clone(),
                    metadata: m
                        .protocols
                        .iter()
                        .find(|(n, _)| Some(n) == protocol.as_ref())
                        .map(|(_, md)| md.clone())
                        .unwrap_or_default(),
                })
                .collect()
        } else {
            Vec::new()
        };
        JoinReply {
            error: codes::NONE,
            generation: self.generation,
            protocol_name: protocol,
            leader,
            member_id: id.to_string(),
            members,
            throttle_ms: 0,
        }
    }

    /// A SyncGroup request. The leader's carries the assignment for every member.
    pub fn sync(
        &mut self,
        member_id: &str,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
        now: i64,
    ) -> Replies {
        let Some(m) = self.members.get_mut(member_id) else {
            return vec![(member_id.to_string(), sync_error(codes::UNKNOWN_MEMBER_ID))];
        };
        if generation != self.generation {
            return vec![(member_id.to_string(), sync_error(codes::ILLEGAL_GENERATION))];
        }
        m.last_heartbeat_ms = now;
        match self.state {
            GroupState::PreparingRebalance => {
                vec![(
                    member_id.to_string(),
                    sync_error(codes::REBALANCE_IN_PROGRESS),
                )]
            }
            GroupState::Stable => vec![(member_id.to_string(), self.sync_reply(member_id))],
            GroupState::Empty | GroupState::Dead => {
                vec![(member_id.to_string(), sync_error(codes::UNKNOWN_MEMBER_ID))]
            }
            GroupState::CompletingRebalance => {
                m.awaiting_sync = true;
                if self.leader.as_deref() != Some(member_id) {
                    return Replies::new();
                }
                for (id, assignment) in assignments {
                    if let Some(target) = self.members.get_mut(&id) {
                        target.assignment = assignment;
                    }
                }
                self.state = GroupState::Stable;
                self.deadline = None;
                let waiting: Vec<String> = self
                    .members
                    .iter()
                    .filter(|(_, m)| m.awaiting_sync)
                    .map(|(id, _)| id.clone())
                    .collect();
                waiting
                    .into_iter()
                    .map(|id| {
                        if let Some(m) = self.members.get_mut(&id) {
                            m.awaiting_sync = false;
                        }
                        let reply = self.sync_reply(&id);
                        (id, reply)
                    })
                    .collect()
            }
        }
    }

    fn sync_reply(&self, id: &str) -> Reply {
        Reply::Sync(SyncReply {
            error: codes::NONE,
            protocol_name: self.protocol.clone(),
            assignment: self
                .members
                .get(id)
                .map(|m| m.assignment.clone())
                .unwrap_or_default(),
        })
    }

    /// A Heartbeat: keeps the member's session; tells it to rejoin during a rebalance.
    pub fn heartbeat(&mut self, member_id: &str, generation: i32, now: i64) -> i16 {
        let state = self.state;
        let Some(m) = self.members.get_mut(member_id) else {
            return codes::UNKNOWN_MEMBER_ID;
        };
        m.last_heartbeat_ms = now;
        match state {
            GroupState::PreparingRebalance => codes::REBALANCE_IN_PROGRESS,
            _ if generation != self.generation => codes::ILLEGAL_GENERATION,
            // Members heartbeat while they wait for the assignment (as Kafka's do).
            _ => codes::NONE,
        }
    }

    /// A LeaveGroup for one member (by member id, or by instance id for static members).
    pub fn leave(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        now: i64,
    ) -> (i16, Replies) {
        let id = match instance_id.and_then(|i| self.statics.get(i)) {
            Some(current) if member_id.is_empty() || member_id == current => current.clone(),
            Some(_) => return (codes::FENCED_INSTANCE_ID, Replies::new()),
            None => member_id.to_string(),
        };
        if !self.members.contains_key(&id) {
            return (codes::UNKNOWN_MEMBER_ID, Replies::new());
        }
        let mut replies = self.answer_pending(&id, codes::UNKNOWN_MEMBER_ID);
        self.remove_member(&id, now);
        replies.extend(self.after_removal(now));
        (codes::NONE, replies)
    }

    /// Fires the timeouts due at `now`: expired sessions leave; a rebalance whose members
    /// did not all rejoin completes with those that did; a leader that never sent the
    /// assignment makes the group rebalance again.
    pub fn tick(&mut self, now: i64) -> Replies {
        let mut replies = Replies::new();
        let expired: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| !m.awaiting_join && now >= m.last_heartbeat_ms + m.session_timeout_ms)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            replies.extend(self.answer_pending(id, codes::UNKNOWN_MEMBER_ID));
            self.remove_member(id, now);
        }
        if !expired.is_empty() {
            replies.extend(self.after_removal(now));
        }
        if self.deadline.is_some_and(|d| now >= d) {
            match self.state {
                GroupState::PreparingRebalance => match self.initial_join {
                    Some(initial) => replies.extend(self.initial_delay_over(initial, now)),
                    None => replies.extend(self.complete_join(now)),
                },
                GroupState::CompletingRebalance => {
                    // The leader never synced: members that did not sync are dropped and the
                    // rest rebalance again.
                    let unsynced: Vec<String> = self
                        .members
                        .iter()
                        .filter(|(_, m)| !m.awaiting_sync)
                        .map(|(id, _)| id.clone())
                        .collect();
                    for id in unsynced {
                        self.remove_member(&id, now);
                    }
                    self.leader = None;
                    if self.members.is_empty() {
                        self.become_empty();
                    } else {
                        // The members that synced are told to rejoin.
                        replies.extend(self.prepare_rebalance(now, None));
                    }
                }
                _ => self.deadline = None,
            }
        }
        replies
    }

    /// Replies that end a removed member's pending requests.
    fn answer_pending(&self, id: &str, error: i16) -> Replies {
        let mut replies = Replies::new();
        if let Some(m) = self.members.get(id) {
            if m.awaiting_join {
                replies.push((id.to_string(), join_error(id, error)));
            }
            if m.awaiting_sync {
                replies.push((id.to_string(), sync_error(error)));
            }
        }
        replies
    }

    fn remove_member(&mut self, id: &str, now: i64) {
        if let Some(m) = self.members.remove(id) {
            self.departed.insert(m.client_key(), now);
            if let Some(instance) = m.instance_id {
                if self.statics.get(&instance).map(String::as_str) == Some(id) {
                    self.statics.remove(&instance);
                }
            }
        }
        if self.leader.as_deref() == Some(id) {
            self.leader = None;
        }
    }

    fn after_removal(&mut self, now: i64) -> Replies {
        if self.members.is_empty() {
            self.become_empty();
            return Replies::new();
        }
        match self.state {
            GroupState::Stable | GroupState::CompletingRebalance => {
                self.prepare_rebalance(now, None)
            }
            GroupState::PreparingRebalance => self.maybe_complete_join(now),
            _ => Replies::new(),
        }
    }

    /// The protocol type stays, as in Kafka: an empty consumer group with offsets is still a
    /// "consumer" group to ListGroups and DescribeGroups (a new first member sets it anew).
    fn become_empty(&mut self) {
        self.state = GroupState::Empty;
        self.deadline = None;
        self.initial_join = None;
        self.leader = None;
        self.protocol = None;
    }

    /// The completed generation, as persisted in `__consumer_offsets` once the group is
    /// stable.
    pub fn stored(&self, now: i64) -> super::records::StoredGroup {
        super::records::StoredGroup {
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            generation: self.generation,
            protocol: self.protocol.clone(),
            leader: self.leader.clone(),
            state_timestamp: now,
            members: self
                .members
                .iter()
                .map(|(id, m)| super::records::StoredMember {
                    member_id: id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout_ms as i32,
                    session_timeout_ms: m.session_timeout_ms as i32,
                    subscription: self.chosen_metadata(m),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        }
    }

    /// A group as a new coordinator finds it in `__consumer_offsets`: stable at its last
    /// generation, every member's session starting now (they keep heartbeating to the new
    /// coordinator and nothing rebalances).
    pub fn restore(
        id: impl Into<String>,
        config: GroupConfig,
        stored: &super::records::StoredGroup,
        now: i64,
    ) -> Group {
        let mut g = Group::new(id, config);
        g.generation = stored.generation;
        if stored.members.is_empty() {
            return g;
        }
        g.protocol_type = Some(stored.protocol_type.clone());
        g.protocol = stored.protocol.clone();
        g.leader = stored.leader.clone();
        g.state = GroupState::Stable;
        for m in &stored.members {
            if let Some(i) = &m.instance_id {
                g.statics.insert(i.clone(), m.member_id.clone());
            }
            g.members.insert(
                m.member_id.clone(),
                Member {
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    protocols: vec![(
                        stored.protocol.clone().unwrap_or_default(),
                        m.subscription.clone(),
                    )],
                    session_timeout_ms: i64::from(m.session_timeout_ms),
                    rebalance_timeout_ms: i64::from(m.rebalance_timeout_ms),
                    last_heartbeat_ms: now,
                    awaiting_join: false,
                    awaiting_sync: false,
                    assignment: m.assignment.clone(),
                    previous_assignment: Bytes::new(),
                    changed: false,
                },
            );
        }
        g
    }

    /// Whether the group's members speak Kafka's consumer protocol (so the group can be
    /// upgraded to KIP-848's).
    pub fn uses_consumer_protocol(&self) -> bool {
        self.protocol_type.as_deref() == Some("consumer")
    }

    /// The members as the consumer protocol takes them over (online upgrade): each with
    /// what it owns now (its assignment, or during a rebalance the one before).
    pub fn upgrade_members(&self) -> Vec<(super::consumer::ClassicJoin, Vec<(String, i32)>)> {
        use strata_client::groups::assigned_partitions;
        self.members
            .iter()
            .map(|(id, m)| {
                let mut owned = assigned_partitions(&m.assignment).unwrap_or_default();
                owned.extend(assigned_partitions(&m.previous_assignment).unwrap_or_default());
                owned.sort();
                owned.dedup();
                let join = super::consumer::ClassicJoin {
                    member_id: id.clone(),
                    instance_id: m.instance_id.clone(),
                    client: super::consumer::Client {
                        id: m.client_id.clone(),
                        host: m.client_host.clone(),
                    },
                    session_timeout_ms: m.session_timeout_ms,
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    protocols: m.protocols.clone(),
                };
                (join, owned)
            })
            .collect()
    }

    /// Starts a rebalance now (a group just downgraded from the consumer protocol: its
    /// members rejoin and the leader assigns).
    pub fn rebalance(&mut self, now: i64) -> Replies {
        match self.state {
            GroupState::Stable | GroupState::CompletingRebalance => {
                self.prepare_rebalance(now, None)
            }
            _ => Replies::new(),
        }
    }

    /// Whether a request naming static instance `instance` comes from a member id that is
    /// not that instance's current one: an old incarnation, fenced (FENCED_INSTANCE_ID).
    pub fn is_fenced(&self, member: &str, instance: Option<&str>) -> bool {
        instance
            .and_then(|i| self.statics.get(i))
            .is_some_and(|current| current != member)
    }

    /// Whether `member` may commit offsets of these partitions: each must be in its
    /// assignment of this generation or of the one before (a cooperative member commits the
    /// partitions it gives up after it got its new assignment). `None` when the group does
    /// not use Kafka's consumer protocol, so assignments cannot be read.
    pub fn may_commit(&self, member: &str, partitions: &[(String, i32)]) -> Option<bool> {
        if self.protocol_type.as_deref() != Some("consumer") {
            return None;
        }
        let m = self.members.get(member)?;
        use strata_client::groups::assigned_partitions;
        let mut owned: std::collections::HashSet<(String, i32)> =
            assigned_partitions(&m.assignment)?.into_iter().collect();
        owned.extend(assigned_partitions(&m.previous_assignment).unwrap_or_default());
        Some(partitions.iter().all(|p| owned.contains(p)))
    }

    /// The topics the members subscribe to; `None` when the group does not use Kafka's
    /// consumer protocol or a member's subscription cannot be read (OffsetDelete then
    /// treats the group as a whole as in use).
    pub fn subscribed_topics(&self) -> Option<std::collections::BTreeSet<String>> {
        if self.protocol_type.as_deref() != Some("consumer") {
            return None;
        }
        let mut topics = std::collections::BTreeSet::new();
        for m in self.members.values() {
            // every protocol a consumer offers carries the same subscription
            let (_, metadata) = m.protocols.first()?;
            topics.extend(strata_client::groups::subscription_topics(metadata)?);
        }
        Some(topics)
    }

    /// A member's metadata for the group's chosen protocol.
    fn chosen_metadata(&self, m: &Member) -> Bytes {
        m.protocols
            .iter()
            .find(|(n, _)| Some(n) == self.protocol.as_ref())
            .map(|(_, md)| md.clone())
            .unwrap_or_default()
    }

    /// The group as DescribeGroups shows it.
    pub fn view(&self) -> GroupView {
        GroupView {
            state: self.state,
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            protocol: self.protocol.clone().unwrap_or_default(),
            generation: self.generation,
            members: self
                .members
                .iter()
                .map(|(id, m)| MemberView {
                    member_id: id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    metadata: self.chosen_metadata(m),
                    assignment: m.assignment.clone(),
                    owned: if m.assignment.is_empty() {
                        m.previous_assignment.clone()
                    } else {
                        m.assignment.clone()
                    },
                })
                .collect(),
        }
    }

    /// The group is deleted or its coordinator moved: pending requests are answered and
    /// nothing more is accepted.
    pub fn kill(&mut self) -> Replies {
        let ids: Vec<String> = self.members.keys().cloned().collect();
        let replies = ids
            .iter()
            .flat_map(|id| self.answer_pending(id, codes::COORDINATOR_NOT_AVAILABLE))
            .collect();
        self.members.clear();
        self.statics.clear();
        self.state = GroupState::Dead;
        self.deadline = None;
        replies
    }
}

#[cfg(test)]
mod tests;
