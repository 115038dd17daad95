//! The endpoints: which paths exist under `/api/v1/`, which methods each takes, and what its
//! body must be (an endpoint that takes one takes a JSON object: an array or a scalar is a
//! 400 that says so, never read as something else). [`route`] turns a parsed request into an [`ApiRequest`] or the error the
//! client gets; [`decode`] does the whole way from bytes (the `api` fuzz target's entry).

use super::error::ApiError;
use super::http::{self, Request};
use crate::config::ch::json as ch;
use crate::config::ch::restore::ChRestore;
use crate::config::VmConfig;

/// Where every endpoint lives.
pub const ROOT: &str = "/api/v1/";

/// What a client asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiRequest {
    /// `vmm.ping`: is lull there, and which version.
    VmmPing,
    /// `vmm.shutdown`: stop the VM if it runs, then end lull.
    VmmShutdown,
    /// `vm.create`: remember this (validated) configuration.
    VmCreate(Box<VmConfig>),
    /// `vm.create` with Cloud Hypervisor's `VmConfig`: lull's configuration mapped from it,
    /// and the body as given (`vm.info` answers with it).
    VmCreateCh(Box<VmConfig>, Box<serde_json::Value>),
    /// `vm.boot`: build and start the created VM.
    VmBoot,
    /// `vm.info`: the VM's state and configuration.
    VmInfo,
    /// `vm.counters`: the `--metrics` report, live while the VM runs.
    VmCounters,
    /// `vm.shutdown`: stop the running VM.
    VmShutdown,
    /// `vm.delete`: drop the VM (stopping it if it runs); a new `vm.create` may follow.
    VmDelete,
    /// `vm.reboot`: stop the running VM and boot it again with the same configuration.
    VmReboot,
    /// `vm.power-button`: refused, lull's machine has no ACPI power button.
    VmPowerButton,
    /// `vm.add-net` (before boot): a virtio-net device on a named tap or on the tap fd sent
    /// with the request.
    VmAddNet(Box<ch::AddNet>),
    /// `vm.pause`: stop every vCPU, and the guest's time with them.
    VmPause,
    /// `vm.resume`: run a paused VM again.
    VmResume,
    /// `vm.snapshot`: write the paused VM to this directory (`file:///DIR`).
    VmSnapshot(std::path::PathBuf),
    /// `vm.restore`: build the VM of the snapshot in `dir`, paused unless `resume`.
    VmRestore(ChRestore),
}

/// The endpoints, the methods each takes (as the `Allow` header lists them) and the request
/// it makes (`None`: built from the body, for `vm.create`).
const ENDPOINTS: [(&str, &str, Option<ApiRequest>); 15] = [
    ("vmm.ping", "GET, PUT", Some(ApiRequest::VmmPing)),
    ("vmm.shutdown", "PUT", Some(ApiRequest::VmmShutdown)),
    ("vm.create", "PUT", None),
    ("vm.boot", "PUT", Some(ApiRequest::VmBoot)),
    ("vm.info", "GET", Some(ApiRequest::VmInfo)),
    ("vm.counters", "GET", Some(ApiRequest::VmCounters)),
    ("vm.shutdown", "PUT", Some(ApiRequest::VmShutdown)),
    ("vm.delete", "PUT", Some(ApiRequest::VmDelete)),
    ("vm.reboot", "PUT", Some(ApiRequest::VmReboot)),
    ("vm.power-button", "PUT", Some(ApiRequest::VmPowerButton)),
    ("vm.add-net", "PUT", None),
    ("vm.pause", "PUT", Some(ApiRequest::VmPause)),
    ("vm.resume", "PUT", Some(ApiRequest::VmResume)),
    ("vm.snapshot", "PUT", None),
    ("vm.restore", "PUT", None),
];

/// The request `req` makes, or why it cannot be served.
pub fn route(req: &Request) -> Result<ApiRequest, ApiError> {
    let (name, allowed, request) = req
        .path
        .strip_prefix(ROOT)
        .and_then(|name| ENDPOINTS.into_iter().find(|(n, _, _)| *n == name))
        .ok_or_else(|| ApiError::NotFound(req.path.clone()))?;
    if !allowed.split(", ").any(|m| m == req.method) {
        return Err(ApiError::MethodNotAllowed {
            endpoint: name,
            method: req.method.clone(),
            allowed,
        });
    }
    match request {
        None if name == "vm.add-net" => add_net(&req.body),
        None if name == "vm.snapshot" => snapshot(&req.body),
        None if name == "vm.restore" => restore(&req.body),
        None => create(&req.body),
        Some(_) if !req.body.is_empty() => Err(ApiError::UnexpectedBody(name)),
        Some(request) => Ok(request),
    }
}

/// `vm.create`: the body is the JSON of `--config`, or Cloud Hypervisor's `VmConfig` (told
/// apart by its fields: `config::ch::json`), checked as the command line is.
fn create(body: &[u8]) -> Result<ApiRequest, ApiError> {
    if body.is_empty() {
        return Err(ApiError::MissingConfig);
    }
    let fields = json_object(body, "vm.create", "the VM configuration, as in --config")?;
    if ch::is_ch_shape(&fields) {
        let (cfg, notes) = ch::to_config(&fields).map_err(ApiError::ChConfig)?;
        for note in notes {
            tracing::info!("vm.create: accepted without effect: {note}");
        }
        let given = serde_json::Value::Object(fields);
        return Ok(ApiRequest::VmCreateCh(Box::new(cfg), Box::new(given)));
    }
    // Valid JSON (checked above), so any error here is about the configuration's fields.
    let cfg: VmConfig = serde_json::from_slice(body).map_err(ApiError::ConfigJson)?;
    cfg.validate().map_err(ApiError::ConfigInvalid)?;
    Ok(ApiRequest::VmCreate(Box::new(cfg)))
}

/// `vm.add-net`: the body is Cloud Hypervisor's `NetConfig`.
fn add_net(body: &[u8]) -> Result<ApiRequest, ApiError> {
    let fields = json_object(body, "vm.add-net", "Cloud Hypervisor's NetConfig")?;
    let net = ch::add_net(&fields).map_err(ApiError::ChNet)?;
    Ok(ApiRequest::VmAddNet(Box::new(net)))
}

/// `vm.snapshot`: the body names the directory, `{"destination_url": "file:///DIR"}` (Cloud
/// Hypervisor's `VmSnapshotConfig`).
fn snapshot(body: &[u8]) -> Result<ApiRequest, ApiError> {
    dir_body(body, "vm.snapshot", "destination_url").map(ApiRequest::VmSnapshot)
}

/// `vm.restore`: the body is Cloud Hypervisor's `RestoreConfig`, `{"source_url":
/// "file:///DIR"}` and, as its clients send them, `prefault`, `memory_restore_mode`, `resume`,
/// `net_fds`... (`config::ch::restore` says which lull honours, accepts or refuses).
fn restore(body: &[u8]) -> Result<ApiRequest, ApiError> {
    let fields = json_object(body, "vm.restore", "Cloud Hypervisor's RestoreConfig")?;
    let (restore, notes) = ch::restore(&fields).map_err(ApiError::ChRestore)?;
    for note in notes {
        tracing::info!("vm.restore: accepted without effect: {note}");
    }
    Ok(ApiRequest::VmRestore(restore))
}

/// A body that is the object `{field: "file:///DIR"}` and nothing else: the directory.
fn dir_body(
    body: &[u8],
    endpoint: &'static str,
    field: &'static str,
) -> Result<std::path::PathBuf, ApiError> {
    json_object(body, endpoint, "{\"...\": \"file:///DIR\"}")?;
    let mut fields: std::collections::BTreeMap<String, String> =
        serde_json::from_slice(body).map_err(ApiError::SnapshotJson)?;
    let url = fields
        .remove(field)
        .filter(|_| fields.is_empty())
        .ok_or_else(|| {
            ApiError::SnapshotJson(<serde_json::Error as serde::de::Error>::custom(format!(
                "{endpoint} takes exactly one field, {field}"
            )))
        })?;
    crate::config::dir_of_url(&url).map_err(ApiError::SnapshotUrl)
}

/// The body as a JSON object, checked before anything reads fields from it (serde would read
/// a struct from an array too, field by field in order, and a struct's decoder stops at its
/// first unknown field before it reaches a syntax error further on): a body that is not JSON
/// is answered with where it breaks, JSON that is not an object with what `endpoint` takes
/// (`what`).
fn json_object(
    body: &[u8],
    endpoint: &'static str,
    what: &'static str,
) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|source| ApiError::NotJson { endpoint, source })?;
    let found = match value {
        serde_json::Value::Object(fields) => return Ok(fields),
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Null => "null",
    };
    Err(ApiError::BodyNotObject {
        endpoint,
        what,
        found,
    })
}

/// The request in `bytes`: `None` if they hold only part of one.
pub fn decode(bytes: &[u8]) -> Result<Option<ApiRequest>, ApiError> {
    http::parse(bytes)?.as_ref().map(route).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{MemoryRestore, MemoryRestoreMode};

    fn request(method: &str, path: &str, body: &str) -> Request {
        Request {
            method: method.into(),
            path: path.into(),
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn every_endpoint_routes_with_its_methods() {
        assert_eq!(
            route(&request("GET", "/api/v1/vmm.ping", "")).unwrap(),
            ApiRequest::VmmPing
        );
        assert_eq!(
            route(&request("PUT", "/api/v1/vmm.ping", "")).unwrap(),
            ApiRequest::VmmPing
        );
        for (path, method, want) in [
            ("vmm.shutdown", "PUT", ApiRequest::VmmShutdown),
            ("vm.boot", "PUT", ApiRequest::VmBoot),
            ("vm.info", "GET", ApiRequest::VmInfo),
            ("vm.counters", "GET", ApiRequest::VmCounters),
            ("vm.shutdown", "PUT", ApiRequest::VmShutdown),
            ("vm.delete", "PUT", ApiRequest::VmDelete),
            ("vm.reboot", "PUT", ApiRequest::VmReboot),
            ("vm.power-button", "PUT", ApiRequest::VmPowerButton),
            ("vm.pause", "PUT", ApiRequest::VmPause),
            ("vm.resume", "PUT", ApiRequest::VmResume),
        ] {
            let path = format!("{ROOT}{path}");
            assert_eq!(route(&request(method, &path, "")).unwrap(), want);
            let other = if method == "GET" { "PUT" } else { "GET" };
            let err = route(&request(other, &path, "")).unwrap_err();
            assert_eq!(err.status(), 405, "{other} {path}: {err}");
        }
    }

    #[test]
    fn create_takes_a_valid_config() {
        let path = "/api/v1/vm.create";
        let Ok(ApiRequest::VmCreate(cfg)) = route(&request("PUT", path, r#"{"cpus": 2}"#)) else {
            panic!("vm.create with a config should route");
        };
        assert_eq!(cfg.cpus, 2);
        for body in ["[]", "[2]", "2", "\"x\"", "true", "null"] {
            let err = route(&request("PUT", path, body)).unwrap_err();
            assert!(
                matches!(err, ApiError::BodyNotObject { .. }),
                "{body}: {err}"
            );
            assert_eq!(err.status(), 400);
            assert!(err.to_string().contains("takes a JSON object"), "{err}");
        }
        for (body, status) in [
            ("", 400),
            ("{", 400),
            (r#"{"cpu": 2}"#, 400),
            (r#"{"cpus": 0}"#, 400),
        ] {
            let err = route(&request("PUT", path, body)).unwrap_err();
            assert_eq!(err.status(), status, "{body:?}: {err}");
        }
    }

    #[test]
    fn create_takes_cloud_hypervisor_s_config_and_names_what_it_refuses() {
        let path = "/api/v1/vm.create";
        let body = r#"{"payload": {"kernel": "/k"}, "cpus": {"boot_vcpus": 2, "max_vcpus": 2},
            "memory": {"size": 134217728, "shared": true}, "console": {"mode": "Off"}}"#;
        let Ok(ApiRequest::VmCreateCh(cfg, given)) = route(&request("PUT", path, body)) else {
            panic!("Cloud Hypervisor's VmConfig should route");
        };
        assert_eq!((cfg.cpus, cfg.memory.0), (2, 128 << 20));
        assert_eq!(given["cpus"]["boot_vcpus"], 2);
        let Ok(ApiRequest::VmAddNet(net)) = route(&request(
            "PUT",
            "/api/v1/vm.add-net",
            r#"{"mac": "52:54:00:00:00:05", "num_queues": 2, "fds": [9]}"#,
        )) else {
            panic!("vm.add-net should route");
        };
        assert_eq!((net.tap, net.body_fds), (None, true));
        let err = route(&request("PUT", "/api/v1/vm.add-net", r#"{"mtu": 9000}"#)).unwrap_err();
        assert_eq!(err.status(), 400);
        let refused = r#"{"payload": {"kernel": "/k"}, "vsock": {"cid": 3, "socket": "/v"}}"#;
        let err = route(&request("PUT", path, refused)).unwrap_err();
        assert_eq!(err.status(), 400);
        let messages = err.messages();
        assert_eq!(messages.len(), 2, "{messages:?}");
        assert!(messages[1].contains("vsock="), "{messages:?}");
    }

    /// A body cut short is answered with where its JSON breaks, whichever endpoint it is for,
    /// not with a complaint about a field before the break.
    #[test]
    fn a_body_that_is_not_json_is_answered_with_the_json_error() {
        for (endpoint, body) in [
            ("vm.create", r#"{"payload": {"kernel": "/k"}, "cpus": "#),
            ("vm.create", r#"{"cpus": 2, "kernel": "/k"#),
            ("vm.add-net", r#"{"tap": "t0", "mac": "#),
            ("vm.restore", r#"{"source_url": "file:///s""#),
            ("vm.snapshot", "{"),
        ] {
            let path = format!("{ROOT}{endpoint}");
            let err = route(&request("PUT", &path, body)).unwrap_err();
            let text = err.messages().join(" / ");
            assert!(matches!(err, ApiError::NotJson { .. }), "{body}: {text}");
            assert_eq!(err.status(), 400);
            assert!(text.contains(endpoint), "{text}");
            assert!(text.contains("EOF while parsing"), "{text}");
            assert!(!text.contains("unknown field"), "{text}");
        }
    }

    /// Each endpoint's refusal names the body it takes: NetConfig, RestoreConfig, VmConfig.
    #[test]
    fn a_refused_body_is_named_as_its_endpoint_s() {
        for (endpoint, body, named) in [
            ("vm.add-net", r#"{"mtu": 9000}"#, "NetConfig"),
            (
                "vm.restore",
                r#"{"source_url": "file:///s", "memory_restore_mode": "lazy"}"#,
                "RestoreConfig",
            ),
            (
                "vm.create",
                r#"{"payload": {"kernel": "/k"}, "vsock": {"cid": 3, "socket": "/v"}}"#,
                "VmConfig",
            ),
        ] {
            let path = format!("{ROOT}{endpoint}");
            let err = route(&request("PUT", &path, body)).unwrap_err();
            let first = &err.messages()[0];
            assert_eq!(err.status(), 400);
            assert!(first.contains(named), "{endpoint}: {first}");
            if named != "VmConfig" {
                assert!(!first.contains("VmConfig"), "{endpoint}: {first}");
            }
        }
    }

    #[test]
    fn snapshot_takes_a_file_url() {
        let path = "/api/v1/vm.snapshot";
        let body = r#"{"destination_url": "file:///tmp/s"}"#;
        assert_eq!(
            route(&request("PUT", path, body)).unwrap(),
            ApiRequest::VmSnapshot("/tmp/s".into())
        );
        let restore = r#"{"source_url": "file:///tmp/s"}"#;
        let paused = ChRestore {
            dir: "/tmp/s".into(),
            resume: false,
            memory: MemoryRestore::default(),
            nets: Vec::new(),
            serial: None,
        };
        assert_eq!(
            route(&request("PUT", "/api/v1/vm.restore", restore)).unwrap(),
            ApiRequest::VmRestore(paused.clone())
        );
        // As Cloud Hypervisor, a RestoreConfig that names no mode is the default, which is
        // lull's mapping; ch-remote names Copy, and gets a copy.
        // What `ch-remote restore source_url=file:///tmp/s` sends: the whole RestoreConfig.
        let ch_remote = r#"{"source_url": "file:///tmp/s", "prefault": false,
            "memory_restore_mode": "Copy", "net_fds": null, "resume": false}"#;
        assert_eq!(
            route(&request("PUT", "/api/v1/vm.restore", ch_remote)).unwrap(),
            ApiRequest::VmRestore(ChRestore {
                memory: MemoryRestore {
                    mode: MemoryRestoreMode::Copy,
                    prefault: false
                },
                ..paused
            })
        );
        let resumed = r#"{"source_url": "file:///tmp/s", "resume": true}"#;
        assert_eq!(
            route(&request("PUT", "/api/v1/vm.restore", resumed)).unwrap(),
            ApiRequest::VmRestore(ChRestore {
                dir: "/tmp/s".into(),
                resume: true,
                memory: MemoryRestore::default(),
                nets: Vec::new(),
                serial: None,
            })
        );
        // net_fds as Cloud Hypervisor's clients send it: counts, the fds with the request.
        let with_fds =
            r#"{"source_url": "file:///tmp/s", "net_fds": [{"id": "net0", "fds": [3]}]}"#;
        let Ok(ApiRequest::VmRestore(got)) = route(&request("PUT", "/api/v1/vm.restore", with_fds))
        else {
            panic!("{with_fds}");
        };
        assert_eq!(
            got.nets,
            [crate::config::ch::restore::RestoredNet {
                id: "net0".into(),
                fds: crate::config::ch::restore::NetFds::Sent(1),
            }]
        );
        for bad in [
            r#"{"source_url": "/tmp/s"}"#,
            r#"{"source_url": "file:///tmp/s", "memory_restore_mode": "Lazy"}"#,
            r#"{"source_url": "file:///tmp/s", "net_fds": [{"id": "net0", "fds": [3, 4]}]}"#,
            r#"{"source_url": "file:///tmp/s", "net_fds": "[net0@[3]]"}"#,
            r#"{"source_url": "file:///tmp/s", "extra": 1}"#,
            r#"{"prefault": true}"#,
            "[]",
        ] {
            let err = route(&request("PUT", "/api/v1/vm.restore", bad)).unwrap_err();
            assert_eq!(err.status(), 400, "{bad}: {err}");
        }
        for bad in [
            "",
            "[]",
            r#"{"destination_url": "/tmp/s"}"#,
            r#"{"destination_url": 5}"#,
            r#"{"url": "file:///tmp/s"}"#,
        ] {
            let err = route(&request("PUT", path, bad)).unwrap_err();
            assert_eq!(err.status(), 400, "{bad}: {err}");
        }
    }

    #[test]
    fn unknown_paths_and_stray_bodies_are_refused() {
        for path in [
            "/",
            "/api/v1/",
            "/api/v1/vm.resize",
            "/api/v2/vm.info",
            "vm.info",
        ] {
            assert_eq!(route(&request("GET", path, "")).unwrap_err().status(), 404);
        }
        let err = route(&request("PUT", "/api/v1/vm.boot", "{}")).unwrap_err();
        assert!(matches!(err, ApiError::UnexpectedBody("vm.boot")), "{err}");
    }

    #[test]
    fn decode_goes_from_bytes_to_a_request() {
        let raw = b"GET /api/v1/vm.info HTTP/1.1\r\nHost: localhost\r\n\r\n";
        assert_eq!(decode(raw).unwrap(), Some(ApiRequest::VmInfo));
        assert_eq!(decode(&raw[..10]).unwrap(), None);
    }
}
