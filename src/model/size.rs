//! Memory sizes as Incus writes them (`limits.memory = "512MiB"`) and as people read them
//! (`1.5 GiB`). Used by `simulate` (a group's limit), the decision core (a new instance's
//! expected use) and the parser (`[daemon] host_reserve`).

const KIB: f64 = 1024.0;
const MIB: f64 = KIB * KIB;
const GIB: f64 = MIB * KIB;

/// A size in bytes, as Incus writes `limits.memory`: bytes, or kB/MB/GB/TB (powers of 1000)
/// and KiB/MiB/GiB/TiB (powers of 1024), a space between number and unit allowed. A
/// percentage of the host is not a size (`None`), nor is a negative number.
fn size(value: &str) -> Option<f64> {
    let v = value.trim();
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (number, unit) = v.split_at(split);
    let n: f64 = number.parse().ok()?;
    let unit = match unit.trim() {
        "" | "B" => 1.0,
        "kB" | "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        "KiB" => KIB,
        "MiB" => MIB,
        "GiB" => GIB,
        "TiB" => GIB * KIB,
        _ => return None,
    };
    Some(n * unit).filter(|b| b.is_finite())
}

/// A size in MiB (see [`bytes`] for what is read); `None` for zero too.
pub fn mib(value: &str) -> Option<f64> {
    size(value).filter(|b| *b > 0.0).map(|b| b / MIB)
}

/// A size in bytes, zero included: `"2GiB"`, `"512MB"`, `"1048576"`; `None` for anything
/// else (a percentage, a negative number, an unknown unit).
pub fn bytes(value: &str) -> Option<u64> {
    // Above u64::MAX a cast saturates: 16 EiB is as good as infinite here.
    size(value).map(|b| b.round() as u64)
}

/// Bytes for people: `512 MiB`, `1.5 GiB`, `2.0 TiB` (`0 B` and `900 KiB` below a MiB).
pub fn human(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= GIB * KIB {
        format!("{:.1} TiB", b / (GIB * KIB))
    } else if b >= GIB {
        format!("{:.1} GiB", b / GIB)
    } else if b >= MIB {
        format!("{:.0} MiB", b / MIB)
    } else if b >= KIB {
        format!("{:.0} KiB", b / KIB)
    } else {
        format!("{bytes} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_incus_writes_them() {
        assert_eq!(bytes("64MiB"), Some(64 << 20));
        assert_eq!(bytes("2GiB"), Some(2 << 30));
        assert_eq!(bytes("2 GiB"), Some(2 << 30));
        assert_eq!(bytes("1.5GiB"), Some(3 << 29));
        assert_eq!(bytes("512MB"), Some(512_000_000));
        assert_eq!(bytes("1048576"), Some(1 << 20));
        assert_eq!(bytes("0"), Some(0));
        assert_eq!(mib("0"), None);
        for bad in ["50%", "lots", "-5", "", "GiB", "5 parsecs"] {
            assert_eq!(bytes(bad), None, "{bad}");
        }
    }

    #[test]
    fn sizes_for_people() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(512 << 20), "512 MiB");
        assert_eq!(human(3 << 29), "1.5 GiB");
        assert_eq!(human(900 << 10), "900 KiB");
        assert_eq!(human(1 << 40), "1.0 TiB");
    }
}
