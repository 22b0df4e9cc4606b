//! Consumer groups (issue 5). So far: the classic protocol's group state machine
//! (`state`) and the records of `__consumer_offsets` with their replay (`records`), pure
//! and tested; the coordinator and the Kafka group APIs build on them.

pub mod coordinator;
pub mod manager;
pub mod records;
pub mod state;
