//! Kafka error codes (Kafka's numbers, never reused) and the mapping from broker errors.

use kafka_protocol::ResponseError as E;
use strata_core::batch::BatchError;

use crate::broker::{AdminError, EpochCheck, ProduceError, Route, WaitError};
use crate::log::{AppendError, ReadError};

pub const NONE: i16 = 0;
pub const UNKNOWN_SERVER_ERROR: i16 = E::UnknownServerError.code();
pub const OFFSET_OUT_OF_RANGE: i16 = E::OffsetOutOfRange.code();
pub const OFFSET_NOT_AVAILABLE: i16 = E::OffsetNotAvailable.code();
pub const UNSUPPORTED_VERSION: i16 = E::UnsupportedVersion.code();
pub const INVALID_CONFIG: i16 = E::InvalidConfig.code();
pub const LEADER_NOT_AVAILABLE: i16 = E::LeaderNotAvailable.code();
pub const NOT_LEADER_OR_FOLLOWER: i16 = E::NotLeaderOrFollower.code();
pub const NOT_ENOUGH_REPLICAS: i16 = E::NotEnoughReplicas.code();
pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = E::UnknownTopicOrPartition.code();
pub const INVALID_TOPIC: i16 = E::InvalidTopicException.code();
pub const INVALID_REQUIRED_ACKS: i16 = E::InvalidRequiredAcks.code();
pub const INVALID_REQUEST: i16 = E::InvalidRequest.code();
pub const CORRUPT_MESSAGE: i16 = E::CorruptMessage.code();
pub const KAFKA_STORAGE_ERROR: i16 = E::KafkaStorageError.code();
pub const FENCED_LEADER_EPOCH: i16 = E::FencedLeaderEpoch.code();
pub const UNKNOWN_LEADER_EPOCH: i16 = E::UnknownLeaderEpoch.code();
pub const STALE_BROKER_EPOCH: i16 = E::StaleBrokerEpoch.code();
pub const INVALID_REPLICA_ASSIGNMENT: i16 = E::InvalidReplicaAssignment.code();
pub const UNSUPPORTED_SASL_MECHANISM: i16 = E::UnsupportedSaslMechanism.code();
pub const ILLEGAL_SASL_STATE: i16 = E::IllegalSaslState.code();
pub const SASL_AUTHENTICATION_FAILED: i16 = E::SaslAuthenticationFailed.code();
pub const RESOURCE_NOT_FOUND: i16 = E::ResourceNotFound.code();
pub const DUPLICATE_RESOURCE: i16 = E::DuplicateResource.code();
pub const UNACCEPTABLE_CREDENTIAL: i16 = E::UnacceptableCredential.code();
pub const TOPIC_AUTHORIZATION_FAILED: i16 = E::TopicAuthorizationFailed.code();
pub const GROUP_AUTHORIZATION_FAILED: i16 = E::GroupAuthorizationFailed.code();
pub const CLUSTER_AUTHORIZATION_FAILED: i16 = E::ClusterAuthorizationFailed.code();
pub const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = E::TransactionalIdAuthorizationFailed.code();
pub const FETCH_SESSION_ID_NOT_FOUND: i16 = E::FetchSessionIdNotFound.code();
pub const INVALID_FETCH_SESSION_EPOCH: i16 = E::InvalidFetchSessionEpoch.code();

/// A Kafka error code with the message to send where the API has a field for one.
pub type Coded = (i16, String);

pub fn batch(e: &BatchError) -> Coded {
    let code = match e {
        BatchError::Truncated { .. }
        | BatchError::CrcMismatch { .. }
        | BatchError::BadLength(_) => E::CorruptMessage.code(),
        BatchError::BadMagic(_) => E::UnsupportedForMessageFormat.code(),
        BatchError::BadRecordCount { .. } | BatchError::TrailingBytes(_) => E::InvalidRecord.code(),
    };
    (code, e.to_string())
}

pub fn append(e: &AppendError) -> Coded {
    let code = match e {
        AppendError::TooLarge { .. } => E::MessageTooLarge.code(),
        AppendError::OutOfOrderSequence { .. } => E::OutOfOrderSequenceNumber.code(),
        AppendError::InvalidProducerEpoch { .. } => E::InvalidProducerEpoch.code(),
        AppendError::InvalidTxnState | AppendError::TxnNotVerified => E::InvalidTxnState.code(),
        AppendError::Unsupported(_) => E::InvalidRecord.code(),
        AppendError::Io(_) => E::KafkaStorageError.code(),
        AppendError::NotContiguous { .. } => E::UnknownServerError.code(),
    };
    (code, e.to_string())
}

pub fn produce(e: &ProduceError) -> Coded {
    match e {
        ProduceError::UnknownTopicOrPartition { .. } => (UNKNOWN_TOPIC_OR_PARTITION, e.to_string()),
        ProduceError::NotLeader { .. } => (NOT_LEADER_OR_FOLLOWER, e.to_string()),
        ProduceError::NotEnoughReplicas(_) => (NOT_ENOUGH_REPLICAS, e.to_string()),
        ProduceError::AcksTooWeak { .. } => (INVALID_REQUIRED_ACKS, e.to_string()),
        ProduceError::InternalTopic(_) => (INVALID_TOPIC, e.to_string()),
        ProduceError::Batch(b) => batch(b),
        ProduceError::Records {
            error: strata_core::validate::RecordsError::Timestamp { .. },
            ..
        } => (E::InvalidTimestamp.code(), e.to_string()),
        ProduceError::Records { .. } => (E::InvalidRecord.code(), e.to_string()),
        ProduceError::Append(a) => append(a),
    }
}

pub fn wait(e: &WaitError) -> Coded {
    let code = match e {
        WaitError::Timeout => E::RequestTimedOut.code(),
        WaitError::StorageFailed => E::KafkaStorageError.code(),
        WaitError::NotLeader => NOT_LEADER_OR_FOLLOWER,
        WaitError::NotEnoughReplicasAfterAppend => E::NotEnoughReplicasAfterAppend.code(),
    };
    (code, e.to_string())
}

/// FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH for a mismatched client epoch.
pub fn epoch(check: EpochCheck) -> Option<i16> {
    match check {
        EpochCheck::Current => None,
        EpochCheck::Fenced => Some(E::FencedLeaderEpoch.code()),
        EpochCheck::Unknown => Some(E::UnknownLeaderEpoch.code()),
    }
}

/// The error code for a partition this broker cannot serve.
pub fn route(r: &Route) -> Option<i16> {
    match r {
        Route::Leader(_) => None,
        Route::NotLeader => Some(NOT_LEADER_OR_FOLLOWER),
        Route::UnknownTopicOrPartition => Some(UNKNOWN_TOPIC_OR_PARTITION),
    }
}

pub fn read(e: &ReadError) -> i16 {
    match e {
        ReadError::OffsetOutOfRange { .. } => OFFSET_OUT_OF_RANGE,
        ReadError::Io(_) => E::KafkaStorageError.code(),
    }
}

pub fn admin(e: &AdminError) -> Coded {
    let code = match e {
        AdminError::InvalidTopic(_) => E::InvalidTopicException.code(),
        AdminError::InvalidPartitions(_) => E::InvalidPartitions.code(),
        AdminError::InvalidReplicationFactor(_) => E::InvalidReplicationFactor.code(),
        AdminError::InvalidReplicaAssignment(_) => INVALID_REPLICA_ASSIGNMENT,
        AdminError::InvalidConfig(_) => E::InvalidConfig.code(),
        AdminError::TopicExists(_) => E::TopicAlreadyExists.code(),
        AdminError::UnknownTopic(_) => E::UnknownTopicOrPartition.code(),
        AdminError::Io(_) => E::KafkaStorageError.code(),
    };
    (code, e.to_string())
}
