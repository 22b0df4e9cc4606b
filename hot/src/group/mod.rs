//! Consumer groups: the classic protocol's group state machine (`state`), the records of
//! `__consumer_offsets` and their replay (`records`), the coordinator of one offsets
//! partition (`coordinator`), the coordinators this broker runs (`manager`), server-side
//! assignors for native members (`assign`) and the native join (`native`). The Kafka
//! APIs are in `crate::kafka::group`; see docs/consumer-groups.md.

pub mod assign;
pub mod consumer;
pub mod coordinator;
pub mod manager;
pub mod native;
pub mod records;
pub mod state;

/// The longest group id served, in bytes.
pub const MAX_GROUP_ID_BYTES: usize = 255;

/// Why `group` cannot be a group id: empty, longer than 255 bytes, or holding a control
/// character (groups are named in logs, metrics and `__consumer_offsets` keys).
pub fn invalid_group_id(group: &str) -> Option<String> {
    if group.is_empty() {
        Some("the group id is empty".into())
    } else if group.len() > MAX_GROUP_ID_BYTES {
        Some(format!(
            "the group id is {} bytes long; at most {MAX_GROUP_ID_BYTES} are allowed",
            group.len()
        ))
    } else if group.chars().any(char::is_control) {
        Some("the group id holds a control character".into())
    } else {
        None
    }
}
