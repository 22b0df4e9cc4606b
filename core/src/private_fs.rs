//! Owner-only directories and files for a node's data. The controllers' metadata log holds
//! every SCRAM user's stored and server keys and the segments hold the records, so nothing a
//! node writes under its data directory may be readable by another local user.
//!
//! Every component creates its directories with [`create_dir_all`] (mode 0700) and its files
//! with [`open_options`] or [`create`] (mode 0600). The mode is given to `mkdir(2)` and
//! `open(2)` themselves, so a file is never readable by others, not even between its creation
//! and a later `chmod`; the process umask can only narrow it further. [`tighten_dir`] closes a
//! directory that an older version or an operator left open.
//!
//! Libraries that create files without taking a mode (the local object store, the cold tier's
//! disk cache) are covered by the process umask the server sets, not by these functions.

use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The mode of every directory under a data directory, and of the data directory itself.
pub const DIR_MODE: u32 = 0o700;
/// The mode of every file under a data directory.
pub const FILE_MODE: u32 = 0o600;
/// The permission bits that let a group or other users in.
const OTHERS: u32 = 0o077;

/// `std::fs::create_dir_all`, each directory it makes mode 0700. Directories that exist
/// already are left as they are (see [`tighten_dir`]).
pub fn create_dir_all(path: impl AsRef<Path>) -> io::Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(path)
}

/// `OpenOptions::new()` that creates files mode 0600; the caller says how to open them.
pub fn open_options() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.mode(FILE_MODE);
    options
}

/// `File::create` (write, create, truncate), mode 0600. A file that exists already and that
/// others may read is narrowed to 0600 as well, since it is about to hold new contents.
pub fn create(path: impl AsRef<Path>) -> io::Result<File> {
    let file = open_options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    if file.metadata()?.permissions().mode() & OTHERS != 0 {
        file.set_permissions(Permissions::from_mode(FILE_MODE))?;
    }
    Ok(file)
}

/// Makes an existing directory owner-only (mode 0700) if a group or other users may enter
/// or read it; returns the mode it had then, `None` when it was private already. Closing the
/// top of a data directory is enough to keep other users out of everything below it.
pub fn tighten_dir(path: impl AsRef<Path>) -> io::Result<Option<u32>> {
    let path = path.as_ref();
    let mode = std::fs::metadata(path)?.permissions().mode() & 0o7777;
    if mode & OTHERS == 0 {
        return Ok(None);
    }
    std::fs::set_permissions(path, Permissions::from_mode(DIR_MODE))?;
    Ok(Some(mode))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    /// A temporary directory of this test's own (strata-core has no tempfile dependency).
    struct Scratch(std::path::PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir = std::env::temp_dir().join(format!(
                "strata-core-private-fs-{name}-{}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir(&dir).unwrap();
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn every_directory_made_is_owner_only_and_existing_ones_are_left_alone() {
        let s = Scratch::new("dirs");
        let open = s.0.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, Permissions::from_mode(0o755)).unwrap();
        let deep = open.join("a").join("b").join("c");
        create_dir_all(&deep).unwrap();
        for d in [open.join("a"), open.join("a").join("b"), deep.clone()] {
            assert_eq!(mode(&d), DIR_MODE, "{}", d.display());
        }
        assert_eq!(mode(&open), 0o755);
        // again, on what exists: nothing to do, and no error
        create_dir_all(&deep).unwrap();
    }

    #[test]
    fn files_are_created_owner_only_and_an_open_one_is_narrowed_when_rewritten() {
        let s = Scratch::new("files");
        let made = s.0.join("made");
        create(&made).unwrap().write_all(b"keys").unwrap();
        assert_eq!(mode(&made), FILE_MODE);
        let appended = s.0.join("appended");
        open_options()
            .append(true)
            .create(true)
            .open(&appended)
            .unwrap();
        assert_eq!(mode(&appended), FILE_MODE);

        let old = s.0.join("old");
        std::fs::write(&old, b"from an older version").unwrap();
        std::fs::set_permissions(&old, Permissions::from_mode(0o644)).unwrap();
        create(&old).unwrap().write_all(b"new").unwrap();
        assert_eq!(mode(&old), FILE_MODE);
        assert_eq!(std::fs::read(&old).unwrap(), b"new");
    }

    #[test]
    fn an_open_directory_is_tightened_once_and_a_private_one_is_not_touched() {
        let s = Scratch::new("tighten");
        let dir = s.0.join("data");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, Permissions::from_mode(0o755)).unwrap();
        assert_eq!(tighten_dir(&dir).unwrap(), Some(0o755));
        assert_eq!(mode(&dir), DIR_MODE);
        assert_eq!(tighten_dir(&dir).unwrap(), None);
        std::fs::set_permissions(&dir, Permissions::from_mode(0o710)).unwrap();
        assert_eq!(tighten_dir(&dir).unwrap(), Some(0o710));
        assert_eq!(mode(&dir), DIR_MODE);
        std::fs::set_permissions(&dir, Permissions::from_mode(0o500)).unwrap();
        assert_eq!(
            tighten_dir(&dir).unwrap(),
            None,
            "no access for others: left as it is"
        );
        assert_eq!(mode(&dir), 0o500);
        std::fs::set_permissions(&dir, Permissions::from_mode(0o700)).unwrap();
        assert!(tighten_dir(s.0.join("missing")).is_err());
    }
}
