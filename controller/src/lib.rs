//! The Strata controller: the cluster metadata state machine (brokers, topics, partitions,
//! ISR, producer-id blocks), replica placement and broker leases. The openraft quorum that
//! replicates the metadata log, and the gRPC services around it, build on this module.

pub mod metadata;
pub mod raft;
