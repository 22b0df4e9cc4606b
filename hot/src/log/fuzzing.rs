//! Entry points shared by the fuzz targets (`fuzz/`) and the property tests: each takes
//! arbitrary bytes and panics only when an invariant of the log is broken.

use std::path::Path;

use strata_core::batch::{self, BatchIter};
use strata_core::segment::{file_name, LOG_SUFFIX};

use super::{LogConfig, PartitionLog};

/// Writes `segment` as the only segment of a partition in `dir`, opens (recovers) the log,
/// and reads it all back. Asserts that recovery never serves a batch with a bad CRC, that
/// offsets only go up, and that the log accepts appends afterwards. Returns the batches read.
pub fn recover_arbitrary_segment(dir: &Path, segment: &[u8]) -> usize {
    std::fs::write(dir.join(file_name(0, LOG_SUFFIX)), segment).expect("write test segment");
    let (log, _) = PartitionLog::open(dir, LogConfig::default(), 0)
        .expect("recovery of a damaged segment must not fail");
    let mut next = log.start_offset();
    let mut batches = 0;
    while let Some(plan) = log
        .plan_read(next, u64::MAX)
        .expect("recovered log must be readable")
    {
        let bytes = plan.read(1 << 20).expect("recovered log must be readable");
        assert!(
            !bytes.is_empty(),
            "a planned read returned nothing at {next}"
        );
        for item in BatchIter::new(&bytes) {
            let (h, range) = item.expect("recovered log served a malformed batch header");
            batch::verify(&bytes[range]).expect("recovered log served a batch with a bad CRC");
            assert!(h.last_offset() as u64 >= next, "offsets went backwards");
            next = h.last_offset() as u64 + 1;
            batches += 1;
        }
    }
    assert_eq!(next, log.end_offset(), "reads must reach the log end");
    batches
}
