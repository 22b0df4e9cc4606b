//! What every Strata component speaks: the record batch format (Kafka RecordBatch v2) and the
//! on-disk segment, index and checkpoint formats shared by the hot tier, the cold tier and
//! the replay tools. This crate does no I/O beyond encoding and decoding bytes, and the
//! owner-only modes every component creates its data directories and files with
//! ([`private_fs`]).

pub mod batch;
#[cfg(feature = "codecs")]
pub mod codec;
#[cfg(feature = "codecs")]
pub mod compact;
pub mod dynamic_config;
pub mod private_fs;
pub mod segment;
pub mod topic;
pub mod topic_config;
pub mod validate;
