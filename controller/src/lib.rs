//! The Strata controller: the metadata quorum on openraft. `metadata` is the cluster state
//! machine (brokers, topics, partitions, ISR, producer-id blocks), placement and broker
//! leases, as pure logic; `raft` stores the metadata log and state on disk; `network` carries
//! Raft between controllers over gRPC; `service` runs a controller node and its gRPC API.

pub mod failpoint;
pub mod health;
pub mod incoming;
pub mod metadata;
pub mod network;
pub mod raft;
pub mod service;

pub use service::{Controller, ControllerConfig};
