//! Helpers for lull's integration tests.
