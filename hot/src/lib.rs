//! The Strata broker: the local log engine and, around it, the append and fetch paths, the
//! Kafka listener and the `strata` binary's commands.

pub mod broker;
pub mod certs;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod group;
pub mod grpc;
pub mod health;
pub mod internal;
pub mod kafka;
pub mod log;
pub mod logging;
pub mod metrics;
pub mod metrics_endpoint;
pub mod replication;
pub mod secure_dev;
pub mod server;
pub mod txn;
