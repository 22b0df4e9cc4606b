//! The cluster metadata and the commands that change it: the state machine behind the
//! metadata log.
//!
//! Pure logic with no I/O and no clock: every controller replica applies the same commands
//! in log order and reaches the same state, including the same placement and leader
//! elections. A command that cannot apply (a stale epoch, a topic that exists with another
//! spec) is refused deterministically and changes nothing; the refusal is the entry's answer.

pub mod acl;
pub mod dynamic;
pub mod leases;
pub mod placement;
pub mod quota;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use placement::{Candidate, PlacementError};

pub type BrokerId = i32;

/// Topic config that lets a replica outside the ISR become leader (may lose acked data).
pub const UNCLEAN_ELECTION_CONFIG: &str = "unclean.leader.election.enable";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// Listener name, e.g. "kafka" or "grpc".
    pub name: String,
    pub host: String,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerRecord {
    pub id: BrokerId,
    /// Changes every time the broker process starts.
    pub incarnation: Uuid,
    /// The metadata version at which this incarnation registered; requests carrying an older
    /// epoch come from a previous incarnation and are refused.
    pub epoch: u64,
    pub endpoints: Vec<Endpoint>,
    pub rack: Option<String>,
    pub fenced: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRecord {
    /// Replica order; the first is the preferred leader.
    pub replicas: Vec<BrokerId>,
    pub isr: Vec<BrokerId>,
    /// `None` while the partition is offline (no eligible replica is alive).
    pub leader: Option<BrokerId>,
    /// Bumped at every leader change.
    pub leader_epoch: i32,
    /// Bumped at every change of this record (leader or ISR): the CAS token for ISR changes.
    pub partition_epoch: i32,
    /// A move to other replicas in progress (Kafka's AlterPartitionReassignments). While it
    /// lasts, `replicas` is the target followed by the original replicas leaving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reassignment: Option<Reassignment>,
}

/// A partition moving to new replicas. The new ones follow the leader and join the ISR as
/// they catch up; once every target replica is in the ISR the move completes: `replicas`
/// becomes the target, the leaving replicas drop out (and delete their copies), and a
/// leader not in the target hands over to one that is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reassignment {
    /// The replicas it moves to, in preference order.
    pub target: Vec<BrokerId>,
    /// The replicas it had when the move began; a cancellation returns to them.
    pub original: Vec<BrokerId>,
    /// Bytes per second each joining replica may copy at; `None`: as fast as it can.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttle: Option<u64>,
}

impl Reassignment {
    /// Replicas the move adds.
    pub fn adding(&self) -> Vec<BrokerId> {
        self.target
            .iter()
            .copied()
            .filter(|b| !self.original.contains(b))
            .collect()
    }

    /// Replicas the move removes.
    pub fn removing(&self) -> Vec<BrokerId> {
        self.original
            .iter()
            .copied()
            .filter(|b| !self.target.contains(b))
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicRecord {
    pub name: String,
    pub id: Uuid,
    pub replication_factor: u16,
    pub configs: BTreeMap<String, String>,
    pub partitions: Vec<PartitionRecord>,
}

impl TopicRecord {
    fn unclean_election(&self) -> bool {
        self.configs
            .get(UNCLEAN_ELECTION_CONFIG)
            .is_some_and(|v| v == "true")
    }
}

/// Everything the metadata log describes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMetadata {
    /// Index of the last applied metadata log entry: lets a reader tell a stale view.
    pub version: u64,
    pub brokers: BTreeMap<BrokerId, BrokerRecord>,
    pub topics: BTreeMap<String, TopicRecord>,
    /// Next producer id no block has handed out.
    pub next_producer_id: i64,
    /// Rotates where new topics put their first leader, so leaders spread across topics.
    pub placement_cursor: u64,
    /// SCRAM credentials by user and mechanism (RFC 5802 stored and server keys: never a
    /// password). Absent from metadata written before credentials existed.
    #[serde(default)]
    pub scram_credentials: BTreeMap<String, BTreeMap<ScramMechanism, ScramCredential>>,
    /// A secret only the metadata holds: the key from which brokers derive the stand-in
    /// credential of a user that does not exist, so that its salt and iterations stay the
    /// same from one login to the next and cannot be told from a real user's. Taken from
    /// the server key of the first credential the log stored, and kept when that one is
    /// deleted. Absent from metadata written before it existed ([`Self::scram_mock_key`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scram_mock_secret: Option<Vec<u8>>,
    /// Access control lists (Kafka's model, [`acl`]).
    #[serde(default)]
    pub acls: std::collections::BTreeSet<acl::AclBinding>,
    /// Client quotas (Kafka's model, [`quota`]).
    #[serde(default, skip_serializing_if = "quota::ClientQuotas::is_empty")]
    pub client_quotas: quota::ClientQuotas,
    /// Dynamic broker and group configs (Kafka's BROKER and GROUP config resources).
    #[serde(default, skip_serializing_if = "dynamic::DynamicConfigs::is_empty")]
    pub dynamic_configs: dynamic::DynamicConfigs,
}

impl ClusterMetadata {
    /// The key unknown users' stand-in SCRAM credentials are derived from: the stored
    /// secret, or, in metadata written before it existed, the server key of the first
    /// user's first credential (it changes only when that credential does). Empty while no
    /// credential exists: there is then no user to tell apart.
    pub fn scram_mock_key(&self) -> &[u8] {
        match &self.scram_mock_secret {
            Some(secret) => secret,
            None => self
                .scram_credentials
                .values()
                .flat_map(|of_user| of_user.values())
                .next()
                .map_or(&[], |c| &c.server_key),
        }
    }
}

/// A SCRAM mechanism, by its SASL name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ScramMechanism {
    #[serde(rename = "SCRAM-SHA-256")]
    Sha256,
    #[serde(rename = "SCRAM-SHA-512")]
    Sha512,
}

impl ScramMechanism {
    pub const ALL: [ScramMechanism; 2] = [ScramMechanism::Sha256, ScramMechanism::Sha512];

    pub fn name(self) -> &'static str {
        match self {
            ScramMechanism::Sha256 => "SCRAM-SHA-256",
            ScramMechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    pub fn from_name(name: &str) -> Option<ScramMechanism> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Kafka's mechanism number (DescribeUserScramCredentials, AlterUserScramCredentials).
    pub fn kafka_type(self) -> i8 {
        match self {
            ScramMechanism::Sha256 => 1,
            ScramMechanism::Sha512 => 2,
        }
    }
}

/// What a server keeps of a SCRAM password (RFC 5802 section 3): enough to verify a client
/// and prove itself, not enough to log in as the user.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScramCredential {
    pub salt: Vec<u8>,
    pub iterations: u32,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
}

impl std::fmt::Debug for ScramCredential {
    // Keys stay out of logs and error messages.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramCredential")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

/// Fewest PBKDF2 iterations a SCRAM credential may use (Kafka's minimum).
pub const MIN_SCRAM_ITERATIONS: u32 = 4096;
/// Most iterations (Kafka's maximum): each login costs this many HMACs.
pub const MAX_SCRAM_ITERATIONS: u32 = 16384;

/// A change to the metadata: one metadata log entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    RegisterBroker {
        id: BrokerId,
        incarnation: Uuid,
        endpoints: Vec<Endpoint>,
        rack: Option<String>,
    },
    /// The lease expired or the broker shut down: move its leaderships away.
    FenceBroker {
        id: BrokerId,
        epoch: u64,
    },
    UnfenceBroker {
        id: BrokerId,
        epoch: u64,
    },
    CreateTopic {
        name: String,
        id: Uuid,
        partitions: u32,
        replication_factor: u16,
        configs: BTreeMap<String, String>,
        /// Each partition's replicas (the first leads); empty: placed here. Left out of the
        /// entry when empty, so entries without it read as before.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        assignments: Vec<Vec<BrokerId>>,
    },
    DeleteTopic {
        name: String,
    },
    AlterTopicConfigs {
        name: String,
        set: BTreeMap<String, String>,
        remove: Vec<String>,
    },
    CreatePartitions {
        name: String,
        total: u32,
        /// The new partitions' replicas (the first leads); empty: placed here. Left out of
        /// the entry when empty, so entries without it read as before.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        assignments: Vec<Vec<BrokerId>>,
    },
    /// Kafka's ElectLeaders for one partition. Preferred: leadership moves to the first
    /// replica if it is alive and in the ISR. Unclean: a partition without a leader takes
    /// the first live replica, in the ISR or not (its ISR becomes that replica alone).
    ElectLeader {
        topic: String,
        partition: u32,
        unclean: bool,
    },
    /// A leader's ISR change, applied only if the partition epoch still matches (CAS).
    AlterIsr {
        topic: String,
        partition: u32,
        leader: BrokerId,
        leader_epoch: i32,
        partition_epoch: i32,
        isr: Vec<BrokerId>,
        /// The members added, each with the broker epoch that caught up (KIP-903): refused if
        /// that broker has registered again since. Absent in entries of older leaders.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        joining: Vec<(BrokerId, u64)>,
    },
    AllocateProducerIds {
        broker: BrokerId,
        epoch: u64,
        count: u32,
    },
    /// Kafka's AlterPartitionReassignments for one partition: move it to `target` (which
    /// replaces a move in progress), or, with `None`, cancel the move in progress and return
    /// to the original replicas.
    ReassignPartition {
        topic: String,
        partition: u32,
        target: Option<Vec<BrokerId>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        throttle: Option<u64>,
    },
    /// Creates or replaces a user's credential for one mechanism.
    UpsertScramCredential {
        user: String,
        mechanism: ScramMechanism,
        credential: ScramCredential,
    },
    DeleteScramCredential {
        user: String,
        mechanism: ScramMechanism,
    },
    /// Adds bindings (all or none: one invalid binding refuses the command).
    CreateAcls {
        acls: Vec<acl::AclBinding>,
    },
    /// Removes every binding any filter matches.
    DeleteAcls {
        filters: Vec<acl::AclFilter>,
    },
    /// Sets and removes client quotas (all or none).
    AlterClientQuotas {
        alterations: Vec<quota::QuotaAlteration>,
    },
    /// Removes, then sets, dynamic configs of a broker, of every broker (the cluster-wide
    /// default) or of a group; refused whole if the layer it leaves is invalid.
    AlterDynamicConfigs {
        scope: dynamic::ConfigScope,
        set: BTreeMap<String, String>,
        remove: Vec<String>,
    },
}

/// What an applied command answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Applied {
    BrokerRegistered {
        epoch: u64,
    },
    /// `created` is false when an identical topic already existed (a no-op).
    TopicCreated {
        id: Uuid,
        created: bool,
    },
    PartitionUpdated {
        leader_epoch: i32,
        partition_epoch: i32,
    },
    ProducerIds {
        first: i64,
        count: u32,
    },
    /// The bindings a DeleteAcls removed.
    AclsDeleted(Vec<acl::AclBinding>),
    Done,
}

/// Why a command was refused. Deterministic: every replica refuses the same entries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum MetadataError {
    #[error("topic '{name}' already exists with {partitions} partitions and replication factor {rf}; refusing a different spec")]
    TopicExists {
        name: String,
        partitions: u32,
        rf: u16,
    },
    #[error("topic '{0}' does not exist")]
    UnknownTopic(String),
    #[error("topic '{topic}' has no partition {partition}")]
    UnknownPartition { topic: String, partition: u32 },
    #[error("{0}")]
    InvalidPartitions(String),
    #[error("{0}")]
    InvalidReplicationFactor(String),
    #[error("{0}")]
    InvalidReplicaAssignment(String),
    #[error("broker {0} is not registered")]
    UnknownBroker(BrokerId),
    #[error("broker {id} epoch {got} is stale (current {current})")]
    StaleBrokerEpoch {
        id: BrokerId,
        current: u64,
        got: u64,
    },
    #[error("partition epoch {got} is stale (current {current})")]
    StalePartitionEpoch { current: i32, got: i32 },
    #[error("broker {broker} at leader epoch {leader_epoch} is not the leader")]
    NotLeader { broker: BrokerId, leader_epoch: i32 },
    #[error("invalid ISR {isr:?}: {reason}")]
    InvalidIsr { isr: Vec<BrokerId>, reason: String },
    #[error("user '{user}' has no {mechanism} credential")]
    UnknownScramCredential { user: String, mechanism: String },
    #[error("invalid SCRAM credential: {0}")]
    InvalidScramCredential(String),
    #[error("invalid ACL: {0}")]
    InvalidAcl(String),
    #[error("invalid client quota: {0}")]
    InvalidQuota(String),
    #[error("{0}")]
    InvalidConfig(String),
    #[error("{0}")]
    InvalidRequest(String),
    /// ElectLeaders: the partition already has the leader asked for.
    #[error("{topic}-{partition}: {reason}")]
    ElectionNotNeeded {
        topic: String,
        partition: u32,
        reason: String,
    },
    /// ElectLeaders (preferred): the first replica is fenced or out of the ISR.
    #[error("{topic}-{partition}: the preferred leader {preferred} is {reason}")]
    PreferredLeaderNotAvailable {
        topic: String,
        partition: u32,
        preferred: BrokerId,
        reason: String,
    },
    /// ElectLeaders (unclean): no replica is alive.
    #[error("{topic}-{partition}: no replica is alive to lead it")]
    EligibleLeadersNotAvailable { topic: String, partition: u32 },
    /// A cancellation of a reassignment that is not happening.
    #[error("{topic}-{partition} is not being reassigned")]
    NoReassignmentInProgress { topic: String, partition: u32 },
}

/// The most replicas a partition may be moved to.
pub const MAX_REPLICAS: usize = 64;

/// The most producer ids one command may reserve (brokers ask for 1,000 at a time).
pub const MAX_PRODUCER_ID_BLOCK: u32 = 1_000_000;

impl Command {
    /// The checks that need no metadata state: bounds on every number that sizes something,
    /// names, and topic configs (the brokers' own rules, from strata-core). The controller
    /// runs them before it proposes a command, and `apply` runs them again, so an entry that
    /// got into the log anyway (an older version, a forged entry) is refused the same way on
    /// every replica instead of being applied.
    pub fn validate(&self) -> Result<(), MetadataError> {
        use strata_core::topic::MAX_PARTITIONS;
        match self {
            Command::CreateTopic {
                name,
                partitions,
                replication_factor,
                configs,
                assignments,
                ..
            } => {
                check_assignments(name, assignments, Some(*replication_factor))?;
                if !assignments.is_empty() && assignments.len() as u32 != *partitions {
                    return Err(MetadataError::InvalidReplicaAssignment(format!(
                        "topic '{name}': {} assignments for {partitions} partitions",
                        assignments.len()
                    )));
                }
                strata_core::topic::validate_topic_name(name)
                    .map_err(MetadataError::InvalidRequest)?;
                if *partitions == 0 || *partitions > MAX_PARTITIONS {
                    return Err(MetadataError::InvalidPartitions(format!(
                        "partition count {partitions} is invalid; it must be between 1 and {MAX_PARTITIONS}"
                    )));
                }
                if *replication_factor == 0 {
                    return Err(MetadataError::InvalidReplicationFactor(
                        "replication factor must be at least 1".into(),
                    ));
                }
                check_topic_configs(name, configs)
            }
            Command::CreatePartitions { name, total, .. } if *total > MAX_PARTITIONS => {
                Err(MetadataError::InvalidPartitions(format!(
                    "topic '{name}': {total} partitions is more than the limit of {MAX_PARTITIONS}"
                )))
            }
            Command::CreatePartitions {
                name, assignments, ..
            } => check_assignments(name, assignments, None),
            Command::AlterTopicConfigs { name, set, .. } => check_topic_configs(name, set),
            Command::AlterDynamicConfigs { scope, set, .. } => {
                dynamic::DynamicConfigs::check_change(scope, set)
            }
            Command::AlterClientQuotas { alterations } => alterations
                .iter()
                .try_for_each(|a| a.validate())
                .map_err(MetadataError::InvalidQuota),
            Command::ReassignPartition {
                topic,
                target: Some(target),
                throttle,
                ..
            } => {
                check_assignments(topic, std::slice::from_ref(target), None)?;
                if target.len() > MAX_REPLICAS {
                    return Err(MetadataError::InvalidReplicaAssignment(format!(
                        "topic '{topic}': {} replicas; at most {MAX_REPLICAS}",
                        target.len()
                    )));
                }
                if *throttle == Some(0) {
                    return Err(MetadataError::InvalidRequest(
                        "a reassignment throttle of 0 bytes per second would never finish".into(),
                    ));
                }
                Ok(())
            }
            Command::AllocateProducerIds { count, .. }
                if *count == 0 || *count > MAX_PRODUCER_ID_BLOCK =>
            {
                Err(MetadataError::InvalidRequest(format!(
                    "cannot reserve {count} producer ids at once; between 1 and {MAX_PRODUCER_ID_BLOCK}"
                )))
            }
            _ => Ok(()),
        }
    }
}

/// A topic's configs under the rules every broker applies when it opens the topic.
fn check_topic_configs(
    topic: &str,
    configs: &BTreeMap<String, String>,
) -> Result<(), MetadataError> {
    strata_core::topic_config::LogConfig::from_map(configs)
        .map(|_| ())
        .map_err(|e| MetadataError::InvalidConfig(format!("topic '{topic}': {e}")))
}

impl From<PlacementError> for MetadataError {
    fn from(e: PlacementError) -> Self {
        MetadataError::InvalidReplicationFactor(e.to_string())
    }
}

/// A credential every replica accepts the same way: a usable user name, iterations in
/// Kafka's range, and keys of the mechanism's hash length.
fn check_scram_credential(
    user: &str,
    mechanism: ScramMechanism,
    c: &ScramCredential,
) -> Result<(), MetadataError> {
    let bad = |why: String| Err(MetadataError::InvalidScramCredential(why));
    if user.is_empty() || user.len() > 256 || user.chars().any(char::is_control) {
        return bad("a user name has 1 to 256 characters and no control characters".into());
    }
    if !(MIN_SCRAM_ITERATIONS..=MAX_SCRAM_ITERATIONS).contains(&c.iterations) {
        return bad(format!(
            "iterations must be between {MIN_SCRAM_ITERATIONS} and {MAX_SCRAM_ITERATIONS}, not {}",
            c.iterations
        ));
    }
    let len = match mechanism {
        ScramMechanism::Sha256 => 32,
        ScramMechanism::Sha512 => 64,
    };
    if c.stored_key.len() != len || c.server_key.len() != len {
        return bad(format!("{} keys are {len} bytes", mechanism.name()));
    }
    if c.salt.len() < 16 || c.salt.len() > 1024 {
        return bad("the salt must be 16 to 1024 bytes".into());
    }
    Ok(())
}

/// Picks a leader: the first replica (in preference order) that is in the ISR and alive;
/// with unclean election, the first live replica at all.
fn elect(
    p: &PartitionRecord,
    alive: &dyn Fn(BrokerId) -> bool,
    unclean: bool,
) -> Option<(BrokerId, bool)> {
    p.replicas
        .iter()
        .copied()
        .find(|r| p.isr.contains(r) && alive(*r))
        .map(|r| (r, false))
        .or_else(|| {
            unclean
                .then(|| {
                    p.replicas
                        .iter()
                        .copied()
                        .find(|r| alive(*r))
                        .map(|r| (r, true))
                })
                .flatten()
        })
}

impl ClusterMetadata {
    /// Ids of the brokers that are not fenced.
    fn alive_ids(&self) -> Vec<BrokerId> {
        self.brokers
            .values()
            .filter(|b| !b.fenced)
            .map(|b| b.id)
            .collect()
    }

    /// Brokers that can take new replicas.
    pub fn live_brokers(&self) -> Vec<&BrokerRecord> {
        self.brokers.values().filter(|b| !b.fenced).collect()
    }

    /// (topic, partition) pairs with no leader.
    pub fn offline_partitions(&self) -> Vec<(String, u32)> {
        self.topics
            .values()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.leader.is_none())
                    .map(|(i, _)| (t.name.clone(), i as u32))
            })
            .collect()
    }

    fn check_broker_epoch(&self, id: BrokerId, epoch: u64) -> Result<(), MetadataError> {
        let b = self
            .brokers
            .get(&id)
            .ok_or(MetadataError::UnknownBroker(id))?;
        if b.epoch != epoch {
            return Err(MetadataError::StaleBrokerEpoch {
                id,
                current: b.epoch,
                got: epoch,
            });
        }
        Ok(())
    }

    /// Applies the command of log entry `index`. On error nothing changes but the version.
    pub fn apply(&mut self, index: u64, cmd: &Command) -> Result<Applied, MetadataError> {
        self.version = index;
        cmd.validate()?;
        match cmd {
            Command::RegisterBroker {
                id,
                incarnation,
                endpoints,
                rack,
            } => {
                // A new incarnation replaces the old one: its leaderships get a new epoch.
                if self
                    .brokers
                    .get(id)
                    .is_some_and(|b| !b.fenced && b.incarnation != *incarnation)
                {
                    self.fence(*id);
                }
                self.brokers.insert(
                    *id,
                    BrokerRecord {
                        id: *id,
                        incarnation: *incarnation,
                        epoch: index,
                        endpoints: endpoints.clone(),
                        rack: rack.clone(),
                        fenced: false,
                    },
                );
                self.elect_offline();
                Ok(Applied::BrokerRegistered { epoch: index })
            }
            Command::FenceBroker { id, epoch } => {
                self.check_broker_epoch(*id, *epoch)?;
                self.fence(*id);
                Ok(Applied::Done)
            }
            Command::UnfenceBroker { id, epoch } => {
                self.check_broker_epoch(*id, *epoch)?;
                if let Some(b) = self.brokers.get_mut(id) {
                    b.fenced = false;
                }
                self.elect_offline();
                Ok(Applied::Done)
            }
            Command::CreateTopic {
                name,
                id,
                partitions,
                replication_factor,
                configs,
                assignments,
            } => {
                if let Some(t) = self.topics.get(name) {
                    if t.partitions.len() as u32 == *partitions
                        && t.replication_factor == *replication_factor
                    {
                        return Ok(Applied::TopicCreated {
                            id: t.id,
                            created: false,
                        });
                    }
                    return Err(MetadataError::TopicExists {
                        name: name.clone(),
                        partitions: t.partitions.len() as u32,
                        rf: t.replication_factor,
                    });
                }
                if *partitions == 0 {
                    return Err(MetadataError::InvalidPartitions(
                        "a topic needs at least one partition".into(),
                    ));
                }
                let assignment = if assignments.is_empty() {
                    placement::assign(
                        &self.candidates(),
                        0,
                        *partitions,
                        *replication_factor as usize,
                        self.placement_cursor as usize,
                    )?
                } else {
                    self.check_registered(name, assignments)?;
                    assignments.clone()
                };
                self.placement_cursor += 1;
                let partitions = assignment.into_iter().map(new_partition).collect();
                self.topics.insert(
                    name.clone(),
                    TopicRecord {
                        name: name.clone(),
                        id: *id,
                        replication_factor: *replication_factor,
                        configs: configs.clone(),
                        partitions,
                    },
                );
                Ok(Applied::TopicCreated {
                    id: *id,
                    created: true,
                })
            }
            Command::DeleteTopic { name } => {
                self.topics
                    .remove(name)
                    .ok_or_else(|| MetadataError::UnknownTopic(name.clone()))?;
                Ok(Applied::Done)
            }
            Command::AlterTopicConfigs { name, set, remove } => {
                let t = self
                    .topics
                    .get_mut(name)
                    .ok_or_else(|| MetadataError::UnknownTopic(name.clone()))?;
                let mut configs = t.configs.clone();
                for k in remove {
                    configs.remove(k);
                }
                configs.extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
                check_topic_configs(name, &configs)?;
                t.configs = configs;
                Ok(Applied::Done)
            }
            Command::CreatePartitions {
                name,
                total,
                assignments,
            } => {
                let candidates = self.candidates();
                let t = self
                    .topics
                    .get(name)
                    .ok_or_else(|| MetadataError::UnknownTopic(name.clone()))?;
                let current = t.partitions.len() as u32;
                if *total <= current {
                    return Err(MetadataError::InvalidPartitions(format!(
                        "topic '{name}' has {current} partitions; the new count {total} must be larger"
                    )));
                }
                let added = if assignments.is_empty() {
                    placement::assign(
                        &candidates,
                        current,
                        total - current,
                        t.replication_factor as usize,
                        self.placement_cursor as usize,
                    )?
                } else {
                    let invalid = |why: String| {
                        Err(MetadataError::InvalidReplicaAssignment(format!(
                            "topic '{name}': {why}"
                        )))
                    };
                    if assignments.len() as u32 != total - current {
                        return invalid(format!(
                            "{} assignments for {} new partitions",
                            assignments.len(),
                            total - current
                        ));
                    }
                    let rf = t.replication_factor as usize;
                    if let Some(r) = assignments.iter().find(|r| r.len() != rf) {
                        return invalid(format!(
                            "assignment {r:?} has {} replicas; the topic's replication factor is {rf}",
                            r.len()
                        ));
                    }
                    self.check_registered(name, assignments)?;
                    assignments.clone()
                };
                let t = self.topics.get_mut(name).expect("checked above");
                t.partitions.extend(added.into_iter().map(new_partition));
                Ok(Applied::Done)
            }
            Command::ElectLeader {
                topic,
                partition,
                unclean,
            } => {
                let alive = self.alive_ids();
                let is_alive = |r: BrokerId| alive.contains(&r);
                let p = self.partition_mut(topic, *partition)?;
                let (topic, partition) = (topic.clone(), *partition);
                if *unclean {
                    if let Some(leader) = p.leader {
                        return Err(MetadataError::ElectionNotNeeded {
                            topic,
                            partition,
                            reason: format!("broker {leader} leads it"),
                        });
                    }
                    let choice = elect(p, &is_alive, true)
                        .ok_or(MetadataError::EligibleLeadersNotAvailable { topic, partition })?;
                    apply_election(p, Some(choice));
                } else {
                    let preferred = *p.replicas.first().expect("a partition has replicas");
                    if p.leader == Some(preferred) {
                        return Err(MetadataError::ElectionNotNeeded {
                            topic,
                            partition,
                            reason: format!("its preferred replica {preferred} leads it"),
                        });
                    }
                    let why = if !is_alive(preferred) {
                        Some("fenced")
                    } else if !p.isr.contains(&preferred) {
                        Some("not in the ISR")
                    } else {
                        None
                    };
                    if let Some(reason) = why {
                        return Err(MetadataError::PreferredLeaderNotAvailable {
                            topic,
                            partition,
                            preferred,
                            reason: reason.into(),
                        });
                    }
                    apply_election(p, Some((preferred, false)));
                }
                Ok(Applied::PartitionUpdated {
                    leader_epoch: p.leader_epoch,
                    partition_epoch: p.partition_epoch,
                })
            }
            Command::AlterIsr {
                topic,
                partition,
                leader,
                leader_epoch,
                partition_epoch,
                isr,
                joining,
            } => {
                let alive = self.alive_ids();
                // A member that caught up as a registration that is no longer its own: a
                // restarted process, whose log (perhaps on an empty disk) has not fetched yet.
                let replaced = joining
                    .iter()
                    .find(|(r, e)| self.brokers.get(r).is_some_and(|b| b.epoch != *e));
                let p = self.partition_mut(topic, *partition)?;
                if p.partition_epoch != *partition_epoch {
                    return Err(MetadataError::StalePartitionEpoch {
                        current: p.partition_epoch,
                        got: *partition_epoch,
                    });
                }
                if p.leader != Some(*leader) || p.leader_epoch != *leader_epoch {
                    return Err(MetadataError::NotLeader {
                        broker: *leader,
                        leader_epoch: *leader_epoch,
                    });
                }
                let invalid = |reason: &str| MetadataError::InvalidIsr {
                    isr: isr.clone(),
                    reason: reason.into(),
                };
                if !isr.contains(leader) {
                    return Err(invalid("the leader must stay in the ISR"));
                }
                if isr.iter().any(|r| !p.replicas.contains(r)) {
                    return Err(invalid("every member must be a replica"));
                }
                if isr.iter().any(|r| !p.isr.contains(r) && !alive.contains(r)) {
                    return Err(invalid("a fenced broker cannot join the ISR"));
                }
                if let Some((r, e)) = replaced.filter(|(r, _)| !p.isr.contains(r)) {
                    return Err(invalid(&format!(
                        "broker {r} caught up as broker epoch {e}, and has registered again                          since: it must fetch again"
                    )));
                }
                let mut deduped = isr.clone();
                deduped.sort_unstable();
                deduped.dedup();
                if deduped.len() != isr.len() {
                    return Err(invalid("members must be distinct"));
                }
                p.isr = isr.clone();
                p.partition_epoch += 1;
                complete_reassignment(p, &|r| alive.contains(&r));
                Ok(Applied::PartitionUpdated {
                    leader_epoch: p.leader_epoch,
                    partition_epoch: p.partition_epoch,
                })
            }
            Command::ReassignPartition {
                topic,
                partition,
                target,
                throttle,
            } => {
                if let Some(target) = target {
                    self.check_registered(topic, std::slice::from_ref(target))?;
                }
                let alive = self.alive_ids();
                let is_alive = |r: BrokerId| alive.contains(&r);
                let p = self.partition_mut(topic, *partition)?;
                reassign(
                    p,
                    topic,
                    *partition,
                    target.as_deref(),
                    *throttle,
                    &is_alive,
                )?;
                Ok(Applied::PartitionUpdated {
                    leader_epoch: p.leader_epoch,
                    partition_epoch: p.partition_epoch,
                })
            }
            Command::AllocateProducerIds {
                broker,
                epoch,
                count,
            } => {
                self.check_broker_epoch(*broker, *epoch)?;
                let first = self.next_producer_id;
                self.next_producer_id += i64::from(*count);
                Ok(Applied::ProducerIds {
                    first,
                    count: *count,
                })
            }
            Command::UpsertScramCredential {
                user,
                mechanism,
                credential,
            } => {
                check_scram_credential(user, *mechanism, credential)?;
                if self.scram_mock_secret.is_none() {
                    self.scram_mock_secret = Some(credential.server_key.clone());
                }
                self.scram_credentials
                    .entry(user.clone())
                    .or_default()
                    .insert(*mechanism, credential.clone());
                Ok(Applied::Done)
            }
            Command::CreateAcls { acls } => {
                for a in acls {
                    a.validate().map_err(MetadataError::InvalidAcl)?;
                }
                self.acls.extend(acls.iter().cloned());
                Ok(Applied::Done)
            }
            Command::DeleteAcls { filters } => {
                let (deleted, kept) = std::mem::take(&mut self.acls)
                    .into_iter()
                    .partition(|a| filters.iter().any(|f| f.matches(a)));
                self.acls = kept;
                Ok(Applied::AclsDeleted(deleted.into_iter().collect()))
            }
            Command::AlterDynamicConfigs { scope, set, remove } => {
                self.dynamic_configs.alter(scope, set, remove)?;
                Ok(Applied::Done)
            }
            Command::AlterClientQuotas { alterations } => {
                self.client_quotas
                    .alter(alterations)
                    .map_err(MetadataError::InvalidQuota)?;
                Ok(Applied::Done)
            }
            Command::DeleteScramCredential { user, mechanism } => {
                let unknown = || MetadataError::UnknownScramCredential {
                    user: user.clone(),
                    mechanism: mechanism.name().to_string(),
                };
                let of_user = self.scram_credentials.get_mut(user).ok_or_else(unknown)?;
                of_user.remove(mechanism).ok_or_else(unknown)?;
                if of_user.is_empty() {
                    self.scram_credentials.remove(user);
                }
                Ok(Applied::Done)
            }
        }
    }

    fn partition_mut(
        &mut self,
        topic: &str,
        partition: u32,
    ) -> Result<&mut PartitionRecord, MetadataError> {
        let t = self
            .topics
            .get_mut(topic)
            .ok_or_else(|| MetadataError::UnknownTopic(topic.to_string()))?;
        t.partitions
            .get_mut(partition as usize)
            .ok_or(MetadataError::UnknownPartition {
                topic: topic.to_string(),
                partition,
            })
    }

    /// A manual assignment names only registered brokers.
    fn check_registered(
        &self,
        topic: &str,
        assignments: &[Vec<BrokerId>],
    ) -> Result<(), MetadataError> {
        match assignments
            .iter()
            .flatten()
            .find(|b| !self.brokers.contains_key(b))
        {
            Some(b) => Err(MetadataError::InvalidReplicaAssignment(format!(
                "topic '{topic}': broker {b} is not registered"
            ))),
            None => Ok(()),
        }
    }

    fn candidates(&self) -> Vec<Candidate> {
        self.live_brokers()
            .into_iter()
            .map(|b| Candidate {
                id: b.id,
                rack: b.rack.clone(),
            })
            .collect()
    }

    /// Marks a broker fenced and moves each of its leaderships to another live ISR member
    /// (or leaves the partition offline); it leaves every ISR it was in, unless it was the
    /// last member, so that it can come back as a clean leader.
    fn fence(&mut self, id: BrokerId) {
        if let Some(b) = self.brokers.get_mut(&id) {
            b.fenced = true;
        }
        let alive = self.alive_ids();
        let is_alive = |r: BrokerId| alive.contains(&r);
        for t in self.topics.values_mut() {
            let unclean = t.unclean_election();
            for p in &mut t.partitions {
                if !p.replicas.contains(&id) {
                    continue;
                }
                let was_leader = p.leader == Some(id);
                if p.isr.contains(&id) && p.isr.len() > 1 {
                    p.isr.retain(|r| *r != id);
                    p.partition_epoch += 1;
                }
                if was_leader {
                    apply_election(p, elect(p, &is_alive, unclean));
                }
            }
        }
    }

    /// Elects leaders for offline partitions where an eligible replica is now alive.
    fn elect_offline(&mut self) {
        let alive = self.alive_ids();
        let is_alive = |r: BrokerId| alive.contains(&r);
        for t in self.topics.values_mut() {
            let unclean = t.unclean_election();
            for p in t.partitions.iter_mut().filter(|p| p.leader.is_none()) {
                if let Some(choice) = elect(p, &is_alive, unclean) {
                    apply_election(p, Some(choice));
                }
            }
        }
    }
}

/// A manual assignment's own checks: every partition names distinct brokers, as many as
/// the replication factor when it is known.
fn check_assignments(
    topic: &str,
    assignments: &[Vec<BrokerId>],
    replication_factor: Option<u16>,
) -> Result<(), MetadataError> {
    for (i, replicas) in assignments.iter().enumerate() {
        let distinct: std::collections::BTreeSet<_> = replicas.iter().collect();
        let sized = replication_factor.is_none_or(|rf| replicas.len() == usize::from(rf));
        if replicas.is_empty() || distinct.len() != replicas.len() || !sized {
            return Err(MetadataError::InvalidReplicaAssignment(format!(
                "topic '{topic}': partition {i} is assigned {replicas:?}; each partition needs \
                 distinct brokers, as many as the replication factor"
            )));
        }
    }
    Ok(())
}

fn new_partition(replicas: Vec<BrokerId>) -> PartitionRecord {
    PartitionRecord {
        leader: replicas.first().copied(),
        isr: replicas.clone(),
        replicas,
        leader_epoch: 0,
        partition_epoch: 0,
        reassignment: None,
    }
}

/// Starts, replaces or (`target` `None`) cancels a partition's move. The replica set
/// changes, so the leader epoch moves even when the leader stays: its followers are then
/// the new set's (every leader change and replica change starts a fresh leader state).
fn reassign(
    p: &mut PartitionRecord,
    topic: &str,
    partition: u32,
    target: Option<&[BrokerId]>,
    throttle: Option<u64>,
    alive: &dyn Fn(BrokerId) -> bool,
) -> Result<(), MetadataError> {
    if let (Some(r), Some(target)) = (&mut p.reassignment, target) {
        if r.target == target {
            // The move in progress, asked again (perhaps with another throttle).
            r.throttle = throttle;
            return Ok(());
        }
    }
    let original = p
        .reassignment
        .as_ref()
        .map_or_else(|| p.replicas.clone(), |r| r.original.clone());
    let (replicas, reassignment) = match target {
        None => {
            if p.reassignment.is_none() {
                return Err(MetadataError::NoReassignmentInProgress {
                    topic: topic.to_string(),
                    partition,
                });
            }
            (original.clone(), None)
        }
        Some(target) if p.reassignment.is_none() && target == p.replicas.as_slice() => {
            // Already there: nothing to move.
            return Ok(());
        }
        Some(target) => {
            let mut replicas = target.to_vec();
            replicas.extend(original.iter().filter(|b| !target.contains(b)));
            let r = Reassignment {
                target: target.to_vec(),
                original: original.clone(),
                throttle,
            };
            (replicas, Some(r))
        }
    };
    // Replicas an earlier target added and this one drops leave the ISR with it; the ISR
    // must keep a member, or nothing acknowledged would be sure to survive.
    let isr: Vec<BrokerId> = p
        .isr
        .iter()
        .copied()
        .filter(|b| replicas.contains(b))
        .collect();
    if isr.is_empty() {
        return Err(MetadataError::InvalidReplicaAssignment(format!(
            "{topic}-{partition}: none of the in-sync replicas {:?} would stay a replica of \
             {replicas:?}; let the move in progress finish first",
            p.isr
        )));
    }
    p.replicas = replicas;
    p.isr = isr;
    p.reassignment = reassignment;
    let leader = p.leader.filter(|l| p.replicas.contains(l) && alive(*l));
    match leader {
        Some(l) => apply_election(p, Some((l, false))),
        None => apply_election(p, elect(p, alive, false)),
    }
    complete_reassignment(p, alive);
    Ok(())
}

/// Completes a partition's move once every target replica is in the ISR and one of them
/// is alive to lead: the replicas become the target, the leaving ones drop out of the ISR,
/// and leadership moves to a target replica if the leader is leaving.
fn complete_reassignment(p: &mut PartitionRecord, alive: &dyn Fn(BrokerId) -> bool) {
    let Some(r) = &p.reassignment else { return };
    if !r.target.iter().all(|b| p.isr.contains(b)) || !r.target.iter().any(|b| alive(*b)) {
        return;
    }
    let target = r.target.clone();
    p.replicas = target.clone();
    p.isr.retain(|b| target.contains(b));
    p.reassignment = None;
    let leader = p.leader.filter(|l| target.contains(l) && alive(*l));
    match leader {
        Some(l) => apply_election(p, Some((l, false))),
        None => apply_election(p, elect(p, alive, false)),
    }
}

/// Installs an election result: a new leader (an unclean one starts a new ISR of itself) or
/// none (offline). Either way the leader epoch moves, so the old leader's writes are stale.
fn apply_election(p: &mut PartitionRecord, choice: Option<(BrokerId, bool)>) {
    match choice {
        Some((leader, unclean)) => {
            p.leader = Some(leader);
            if unclean {
                p.isr = vec![leader];
            }
        }
        None => p.leader = None,
    }
    p.leader_epoch += 1;
    p.partition_epoch += 1;
}

#[cfg(test)]
mod tests;
