//! A restored VM's nets on host taps of its own: a snapshot's configuration names the taps
//! its VM had, and every VM restored from it (a clone) would attach to those same taps. A
//! clone is given its own instead, net by net:
//!
//! - `lull run --restore DIR --net tap=NAME ...`: one `--net` per net of the snapshot, in the
//!   order of its configuration ([`on_named_taps`]);
//! - `vm.restore` with Cloud Hypervisor's `net_fds` (`[{"id": "net0", "num_fds": 1}]`, the tap
//!   fds sent with the request by `SCM_RIGHTS`), and `lull ch --restore ...,net_fds=[net0@[N]]`
//!   with fds lull inherited: the net that `id` names ([`net_index`]) takes the fd.
//!
//! Only the host side changes ([`on_new_tap`]): the guest side is the snapshot's, its MAC
//! above all (the guest knows it, and its device state says so), and its transmit rate limit.
//! A net's MAC is pinned to the snapshot's even where the snapshot derived it from the old
//! tap's name.
//!
//! lull's nets have no ids of their own: `net_fds` names them by position, `netN`, `net_N`
//! (libvirt's ch driver's ids) or `_netN` (the ids Cloud Hypervisor gives nets created without
//! one) for the N-th net of the configuration, counted from 0.

use super::{MacAddr, NetConfig};

/// A new host side for a restored VM's nets that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RestoreNetsError {
    /// `--net` with `--restore`: not one per net of the snapshot.
    #[error(
        "{given} --net given with --restore, and the snapshot has {snapshot} net(s): give one \
         --net tap=NAME per net of the snapshot, in the order of its configuration (or none, \
         to attach to the taps it names)"
    )]
    Count {
        /// `--net`s given.
        given: usize,
        /// The snapshot's nets.
        snapshot: usize,
    },
    /// `--net` with `--restore` and a MAC the guest does not have.
    #[error(
        "--net {given} with --restore: the restored guest knows its net {index} as \
         {snapshot}; leave mac= out (the snapshot's is kept) or give that one"
    )]
    Mac {
        /// The `--net` value.
        given: String,
        /// The net, counted from 0.
        index: usize,
        /// The snapshot's MAC of that net.
        snapshot: MacAddr,
    },
    /// `--net` with `--restore` and options of the guest side.
    #[error(
        "--net {0} with --restore: only tap=NAME (and mac=, the snapshot's) may be given: \
         the rate limit is the snapshot's"
    )]
    NotHostSide(String),
    /// `--net` with `--restore` naming one tap for two nets.
    #[error("Tap {0} is given to two nets with --restore: give each net its own tap")]
    SameTap(String),
    /// A `net_fds` id that names no net.
    #[error(
        "net_fds: '{id}' names no net of the snapshot, which has {count}: lull's nets are \
         net0, net1... (or net_0, _net0...) in the order of its configuration"
    )]
    UnknownId {
        /// The id.
        id: String,
        /// The snapshot's nets.
        count: usize,
    },
    /// Two `net_fds` entries for one net.
    #[error("net_fds: net {0} is given twice: give each net at most once")]
    Twice(usize),
    /// A `net_fds` entry with another count of fds than the device uses.
    #[error(
        "net_fds: '{id}' comes with {count} fd(s): lull's virtio-net has one queue pair, so \
         give one tap fd per net"
    )]
    FdCount {
        /// The id.
        id: String,
        /// The fds it names.
        count: usize,
    },
}

/// The index of the net that the `net_fds` id `id` names among `count` nets: `netN`,
/// `_netN`, or `net_N` (the ids libvirt's ch driver gives its nets: `net_0`, `net_1`...).
pub fn net_index(id: &str, count: usize) -> Result<usize, RestoreNetsError> {
    let unknown = || RestoreNetsError::UnknownId {
        id: id.to_string(),
        count,
    };
    let digits = id
        .strip_prefix("_net")
        .or_else(|| id.strip_prefix("net_"))
        .or_else(|| id.strip_prefix("net"))
        .ok_or_else(unknown)?;
    // "net01" is not "net1": only the canonical spelling names a net.
    if digits.is_empty() || (digits.len() > 1 && digits.starts_with('0')) {
        return Err(unknown());
    }
    let index: usize = digits.parse().map_err(|_| unknown())?;
    if index >= count {
        return Err(unknown());
    }
    Ok(index)
}

/// The snapshot's net `old` on the host tap of `new` (its name and, if it has one, its fd):
/// everything the guest sees, the MAC first, stays `old`'s.
pub fn on_new_tap(old: &NetConfig, new: &NetConfig) -> NetConfig {
    NetConfig {
        tap: new.tap.clone(),
        fd: new.fd,
        mac: Some(old.mac()),
        ..old.clone()
    }
}

/// The snapshot's nets `snapshot` on the taps of `given` (`--net` with `--restore`), one each
/// in order; `given` empty keeps the snapshot's taps.
pub fn on_named_taps(
    snapshot: &[NetConfig],
    given: &[NetConfig],
) -> Result<Vec<NetConfig>, RestoreNetsError> {
    if given.is_empty() {
        return Ok(snapshot.to_vec());
    }
    if given.len() != snapshot.len() {
        return Err(RestoreNetsError::Count {
            given: given.len(),
            snapshot: snapshot.len(),
        });
    }
    if let Some((_, n)) = given
        .iter()
        .enumerate()
        .find(|(i, n)| given[..*i].iter().any(|m| m.tap == n.tap))
    {
        return Err(RestoreNetsError::SameTap(n.tap.clone()));
    }
    snapshot
        .iter()
        .zip(given)
        .enumerate()
        .map(|(index, (old, new))| {
            if new.rate != devices::rate_limiter::RateLimit::default() {
                return Err(RestoreNetsError::NotHostSide(new.to_string()));
            }
            match new.mac {
                Some(mac) if mac != old.mac() => Err(RestoreNetsError::Mac {
                    given: new.to_string(),
                    index,
                    snapshot: old.mac(),
                }),
                _ => Ok(on_new_tap(old, new)),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(text: &str) -> NetConfig {
        text.parse().unwrap()
    }

    #[test]
    fn ids_name_nets_by_position() {
        assert_eq!(net_index("net0", 2), Ok(0));
        assert_eq!(net_index("_net1", 2), Ok(1));
        assert_eq!(net_index("net1", 2), Ok(1));
        // libvirt's ch driver (virCHMonitorBuildRestoreJson): "net_" and the index.
        assert_eq!(net_index("net_0", 2), Ok(0));
        assert_eq!(net_index("net_1", 2), Ok(1));
        for id in [
            "net2", "_net2", "net", "_net", "net01", "net-1", "tap0", "net0x", "", "net_", "net_2",
            "net__0", "net_01",
        ] {
            assert_eq!(
                net_index(id, 2),
                Err(RestoreNetsError::UnknownId {
                    id: id.to_string(),
                    count: 2
                }),
                "{id}"
            );
        }
        assert!(net_index("net0", 0).is_err());
    }

    #[test]
    fn a_new_tap_keeps_the_guest_side_and_pins_the_mac() {
        let old = net("tap=a,ops=100");
        let mut new = net("tap=b");
        new.fd = Some(7);
        let got = on_new_tap(&old, &new);
        assert_eq!(got.tap, "b");
        assert_eq!(got.fd, Some(7));
        // The snapshot's MAC was derived from "a"; "b" would derive another.
        assert_eq!(got.mac(), MacAddr::derived("a"));
        assert_ne!(got.mac(), MacAddr::derived("b"));
        assert_eq!(got.rate.ops_per_sec, 100);
    }

    #[test]
    fn named_taps_replace_the_snapshots_in_order() {
        let snapshot = [net("tap=a"), net("tap=b,mac=52:54:00:00:00:02")];
        assert_eq!(on_named_taps(&snapshot, &[]).unwrap(), snapshot.to_vec());
        let got = on_named_taps(
            &snapshot,
            &[net("tap=c"), net("tap=d,mac=52:54:00:00:00:02")],
        )
        .unwrap();
        assert_eq!(
            got.iter().map(|n| n.tap.as_str()).collect::<Vec<_>>(),
            ["c", "d"]
        );
        assert_eq!(got[0].mac(), MacAddr::derived("a"));
        assert_eq!(got[1].mac(), snapshot[1].mac());
    }

    #[test]
    fn named_taps_refuse_what_the_guest_would_see() {
        let snapshot = [net("tap=a")];
        assert_eq!(
            on_named_taps(&snapshot, &[net("tap=c"), net("tap=d")]),
            Err(RestoreNetsError::Count {
                given: 2,
                snapshot: 1
            })
        );
        let err = on_named_taps(&snapshot, &[net("tap=c,mac=52:54:00:00:00:09")]).unwrap_err();
        assert!(
            matches!(err, RestoreNetsError::Mac { index: 0, .. }),
            "{err}"
        );
        assert!(err.to_string().contains(&MacAddr::derived("a").to_string()));
        let err = on_named_taps(&snapshot, &[net("tap=c,bandwidth=1M")]).unwrap_err();
        assert!(matches!(err, RestoreNetsError::NotHostSide(_)), "{err}");
        assert!(on_named_taps(&[], &[net("tap=c")]).is_err());
        assert_eq!(
            on_named_taps(&[net("tap=a"), net("tap=b")], &[net("tap=c"), net("tap=c")]),
            Err(RestoreNetsError::SameTap("c".into()))
        );
    }
}
