//! `net_fds` of a restore (`vm.restore`'s body, or `--restore` of `lull ch`): the tap fds
//! given become the host side of the snapshot's nets they name (`config::restore_nets` says
//! how ids name nets and what a net keeps of the snapshot's).
//!
//! Fds sent with `vm.restore` are taken in the order sent, as many for each entry as it
//! names, as Cloud Hypervisor does; their sum must be the count sent. Each is checked to be a
//! tap (`TUNGETIFF`) before anything is built. The fds a restore takes are kept open for the
//! VM's life by the caller; on any refusal they are dropped, so closed.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use super::error::ApiError;
use crate::config::ch::options;
use crate::config::ch::restore::{NetFds, RestoredNet};
use crate::config::restore_nets::{net_index, on_new_tap, RestoreNetsError};
use crate::config::NetConfig;
use crate::host::sys::scm::SentFds;
use crate::host::sys::tap::Tap;

/// The snapshot's nets after a restore's `net_fds`.
#[derive(Debug)]
pub struct RestoredTaps {
    /// The nets, in the snapshot's order: those `net_fds` named on their new tap fd.
    pub nets: Vec<NetConfig>,
    /// The fds sent with the request that `nets` use (by number): keep them open while the
    /// VM runs.
    pub keep: Vec<OwnedFd>,
}

/// The snapshot's nets `snapshot` with the taps `given` names, its sent fds from `sent`.
pub fn resolve(
    snapshot: &[NetConfig],
    given: &[RestoredNet],
    sent: SentFds,
) -> Result<RestoredTaps, ApiError> {
    let want: usize = given
        .iter()
        .map(|n| match n.fds {
            NetFds::Sent(count) => count,
            NetFds::Inherited(_) => 0,
        })
        .sum();
    if !sent.complete() || sent.count != want {
        return Err(ApiError::RestoreNetFds {
            want,
            sent: sent.said(),
        });
    }
    // Every id first, so that no fd is looked at for a request refused anyway.
    let mut taken = vec![false; snapshot.len()];
    let mut indices = Vec::new();
    for net in given {
        let index = net_index(&net.id, snapshot.len()).map_err(ApiError::RestoreNets)?;
        if std::mem::replace(&mut taken[index], true) {
            return Err(ApiError::RestoreNets(RestoreNetsError::Twice(index)));
        }
        indices.push(index);
    }
    let mut nets = snapshot.to_vec();
    let mut keep = Vec::new();
    let mut fds = sent.fds.into_iter();
    for (net, index) in given.iter().zip(indices) {
        let bad = |source| ApiError::RestoreNetFd {
            id: net.id.clone(),
            source,
        };
        let (tap, raw) = match &net.fds {
            NetFds::Sent(_) => {
                // `want` counted one fd for this entry (`config::ch::restore` refuses others).
                let fd = fds.next().ok_or(ApiError::RestoreNetFds {
                    want,
                    sent: want.saturating_sub(1).to_string(),
                })?;
                let tap = Tap::from_sent(fd.as_fd()).map_err(bad)?;
                let raw = fd.as_raw_fd();
                keep.push(fd);
                (tap, raw)
            }
            NetFds::Inherited(list) => {
                let [raw] = list.as_slice() else {
                    return Err(ApiError::RestoreNets(RestoreNetsError::FdCount {
                        id: net.id.clone(),
                        count: list.len(),
                    }));
                };
                (Tap::from_fd(*raw).map_err(bad)?, *raw)
            }
        };
        let new = options::fd_net(raw, tap.name(), None).map_err(ApiError::ChConfig)?;
        nets[index] = on_new_tap(&snapshot[index], &new);
    }
    Ok(RestoredTaps { nets, keep })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::sys::scm::Received;

    fn sent(files: usize) -> SentFds {
        let mut s = SentFds::default();
        s.add(Received {
            fds: (0..files)
                .map(|_| OwnedFd::from(std::fs::File::open("/dev/null").unwrap()))
                .collect(),
            truncated: false,
        });
        s
    }

    fn net(id: &str) -> RestoredNet {
        RestoredNet {
            id: id.into(),
            fds: NetFds::Sent(1),
        }
    }

    fn nets() -> Vec<NetConfig> {
        vec!["tap=a".parse().unwrap(), "tap=b".parse().unwrap()]
    }

    #[test]
    fn no_net_fds_keep_the_snapshots_taps() {
        let got = resolve(&nets(), &[], SentFds::default()).unwrap();
        assert_eq!(got.nets, nets());
        assert!(got.keep.is_empty());
    }

    /// Refused before any fd is looked at: the counts, an id naming no net, a net twice; and
    /// an fd that is not a tap (/dev/null here), naming the net.
    #[test]
    fn what_cannot_be_restored_is_refused_by_name() {
        let cases: [(&[RestoredNet], usize, &str); 5] = [
            (&[net("net0")], 0, "1 fd(s) and 0 were sent"),
            (&[], 1, "0 fd(s) and 1 were sent"),
            (&[net("net2")], 1, "'net2' names no net"),
            (&[net("net0"), net("_net0")], 2, "net 0 is given twice"),
            (
                &[net("_net1")],
                1,
                "the fd given for _net1 is not a usable tap",
            ),
        ];
        for (given, files, named) in cases {
            let err = resolve(&nets(), given, sent(files)).unwrap_err();
            assert_eq!(err.status(), 400, "{given:?}");
            let text = err.messages().join(": ");
            assert!(text.contains(named), "{given:?}: {text}");
        }
        let mut many = sent(crate::host::sys::scm::MAX_FDS_PER_MESSAGE);
        many.add(Received {
            fds: Vec::new(),
            truncated: true,
        });
        let err = resolve(&nets(), &[net("net0")], many).unwrap_err();
        assert!(err.to_string().contains("more than 253"), "{err}");
    }
}
