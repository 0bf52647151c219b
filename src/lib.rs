//! incus-hpa: a horizontal autoscaler for Incus containers.
//!
//! The desired state ([`config`]) is compared with what Incus reports ([`observe`]) by a pure
//! decision core ([`decide`]); the resulting plan is carried out by [`act`]. The
//! [`reconciler`] runs that per group, level-triggered, with backoff; [`daemon`] is the loop
//! around it (reloads, shutdown, systemd notifications). [`simulate`] replays demand traces
//! through the same decision core on a simulated clock.

pub mod act;
pub mod app;
pub mod cli;
pub mod config;
pub mod control;
pub mod daemon;
pub mod decide;
pub mod dry_run;
pub mod endpoints;
pub mod events;
pub mod exposition;
pub mod external;
pub mod headroom;
pub mod history;
pub mod hooks;
pub mod incus;
pub mod informer;
pub mod lease;
pub mod limits;
pub mod logging;
pub mod manual;
pub mod memory;
pub mod model;
pub mod observe;
pub mod ready;
pub mod reconciler;
pub mod report;
pub mod schedule;
pub mod simulate;
pub mod systemd;
pub mod table;
pub mod text;
pub mod watch;
