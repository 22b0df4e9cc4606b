//! Replication between brokers, as pure logic first: the leader's bookkeeping of followers,
//! the high watermark and ISR proposals (`leader`), and the leader-epoch history that makes
//! followers truncate to where they agree with the leader before fetching (`epochs`). The
//! follower fetcher and the wiring into the partition runtime build on these.

pub mod epochs;
pub mod leader;
