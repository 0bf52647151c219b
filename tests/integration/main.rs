//! Integration tests: the daemon loop against an in-memory Incus (fast, paused time), the CLI,
//! and (ignored unless asked for) the daemon against a real incusd.

mod cli;
mod cluster;
mod dashboard;
mod docs;
mod fake;
mod fences;
mod generated;
mod headroom;
mod https;
mod informer;
mod lab;
mod leases;
mod listeners;
mod notify;
mod operators;
mod passes;
mod props;
mod ready;
mod real_cluster;
mod real_headroom;
mod real_https;
mod real_incus;
mod real_leases;
mod real_operators;
mod real_readings;
mod real_ready;
mod real_signals;
mod real_trust;
mod reconcile;
mod setup_script;
mod simulate;
mod soak_script;
mod trust;
mod util;
mod watch;
