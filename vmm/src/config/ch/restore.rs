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
//! | `net_fds`, `vfio_fds`, `zone_updates` | accepted empty; refused otherwise (taps are attached by name; no VFIO, no memory zones) |
//! | `iommufd_fd` | refused (no VFIO) |
//! | `serial` | lull's own: where the restored VM's console goes (`stdio`, `off`, `file=PATH`); a snapshot's own console file is its saving run's output and is not reused unless given here |

use std::path::PathBuf;

use super::options::Opt;
use super::ChError;
use crate::config::{MemoryRestore, MemoryRestoreMode};

/// What a `RestoreConfig` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChRestore {
    /// The snapshot's directory (`source_url`).
    pub dir: PathBuf,
    /// Run the VM once restored (`resume`); otherwise it waits, paused, for `vm.resume`.
    pub resume: bool,
    /// How its memory is restored (`memory_restore_mode`, `prefault`).
    pub memory: MemoryRestore,
    /// Where the restored VM's console goes (`serial`, lull's own option); `None`: the
    /// default, never the snapshot's console file.
    pub serial: Option<crate::config::SerialMode>,
}

/// Maps a `RestoreConfig`'s options; `notes` gets what is accepted without effect.
pub fn restore(opts: &[Opt], notes: &mut Vec<String>) -> Result<ChRestore, ChError> {
    let mut dir = None;
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
                        .map_err(|_| o.bad("stdio, off or file=PATH"))?,
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
            "net_fds" => o.only(
                &["[]"],
                "lull attaches a restored VM's nets to the taps its snapshot names: create them, \
                 and pass no fds",
            )?,
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
        serial,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ch::options::split;

    fn parsed(text: &str) -> Result<ChRestore, ChError> {
        restore(&split("--restore", text), &mut Vec::new())
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
                serial: None,
            }
        );
        let mut notes = Vec::new();
        let got = restore(
            &split(
                "--restore",
                "source_url=file:///s,prefault=on,resume=true,memory_restore_mode=copy,net_fds=[]",
            ),
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
            ("source_url=file:///s,iommufd_fd=5", "iommufd_fd=5"),
            ("source_url=file:///s,zone_updates=[z]", "zone_updates=[z]"),
            ("source_url=file:///s,speed=fast", "speed=fast"),
        ] {
            let err = parsed(text).unwrap_err().to_string();
            assert!(err.contains(named), "{text}: {err}");
        }
    }
}
