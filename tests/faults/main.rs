//! Fault injection between the daemon and incusd: a proxy on the unix socket that answers
//! chosen requests with errors, drops, delays, garbage or failed operations ([`proxy`]), its
//! own tests against a fake upstream, and the fault scenarios against the real incusd
//! ([`scenarios`], ignored unless asked for: `scripts/test.sh` runs them one at a time and
//! prints the table they fill); the third round of trust ([`third`]); a group that serves,
//! whose endpoints command hangs or fails ([`traffic`]).

#[path = "../integration/hooks_common.rs"]
#[allow(dead_code)]
mod hooks_common;
#[path = "../../benches/support/incusd.rs"]
mod incusd;
#[path = "../integration/lab.rs"]
#[allow(dead_code)]
mod lab;
mod proxy;
mod proxy_tests;
mod scenarios;
mod third;
mod traffic;
mod trust;
#[path = "../integration/web.rs"]
#[allow(dead_code)]
mod web;
mod world;
