//! The metadata quorum's storage on openraft: the type configuration, the durable metadata
//! log ([`LogStore`]) and the metadata state machine ([`StateMachine`]). Both pass openraft's
//! storage conformance suite (`tests` below).

mod log_store;
mod state_machine;

use std::io::Cursor;

use serde::{Deserialize, Serialize};

pub use log_store::LogStore;
pub use state_machine::StateMachine;

use crate::metadata::{Applied, Command, MetadataError};

pub type NodeId = u64;

/// The answer to one metadata-log entry: applied, or refused (deterministically).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply(pub Result<Applied, MetadataError>);

openraft::declare_raft_types!(
    /// Strata's metadata quorum types.
    pub TypeConfig:
        D = Command,
        R = Reply,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
);

pub type Entry = openraft::Entry<TypeConfig>;

#[cfg(test)]
mod tests;
