//! Property tests: whatever a driver puts in the descriptor table and the available ring,
//! the device never panics, uses at most what was offered, and every status it writes is
//! one of the three the spec defines.

use proptest::prelude::*;
use vm_memory::{Bytes, GuestAddress};

use super::tests::{Driver, MEM_SIZE, QSIZE};

/// Addresses mostly in a small data area (so that chains often make sense), sometimes
/// anywhere above the rings (so that the device's writes never move the used index under the
/// test's feet), including outside guest memory and near the top of the address space.
fn addr() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => (0x10000u64..0x10400).prop_map(|a| a & !0x7),
        1 => 0x8000u64..(MEM_SIZE as u64 + 0x1000),
        1 => any::<u64>(),
    ]
}

fn len() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => prop::sample::select(vec![0u32, 1, 8, 16, 512, 1024, 4096]),
        1 => any::<u32>(),
    ]
}

/// (addr, len, flags, next) for each descriptor of the table.
fn table() -> impl Strategy<Value = Vec<(u64, u32, u16, u16)>> {
    prop::collection::vec(
        (addr(), len(), 0u16..8, 0u16..(QSIZE + 2)),
        usize::from(QSIZE),
    )
}

proptest! {
    #[test]
    fn arbitrary_chains_never_panic(
        descs in table(),
        heads in prop::collection::vec(0u16..(QSIZE + 2), 1..8),
        header in (0u32..16, any::<u64>()),
        readonly in any::<bool>(),
    ) {
        let mut d = Driver::ready(16, readonly);
        d.mem.write_obj(header.0, GuestAddress(0x10000)).unwrap();
        d.mem.write_obj(header.1 % 32, GuestAddress(0x10008)).unwrap();
        for (i, (a, l, f, n)) in descs.iter().enumerate() {
            d.set_desc(u16::try_from(i).unwrap(), *a, *l, *f, *n);
        }
        let mut used = 0u16;
        for head in heads {
            d.mem.write_obj(0xeeu8, GuestAddress(0x10200)).unwrap();
            let before = d.used_idx();
            d.offer(head);
            let after = d.used_idx();
            prop_assert!(after.wrapping_sub(before) <= 1);
            used = used.wrapping_add(after.wrapping_sub(before));
        }
        // Every chain the device returned was counted exactly once.
        let s = d.mmio.device().stats();
        prop_assert_eq!(
            u64::from(used),
            s.reads + s.writes + s.flushes + s.ids + s.errors + s.dropped
        );
        if readonly {
            prop_assert_eq!(s.writes, 0);
            prop_assert!(d.disk().bytes.iter().all(|b| *b == 0));
        }
    }
}
