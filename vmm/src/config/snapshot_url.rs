//! The `file:///DIR` URLs that name a snapshot's directory (`vm.snapshot`'s destination_url,
//! `vm.restore`'s and `--restore`'s source_url).

use std::path::PathBuf;

/// Why a URL names no snapshot directory.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotUrlError {
    /// The URL is not `file:///absolute/dir`.
    #[error(
        "{0:?} is not a file:///DIR URL: give the snapshot directory as file:///absolute/path"
    )]
    NotFileUrl(String),
}

/// The directory of a `file:///DIR` URL.
pub fn dir_of_url(url: &str) -> Result<PathBuf, SnapshotUrlError> {
    url.strip_prefix("file://")
        .filter(|p| p.starts_with('/'))
        .map(PathBuf::from)
        .ok_or_else(|| SnapshotUrlError::NotFileUrl(url.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_must_be_absolute_file_urls() {
        assert_eq!(
            dir_of_url("file:///tmp/snap").unwrap(),
            PathBuf::from("/tmp/snap")
        );
        for bad in ["/tmp/snap", "file://tmp/snap", "http://x/y", ""] {
            assert!(matches!(
                dir_of_url(bad),
                Err(SnapshotUrlError::NotFileUrl(_))
            ));
        }
    }
}
