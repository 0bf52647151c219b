//! The two clocks of leases ([`Clocks`]): the wall clock they are written in, and the daemon's
//! own clock that fences its actions.

use std::sync::Arc;
use std::time::Duration;

/// The two clocks of leases: the wall clock they are written in (milliseconds since the Unix
/// epoch), and this daemon's own clock that fences its actions. The own clock must keep
/// counting while the host is suspended (`CLOCK_BOOTTIME`; tokio's clock, `CLOCK_MONOTONIC`,
/// stops), or a holder woken after a suspend would go on acting on a lease long gone.
#[derive(Clone)]
pub struct Clocks {
    pub wall: Arc<dyn Fn() -> i64 + Send + Sync>,
    pub mono: Arc<dyn Fn() -> Duration + Send + Sync>,
}

impl Clocks {
    /// The system's clocks: `CLOCK_REALTIME` and `CLOCK_BOOTTIME`.
    pub fn system() -> Self {
        Self {
            wall: Arc::new(wall_ms),
            mono: Arc::new(|| {
                let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
                Duration::new(
                    u64::try_from(t.tv_sec).unwrap_or(0),
                    u32::try_from(t.tv_nsec).unwrap_or(0),
                )
            }),
        }
    }

    /// Clocks that follow tokio's clock (paused, in tests), one for the whole process: every
    /// daemon of a test reads the same wall clock, which starts at the system's time when it
    /// is first asked for. Each test's paused clock has a base of its own, and one test may
    /// have advanced it far beyond another's: the clocks count backwards as well as forwards
    /// from the first reading (never a difference held at zero, which stopped them), the own
    /// clock from a day in.
    pub fn tokio() -> Self {
        static START: std::sync::OnceLock<(tokio::time::Instant, i64)> = std::sync::OnceLock::new();
        let (t0, w0) = *START.get_or_init(|| (tokio::time::Instant::now(), wall_ms()));
        const DAY: Duration = Duration::from_secs(24 * 3600);
        let since = move || {
            let now = tokio::time::Instant::now();
            match now.checked_duration_since(t0) {
                Some(ahead) => (ahead, true),
                None => (t0 - now, false),
            }
        };
        Self {
            wall: Arc::new(move || match since() {
                (d, true) => w0 + super::record::ms(d),
                (d, false) => w0 - super::record::ms(d),
            }),
            mono: Arc::new(move || match since() {
                (d, true) => DAY + d,
                (d, false) => DAY.saturating_sub(d),
            }),
        }
    }
}

/// Milliseconds since the Unix epoch, by the system's clock.
pub fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, super::record::ms)
}
