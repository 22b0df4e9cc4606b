//! Consumer groups: the classic protocol's group state machine (`state`), the records of
//! `__consumer_offsets` and their replay (`records`), the coordinator of one offsets
//! partition (`coordinator`), the coordinators this broker runs (`manager`), server-side
//! assignors for native members (`assign`) and the native join (`native`). The Kafka
//! APIs are in `crate::kafka::group`; see docs/consumer-groups.md.

pub mod assign;
pub mod coordinator;
pub mod manager;
pub mod native;
pub mod records;
pub mod state;
