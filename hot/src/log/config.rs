//! Per-topic log configuration: defined in strata-core, where the controllers validate a
//! topic's configs with the same rules before they accept them.

pub use strata_core::topic_config::*;
