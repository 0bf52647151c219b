//! Fault injection between the daemon and incusd: a proxy on the unix socket that answers
//! chosen requests with errors, drops, delays, garbage or failed operations ([`proxy`]), and
//! the proxy's own tests against a fake upstream (and, ignored unless asked for, a real incusd).

mod proxy;
mod proxy_tests;
