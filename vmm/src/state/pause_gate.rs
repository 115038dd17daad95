//! The pause gate: where every vCPU thread waits, outside `KVM_RUN`, while the VM is paused.
//!
//! ```text
//!  controller (API thread)                 vCPU thread i (vcpu::run, each loop iteration)
//!  ───────────────────────                 ──────────────────────────────────────────────
//!  request()  ── flag set ──────────────►  is_requested()? ─ yes ─► park(): parked += 1
//!  irqchip kick_all() ─ out of KVM_RUN,                              waits on the condvar
//!                       out of a halt
//!  wait_parked(): every vCPU parked ◄───────────────────────────── (notify)
//!  ...paused: nothing runs guest code...
//!  release(paused_ns) ── flag cleared, ──►  park() returns paused_ns: the vCPU shifts its
//!                        notify all         TSC back by it, then carries on where it was
//!  wait_released(): every vCPU it ◄──────── left the gate (notify)
//!                   released has left
//! ```
//!
//! A halted vCPU stays halted and a vCPU waiting for SIPI keeps waiting: the loop parks at
//! its top and then goes back to the state it was in. While parked, a vCPU hands its state to
//! each [`PauseGate::save_all`] (a snapshot): only its own thread can read its vCPU. A stop
//! request releases parked vCPUs (they then stop) and ends every wait.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use timer::lock;

/// Why the vCPUs could not all be parked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PauseWaitError {
    /// The VM stops (a stop request came while pausing).
    #[error("The VM is stopping: there is nothing left to pause")]
    Stopping,
    /// Some vCPU did not reach the gate in time (a lull bug, or a host far too loaded).
    #[error(
        "Only {parked} of {running} vCPU(s) stopped within {timeout_ms} ms; the VM was resumed"
    )]
    Timeout {
        /// vCPUs parked.
        parked: u32,
        /// vCPU threads running.
        running: u32,
        /// How long lull waited.
        timeout_ms: u128,
    },
    /// Some released vCPU did not leave the gate in time (the VM is resumed all the same).
    #[error("{leaving} released vCPU(s) had not left the pause gate after {timeout_ms} ms")]
    NotLeft {
        /// vCPUs still in the gate.
        leaving: u32,
        /// How long lull waited.
        timeout_ms: u128,
    },
}

/// Why a parked vCPU could not hand over its state.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    /// A KVM call reading it failed.
    #[error("KVM call {call} failed: {source}")]
    Kvm {
        /// Which call.
        call: &'static str,
        /// Why.
        source: kvm_ioctls::Error,
    },
    /// It could not be encoded.
    #[error("cannot encode it: {0}")]
    Encode(#[from] serde_json::Error),
}

/// What one parked vCPU handed to [`PauseGate::save_all`]: its id and its state (or why it
/// could not read it).
pub type SavedState = (u32, Result<Vec<u8>, SaveError>);

#[derive(Debug, Default)]
struct GateState {
    /// vCPU threads inside their run loop.
    running: u32,
    /// vCPU threads parked in the gate in this generation (a release sets it to 0: a thread
    /// it released that has not woken yet is not parked for the next pause).
    parked: u32,
    /// Threads released that have not left the gate yet.
    leaving: u32,
    /// Bumped by every release: a parked thread leaves when it changes.
    generation: u64,
    /// How long the last pause lasted (handed to the threads it releases).
    paused_ns: u64,
    /// A stop was requested: nobody waits any more.
    stopping: bool,
    /// Bumped by every request for the parked vCPUs' state (a snapshot).
    save_generation: u64,
    /// What each parked vCPU handed back for the last such request: (vCPU, its state).
    saved: Vec<SavedState>,
}

/// Where vCPU threads wait while the VM is paused. One per VM, in [`super::VcpuShared`].
#[derive(Debug, Default)]
pub struct PauseGate {
    requested: AtomicBool,
    state: Mutex<GateState>,
    changed: Condvar,
}

impl PauseGate {
    /// Whether a pause is requested (read by each vCPU thread once per loop iteration).
    pub fn is_requested(&self) -> bool {
        self.requested.load(Ordering::Acquire)
    }

    /// A vCPU thread is about to start (counted from before it exists, so that a pause
    /// requested meanwhile waits for it to park).
    pub fn thread_started(&self) {
        lock(&self.state).running += 1;
        self.changed.notify_all();
    }

    /// A vCPU thread leaves its run loop (it no longer counts for [`Self::wait_parked`]).
    pub fn thread_ended(&self) {
        let mut s = lock(&self.state);
        s.running = s.running.saturating_sub(1);
        drop(s);
        self.changed.notify_all();
    }

    /// Asks every vCPU thread to park; the caller then kicks them.
    pub fn request(&self) {
        self.requested.store(true, Ordering::Release);
    }

    /// Waits until every running vCPU thread is parked, for at most `timeout`.
    pub fn wait_parked(&self, timeout: Duration) -> Result<(), PauseWaitError> {
        let s = lock(&self.state);
        self.wait_for_all(s, timeout, |s| s.parked).map(drop)
    }

    /// Waits (up to `timeout`, from `s`) until `count` of the state reaches the number of
    /// running vCPU threads; fails if the VM stops first. The state, locked.
    fn wait_for_all<'a>(
        &'a self,
        s: MutexGuard<'a, GateState>,
        timeout: Duration,
        count: impl Fn(&GateState) -> u32,
    ) -> Result<MutexGuard<'a, GateState>, PauseWaitError> {
        let s = self.wait_until(s, timeout, |s| count(s) >= s.running);
        if s.stopping {
            return Err(PauseWaitError::Stopping);
        }
        if count(&s) >= s.running {
            return Ok(s);
        }
        Err(PauseWaitError::Timeout {
            parked: count(&s),
            running: s.running,
            timeout_ms: timeout.as_millis(),
        })
    }

    /// Waits (up to `timeout`, from `s`) until `done` holds or the VM stops; the state,
    /// locked, for the caller to tell which.
    fn wait_until<'a>(
        &'a self,
        mut s: MutexGuard<'a, GateState>,
        timeout: Duration,
        done: impl Fn(&GateState) -> bool,
    ) -> MutexGuard<'a, GateState> {
        let end = Instant::now() + timeout;
        while !s.stopping && !done(&s) {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            s = self
                .changed
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        s
    }

    /// Releases the parked vCPU threads; each gets `paused_ns`, how long the VM was paused.
    pub fn release(&self, paused_ns: u64) {
        let mut s = lock(&self.state);
        self.requested.store(false, Ordering::Release);
        s.generation = s.generation.wrapping_add(1);
        s.paused_ns = paused_ns;
        // Every parked thread leaves. One that has not woken yet must not count for the next
        // pause: its `save` would wait for a save generation it never sees (it re-parks with
        // the current one), and the snapshot would time out.
        s.leaving += s.parked;
        s.parked = 0;
        drop(s);
        self.changed.notify_all();
    }

    /// Waits, up to `timeout`, until every thread a release let go has left the gate (its
    /// vCPU runs again); at once if the VM stops.
    pub fn wait_released(&self, timeout: Duration) -> Result<(), PauseWaitError> {
        let s = self.wait_until(lock(&self.state), timeout, |s| s.leaving == 0);
        if s.leaving == 0 || s.stopping {
            return Ok(());
        }
        Err(PauseWaitError::NotLeft {
            leaving: s.leaving,
            timeout_ms: timeout.as_millis(),
        })
    }

    /// The VM stops: parked threads leave (with 0) and nobody waits for them any more.
    pub fn stop(&self) {
        lock(&self.state).stopping = true;
        self.changed.notify_all();
    }

    /// Asks every parked vCPU for its state (`save` of [`Self::park`]) and waits up to
    /// `timeout` for all of them; the states by vCPU.
    pub fn save_all(&self, timeout: Duration) -> Result<Vec<SavedState>, PauseWaitError> {
        self.wait_parked(timeout)?;
        let mut s = lock(&self.state);
        s.saved.clear();
        s.save_generation = s.save_generation.wrapping_add(1);
        self.changed.notify_all();
        let saved = |s: &GateState| u32::try_from(s.saved.len()).unwrap_or(u32::MAX);
        let mut s = self.wait_for_all(s, timeout, saved)?;
        let mut saved = std::mem::take(&mut s.saved);
        saved.sort_by_key(|(id, _)| *id);
        Ok(saved)
    }

    /// On vCPU thread `id`: waits until the pause ends, handing its state (`save`) to every
    /// [`Self::save_all`] meanwhile; how long the VM was paused (0 if it stops, or if the pause
    /// ended before this thread got here).
    pub fn park(&self, id: u32, save: &mut dyn FnMut() -> Result<Vec<u8>, SaveError>) -> u64 {
        let mut s = lock(&self.state);
        if !self.is_requested() || s.stopping {
            return 0;
        }
        let generation = s.generation;
        let mut saved_for = s.save_generation;
        s.parked += 1;
        self.changed.notify_all();
        while s.generation == generation && !s.stopping {
            if s.save_generation != saved_for {
                saved_for = s.save_generation;
                drop(s);
                let state = save();
                s = lock(&self.state);
                s.saved.push((id, state));
                self.changed.notify_all();
                continue;
            }
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        if s.generation == generation {
            // Left for a stop: still counted in this generation.
            s.parked -= 1;
        } else {
            s.leaving = s.leaving.saturating_sub(1);
            self.changed.notify_all();
        }
        if s.stopping {
            0
        } else {
            s.paused_ns
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Each vCPU's saved bytes (the test's saves do not fail).
    fn bytes(saved: Vec<SavedState>) -> Vec<(u32, Vec<u8>)> {
        saved
            .into_iter()
            .map(|(id, state)| (id, state.expect("a test save does not fail")))
            .collect()
    }

    #[test]
    fn every_running_thread_parks_and_leaves_with_the_pause_length() {
        let gate = Arc::new(PauseGate::default());
        let threads: Vec<_> = (0..3)
            .map(|_| {
                gate.thread_started();
                let g = gate.clone();
                std::thread::spawn(move || {
                    while !g.is_requested() {
                        std::thread::yield_now();
                    }
                    g.park(0, &mut || Ok(Vec::new()))
                })
            })
            .collect();
        gate.request();
        gate.wait_parked(Duration::from_secs(30)).unwrap();
        assert_eq!(lock(&gate.state).parked, 3);
        gate.release(1234);
        for t in threads {
            assert_eq!(t.join().unwrap(), 1234);
        }
        assert_eq!(lock(&gate.state).parked, 0);
        assert!(!gate.is_requested());
    }

    #[test]
    fn a_thread_that_is_not_asked_does_not_park() {
        let gate = PauseGate::default();
        gate.thread_started();
        assert_eq!(gate.park(0, &mut || Ok(Vec::new())), 0);
        gate.request();
        gate.release(5);
        assert_eq!(
            gate.park(0, &mut || Ok(Vec::new())),
            0,
            "the pause already ended"
        );
    }

    #[test]
    fn parked_threads_hand_their_state_to_each_save() {
        let gate = Arc::new(PauseGate::default());
        let threads: Vec<_> = (0..2u32)
            .map(|id| {
                gate.thread_started();
                let g = gate.clone();
                std::thread::spawn(move || {
                    while !g.is_requested() {
                        std::thread::yield_now();
                    }
                    let mut saves = 0u8;
                    g.park(id, &mut || {
                        saves += 1;
                        Ok(vec![u8::try_from(id).unwrap_or(0), saves])
                    })
                })
            })
            .collect();
        gate.request();
        let first = gate.save_all(Duration::from_secs(30)).unwrap();
        let second = gate.save_all(Duration::from_secs(30)).unwrap();
        assert_eq!(bytes(first), vec![(0, vec![0, 1]), (1, vec![1, 1])]);
        assert_eq!(bytes(second), vec![(0, vec![0, 2]), (1, vec![1, 2])]);
        gate.release(7);
        for t in threads {
            assert_eq!(t.join().unwrap(), 7, "still parked after the saves");
        }
    }

    /// A pause right after a resume, before the released threads have woken: the gate does
    /// not count them as parked, so the snapshot waits for them to park again and gets every
    /// vCPU's state (they used to count, then re-park past the save request and never answer).
    #[test]
    fn a_pause_right_after_a_release_waits_for_every_thread_again() {
        let gate = Arc::new(PauseGate::default());
        let threads: Vec<_> = [0u8, 1]
            .into_iter()
            .map(|id| {
                gate.thread_started();
                let g = gate.clone();
                // Parks at each of the two pauses, then ends.
                std::thread::spawn(move || {
                    for _ in 0..2 {
                        while !g.is_requested() {
                            std::thread::yield_now();
                        }
                        g.park(id.into(), &mut || Ok(vec![id]));
                    }
                })
            })
            .collect();
        gate.request();
        gate.wait_parked(Duration::from_secs(30)).unwrap();
        gate.release(1);
        assert_eq!(
            lock(&gate.state).parked,
            0,
            "released threads are not parked"
        );
        gate.request();
        let saved = gate.save_all(Duration::from_secs(30)).unwrap();
        assert_eq!(bytes(saved), vec![(0, vec![0]), (1, vec![1])]);
        gate.release(1);
        for t in threads {
            t.join().unwrap();
        }
    }

    /// A resume waits for the threads it released, and only for those: a thread that never
    /// parked (the pause ended before it got to the gate) is not waited for.
    #[test]
    fn wait_released_waits_for_the_released_threads_only() {
        let gate = Arc::new(PauseGate::default());
        gate.thread_started();
        gate.thread_started();
        let g = gate.clone();
        let parked = std::thread::spawn(move || {
            while !g.is_requested() {
                std::thread::yield_now();
            }
            g.park(0, &mut || Ok(Vec::new()))
        });
        gate.request();
        // One of the two running threads parks; the other never comes (it is released below
        // before it gets to the gate).
        let end = Instant::now() + Duration::from_secs(30);
        while lock(&gate.state).parked < 1 {
            assert!(Instant::now() < end, "the thread never parked");
            std::thread::yield_now();
        }
        gate.release(3);
        gate.wait_released(Duration::from_secs(30)).unwrap();
        assert_eq!(lock(&gate.state).leaving, 0);
        assert_eq!(parked.join().unwrap(), 3);
    }

    #[test]
    fn a_released_thread_that_does_not_leave_times_out_and_a_stop_ends_the_wait() {
        let gate = PauseGate::default();
        gate.thread_started();
        gate.request();
        // As if a thread were parked and never woke up again.
        lock(&gate.state).parked = 1;
        gate.release(1);
        assert_eq!(
            gate.wait_released(Duration::from_millis(1)),
            Err(PauseWaitError::NotLeft {
                leaving: 1,
                timeout_ms: 1
            })
        );
        gate.stop();
        assert_eq!(gate.wait_released(Duration::from_secs(30)), Ok(()));
    }

    #[test]
    fn a_missing_thread_times_out_and_a_stop_ends_the_wait() {
        let gate = Arc::new(PauseGate::default());
        gate.thread_started();
        gate.request();
        let err = gate.wait_parked(Duration::from_millis(1)).unwrap_err();
        assert!(matches!(
            err,
            PauseWaitError::Timeout {
                parked: 0,
                running: 1,
                ..
            }
        ));
        gate.thread_ended();
        gate.wait_parked(Duration::from_millis(1)).unwrap();
        gate.thread_started();
        let g = gate.clone();
        let parked = std::thread::spawn(move || g.park(0, &mut || Ok(Vec::new())));
        gate.wait_parked(Duration::from_secs(30)).unwrap();
        gate.stop();
        assert_eq!(parked.join().unwrap(), 0, "a stop releases with 0");
        assert_eq!(
            gate.wait_parked(Duration::from_secs(1)),
            Err(PauseWaitError::Stopping)
        );
    }
}
