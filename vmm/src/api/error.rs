//! What can go wrong with the API socket or one of its requests, and how each is answered.

use std::path::PathBuf;
use std::sync::Arc;

use super::limits;
use crate::config::ConfigError;
use crate::vm::VmError;

/// What went wrong with the API socket or one of its requests.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The socket cannot be created.
    #[error("Cannot create the API socket {path}: {source}")]
    Socket {
        /// The socket's path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The inherited API socket (`--api-socket fd=N`) cannot serve.
    #[error("--api-socket: {0}")]
    Inherited(#[source] crate::host::sys::listener::ListenerError),
    /// Something is already at the socket's path.
    #[error("{0} already exists: remove it if no lull serves it, or choose another path")]
    SocketExists(PathBuf),
    /// A host resource (eventfd, epoll, thread, signal handler) could not be created.
    #[error("Cannot create {what}: {source}")]
    Host {
        /// What.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// The API server's seccomp filter could not be built or installed.
    #[error("Cannot filter the API server's system calls: {0}")]
    Seccomp(#[source] crate::host::seccomp::SeccompError),
    /// The connection failed while the request was read or the response written.
    #[error("API connection: {0}")]
    Connection(#[source] std::io::Error),
    /// The client closed the connection before its request was complete.
    #[error("The client hung up before its request was complete")]
    HungUp,
    /// The server was full when the connection came (every one of its connections was in the
    /// middle of a request): the request was read and not carried out.
    #[error(
        "The API server has too many connections: lull serves {} at once and each is busy; \
         the request was not carried out, send it again",
        limits::MAX_CONNECTIONS
    )]
    TooManyConnections,
    /// The request did not arrive whole in time.
    #[error("The request was not complete within {} s", limits::REQUEST_TIMEOUT.as_secs())]
    Timeout,
    /// The request is not HTTP/1.x.
    #[error("Malformed HTTP request: {0}")]
    Malformed(httparse::Error),
    /// The request is HTTP but breaks a rule of this server.
    #[error("Bad request: {0}")]
    BadRequest(&'static str),
    /// The request's head (request line and headers) is too long.
    #[error("The request head exceeds {} bytes", limits::MAX_HEAD)]
    HeadTooLarge,
    /// The request's body is too long.
    #[error("The request body of {0} bytes exceeds {max} bytes", max = limits::MAX_BODY)]
    BodyTooLarge(u64),
    /// A transfer coding (chunked) was asked for.
    #[error("Transfer-Encoding is not supported: send the body with a Content-Length")]
    TransferEncoding,
    /// No such endpoint.
    #[error("Unknown endpoint {0}: see docs/API.md")]
    NotFound(String),
    /// The endpoint exists but does not take this method.
    #[error("{endpoint} does not take {method}: use {allowed}")]
    MethodNotAllowed {
        /// The endpoint.
        endpoint: &'static str,
        /// The request's method.
        method: String,
        /// The methods it takes.
        allowed: &'static str,
    },
    /// A body was sent to an endpoint that takes none.
    #[error("{0} takes no request body")]
    UnexpectedBody(&'static str),
    /// The body is not JSON at all.
    #[error("The body of {endpoint} is not valid JSON: {source}")]
    NotJson {
        /// The endpoint.
        endpoint: &'static str,
        /// Where and why the JSON breaks.
        source: serde_json::Error,
    },
    /// The body is JSON but not the object the endpoint takes.
    #[error("{endpoint} takes a JSON object as its body ({what}), not {found}")]
    BodyNotObject {
        /// The endpoint.
        endpoint: &'static str,
        /// What the object is.
        what: &'static str,
        /// What the body is instead ("an array", "a number", ...).
        found: &'static str,
    },
    /// `vm.create` without a body.
    #[error("vm.create needs the VM configuration (the JSON of --config) as its body")]
    MissingConfig,
    /// The `vm.create` body is not a VM configuration.
    #[error("The body is not a VM configuration: {0}")]
    ConfigJson(#[source] serde_json::Error),
    /// The configuration is out of range.
    #[error("The VM configuration is not valid: {0}")]
    ConfigInvalid(#[source] ConfigError),
    /// The body is Cloud Hypervisor's `VmConfig` and asks for what lull does not have.
    #[error("The body is Cloud Hypervisor's VmConfig, and lull cannot take it as it is")]
    ChConfig(#[source] crate::config::ch::ChError),
    /// The `vm.add-net` body is Cloud Hypervisor's `NetConfig` and asks for what lull does not
    /// have.
    #[error("The body is Cloud Hypervisor's NetConfig, and lull cannot take it as it is")]
    ChNet(#[source] crate::config::ch::ChError),
    /// The `vm.restore` body is Cloud Hypervisor's `RestoreConfig` and asks for what lull does
    /// not have.
    #[error("The body is Cloud Hypervisor's RestoreConfig, and lull cannot take it as it is")]
    ChRestore(#[source] crate::config::ch::ChError),
    /// The configuration names a kernel, initramfs, disk, tap or path lull cannot use.
    #[error("The VM configuration cannot be used")]
    ConfigInputs(#[source] VmError),
    /// The VM has not been created (`vm.create`).
    #[error("The VM is not created")]
    VmNotCreated,
    /// `vm.create` when a VM exists.
    #[error("The VM is already created")]
    VmAlreadyCreated,
    /// `vm.restore` when a VM exists.
    #[error("The VM is already created: vm.delete it before vm.restore")]
    RestoreOverVm,
    /// The VM has not been booted (`vm.boot`).
    #[error("The VM is not booted")]
    VmNotBooted,
    /// `vm.boot` when the VM runs.
    #[error("The VM is already booted")]
    VmAlreadyBooted,
    /// `vm.shutdown` when the VM has already stopped.
    #[error("The VM is not running: it has stopped")]
    VmNotRunning,
    /// `vm.add-net` once the VM has booted.
    #[error("lull adds a net only before vm.boot (no hotplug): vm.delete, vm.create, vm.add-net, vm.boot")]
    AddNetAfterBoot,
    /// `vm.add-net` with neither a tap name nor an fd.
    #[error(
        "vm.add-net needs a tap: name it (\"tap\") or send its fd with the request (SCM_RIGHTS)"
    )]
    AddNetNoTap,
    /// `vm.add-net` with fd numbers in its body and none sent with the request.
    #[error("vm.add-net: lull takes a tap fd only sent with the request (SCM_RIGHTS), never a number in the body")]
    AddNetBodyFds,
    /// `vm.add-net` with more than one fd.
    #[error("vm.add-net: lull takes one tap fd (one queue pair) per device; {0} were sent")]
    AddNetFds(String),
    /// The fd sent with `vm.add-net` is not a usable tap.
    #[error("vm.add-net: the fd sent is not a usable tap")]
    AddNetFd(#[source] crate::host::sys::tap::TapError),
    /// `vm.restore` with another count of fds sent than its `net_fds` names.
    #[error(
        "vm.restore: net_fds names {want} fd(s) and {sent} were sent with the request: send \
         one tap fd (SCM_RIGHTS) for each net listed, in the order listed"
    )]
    RestoreNetFds {
        /// The fds `net_fds` names.
        want: usize,
        /// The fds sent, as [`SentFds::said`](crate::host::sys::scm::SentFds::said) says.
        sent: String,
    },
    /// A `net_fds` that names no net, or one net twice, or too many fds for one.
    #[error("vm.restore: {0}")]
    RestoreNets(crate::config::restore_nets::RestoreNetsError),
    /// An fd given in `net_fds` that is not a usable tap.
    #[error("vm.restore: the fd given for {id} is not a usable tap")]
    RestoreNetFd {
        /// The net's id.
        id: String,
        /// Why.
        #[source]
        source: crate::host::sys::tap::TapError,
    },
    /// `vm.power-button`: lull's machine has no ACPI.
    #[error(
        "lull's machine has no ACPI power button, so the guest cannot be asked to power off: \
         use vm.shutdown (lull stops the VM), or have the guest power off itself"
    )]
    NoPowerButton,
    /// `vm.boot` after the VM ran and stopped.
    #[error("The VM has already run: vm.delete it and vm.create another, or start another lull")]
    VmAlreadyRan,
    /// The VM could not be built or started.
    #[error("Cannot boot the VM")]
    Boot(#[source] VmError),
    /// The VM failed while it ran; it has no report.
    #[error("The VM failed while it ran")]
    RunFailed(#[source] Arc<VmError>),
    /// The VM did not stop in time after a stop request.
    #[error("The VM did not stop within {} s of the stop request", limits::STOP_TIMEOUT.as_secs())]
    StopTimeout,
    /// The VM thread ended without saying how (a lull bug).
    #[error("The VM thread ended without a result")]
    RunnerLost,
    /// `vm.pause` or `vm.resume` refused or failed (paused twice, not paused, a vCPU that
    /// did not stop).
    #[error("Cannot {action} the VM")]
    Pause {
        /// `pause` or `resume`.
        action: &'static str,
        /// Why.
        source: crate::vm::pause_resume::PauseError,
    },
    /// The `vm.snapshot` or `vm.restore` body is not the object the endpoint takes.
    #[error("vm.snapshot takes {{\"destination_url\": \"file:///DIR\"}} and vm.restore {{\"source_url\": \"file:///DIR\"}}: {0}")]
    SnapshotJson(#[source] serde_json::Error),
    /// The destination is not a `file:///DIR` URL.
    #[error("Bad snapshot destination")]
    SnapshotUrl(#[source] crate::config::SnapshotUrlError),
    /// The snapshot could not be restored (read, refused, or built).
    #[error("Cannot restore the VM")]
    Restore(#[source] VmError),
    /// The snapshot could not be taken.
    #[error("Cannot snapshot the VM")]
    Snapshot(#[source] crate::vm::snapshot::TakeError),
    /// A response body could not be encoded (a lull bug).
    #[error("Cannot encode the response: {0}")]
    Encode(#[source] serde_json::Error),
}

impl ApiError {
    /// The HTTP status this error is answered with (Cloud Hypervisor's choices).
    pub fn status(&self) -> u16 {
        match self {
            Self::Malformed(_)
            | Self::BadRequest(_)
            | Self::UnexpectedBody(_)
            | Self::NotJson { .. }
            | Self::BodyNotObject { .. }
            | Self::MissingConfig
            | Self::ConfigJson(_)
            | Self::ConfigInvalid(_)
            | Self::ChConfig(_)
            | Self::ChNet(_)
            | Self::ChRestore(_)
            | Self::AddNetNoTap
            | Self::AddNetBodyFds
            | Self::AddNetFds(_)
            | Self::AddNetFd(_)
            | Self::RestoreNetFds { .. }
            | Self::RestoreNets(_)
            | Self::RestoreNetFd { .. }
            | Self::ConfigInputs(_)
            | Self::SnapshotJson(_)
            | Self::SnapshotUrl(_) => 400,
            // Cloud Hypervisor's API description: "The VM instance could not be restored
            // because it is already created" is 404.
            Self::NotFound(_) | Self::VmNotCreated | Self::RestoreOverVm => 404,
            // Cloud Hypervisor's API description: "The VM instance could not resume because it
            // is not paused" is 405.
            Self::Pause {
                source: crate::vm::pause_resume::PauseError::NotPaused,
                ..
            } => 405,
            Self::MethodNotAllowed { .. }
            | Self::VmNotBooted
            | Self::VmNotRunning
            | Self::AddNetAfterBoot
            | Self::NoPowerButton => 405,
            Self::Timeout => 408,
            Self::BodyTooLarge(_) => 413,
            Self::HeadTooLarge => 431,
            Self::TransferEncoding => 501,
            Self::TooManyConnections => 503,
            Self::Socket { .. }
            | Self::SocketExists(_)
            | Self::Inherited(_)
            | Self::Host { .. }
            | Self::Seccomp(_)
            | Self::Connection(_)
            | Self::HungUp
            | Self::VmAlreadyCreated
            | Self::VmAlreadyBooted
            | Self::VmAlreadyRan
            | Self::Boot(_)
            | Self::RunFailed(_)
            | Self::StopTimeout
            | Self::RunnerLost
            | Self::Pause { .. }
            | Self::Snapshot(_)
            | Self::Restore(_)
            | Self::Encode(_) => 500,
        }
    }

    /// lull's exit status when the API cannot be served at all (see [`crate::exit_code`]).
    pub fn exit_status(&self) -> i32 {
        match self {
            Self::Socket { .. }
            | Self::SocketExists(_)
            | Self::Inherited(_)
            | Self::RestoreNetFds { .. }
            | Self::RestoreNets(_)
            | Self::RestoreNetFd { .. } => crate::exit_code::BAD_INPUT,
            // A snapshot refused at start (`--restore`): as `lull run --restore` says it.
            Self::Restore(e) => crate::exit_code::for_vm_error(e),
            _ => crate::exit_code::VMM_FAILURE,
        }
    }

    /// The error and its causes, each said once (a cause already quoted by the message above
    /// it is left out): the body of an error response.
    pub fn messages(&self) -> Vec<String> {
        let mut out: Vec<String> = vec![self.to_string()];
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            let text = s.to_string();
            if !out.iter().any(|m| m.contains(&text)) {
                out.push(text);
            }
            source = s.source();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_name_each_cause_once() {
        let quoted = ApiError::ConfigInvalid(ConfigError::Cpus(0));
        assert_eq!(quoted.messages().len(), 1, "{:?}", quoted.messages());
        let chained = ApiError::Boot(VmError::Host {
            what: "the stop eventfd",
            source: std::io::Error::from_raw_os_error(libc::EMFILE),
        });
        let messages = chained.messages();
        assert_eq!(messages[0], "Cannot boot the VM");
        assert!(messages[1].starts_with("Cannot create the stop eventfd"));
        assert_eq!(messages.len(), 2, "{messages:?}");
    }

    #[test]
    fn state_errors_answer_as_cloud_hypervisor_does() {
        assert_eq!(ApiError::VmNotCreated.status(), 404);
        assert_eq!(ApiError::VmNotBooted.status(), 405);
        assert_eq!(ApiError::VmAlreadyCreated.status(), 500);
        assert_eq!(ApiError::RestoreOverVm.status(), 404);
        let pause = |source| ApiError::Pause {
            action: "pause",
            source,
        };
        assert_eq!(
            pause(crate::vm::pause_resume::PauseError::NotPaused).status(),
            405
        );
        assert_eq!(
            pause(crate::vm::pause_resume::PauseError::AlreadyPaused).status(),
            500
        );
        assert_eq!(ApiError::NotFound("/x".into()).status(), 404);
    }

    #[test]
    fn a_snapshot_refused_at_start_ends_lull_as_lull_run_does() {
        let refused = VmError::Snapshot(crate::snapshot::SnapshotError::VcpuFileName("x".into()));
        assert_eq!(
            ApiError::Restore(refused).exit_status(),
            crate::exit_code::BAD_INPUT
        );
        assert_eq!(
            ApiError::RunnerLost.exit_status(),
            crate::exit_code::VMM_FAILURE
        );
    }
}
