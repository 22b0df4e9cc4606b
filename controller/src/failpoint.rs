//! Failpoints for process tests: named places where a test can make a controller or a broker
//! misbehave on cue, to stage faults that signals alone cannot (a controller that dies after
//! committing a change but before answering it; a broker whose metadata view lags).
//!
//! Off unless the process was started with `STRATA_TEST_FAILPOINTS_DIR` set; then a failpoint
//! named `N` is armed while the file `N` exists in that directory. Tests arm one by creating
//! the file and disarm it by removing it, at any time, in any process sharing the directory.
//! Never set the variable in production: it lets whoever writes that directory stop the node.

use std::path::PathBuf;
use std::sync::OnceLock;

fn dir() -> Option<&'static PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| std::env::var_os("STRATA_TEST_FAILPOINTS_DIR").map(PathBuf::from))
        .as_ref()
}

/// Whether failpoints are on in this process at all (so a caller can skip building a name).
pub fn enabled() -> bool {
    dir().is_some()
}

/// Whether failpoint `name` is armed now (it stays armed until the test removes its file).
pub fn armed(name: &str) -> bool {
    dir().is_some_and(|d| d.join(name).exists())
}

/// Waits while failpoint `name` is armed (at once when failpoints are off): a test holds the
/// caller there until it removes the file.
pub async fn hold_while_armed(name: &str) {
    while armed(name) {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Fires failpoint `name` once: true for the one caller that disarms it (its file is renamed
/// to `name.fired`, so a test can also tell that it fired), false for everyone else.
pub fn take(name: &str) -> bool {
    dir().is_some_and(|d| std::fs::rename(d.join(name), d.join(format!("{name}.fired"))).is_ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn off_without_the_directory() {
        // The test process never sets STRATA_TEST_FAILPOINTS_DIR.
        assert!(!super::armed("anything"));
        assert!(!super::take("anything"));
    }
}
