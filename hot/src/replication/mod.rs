//! Replication between brokers. Pure logic: the leader's bookkeeping of followers, the high
//! watermark and ISR proposals (`leader`), and the leader-epoch history that makes followers
//! truncate to where they agree with the leader before fetching (`epochs`). Wiring: the
//! follower's fetcher task (`follower`), its fetch sessions to each leader broker (`session`) and the leader's gRPC service (`service`).

pub mod epochs;
pub mod follower;
pub mod leader;
pub mod service;
pub mod session;
pub mod stages;
pub mod throttle;
