//! Host headroom (`[daemon] host_reserve`): the memory each host keeps available, what a pass
//! read of the hosts when it would add instances ([`Headroom`]), and what the decision made of
//! it ([`HeadroomCheck`]). Facts and outcomes only: the reading is `crate::headroom`'s, the cap
//! `crate::decide`'s.

use std::fmt;

use super::size::{bytes, human};

/// The largest percentage `host_reserve` accepts: a host that keeps more than 90 % of its
/// memory free runs nothing.
pub const RESERVE_PERCENT_MAX: f64 = 90.0;

/// `[daemon] host_reserve`: the memory each host keeps available, whatever the groups want.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HostReserve {
    /// A size, the same on every host.
    Bytes(u64),
    /// A percentage of each host's total memory.
    Percent(f64),
}

impl Default for HostReserve {
    /// 5 %: see `host_reserve` in the table of keys for why.
    fn default() -> Self {
        HostReserve::Percent(5.0)
    }
}

impl HostReserve {
    /// `"2GiB"`, `"512MiB"`, `"1073741824"` (bytes) or `"10%"` (of each host's total, 0 to
    /// [`RESERVE_PERCENT_MAX`]); the error says what is wrong, for the parser to locate.
    pub fn parse(s: &str) -> Result<Self, String> {
        if let Some(p) = s.trim().strip_suffix('%') {
            return match p.trim().parse::<f64>() {
                Ok(p) if (0.0..=RESERVE_PERCENT_MAX).contains(&p) => Ok(HostReserve::Percent(p)),
                Ok(p) if p.is_finite() => Err(format!(
                    "{p}% is out of range: a percentage must be from 0 to {RESERVE_PERCENT_MAX}"
                )),
                _ => Err(format!("{s:?} is not a percentage: write e.g. \"10%\"")),
            };
        }
        bytes(s).map(HostReserve::Bytes).ok_or_else(|| {
            format!(
                "{s:?} is not a size or a percentage: write e.g. \"2GiB\", \"512MiB\", a number \
                 of bytes, or \"10%\" of each host's memory"
            )
        })
    }

    /// What it keeps, in bytes, of a host with `total` bytes of memory.
    pub fn of(self, total: u64) -> u64 {
        match self {
            HostReserve::Bytes(b) => b,
            HostReserve::Percent(p) => (total as f64 * p / 100.0) as u64,
        }
    }
}

impl fmt::Display for HostReserve {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostReserve::Bytes(b) => f.write_str(&human(*b)),
            HostReserve::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// What one host has for new instances, as read in one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoom {
    /// The cluster member; empty for a single server.
    pub member: String,
    /// Memory available, bytes: the host's `MemAvailable`, or Incus' total − used, less
    /// what passes of other groups in the same round planned to put there.
    pub available: u64,
    /// What `host_reserve` keeps of it, bytes.
    pub reserve: u64,
    /// A new instance of the group may be placed there: the group's `target` allows it and
    /// the member is online (always, on a single server).
    pub placeable: bool,
}

impl HostRoom {
    /// What new instances may use there: available − reserve, 0 when below.
    pub fn room(&self) -> u64 {
        self.available.saturating_sub(self.reserve)
    }
}

/// The hosts' figures, read for one pass that would add instances (see `crate::headroom`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Headroom {
    /// The hosts read: the server, or the cluster members the pass could use. A host that
    /// could not be read is missing: nothing is placed there, and a start there is not
    /// checked.
    pub hosts: Vec<HostRoom>,
    /// Incus is a cluster: each new instance goes to a member chosen for it (its `target`).
    pub clustered: bool,
}

/// Where the expected use of a new instance comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpectedUse {
    /// The mean working set of this many measured instances of the group.
    Measured(usize),
    /// The group's `limits.memory`.
    Limit,
    /// Neither is known: counted as 0.
    Unknown,
}

/// What the host check did to one pass's additions (creations, starts, promotions, warm-pool
/// creations).
#[derive(Debug, Clone, PartialEq)]
pub struct HeadroomCheck {
    /// What each new instance is expected to use, bytes.
    pub per_instance: u64,
    pub basis: ExpectedUse,
    /// Additions let through.
    pub admitted: u32,
    /// Additions held back: no host they could go to has room for them.
    pub held: u32,
    /// What the admitted additions are expected to use, by member (`""`: a single server).
    pub claimed: Vec<(String, u64)>,
    /// The hosts as read.
    pub hosts: Vec<HostRoom>,
    /// The group's `min` when it stays below it for lack of room.
    pub below_min: Option<u32>,
}

impl fmt::Display for HeadroomCheck {
    /// The journal line of a pass that held additions back: what was available, what was
    /// needed, and where the expected use comes from.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per = human(self.per_instance);
        let total = self.admitted + self.held;
        write!(f, "{} of {total} addition(s) held back: ", self.held)?;
        let placeable: Vec<&HostRoom> = self.hosts.iter().filter(|h| h.placeable).collect();
        match placeable.as_slice() {
            [h] if h.member.is_empty() => write!(
                f,
                "the host has {} available, and {total} new instance(s) need {} ({} of \
                 host_reserve + {total} × {per})",
                human(h.available),
                human(
                    h.reserve
                        .saturating_add(self.per_instance.saturating_mul(u64::from(total)))
                ),
                human(h.reserve),
            )?,
            [] => f.write_str("no cluster member the group may use could be read")?,
            hosts => {
                f.write_str("no cluster member has room for another: ")?;
                let each: Vec<String> = hosts
                    .iter()
                    .map(|h| {
                        format!(
                            "{} has {} available, needs {}",
                            h.member,
                            human(h.available),
                            human(
                                h.reserve
                                    .saturating_add(claimed(&self.claimed, &h.member))
                                    .saturating_add(self.per_instance)
                            )
                        )
                    })
                    .collect();
                f.write_str(&each.join(", "))?;
            }
        }
        write!(f, "; each new instance is expected to use {per} (")?;
        match self.basis {
            ExpectedUse::Measured(n) => {
                write!(f, "the mean working set of {n} measured instance(s)")?
            }
            ExpectedUse::Limit => f.write_str("its limits.memory: no instance is measured")?,
            ExpectedUse::Unknown => f.write_str(
                "unknown: no instance is measured and the group's config has no limits.memory; \
                 counted as 0",
            )?,
        }
        f.write_str(")")?;
        if let Some(min) = self.below_min {
            write!(
                f,
                "; the group stays below its min ({min}): a host that cannot hold another \
                 instance is not pushed into the OOM killer"
            )?;
        }
        Ok(())
    }
}

/// What `claimed` puts on `member`.
fn claimed(claimed: &[(String, u64)], member: &str) -> u64 {
    claimed
        .iter()
        .filter(|(m, _)| m == member)
        .map(|(_, b)| b)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_are_sizes_or_percentages() {
        assert_eq!(HostReserve::parse("2GiB"), Ok(HostReserve::Bytes(2 << 30)));
        assert_eq!(HostReserve::parse("0"), Ok(HostReserve::Bytes(0)));
        assert_eq!(HostReserve::parse("10%"), Ok(HostReserve::Percent(10.0)));
        assert_eq!(HostReserve::parse("0%"), Ok(HostReserve::Percent(0.0)));
        assert!(HostReserve::parse("95%")
            .unwrap_err()
            .contains("out of range"));
        assert!(HostReserve::parse("-1%")
            .unwrap_err()
            .contains("out of range"));
        assert!(HostReserve::parse("x%")
            .unwrap_err()
            .contains("not a percentage"));
        assert!(HostReserve::parse("2 gigs")
            .unwrap_err()
            .contains("not a size"));
        assert_eq!(HostReserve::Percent(5.0).of(1000), 50);
        assert_eq!(HostReserve::Bytes(7).of(1000), 7);
    }

    #[test]
    fn the_message_says_what_was_available_and_what_was_needed() {
        let check = HeadroomCheck {
            per_instance: 512 << 20,
            basis: ExpectedUse::Measured(3),
            admitted: 1,
            held: 2,
            claimed: vec![(String::new(), 512 << 20)],
            hosts: vec![HostRoom {
                member: String::new(),
                available: 2 << 30,
                reserve: 1 << 30,
                placeable: true,
            }],
            below_min: Some(4),
        };
        assert_eq!(
            check.to_string(),
            "2 of 3 addition(s) held back: the host has 2.0 GiB available, and 3 new \
             instance(s) need 2.5 GiB (1.0 GiB of host_reserve + 3 × 512 MiB); each new \
             instance is expected to use 512 MiB (the mean working set of 3 measured instance(s)); the group stays \
             below its min (4): a host that cannot hold another instance is not pushed into \
             the OOM killer"
        );
    }
}
