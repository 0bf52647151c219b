//! Logging: to journald with structured fields (GROUP, INSTANCE, ACTION, CURRENT, DESIRED,
//! UTILIZATION, REASON, …) when started by systemd with the journal (JOURNAL_STREAM set),
//! human-readable to stderr otherwise. `RUST_LOG` filters as usual (default `info`).

use std::io::IsTerminal;

use tracing_subscriber::prelude::*;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Safe to call once per process.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        match tracing_journald::layer() {
            Ok(layer) => {
                // Fields keep their names, upper-cased: GROUP=web, not F_GROUP=web.
                registry.with(layer.with_field_prefix(None)).init();
                return;
            }
            Err(e) => eprintln!("incus-hpa: journald is not reachable ({e}); logging to stderr"),
        }
    }
    registry
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal()),
        )
        .init();
}
