//! The management API: the part of Cloud Hypervisor's REST API that orchestrators use, over a
//! Unix socket (`lull run --api-socket PATH`), to create, boot, watch and stop one VM.
//!
//! ```text
//!  clients ── HTTP/1.1 on the socket ──► server (lull's main thread: one event-manager loop,
//!                                         as the VMM thread's, over the listener, every
//!                                         connection, stop signals and "the VM thread
//!                                         ended"; seccomp-filtered)
//!    conn::Conn           one connection: incremental framing, keep-alive, deadlines
//!    http::parse_next     framing over `httparse`, size limits
//!    routes::route        method + path + body ─► ApiRequest
//!    Controller::handle   the VM's life:
//!                           NotCreated ─vm.create─► Created ─vm.boot─► Running ─stop─► Shutdown
//!                                                                │
//!                          runner: the `vm` thread runs vm::run_observed; once every thread
//!                          runs it hands back a LiveVm (live counters, stop requests)
//!  client ◄── Response (JSON; an error is Cloud Hypervisor's array of messages) ─┘
//! ```
//!
//! Connections are served concurrently on one thread (non-blocking sockets, `event-manager`
//! over epoll): a client that sends half a request or does not read its answer holds its own
//! connection and nothing else, so a stalled client delays no other. Connections persist (HTTP/1.1 keep-alive) up to
//! [`http::MAX_REQUESTS`] requests, unless the client says `Connection: close`; each request
//! must arrive whole within [`http::REQUEST_TIMEOUT`] of the connection being ready for it
//! (accepted, or the previous answer written), which is also the idle timeout. At most
//! [`server::MAX_CONNECTIONS`] are served; one more closes the idle one that waited longest,
//! never one in the middle of a request, and with none idle is answered 503 unserved.
//! Bodies are at most [`http::MAX_BODY`] (a larger Content-Length is answered 413 unread).
//! A malformed, oversized or abandoned request gets an error (or, if the client hung up,
//! nothing) and changes nothing; the VM runs on its own thread and never waits for the
//! server. The socket is created with owner-only permissions (`server::ApiSocket`).
//!
//! Status codes follow Cloud Hypervisor: 200 with a JSON body, 204 without; 400 for a request
//! that cannot be understood, 404 for an unknown endpoint or a VM not created, 405 for a
//! method the endpoint does not take or a VM not booted, 503 for a connection the server has
//! no room for, 500 for everything else (creating twice, booting twice, a boot that fails).
//! See `docs/API.md`.

pub mod ch_client;
mod clients;
pub mod conn;
pub mod controller;
mod error;
pub mod events;
pub mod http;
mod limits;
pub mod restore_taps;
pub mod routes;
pub mod runner;
pub mod server;
mod socket;
mod watch;

pub use error::ApiError;
pub use events::EventMonitor;
pub use server::{serve, serve_on, ApiSocket, InitialVm};
