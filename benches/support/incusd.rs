//! Which process is incusd: shared by the benchmarks (its CPU time) and the fault suite (which
//! stops and restarts it).

/// The pid of incusd itself, not one of its `incusd fork…`/`callhook` helpers.
pub fn incusd_pid() -> Option<String> {
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find(|pid| {
            let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let mut argv = cmd.split('\0');
            argv.next()
                .is_some_and(|a| a.ends_with("/incusd") || a == "incusd")
                && !argv
                    .next()
                    .is_some_and(|a| a.starts_with("fork") || a == "callhook")
        })
}
