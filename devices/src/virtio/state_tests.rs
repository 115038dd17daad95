//! Transport state across a save and a restore: a restored virtio-blk serves the next request
//! exactly as the saved one does, and a state no transport could hold is refused, leaving the
//! transport as it was.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use virtio_bindings::virtio_blk::{VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT};
use virtio_bindings::virtio_mmio::*;
use vm_memory::{Bytes, GuestAddress};

use super::block::Block;
use super::disk::MemDisk;
use super::mmio::{SavedTransport, TransportState, TransportStateError, VirtioMmioDevice};
use super::tests::{Driver, Lines, Timers, MEM_SIZE, QSIZE};
use crate::mmio::MmioDevice;
use crate::rate_limiter::RateLimit;

/// A new device on a copy of `d`'s disk and memory, restored from `d`'s saved state (through
/// its JSON text, as a snapshot file holds it).
fn restored_copy(d: &Driver) -> Driver {
    let text = serde_json::to_string(&d.mmio.save()).unwrap();
    let mut copy = Driver::raw_with(Block::new(d.disk().clone(), false, b"lull-test-disk"));
    let mut bytes = vec![0u8; MEM_SIZE];
    d.mem.read_slice(&mut bytes, GuestAddress(0)).unwrap();
    copy.mem.write_slice(&bytes, GuestAddress(0)).unwrap();
    copy.avail_idx = d.avail_idx;
    let state: TransportState = serde_json::from_str(&text).unwrap();
    copy.mmio.restore(&state).unwrap();
    copy
}

#[test]
fn a_restored_queue_serves_the_next_request_as_the_saved_one() {
    let mut d = Driver::ready(64, false);
    // Past one wrap of the rings, so the indices are not where a fresh queue's are.
    for i in 0..u64::from(QSIZE) + 3 {
        d.fill_data(&[i as u8; 512]);
        assert_eq!(d.request(VIRTIO_BLK_T_OUT, i % 64, 512, false).0, 0);
    }
    let mut copy = restored_copy(&d);
    assert_eq!(copy.r(VIRTIO_MMIO_STATUS), d.r(VIRTIO_MMIO_STATUS));
    assert_eq!(copy.mmio.driver_features(), d.mmio.driver_features());
    assert_eq!(copy.mmio.interrupt_pending(), d.mmio.interrupt_pending());
    for (sector, kind, writes) in [(5, VIRTIO_BLK_T_OUT, false), (5, VIRTIO_BLK_T_IN, true)] {
        d.fill_data(&[0xa5; 512]);
        copy.fill_data(&[0xa5; 512]);
        let a = d.request(kind, sector, 512, writes);
        let b = copy.request(kind, sector, 512, writes);
        assert_eq!(a, b);
        assert_eq!(d.used_idx(), copy.used_idx());
        assert_eq!(d.data(512), copy.data(512));
    }
    assert_eq!(d.disk().bytes, copy.disk().bytes);
    assert_eq!(d.mmio.save(), copy.mmio.save());
}

#[test]
fn a_fresh_transport_restores_to_a_fresh_transport() {
    let d = Driver::raw(8, false);
    let copy = restored_copy(&d);
    assert_eq!(copy.mmio.save(), d.mmio.save());
    assert_eq!(copy.mmio.status(), 0);
}

#[test]
fn impossible_states_are_refused_and_change_nothing() {
    let mut d = Driver::ready(8, false);
    d.request(VIRTIO_BLK_T_OUT, 0, 512, false);
    let good = d.mmio.save();
    let mut target = Driver::raw(8, false);
    let before = target.mmio.save();
    let queue = |f: &dyn Fn(&mut super::mmio::QueueSnapshot)| {
        let mut s = good.clone();
        f(&mut s.queues[0]);
        s
    };
    let cases: Vec<(TransportState, &str)> = vec![
        (
            TransportState {
                device_type: 1,
                ..good.clone()
            },
            "type",
        ),
        (
            TransportState {
                queues: vec![],
                ..good.clone()
            },
            "queue count",
        ),
        (queue(&|q| q.size = 3), "size not a power of two"),
        (queue(&|q| q.size = 512), "size above the max"),
        (queue(&|q| q.size = 0), "size zero"),
        (queue(&|q| q.desc_table = 0x1001), "misaligned table"),
        (queue(&|q| q.desc_table = 1 << 40), "table outside memory"),
        (
            queue(&|q| q.used_ring = MEM_SIZE as u64 - 8),
            "used ring across the end",
        ),
        (
            TransportState {
                driver_features: 1 << 63,
                ..good.clone()
            },
            "features not offered",
        ),
        (
            TransportState {
                driver_features: 0,
                ..good.clone()
            },
            "FEATURES_OK without VERSION_1",
        ),
        (
            TransportState {
                interrupt_status: 4,
                ..good.clone()
            },
            "interrupt bit",
        ),
        (
            TransportState {
                config_generation: 1,
                ..good.clone()
            },
            "generation",
        ),
    ];
    for (bad, why) in cases {
        assert!(target.mmio.restore(&bad).is_err(), "{why}: accepted");
        assert_eq!(target.mmio.save(), before, "{why}: changed the transport");
    }
    // A queue that is not ready may hold anything the driver has written so far.
    let unready = queue(&|q| {
        q.ready = false;
        q.desc_table = 1 << 40;
    });
    assert!(target.mmio.restore(&unready).is_ok());
    target.mmio.restore(&good).unwrap();
    assert_eq!(target.mmio.save(), good);
}

#[test]
fn a_rate_limiter_keeps_its_buckets_and_asks_again_for_its_refill() {
    let now = Arc::new(AtomicU64::new(1_000_000));
    let limit: RateLimit = "ops=2,refill=1s".parse().unwrap();
    let block = |now: &Arc<AtomicU64>| {
        let clock = now.clone();
        Block::new(MemDisk::new(8), false, b"limited")
            .with_rate_limit(limit, Arc::new(move || clock.load(Ordering::Relaxed)))
    };
    let mut d = Driver::ready_with(block(&now));
    d.request(VIRTIO_BLK_T_OUT, 0, 512, false);
    d.request(VIRTIO_BLK_T_OUT, 1, 512, false);
    // The third waits for a refill 0.5 s ahead.
    let before = d.used_idx();
    d.offer(0);
    assert_eq!(d.used_idx(), before);
    now.fetch_add(100_000_000, Ordering::Relaxed);
    let saved = d.mmio.save();
    let throttle = saved.throttle.expect("a limited device saves its limiter");
    assert_eq!(throttle.waiting_ns, Some(400_000_000));
    // Quiesced (a pause), the device's state is as of the quiescing however long it lasts.
    let mut paused = VirtioMmioDevice::new(
        Driver::raw_with(block(&now)).mmio,
        Arc::new(Lines::default()),
        5,
    );
    paused.restore(&saved).unwrap();
    paused.quiesce(true);
    now.fetch_add(250_000_000, Ordering::Relaxed);
    let kept = paused.save().throttle.expect("still limited");
    assert_eq!(kept.waiting_ns, Some(400_000_000));
    assert_eq!(kept.limiter, throttle.limiter);
    paused.quiesce(false);
    assert_eq!(
        paused.save().throttle.unwrap().waiting_ns,
        Some(150_000_000)
    );
    // Restored on a clock 7 s later: the refill is asked for 0.4 s from then.
    let later = Arc::new(AtomicU64::new(now.load(Ordering::Relaxed) + 7_000_000_000));
    let copy = Driver::raw_with(block(&later));
    let timers = Arc::new(Timers::default());
    let mut dev =
        VirtioMmioDevice::new(copy.mmio, Arc::new(Lines::default()), 5).with_timer(timers.clone());
    dev.restore(&saved).unwrap();
    let asked = timers.0.lock().unwrap().clone();
    assert_eq!(asked, vec![later.load(Ordering::Relaxed) + 400_000_000]);
    assert_eq!(dev.save_transport(), saved.clone());
    // An unlimited device refuses a limited one's state.
    let mut plain = Driver::raw(8, false);
    assert!(matches!(
        plain.mmio.restore(&saved),
        Err(TransportStateError::Throttle(_))
    ));
}
