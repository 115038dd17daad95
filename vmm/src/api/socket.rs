//! The API's listening socket: bound with owner-only permissions (never reachable wider), or
//! inherited from the caller; its file removed when lull is done with it.

use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use super::error::ApiError;
use crate::host::sys::listener;

/// The listening socket; its file (if lull created it) is removed when it is dropped.
pub struct ApiSocket {
    pub(super) listener: UnixListener,
    /// The file lull bound, or `None` for an inherited socket (its owner removes its file).
    path: Option<PathBuf>,
}

impl ApiSocket {
    /// Creates the socket at `path`, readable and writable by its owner only, and never
    /// reachable with wider permissions: it is bound in a private directory, restricted, then
    /// linked to `path` (which must not exist).
    pub fn bind(path: &Path) -> Result<Self, ApiError> {
        let fail = |source| ApiError::Socket {
            path: path.to_path_buf(),
            source,
        };
        if path.symlink_metadata().is_ok() {
            return Err(ApiError::SocketExists(path.to_path_buf()));
        }
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let private = parent.join(format!(".lull-api-{}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&private)
            .map_err(fail)?;
        let staged = private.join("s");
        let bound = UnixListener::bind(&staged).and_then(|listener| {
            std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
            std::fs::hard_link(&staged, path)?;
            Ok(listener)
        });
        let _ = std::fs::remove_file(&staged);
        let _ = std::fs::remove_dir(&private);
        let listener = bound.map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => ApiError::SocketExists(path.to_path_buf()),
            _ => fail(e),
        })?;
        listener.set_nonblocking(true).map_err(fail)?;
        Ok(Self {
            listener,
            path: Some(path.to_path_buf()),
        })
    }

    /// The listening socket `fd` lull was started with (`--api-socket fd=N`), taken over.
    pub fn inherit(fd: std::os::fd::RawFd) -> Result<Self, ApiError> {
        Ok(Self {
            listener: listener::inherited_listener(fd).map_err(ApiError::Inherited)?,
            path: None,
        })
    }

    /// How the log names the socket.
    pub(super) fn describe(&self) -> String {
        match &self.path {
            Some(path) => path.display().to_string(),
            None => format!("fd {}", self.listener.as_raw_fd()),
        }
    }
}

impl Drop for ApiSocket {
    fn drop(&mut self) {
        if let Some(path) = &self.path {
            let _ = std::fs::remove_file(path);
        }
    }
}
