//! Schedule windows on instants written in RFC 3339: edges, weekdays, overlaps, midnight, both
//! daylight saving changes of 2026 in Europe/Paris and America/New_York, the host's zone,
//! `next_change`, and the messages for bad expressions and zones. No clock is read.

use std::time::{Duration, SystemTime};

use super::{check, Bounds, Windows, Zone};
use crate::model::ScheduleSpec;

/// The instant an RFC 3339 string names.
fn t(s: &str) -> SystemTime {
    let at: jiff::Timestamp = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
    SystemTime::from(at)
}

/// Instants, each with whether the window is open then.
type Instants<'a> = &'a [(&'a str, bool)];

/// A window with its `min` and `max`, in `zone` (`None`: the host's).
fn window(
    cron: &str,
    duration: &str,
    zone: Option<&str>,
    min: Option<u32>,
    max: Option<u32>,
) -> ScheduleSpec {
    ScheduleSpec {
        cron: cron.into(),
        duration: humantime::parse_duration(duration).expect(duration),
        min,
        max,
        timezone: zone.map(str::to_owned),
    }
}

/// `window` without bounds.
fn plain(cron: &str, duration: &str, zone: Option<&str>) -> ScheduleSpec {
    window(cron, duration, zone, Some(1), None)
}

fn compile(specs: &[ScheduleSpec], host: &str) -> Windows {
    let host = Zone::named(host).expect("a host zone");
    Windows::new(specs, &host).expect("valid windows")
}

/// Whether the single window of `specs` is open at each instant of `cases`.
fn assert_open(what: &str, specs: &[ScheduleSpec], host: &str, cases: Instants) {
    let windows = compile(specs, host);
    for &(at, open) in cases {
        let got = !windows.at(t(at)).open.is_empty();
        assert_eq!(got, open, "{what}: at {at} expected open={open}");
    }
}

#[test]
fn the_start_is_open_and_the_end_closed() {
    // Monday 2026-06-01, Paris summer time (+02:00).
    let specs = [plain("0 8 * * 1-5", "10h", Some("Europe/Paris"))];
    assert_open(
        "weekday mornings",
        &specs,
        "UTC",
        &[
            ("2026-06-01T07:59:59.999999999+02:00", false),
            ("2026-06-01T08:00:00+02:00", true),
            ("2026-06-01T06:00:00Z", true),
            ("2026-06-01T08:00:00.5+02:00", true),
            ("2026-06-01T17:59:59.999999999+02:00", true),
            ("2026-06-01T18:00:00+02:00", false),
            ("2026-06-05T09:00:00+02:00", true),  // Friday
            ("2026-06-06T09:00:00+02:00", false), // Saturday
            ("2026-06-07T09:00:00+02:00", false), // Sunday
            ("2026-06-08T07:00:00+02:00", false), // Monday, before
        ],
    );
}

#[test]
fn weekday_fields() {
    // 2026-06-01 is a Monday; one hour from 09:00 UTC.
    let cases: &[(&str, Instants)] = &[
        (
            "0 9 * * 1-5",
            &[
                ("2026-06-03T09:30:00Z", true),
                ("2026-06-06T09:30:00Z", false),
            ],
        ),
        (
            "0 9 * * MON-FRI",
            &[
                ("2026-06-05T09:30:00Z", true),
                ("2026-06-07T09:30:00Z", false),
            ],
        ),
        (
            "0 9 * * mon-fri",
            &[
                ("2026-06-01T09:30:00Z", true),
                ("2026-06-06T09:30:00Z", false),
            ],
        ),
        (
            "0 9 * * 1,3,5",
            &[
                ("2026-06-01T09:30:00Z", true),
                ("2026-06-02T09:30:00Z", false),
                ("2026-06-03T09:30:00Z", true),
            ],
        ),
        (
            "0 9 * * 6,0",
            &[
                ("2026-06-06T09:30:00Z", true),
                ("2026-06-07T09:30:00Z", true),
                ("2026-06-08T09:30:00Z", false),
            ],
        ),
        (
            "0 9 * * 7",
            &[
                ("2026-06-07T09:30:00Z", true),
                ("2026-06-06T09:30:00Z", false),
            ],
        ),
        (
            "0 9 * * 5-7",
            &[
                ("2026-06-04T09:30:00Z", false),
                ("2026-06-05T09:30:00Z", true),
                ("2026-06-07T09:30:00Z", true),
            ],
        ),
        (
            "0 9 * * sat-sun",
            &[
                ("2026-06-07T09:30:00Z", true),
                ("2026-06-05T09:30:00Z", false),
            ],
        ),
        (
            "0 9 * * 1#1",
            &[
                ("2026-06-01T09:30:00Z", true),
                ("2026-06-08T09:30:00Z", false),
            ],
        ),
    ];
    for (cron, at) in cases {
        assert_open(cron, &[plain(cron, "1h", Some("UTC"))], "UTC", at);
    }
}

#[test]
fn overlapping_windows_take_the_highest_min_and_max() {
    let specs = [
        window("0 8 * * *", "10h", None, Some(4), Some(12)),
        window("0 12 * * *", "2h", None, Some(6), Some(8)),
        window("0 13 * * *", "1h", None, Some(2), None),
        window("0 16 * * *", "1h", None, None, Some(20)),
    ];
    let windows = compile(&specs, "UTC");
    // The open windows, then min and max.
    type Expected<'a> = (&'a [usize], Option<u32>, Option<u32>);
    let cases: &[(&str, Expected)] = &[
        ("2026-06-01T07:00:00Z", (&[], None, None)),
        ("2026-06-01T09:00:00Z", (&[0], Some(4), Some(12))),
        ("2026-06-01T12:30:00Z", (&[0, 1], Some(6), Some(12))),
        ("2026-06-01T13:30:00Z", (&[0, 1, 2], Some(6), Some(12))),
        ("2026-06-01T16:30:00Z", (&[0, 3], Some(4), Some(20))),
        ("2026-06-01T19:00:00Z", (&[], None, None)),
    ];
    for &(at, expected) in cases {
        let got = windows.at(t(at));
        assert_eq!((got.open.as_slice(), got.min, got.max), expected, "at {at}");
    }
}

#[test]
fn a_window_spans_midnight() {
    // Friday 2026-06-05 22:00 UTC for 8 hours: the weekday is the start's.
    assert_open(
        "friday night",
        &[plain("0 22 * * 5", "8h", None)],
        "UTC",
        &[
            ("2026-06-05T21:59:59Z", false),
            ("2026-06-05T22:00:00Z", true),
            ("2026-06-06T00:00:00Z", true),
            ("2026-06-06T05:59:59Z", true),
            ("2026-06-06T06:00:00Z", false),
            ("2026-06-06T23:00:00Z", false),
        ],
    );
    assert_open(
        "every night",
        &[plain("30 23 * * *", "1h", None)],
        "UTC",
        &[
            ("2026-12-31T23:45:00Z", true),
            ("2027-01-01T00:15:00Z", true),
        ],
    );
}

#[test]
fn daylight_saving_changes_of_2026() {
    // Paris: 2026-03-29 02:00 CET -> 03:00 CEST, 2026-10-25 03:00 CEST -> 02:00 CET.
    // New York: 2026-03-08 02:00 EST -> 03:00 EDT, 2026-11-01 02:00 EDT -> 01:00 EST.
    let paris = Some("Europe/Paris");
    let new_york = Some("America/New_York");
    let cases: &[(&str, &str, Option<&str>, Instants)] = &[
        // A start in the skipped hour opens once, at the jump.
        (
            "30 2 * * *",
            "1h",
            paris,
            &[
                ("2026-03-28T02:30:00+01:00", true),
                ("2026-03-29T01:59:59+01:00", false),
                ("2026-03-29T03:00:00+02:00", true),
                ("2026-03-29T03:59:59+02:00", true),
                ("2026-03-29T04:00:00+02:00", false),
                ("2026-03-30T02:30:00+02:00", true),
            ],
        ),
        // Several or stepped times skip the hour that does not exist.
        (
            "*/30 2 * * *",
            "20m",
            paris,
            &[
                ("2026-03-28T02:40:00+01:00", true),
                ("2026-03-29T03:00:00+02:00", false),
                ("2026-03-29T03:10:00+02:00", false),
            ],
        ),
        // Durations are elapsed time: 10 hours from 00:00 CET end at 11:00 CEST.
        (
            "0 0 * * *",
            "10h",
            paris,
            &[
                ("2026-03-29T10:59:59+02:00", true),
                ("2026-03-29T11:00:00+02:00", false),
            ],
        ),
        (
            "0 8 * * *",
            "10h",
            paris,
            &[
                ("2026-03-29T17:59:59+02:00", true),
                ("2026-03-29T18:00:00+02:00", false),
            ],
        ),
        // A repeated start opens once, at its first pass.
        (
            "30 2 * * *",
            "1h",
            paris,
            &[
                ("2026-10-25T02:29:59+02:00", false),
                ("2026-10-25T02:30:00+02:00", true),
                ("2026-10-25T02:29:59+01:00", true),
                ("2026-10-25T02:30:00+01:00", false),
                ("2026-10-25T02:45:00+01:00", false),
            ],
        ),
        // Stepped minutes match on both passes.
        (
            "*/30 2 * * *",
            "10m",
            paris,
            &[
                ("2026-10-25T02:35:00+02:00", true),
                ("2026-10-25T02:15:00+01:00", false),
                ("2026-10-25T02:35:00+01:00", true),
            ],
        ),
        // 10 hours from 00:00 CEST end at 09:00 CET.
        (
            "0 0 * * *",
            "10h",
            paris,
            &[
                ("2026-10-25T08:59:59+01:00", true),
                ("2026-10-25T09:00:00+01:00", false),
            ],
        ),
        (
            "30 2 * * *",
            "1h",
            new_york,
            &[
                ("2026-03-08T01:59:59-05:00", false),
                ("2026-03-08T03:00:00-04:00", true),
                ("2026-03-08T03:59:59-04:00", true),
                ("2026-03-08T04:00:00-04:00", false),
            ],
        ),
        (
            "0 0 * * *",
            "10h",
            new_york,
            &[
                ("2026-03-08T10:59:59-04:00", true),
                ("2026-03-08T11:00:00-04:00", false),
            ],
        ),
        (
            "30 1 * * *",
            "1h",
            new_york,
            &[
                ("2026-11-01T01:29:59-04:00", false),
                ("2026-11-01T01:30:00-04:00", true),
                ("2026-11-01T01:29:59-05:00", true),
                ("2026-11-01T01:30:00-05:00", false),
            ],
        ),
        (
            "0 0 * * *",
            "10h",
            new_york,
            &[
                ("2026-11-01T08:59:59-05:00", true),
                ("2026-11-01T09:00:00-05:00", false),
            ],
        ),
    ];
    for &(cron, duration, zone, at) in cases {
        let what = format!("{cron} for {duration} in {zone:?}");
        assert_open(&what, &[plain(cron, duration, zone)], "UTC", at);
    }
}

#[test]
fn a_window_without_a_zone_uses_the_host_zone() {
    let at =
        |spec: ScheduleSpec, host: &str, s: &str| !compile(&[spec], host).at(t(s)).open.is_empty();
    let host_zone = || plain("0 8 * * *", "1h", None);
    let new_york = || plain("0 8 * * *", "1h", Some("America/New_York"));
    let cases = [
        (host_zone(), "Asia/Tokyo", "2026-06-01T23:30:00Z", true),
        (host_zone(), "Asia/Tokyo", "2026-06-01T06:30:00Z", false),
        (host_zone(), "Europe/Paris", "2026-06-01T06:30:00Z", true),
        (host_zone(), "UTC", "2026-06-01T08:30:00Z", true),
        (new_york(), "Asia/Tokyo", "2026-06-01T12:30:00Z", true),
        (new_york(), "Asia/Tokyo", "2026-06-01T23:30:00Z", false),
    ];
    for (spec, host, s, open) in cases {
        assert_eq!(
            at(spec.clone(), host, s),
            open,
            "{spec:?} on a host in {host} at {s}"
        );
    }
}

#[test]
fn the_host_zone_is_named_or_explained() {
    match Zone::host() {
        Ok(zone) => {
            if let Some(name) = zone.name() {
                assert_eq!(Zone::named(name), Ok(zone));
            }
        }
        Err(e) => assert!(e.contains("timezone = \"Europe/Paris\""), "{e}"),
    }
}

/// `next_change` is as expected, and the windows' state holds until then and changes there.
fn assert_next_change(specs: &[ScheduleSpec], now: &str, expected: Option<&str>) {
    let windows = compile(specs, "UTC");
    let before = windows.at(t(now));
    assert_eq!(before.next_change, expected.map(t), "{specs:?} at {now}");
    if let Some(change) = before.next_change {
        let just_before = windows.at(change - Duration::from_nanos(1));
        assert_eq!(
            just_before.open, before.open,
            "{specs:?}: held until {expected:?}"
        );
        assert_ne!(
            windows.at(change).open,
            before.open,
            "{specs:?}: changed at {expected:?}"
        );
    }
}

#[test]
fn next_change_is_the_next_opening_or_closing() {
    let weekdays = [plain("0 8 * * 1-5", "10h", Some("Europe/Paris"))];
    let even_hours = [plain("0 */2 * * *", "90m", None)];
    let two = [
        plain("0 8 * * *", "10h", None),
        plain("0 12 * * *", "1h", None),
    ];
    let paris_2_30 = [plain("30 2 * * *", "1h", Some("Europe/Paris"))];
    let cases: &[(&[ScheduleSpec], &str, Option<&str>)] = &[
        (
            &weekdays,
            "2026-06-01T07:00:00+02:00",
            Some("2026-06-01T08:00:00+02:00"),
        ),
        (
            &weekdays,
            "2026-06-01T08:00:00+02:00",
            Some("2026-06-01T18:00:00+02:00"),
        ),
        (
            &weekdays,
            "2026-06-01T09:00:00+02:00",
            Some("2026-06-01T18:00:00+02:00"),
        ),
        (
            &weekdays,
            "2026-06-01T18:00:00+02:00",
            Some("2026-06-02T08:00:00+02:00"),
        ),
        (
            &weekdays,
            "2026-06-05T19:00:00+02:00",
            Some("2026-06-08T08:00:00+02:00"),
        ),
        (
            &even_hours,
            "2026-06-01T00:10:00Z",
            Some("2026-06-01T01:30:00Z"),
        ),
        (
            &even_hours,
            "2026-06-01T01:30:00Z",
            Some("2026-06-01T02:00:00Z"),
        ),
        (&two, "2026-06-01T09:00:00Z", Some("2026-06-01T12:00:00Z")),
        (&two, "2026-06-01T12:30:00Z", Some("2026-06-01T13:00:00Z")),
        (&two, "2026-06-01T13:00:00Z", Some("2026-06-01T18:00:00Z")),
        (
            &paris_2_30,
            "2026-03-29T00:00:00Z",
            Some("2026-03-29T03:00:00+02:00"),
        ),
        (
            &paris_2_30,
            "2026-10-25T00:45:00Z",
            Some("2026-10-25T02:30:00+01:00"),
        ),
        (
            &paris_2_30,
            "2026-10-25T02:30:00+01:00",
            Some("2026-10-26T02:30:00+01:00"),
        ),
        (&[], "2026-06-01T00:00:00Z", None),
    ];
    for &(specs, now, expected) in cases {
        assert_next_change(specs, now, expected);
    }
}

#[test]
fn a_window_that_reopens_before_it_closes_stays_open() {
    // Every hour for 90 minutes, every two hours for two (a match at the very end counts):
    // neither closes; `next_change` is where the search stopped, a safe time to look again,
    // when it is still open.
    for (cron, duration) in [("0 * * * *", "90m"), ("0 */2 * * *", "2h")] {
        let windows = compile(&[plain(cron, duration, None)], "UTC");
        let now = t("2026-06-01T00:10:00Z");
        let bounds = windows.at(now);
        assert_eq!(bounds.open, [0], "{cron}");
        let change = bounds.next_change.expect("a time to look again");
        assert!(
            change > now + Duration::from_secs(24 * 3600),
            "{cron}: {change:?}"
        );
        assert_eq!(windows.at(change).open, [0], "{cron}");
    }
}

#[test]
fn a_zero_duration_never_opens() {
    let windows = compile(&[plain("0 8 * * *", "0s", None)], "UTC");
    assert_eq!(windows.at(t("2026-06-01T08:00:00Z")), Bounds::default());
}

#[test]
fn accepted_expressions_and_zones() {
    let cases = [
        ("0 8 * * 1-5", None),
        ("*/15 * * * *", Some("UTC")),
        ("0 0 1 jan *", Some("America/New_York")),
        ("0 9 * * mon-fri", Some("Europe/Paris")),
        ("0 9 * * mon-fri", Some("europe/paris")),
        ("  0 8 * * *  ", Some("Asia/Kolkata")),
        ("@daily", None),
        ("@Weekly", None),
        ("0 9 * * 1#2", None),
        ("0 18 L * *", None),
        ("0 0 29 2 *", None),
    ];
    for (cron, zone) in cases {
        assert_eq!(check(cron, zone), Ok(()), "{cron} in {zone:?}");
    }
}

#[test]
fn bad_expressions_and_zones_are_explained() {
    let cases: &[(&str, Option<&str>, &[&str])] = &[
        ("", None, &["empty", "five fields"]),
        ("0 8 * *", None, &["4 fields", "expected five"]),
        (
            "0 0 8 * * 1-5",
            None,
            &["6 fields", "expected five", "seconds"],
        ),
        ("0 0 8 * * 1-5 2026", None, &["7 fields", "expected five"]),
        (
            "61 * * * *",
            None,
            &["minute field \"61\": number out of bounds;", "0-59"],
        ),
        ("*/0 * * * *", None, &["minute field \"*/0\""]),
        ("0 24 * * *", None, &["hour field \"24\"", "0-23"]),
        ("0 8 0 * *", None, &["day-of-month field \"0\"", "1-31"]),
        (
            "0 8 * 13 *",
            None,
            &["month field \"13\"", "1-12 or JAN-DEC"],
        ),
        ("0 8 * * 8", None, &["day-of-week field \"8\"", "SUN-SAT"]),
        (
            "0 8 * * MOX",
            None,
            &["day-of-week field \"MOX\": illegal character 'M';"],
        ),
        (
            "0 8 x * *",
            None,
            &["day-of-month field \"x\"", "a range a-b"],
        ),
        ("0 0 30 2 *", None, &["never matches"]),
        ("@reboot", None, &["unknown cron nickname", "@daily"]),
        (
            "0 8 * * *",
            Some("paris"),
            &["unknown time zone \"paris\": did you mean \"Europe/Paris\"?"],
        ),
        (
            "0 8 * * *",
            Some("Mars/Olympus"),
            &[
                "unknown time zone \"Mars/Olympus\"",
                "IANA",
                "\"Europe/Paris\"",
            ],
        ),
        ("0 8 * * *", Some("+02:00"), &["IANA"]),
        ("0 8 * * *", Some(""), &["unknown time zone"]),
    ];
    for &(cron, zone, needles) in cases {
        let e = check(cron, zone).expect_err(cron);
        for needle in needles {
            assert!(
                e.contains(needle),
                "{cron} in {zone:?}: {e:?} lacks {needle:?}"
            );
        }
    }
}

#[test]
fn windows_name_the_bad_one() {
    let specs = [
        plain("0 8 * * *", "1h", None),
        plain("0 8 * * *", "1h", Some("Mars/Olympus")),
    ];
    let e = Windows::new(&specs, &Zone::UTC).expect_err("an unknown zone");
    assert!(e.starts_with("schedule window 1: unknown time zone"), "{e}");
    let specs = [plain("0 25 * * *", "1h", None)];
    let e = Windows::new(&specs, &Zone::UTC).expect_err("a bad hour");
    assert!(e.starts_with("schedule window 0: hour field"), "{e}");
}
