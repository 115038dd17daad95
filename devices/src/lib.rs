//! Guest-facing devices of lull: pure register models, no threads, no `unsafe`.
#![forbid(unsafe_code)]
