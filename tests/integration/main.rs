//! Integration tests: the daemon loop against an in-memory Incus (fast, paused time), the CLI,
//! and (ignored unless asked for) the daemon against a real incusd.

mod cli;
mod fake;
mod real_incus;
mod reconcile;
mod util;
mod watch;
