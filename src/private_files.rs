//! The files the broker keeps its state in are for the broker alone: every tool input, every
//! webhook signing secret (stored in clear, as HMAC needs) and the receipt key live in them. One
//! place says how such a file is created (mode 0600, whatever the umask) and what is said at start
//! when an existing one is readable by others.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

/// Options that create a new file only the broker's user may read or write (0600 on Unix).
pub fn new_private_file() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options
}

/// Creates `path` empty and private if nothing is there yet, so that what is written into it
/// later (SQLite, which gives its WAL and shared-memory files the database file's mode, or a
/// backup) is never readable by others. An existing file is left as it is.
pub fn create_private_if_missing(path: &Path) -> io::Result<()> {
    match new_private_file().open(path) {
        Ok(file) => file.sync_all(),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Opens (creating it private if missing) a file to hold a lock in.
pub fn open_private_lock_file(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.create(true).truncate(false).write(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

/// The permission bits of `path` that let others than its owner in (group or world), if it
/// exists and has any: what the start log warns about.
pub fn shared_with_others(path: &Path) -> Option<u32> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
        (mode & 0o077 != 0).then_some(mode)
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

/// Warns, once per file, about each of `paths` that others than the broker's user may read.
pub fn warn_if_shared<'a>(paths: impl IntoIterator<Item = &'a Path>) {
    for path in paths {
        if let Some(mode) = shared_with_others(path) {
            tracing::warn!(
                path = %path.display(),
                mode = format!("{mode:o}"),
                "this file holds every tool input and webhook secret but others may read it: \
                 run `chmod 600 {}` (and its -wal, -shm, .lock and receipt key files)",
                path.display()
            );
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_new_file_is_private_and_an_existing_one_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("new.db");
        create_private_if_missing(&new).unwrap();
        assert_eq!(mode(&new), 0o600);
        assert_eq!(shared_with_others(&new), None);

        let old = dir.path().join("old.db");
        std::fs::write(&old, b"kept").unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
        create_private_if_missing(&old).unwrap();
        assert_eq!(std::fs::read(&old).unwrap(), b"kept");
        assert_eq!(shared_with_others(&old), Some(0o644));
        assert_eq!(shared_with_others(&dir.path().join("absent")), None);

        let lock = dir.path().join("a.lock");
        drop(open_private_lock_file(&lock).unwrap());
        assert_eq!(mode(&lock), 0o600);
    }
}
