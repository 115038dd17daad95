//! A counter set declared once: the live counters a thread bumps (atomics) and the read-out
//! the report serializes (plain fields) come from one field list, so a new counter is written
//! in one place and cannot be forgotten in the read-out.
//!
//! ```text
//!  counter_set! {
//!      /// docs of the live set       ──> pub struct Live { pub a: AtomicU64, pub g: GroupLive }
//!      pub struct Live;
//!      /// docs of the read-out       ──> pub struct Readout { pub a: u64, pub g: GroupReadout,
//!      pub struct Readout {                                     pub d: u64 }
//!          /// A counter.             ──> impl Live { pub fn read(&self) -> Readout }
//!          a: AtomicU64 => u64,           (relaxed loads, then each derived field)
//!          /// A nested set.
//!          g: GroupLive => GroupReadout,
//!          /// Derived from the fields above it, only in the read-out.
//!          d: u64 = a * 2,
//!      }
//!  }
//! ```
//!
//! A field `name: Live => Readout` is in both structs; reading it goes through [`ReadOut`]
//! (an `AtomicU64` reads as `u64` or `Some(u64)`, a histogram of atomics as a `Vec`, a nested
//! set as its read-out). A field `name: Type = expr` is only in the read-out, computed from
//! the fields declared before it. Doc comments go to both structs, `#[serde(..)]` attributes
//! only to the read-out. Field order is the read-out's JSON key order.

use std::sync::atomic::{AtomicU64, Ordering};

/// How one live field reads into its read-out type `T` (relaxed: each value is exact, the set
/// is not one atomic moment).
pub trait ReadOut<T> {
    /// The value now.
    fn read_out(&self) -> T;
}

impl ReadOut<u64> for AtomicU64 {
    fn read_out(&self) -> u64 {
        self.load(Ordering::Relaxed)
    }
}

/// A counter the read-out lists as optional (absent in reports of a lull before it).
impl ReadOut<Option<u64>> for AtomicU64 {
    fn read_out(&self) -> Option<u64> {
        Some(self.load(Ordering::Relaxed))
    }
}

/// A histogram: one counter per bucket.
impl<const N: usize> ReadOut<Vec<u64>> for [AtomicU64; N] {
    fn read_out(&self) -> Vec<u64> {
        self.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }
}

/// A value fixed when the set is made (e.g. whose counters they are).
impl ReadOut<u32> for u32 {
    fn read_out(&self) -> u32 {
        *self
    }
}

/// Declares a live counter set and its read-out from one field list (see the module docs).
macro_rules! counter_set {
    (
        $(#[$live_attr:meta])* $live_vis:vis struct $Live:ident;
        $(#[$readout_attr:meta])* $readout_vis:vis struct $Readout:ident { $($fields:tt)* }
    ) => {
        $crate::counter_set::counter_set!(@field
            {
                $(#[$live_attr])* $live_vis struct $Live;
                $(#[$readout_attr])* $readout_vis struct $Readout
            }
            [] [] [] [] $($fields)*
        );
    };
    // A counter: in both structs, read through `ReadOut`.
    (@field $head:tt [$($live:tt)*] [$($readout:tt)*] [$($read:tt)*] [$($name:ident)*]
        $(#[doc = $doc:literal])* $(#[serde($($serde:tt)*)])*
        $field:ident : $live_ty:ty => $readout_ty:ty, $($rest:tt)*
    ) => {
        $crate::counter_set::counter_set!(@field $head
            [$($live)* $(#[doc = $doc])* pub $field: $live_ty,]
            [$($readout)* $(#[doc = $doc])* $(#[serde($($serde)*)])* pub $field: $readout_ty,]
            [$($read)* (counter $field $readout_ty)]
            [$($name)* $field]
            $($rest)*
        );
    };
    // A derived field: only in the read-out, computed from the fields before it.
    (@field $head:tt [$($live:tt)*] [$($readout:tt)*] [$($read:tt)*] [$($name:ident)*]
        $(#[doc = $doc:literal])* $(#[serde($($serde:tt)*)])*
        $field:ident : $readout_ty:ty = $value:expr, $($rest:tt)*
    ) => {
        $crate::counter_set::counter_set!(@field $head
            [$($live)*]
            [$($readout)* $(#[doc = $doc])* $(#[serde($($serde)*)])* pub $field: $readout_ty,]
            [$($read)* (derived $field $readout_ty = $value)]
            [$($name)* $field]
            $($rest)*
        );
    };
    // Every field taken: the two structs and the read.
    (@field
        {
            $(#[$live_attr:meta])* $live_vis:vis struct $Live:ident;
            $(#[$readout_attr:meta])* $readout_vis:vis struct $Readout:ident
        }
        [$($live:tt)*] [$($readout:tt)*] [$($read:tt)*] [$($name:ident)*]
    ) => {
        $(#[$live_attr])*
        $live_vis struct $Live {
            $($live)*
        }

        $(#[$readout_attr])*
        $readout_vis struct $Readout {
            $($readout)*
        }

        impl $Live {
            /// Reads every counter (relaxed loads) into the read-out.
            pub fn read(&self) -> $Readout {
                $($crate::counter_set::counter_set!(@read self $read);)*
                $Readout { $($name),* }
            }
        }

        impl $crate::counter_set::ReadOut<$Readout> for $Live {
            fn read_out(&self) -> $Readout {
                self.read()
            }
        }
    };
    (@read $this:tt (counter $field:ident $readout_ty:ty)) => {
        let $field: $readout_ty = $crate::counter_set::ReadOut::read_out(&$this.$field);
    };
    (@read $this:tt (derived $field:ident $readout_ty:ty = $value:expr)) => {
        let $field: $readout_ty = $value;
    };
}

pub(crate) use counter_set;

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use serde::Serialize;

    counter_set! {
        /// Live.
        #[derive(Debug, Default)]
        pub struct InnerLive;
        /// Read-out.
        #[derive(Debug, Default, PartialEq, Eq, Serialize)]
        pub struct Inner {
            /// b.
            b: AtomicU64 => u64,
        }
    }

    counter_set! {
        /// Live.
        #[derive(Debug, Default)]
        pub struct OuterLive;
        /// Read-out.
        #[derive(Debug, Default, PartialEq, Eq, Serialize)]
        pub struct Outer {
            /// a.
            a: AtomicU64 => u64,
            /// inner.
            inner: InnerLive => Inner,
            /// twice a.
            twice: u64 = a * 2,
            /// hist.
            hist: [AtomicU64; 2] => Vec<u64>,
            /// opt.
            #[serde(skip_serializing_if = "Option::is_none")]
            opt: AtomicU64 => Option<u64>,
        }
    }

    #[test]
    fn reads_every_field_in_declared_order() {
        let live = OuterLive::default();
        live.a.store(3, Ordering::Relaxed);
        live.inner.b.store(4, Ordering::Relaxed);
        live.hist[1].store(5, Ordering::Relaxed);
        live.opt.store(6, Ordering::Relaxed);
        let out = live.read();
        assert_eq!(
            out,
            Outer {
                a: 3,
                inner: Inner { b: 4 },
                twice: 6,
                hist: vec![0, 5],
                opt: Some(6),
            }
        );
        assert_eq!(
            serde_json::to_string(&out).expect("serializes"),
            r#"{"a":3,"inner":{"b":4},"twice":6,"hist":[0,5],"opt":6}"#
        );
        let absent = serde_json::to_string(&Outer::default()).expect("serializes");
        assert!(!absent.contains("opt"), "{absent}");
    }
}
