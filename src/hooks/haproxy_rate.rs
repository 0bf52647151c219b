//! `incus-hpa hook haproxy-rate`: an external program for `[[groups.NAME.external]]` that
//! prints a HAProxy backend's current rate, so a group can scale on requests per instance.
//!
//! It asks the runtime API socket for `show stat` (CSV) and prints the `rate` column of the
//! backend's `BACKEND` row: the sessions per second over the last second, which in `mode http`
//! is one per request. With `target = 50`, the group wants one instance per 50 requests per
//! second. (HAProxy leaves `req_rate` empty on a backend row: it is a frontend's.)

use std::path::Path;

use super::haproxy::send;

/// Reads the `rate` of `backend`'s BACKEND row from the answer to `show stat`.
pub fn parse_rate(text: &str, backend: &str) -> Result<u64, String> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .and_then(|h| h.strip_prefix("# "))
        .ok_or_else(|| format!("HAProxy answered: {}", text.trim()))?
        .split(',')
        .collect();
    let column = |name: &str| {
        header
            .iter()
            .position(|c| *c == name)
            .ok_or_else(|| format!("no {name} column in the answer to show stat"))
    };
    let (px, sv, rate) = (column("pxname")?, column("svname")?, column("rate")?);
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        if f.get(px) == Some(&backend) && f.get(sv) == Some(&"BACKEND") {
            let value = f.get(rate).copied().unwrap_or("");
            return value
                .parse()
                .map_err(|_| format!("backend {backend} has no rate ({value:?})"));
        }
    }
    Err(format!("no backend {backend} in HAProxy's statistics"))
}

/// The current rate of `backend`, asked on `socket`.
pub fn rate(socket: &Path, backend: &str) -> Result<u64, String> {
    parse_rate(&send(socket, "show stat")?, backend)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backend_row_gives_the_rate() {
        let text = "# pxname,svname,qcur,rate,req_rate\nfe,FRONTEND,,9,9\nweb,web-1,0,3,\nweb,BACKEND,0,42,\n\n";
        assert_eq!(parse_rate(text, "web").unwrap(), 42);
        assert!(parse_rate(text, "api")
            .unwrap_err()
            .contains("no backend api"));
        assert!(parse_rate("Unknown command.\n", "web").is_err());
    }
}
