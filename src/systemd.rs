//! sd_notify: READY, STATUS, WATCHDOG and STOPPING. Every call is a no-op off systemd
//! (no `NOTIFY_SOCKET`), so the daemon runs the same in a terminal.

use std::time::Duration;

use sd_notify::NotifyState;

/// Tells systemd the daemon is ready (config loaded, Incus answered).
pub fn ready() {
    notify(&[NotifyState::Ready]);
}

/// The one-line status `systemctl status` shows. Its control characters become spaces (see
/// [`crate::text::printable`]): a newline would end `STATUS=` and start another assignment.
pub fn status(line: &str) {
    notify(&[NotifyState::Status(&crate::text::printable(line))]);
}

/// Tells systemd the daemon is shutting down.
pub fn stopping() {
    notify(&[NotifyState::Stopping]);
}

/// Pets the watchdog.
pub fn watchdog() {
    notify(&[NotifyState::Watchdog]);
}

/// How often to pet the watchdog (half its timeout), when systemd set one for us.
pub fn watchdog_period() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID") {
        if pid.parse::<u32>().ok() != Some(std::process::id()) {
            return None;
        }
    }
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

fn notify(states: &[NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}
