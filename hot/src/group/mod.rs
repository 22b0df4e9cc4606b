//! Consumer groups (issue 5). So far: the classic protocol's group state machine
//! (`state`), pure and tested; the coordinator, `__consumer_offsets` and the Kafka APIs
//! build on it.

pub mod state;
