//! The Strata broker: the local log engine and, around it, the append and fetch paths and the
//! Kafka listener.

pub mod log;
