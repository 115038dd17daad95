//! The lull VMM library: CLI, KVM set-up, boot, vCPU threads.
