//! Timer bases and the hierarchical pull model (see `docs/ARCHITECTURE.md`).
#![forbid(unsafe_code)]
