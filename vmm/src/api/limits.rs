//! The API's limits: how large and how slow a request may be, how many a connection carries,
//! how long a stop may take. Their own file because both the code that enforces them and
//! [`super::ApiError`]'s messages name them.

use std::time::Duration;

/// Largest request head (request line and headers) accepted.
pub const MAX_HEAD: usize = 8 * 1024;
/// Largest request body accepted (a VM configuration is well under 1 KiB); a request that
/// announces more is answered 413 before its body is read.
pub const MAX_BODY: usize = 1 << 20;
/// Most headers in one request.
pub const MAX_HEADERS: usize = 32;
/// A request must arrive whole within this time of the moment the connection was ready for
/// it: its accept for the first, the previous answer's last byte written for the next ones. A
/// connection that has not begun a request by then is closed (the keep-alive idle timeout);
/// one in the middle of a request is answered 408 and closed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Most requests answered on one connection; the last one's answer says `Connection: close`.
pub const MAX_REQUESTS: u32 = 100;

/// Most connections served at once. When every one is in the middle of a request, a new one
/// is refused (503, see [`MAX_REFUSING`]); when some are idle, the one idle longest is closed
/// for it.
pub const MAX_CONNECTIONS: usize = 64;
/// Most connections being refused at once (each reads its request and answers it 503); beyond
/// [`MAX_CONNECTIONS`] + this, lull accepts no connection until one closes or goes idle:
/// clients wait in the socket's backlog, as they would for a slow server.
pub const MAX_REFUSING: usize = 64;

/// How long a stop request may take to end the run.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);
