//! `strata-compactor`: cold-tier jobs beside the cluster. For `cleanup.policy=compact`
//! topics it rewrites remote segments keeping the latest record per key (tombstones until
//! `delete.retention.ms`); it merges small remote segments; it removes objects no manifest
//! names after a grace period. It reads and writes the object store only, and changes a
//! partition's manifest with the same create-only writes the brokers use.

pub mod job;
pub mod service;
