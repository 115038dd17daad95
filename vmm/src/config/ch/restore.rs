//! Cloud Hypervisor's `RestoreConfig`: the body its clients (`ch-remote restore`, libvirt's
//! ch driver) send to `vm.restore`, and the value of its `--restore` flag
//! (`source_url=file:///DIR,prefault=on,resume=true`). Both become a list of [`Opt`]s and
//! go through [`restore`], so a field and its flag option are honoured, accepted or refused
//! alike:
//!
//! | option | lull |
//! |---|---|
//! | `source_url` | honoured: a `file:///DIR` URL, the snapshot's directory |
//! | `resume` | honoured: the restored VM runs at once instead of waiting, paused, for `vm.resume` |
//! | `prefault` | honoured: every page of the snapshot is read in at restore (a mapping is populated; a copy reads every page of data anyway) |
//! | `memory_restore_mode` | honoured: `copy` copies the snapshot's memory in; `ondemand`, and no `memory_restore_mode` at all, map it copy-on-write (pages come from the file when first touched, shared by the VMs restored from one snapshot: `snapshot::mapped`) |
//! | `net_fds` | honoured: each listed net of the snapshot (`netN` or `_netN`: the N-th, `config::restore_nets`) is attached to the tap fd given for it instead of the tap the snapshot names, its MAC and device state kept. In `vm.restore`'s body (`[{"id": "net0", "num_fds": 1}]`) the fds are those sent with the request (`SCM_RIGHTS`), in order; in `--restore` (`net_fds=[net0@[N]]`) they are lull's own (inherited) fds. One fd per net (one queue pair) |
//! | `vfio_fds`, `zone_updates` | accepted empty; refused otherwise (no VFIO, no memory zones) |
//! | `iommufd_fd` | refused (no VFIO) |
//! | `serial` | lull's own: where the restored VM's console goes (`stdio`, `off`, `file=PATH`, `pty`); a snapshot's own console file is its saving run's output and is not reused unless given here |

use std::path::PathBuf;

use super::options::Opt;
use super::ChError;
use crate::config::restore_nets::RestoreNetsError;
use crate::config::{ConfigError, MemoryRestore, MemoryRestoreMode};

/// Where a `RestoreConfig` was read from, which says where its `net_fds` are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Front {
    /// `vm.restore`'s JSON body: the fds come with the request (`SCM_RIGHTS`); numbers in
    /// the body mean nothing in lull's process and are ignored.
    Api,
    /// `--restore`: the fds are lull's own, inherited by number.
    Flag,
}

/// The fds one `net_fds` entry gives its net.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetFds {
    /// This many, sent with the `vm.restore` request (after the previous entries' fds).
    Sent(usize),
    /// lull's own descriptors (`--restore ...,net_fds=[net0@[N]]`).
    Inherited(Vec<i32>),
}

/// One `net_fds` entry: a net of the snapshot (`netN`, `_netN`) and its new tap fds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoredNet {
    /// The net's id as given.
    pub id: String,
    /// Its fds.
    pub fds: NetFds,
}

/// What a `RestoreConfig` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChRestore {
    /// The snapshot's directory (`source_url`).
    pub dir: PathBuf,
    /// Run the VM once restored (`resume`); otherwise it waits, paused, for `vm.resume`.
    pub resume: bool,
    /// How its memory is restored (`memory_restore_mode`, `prefault`).
    pub memory: MemoryRestore,
    /// Nets given new tap fds (`net_fds`), in the order given.
    pub nets: Vec<RestoredNet>,
    /// Where the restored VM's console goes (`serial`, lull's own option); `None`: the
    /// default, never the snapshot's console file.
    pub serial: Option<crate::config::SerialMode>,
}

/// Maps a `RestoreConfig`'s options read from `front`; `notes` gets what is accepted without
/// effect.
pub fn restore(opts: &[Opt], front: Front, notes: &mut Vec<String>) -> Result<ChRestore, ChError> {
    let mut dir = None;
    let mut nets = Vec::new();
    let mut resume = false;
    let mut memory = MemoryRestore::default();
    let mut serial = None;
    for o in opts {
        match o.key.as_str() {
            "source_url" => {
                let url = crate::config::dir_of_url(&o.value)
                    .map_err(|_| o.bad("a file:///DIR URL (an absolute path)"))?;
                dir = Some(url);
            }
            "resume" => resume = o.toggle()?,
            "serial" => {
                serial = Some(
                    o.value
                        .parse()
                        .map_err(|_| o.bad("stdio, off, file=PATH or pty"))?,
                );
            }
            "prefault" => memory.prefault = o.toggle()?,
            "memory_restore_mode" => {
                memory.mode = match o.value.as_str() {
                    "copy" | "Copy" => MemoryRestoreMode::Copy,
                    "ondemand" | "OnDemand" => MemoryRestoreMode::Map,
                    _ => return Err(o.bad("copy or ondemand")),
                }
            }
            "net_fds" => nets = net_fds(o, front)?,
            "vfio_fds" | "iommufd_fd" => o.only(&["[]"], "lull has no VFIO passthrough")?,
            "zone_updates" => o.only(&["[]"], "lull has no memory zones")?,
            _ => return Err(o.refuse("not a RestoreConfig option lull knows")),
        }
    }
    if memory.prefault && memory.mode == MemoryRestoreMode::Copy {
        notes.push(
            "prefault with memory_restore_mode=copy: a copy reads every page of data anyway"
                .to_string(),
        );
    }
    Ok(ChRestore {
        dir: dir.ok_or(ChError::Missing("source_url (the snapshot, file:///DIR)"))?,
        resume,
        memory,
        nets,
        serial,
    })
}

/// `net_fds`: `[{"id": "net0", "num_fds": 1, "fds": [..]}]` in a body (the count is
/// `num_fds`, else the length of `fds`), `[net0@[3],net1@[4]]` in `--restore`.
fn net_fds(o: &Opt, front: Front) -> Result<Vec<RestoredNet>, ChError> {
    let nets = match front {
        Front::Api => api_net_fds(o)?,
        Front::Flag => flag_net_fds(o)?,
    };
    for net in &nets {
        let count = match &net.fds {
            NetFds::Sent(n) => *n,
            NetFds::Inherited(fds) => fds.len(),
        };
        if count != 1 {
            return Err(ConfigError::from(RestoreNetsError::FdCount {
                id: net.id.clone(),
                count,
            })
            .into());
        }
    }
    Ok(nets)
}

fn api_net_fds(o: &Opt) -> Result<Vec<RestoredNet>, ChError> {
    let expected = "a list of {\"id\": \"net0\", \"num_fds\": 1} (the fds sent with the request)";
    let bad = || o.bad(expected);
    let entries: Vec<serde_json::Value> = serde_json::from_str(&o.value).map_err(|_| bad())?;
    entries
        .iter()
        .map(|e| {
            let id = e
                .get("id")
                .and_then(serde_json::Value::as_str)
                .ok_or_else(bad)?;
            let listed = match e.get("fds") {
                None | Some(serde_json::Value::Null) => None,
                Some(fds) => Some(fds.as_array().ok_or_else(bad)?.len()),
            };
            let num = match e.get("num_fds") {
                None | Some(serde_json::Value::Null) => None,
                Some(n) => Some(
                    n.as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or_else(bad)?,
                ),
            };
            let count = match (num, listed) {
                (Some(n), Some(l)) if n != l => return Err(bad()),
                (Some(n), _) => n,
                (None, Some(l)) => l,
                (None, None) => 0,
            };
            Ok(RestoredNet {
                id: id.to_string(),
                fds: NetFds::Sent(count),
            })
        })
        .collect()
}

fn flag_net_fds(o: &Opt) -> Result<Vec<RestoredNet>, ChError> {
    let bad = || o.bad("[net0@[FD],net1@[FD]...] (lull's own tap fds)");
    let list = o
        .value
        .strip_prefix('[')
        .and_then(|v| v.strip_suffix(']'))
        .ok_or_else(bad)?;
    let mut nets = Vec::new();
    let mut rest = list.trim();
    while !rest.is_empty() {
        let (id, after) = rest.split_once("@[").ok_or_else(bad)?;
        let (fds, after) = after.split_once(']').ok_or_else(bad)?;
        let fds = fds
            .split(',')
            .filter(|f| !f.trim().is_empty())
            .map(|f| f.trim().parse::<i32>().ok().filter(|fd| *fd >= 0))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(bad)?;
        let id = id.trim();
        if id.is_empty() {
            return Err(bad());
        }
        nets.push(RestoredNet {
            id: id.to_string(),
            fds: NetFds::Inherited(fds),
        });
        rest = after.trim_start();
        if let Some(next) = rest.strip_prefix(',') {
            rest = next.trim_start();
        } else if !rest.is_empty() {
            return Err(bad());
        }
    }
    Ok(nets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ch::options::split;

    fn parsed(text: &str) -> Result<ChRestore, ChError> {
        restore(&split("--restore", text), Front::Flag, &mut Vec::new())
    }

    #[test]
    fn source_url_and_resume_are_honoured() {
        assert_eq!(
            parsed("source_url=file:///s").unwrap(),
            ChRestore {
                dir: "/s".into(),
                resume: false,
                memory: MemoryRestore {
                    mode: MemoryRestoreMode::Map,
                    prefault: false
                },
                nets: Vec::new(),
                serial: None,
            }
        );
        let mut notes = Vec::new();
        let got = restore(
            &split(
                "--restore",
                "source_url=file:///s,prefault=on,resume=true,memory_restore_mode=copy,net_fds=[]",
            ),
            Front::Flag,
            &mut notes,
        )
        .unwrap();
        assert!(got.resume);
        assert_eq!(
            got.memory,
            MemoryRestore {
                mode: MemoryRestoreMode::Copy,
                prefault: true
            }
        );
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].starts_with("prefault with"), "{notes:?}");
        for (mode, want) in [
            ("ondemand", MemoryRestoreMode::Map),
            ("OnDemand", MemoryRestoreMode::Map),
            ("Copy", MemoryRestoreMode::Copy),
        ] {
            let text = format!("source_url=file:///s,memory_restore_mode={mode}");
            assert_eq!(parsed(&text).unwrap().memory.mode, want, "{text}");
        }
        let got = parsed("source_url=file:///s,serial=file=/var/log/console").unwrap();
        assert_eq!(
            got.serial,
            Some(crate::config::SerialMode::File("/var/log/console".into()))
        );
        assert!(parsed("source_url=file:///s,serial=tty").is_err());
    }

    #[test]
    fn what_lull_cannot_do_is_refused_by_name() {
        for (text, named) in [
            ("prefault=on", "source_url"),
            ("source_url=/s", "--restore source_url"),
            ("source_url=tcp://h/s", "--restore source_url"),
            ("source_url=file:///s,resume=maybe", "--restore resume"),
            (
                "source_url=file:///s,memory_restore_mode=lazy",
                "memory_restore_mode=lazy",
            ),
            ("source_url=file:///s,net_fds=[net0@3]", "net_fds=[net0@3]"),
            (
                "source_url=file:///s,net_fds=[net0@[-1]]",
                "net_fds=[net0@[-1]]",
            ),
            (
                "source_url=file:///s,net_fds=[net0@[3]x]",
                "net_fds=[net0@[3]x]",
            ),
            ("source_url=file:///s,net_fds=[@[3]]", "net_fds=[@[3]]"),
            (
                "source_url=file:///s,net_fds=[net0@[3,4]]",
                "'net0' comes with 2 fd(s)",
            ),
            (
                "source_url=file:///s,net_fds=[net0@[]]",
                "'net0' comes with 0 fd(s)",
            ),
            ("source_url=file:///s,iommufd_fd=5", "iommufd_fd=5"),
            ("source_url=file:///s,zone_updates=[z]", "zone_updates=[z]"),
            ("source_url=file:///s,speed=fast", "speed=fast"),
        ] {
            let err = parsed(text).unwrap_err().to_string();
            assert!(err.contains(named), "{text}: {err}");
        }
    }

    #[test]
    fn net_fds_are_read_from_the_flag_as_lulls_own_fds() {
        let got = parsed("source_url=file:///s,net_fds=[net0@[3], _net1@[4]]").unwrap();
        assert_eq!(
            got.nets,
            [
                RestoredNet {
                    id: "net0".into(),
                    fds: NetFds::Inherited(vec![3]),
                },
                RestoredNet {
                    id: "_net1".into(),
                    fds: NetFds::Inherited(vec![4]),
                },
            ]
        );
    }

    /// In a body the fds are counted, never taken by number (a client could name any of
    /// lull's own descriptors): they come with the request.
    #[test]
    fn net_fds_of_a_body_are_counts_of_the_fds_sent() {
        let body = |net_fds: &str| {
            let opt = Opt {
                key: "net_fds".into(),
                name: "vm.restore.net_fds".into(),
                value: net_fds.into(),
            };
            let url = Opt {
                key: "source_url".into(),
                name: "vm.restore.source_url".into(),
                value: "file:///s".into(),
            };
            restore(&[url, opt], Front::Api, &mut Vec::new())
        };
        let sent = |id: &str| RestoredNet {
            id: id.into(),
            fds: NetFds::Sent(1),
        };
        for (value, want) in [
            (
                r#"[{"id": "net0", "num_fds": 1, "fds": [-1]}]"#,
                vec![sent("net0")],
            ),
            (
                r#"[{"id": "net1", "fds": [7]}, {"id": "net0", "num_fds": 1}]"#,
                vec![sent("net1"), sent("net0")],
            ),
            (
                r#"[{"id": "_net0", "num_fds": 1, "fds": null}]"#,
                vec![sent("_net0")],
            ),
        ] {
            assert_eq!(body(value).unwrap().nets, want, "{value}");
        }
        for (value, named) in [
            (
                r#"[{"id": "net0", "num_fds": 2}]"#,
                "'net0' comes with 2 fd(s)",
            ),
            (r#"[{"id": "net0"}]"#, "'net0' comes with 0 fd(s)"),
            (
                r#"[{"id": "net0", "num_fds": 1, "fds": [3, 4]}]"#,
                "vm.restore.net_fds=",
            ),
            (r#"[{"num_fds": 1}]"#, "vm.restore.net_fds="),
            (r#"[net0@[3]]"#, "vm.restore.net_fds="),
            (r#"{"id": "net0"}"#, "vm.restore.net_fds="),
        ] {
            let err = body(value).unwrap_err().to_string();
            assert!(err.contains(named), "{value}: {err}");
        }
    }
}
