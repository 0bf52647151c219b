//! The informer's cache on its own: listings, tickets, tombstones, projects dropped.

use super::*;
use crate::model::InstanceStatus;

fn inst(name: &str, status: &str, group: Option<&str>) -> Instance {
    serde_json::from_value(serde_json::json!({
        "name": name,
        "status": status,
        "config": group.map_or_else(serde_json::Map::new, |g| {
            let mut m = serde_json::Map::new();
            m.insert(GROUP_KEY.into(), g.into());
            m
        }),
    }))
    .unwrap()
}

fn names(s: &Store) -> Vec<(String, String)> {
    s.snapshot().remove("default").unwrap_or_default()
}

#[test]
fn a_listing_is_fresh_until_resync_and_invalidation() {
    let s = Store::default();
    let t0 = Instant::now();
    let resync = Duration::from_secs(300);
    assert!(s.instances("default", t0, resync).is_none(), "never listed");
    let t = s.ticket();
    s.listed(
        "default",
        t,
        vec![inst("web-a", "Running", Some("web"))],
        t0,
    );
    assert_eq!(s.instances("default", t0, resync).unwrap().len(), 1);
    assert!(s
        .instances("default", t0 + Duration::from_secs(299), resync)
        .is_some());
    assert!(s.instances("default", t0 + resync, resync).is_none());
    s.invalidate_all();
    assert!(s.instances("default", t0, resync).is_none());
}

#[test]
fn an_older_read_never_overwrites_a_newer_one_nor_brings_back_the_gone() {
    let s = Store::default();
    let t0 = Instant::now();
    s.listed("default", s.ticket(), vec![], t0);
    let slow = s.ticket();
    let slower = s.ticket();
    let fast = s.ticket();
    s.put(
        "default",
        "web-a",
        fast,
        Some(inst("web-a", "Running", Some("web"))),
    );
    s.put(
        "default",
        "web-a",
        slow,
        Some(inst("web-a", "Stopped", Some("web"))),
    );
    assert_eq!(names(&s), vec![("web-a".into(), "Running".into())]);
    let gone = s.ticket();
    s.put("default", "web-a", gone, None);
    s.put(
        "default",
        "web-a",
        slower,
        Some(inst("web-a", "Running", Some("web"))),
    );
    assert_eq!(names(&s), vec![]);
    // A detached instance (no group key) leaves the cache.
    s.put(
        "default",
        "web-b",
        s.ticket(),
        Some(inst("web-b", "Running", Some("web"))),
    );
    s.put(
        "default",
        "web-b",
        s.ticket(),
        Some(inst("web-b", "Running", None)),
    );
    assert_eq!(names(&s), vec![]);
}

#[test]
fn an_instance_whose_member_does_not_answer_keeps_what_was_known_of_it() {
    let s = Store::default();
    let t0 = Instant::now();
    let mut known = inst("web-a", "Running", Some("web"));
    known.location = "m3".into();
    s.listed("default", s.ticket(), vec![known.clone()], t0);
    // What a cluster lists for it once m3 is offline; and a stranger's, never seen.
    let stub = |name: &str| -> Instance {
        serde_json::from_value(serde_json::json!({
            "name": name, "status": "Error", "status_code": 112, "location": "m3",
            "config": null, "profiles": null, "created_at": "0001-01-01T00:00:00Z",
        }))
        .unwrap()
    };
    s.listed("default", s.ticket(), vec![stub("web-a"), stub("db-1")], t0);
    let got = s.instances("default", t0, Duration::MAX).unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].unreachable && got[0].config == known.config);
    assert_eq!(got[0].status(), InstanceStatus::Unreachable);
    // Back: an ordinary instance again.
    s.listed("default", s.ticket(), vec![known], t0);
    let got = s.instances("default", t0, Duration::MAX).unwrap();
    assert_eq!(got[0].status(), InstanceStatus::Running);
}

#[test]
fn a_listing_keeps_what_was_written_after_it_was_sent() {
    let s = Store::default();
    let t0 = Instant::now();
    let list = s.ticket();
    s.put("default", "web-new", s.ticket(), None); // not followed yet: ignored
    s.listed("default", list, vec![], t0);
    let list = s.ticket();
    s.put(
        "default",
        "web-new",
        s.ticket(),
        Some(inst("web-new", "Running", Some("web"))),
    );
    s.listed(
        "default",
        list,
        vec![inst("web-old", "Running", Some("web"))],
        t0,
    );
    assert_eq!(
        names(&s),
        vec![
            ("web-new".into(), "Running".into()),
            ("web-old".into(), "Running".into())
        ]
    );
}

#[test]
fn events_of_projects_not_followed_are_ignored() {
    let s = Store::default();
    s.put(
        "other",
        "x",
        s.ticket(),
        Some(inst("x", "Running", Some("web"))),
    );
    assert!(s.snapshot().is_empty());
}

#[test]
fn projects_no_group_observes_are_dropped_with_their_instances() {
    let s = Store::default();
    let t0 = Instant::now();
    let web = vec![inst("web-a", "Running", Some("web"))];
    s.listed("default", s.ticket(), web, t0);
    let api = vec![inst("api-a", "Running", Some("api"))];
    s.listed("staging", s.ticket(), api, t0);
    s.retain_projects(&BTreeSet::from(["staging".to_owned()]));
    assert!(!s.follows("default") && s.follows("staging"));
    // A read of the dropped project that comes back late is not taken in.
    let late = Some(inst("web-b", "Running", Some("web")));
    s.put("default", "web-b", s.ticket(), late);
    assert_eq!(s.snapshot().into_keys().collect::<Vec<_>>(), ["staging"]);
    assert!(s.instances("default", t0, Duration::MAX).is_none());
}

#[test]
fn a_tombstone_is_dropped_once_no_read_sent_before_it_can_come_back() {
    let s = Store::default();
    let t0 = Instant::now();
    s.listed("default", s.ticket(), vec![], t0);
    // Every event about an instance of no group is read and leaves it out of the cache (as a
    // deletion does): nothing is kept of them once no older read is in flight.
    for i in 0..100 {
        let name = format!("db-{i}");
        let found = Some(inst(&name, "Running", None));
        s.put("default", &name, s.ticket(), found);
    }
    s.put("default", "web-gone", s.ticket(), None);
    assert_eq!(s.entries("default"), 0, "tombstones kept");
    // A read sent before a removal still counts against it while it is in flight.
    let slow = s.ticket();
    s.put("default", "web-a", s.ticket(), None);
    assert_eq!(s.entries("default"), 1);
    let stale = Some(inst("web-a", "Running", Some("web")));
    s.put("default", "web-a", slow, stale);
    assert_eq!(names(&s), vec![], "the stale read brought web-a back");
    assert_eq!(s.entries("default"), 0);
}

#[test]
fn a_group_reads_its_own_instances_from_the_index_as_listings_and_reads_change_them() {
    let s = Store::default();
    let t0 = Instant::now();
    let of = |g: &str| -> Vec<String> {
        let mut v: Vec<String> = s
            .group_instances("default", g, t0, Duration::MAX)
            .unwrap()
            .into_iter()
            .map(|i| i.name.clone())
            .collect();
        v.sort();
        v
    };
    assert!(s
        .group_instances("default", "web", t0, Duration::MAX)
        .is_none());
    s.listed(
        "default",
        s.ticket(),
        vec![
            inst("web-a", "Running", Some("web")),
            inst("web-b", "Running", Some("web")),
            inst("api-a", "Running", Some("api")),
            inst("loose", "Running", None),
        ],
        t0,
    );
    assert_eq!(of("web"), ["web-a", "web-b"]);
    assert_eq!(of("api"), ["api-a"]);
    assert!(of("db").is_empty());
    // A read finds web-b in another group (its key edited), one finds api-a gone, a new one.
    s.put(
        "default",
        "web-b",
        s.ticket(),
        Some(inst("web-b", "Running", Some("api"))),
    );
    s.put("default", "api-a", s.ticket(), None);
    s.put(
        "default",
        "web-c",
        s.ticket(),
        Some(inst("web-c", "Running", Some("web"))),
    );
    assert_eq!(of("web"), ["web-a", "web-c"]);
    assert_eq!(of("api"), ["web-b"]);
    // A key taken away leaves the group; a listing makes the index anew.
    s.put(
        "default",
        "web-a",
        s.ticket(),
        Some(inst("web-a", "Running", None)),
    );
    assert_eq!(of("web"), ["web-c"]);
    s.listed(
        "default",
        s.ticket(),
        vec![inst("web-a", "Running", Some("web"))],
        t0,
    );
    assert_eq!(of("web"), ["web-a"]);
    assert!(of("api").is_empty());
    // The index and the whole project agree.
    let all = s.instances("default", t0, Duration::MAX).unwrap();
    assert_eq!(all.len(), 1);
}

#[test]
fn the_cache_keeps_every_key_but_those_incus_writes_for_itself_and_the_uuid() {
    let s = Store::default();
    let t0 = Instant::now();
    let mut i = inst("web-a", "Running", Some("web"));
    for (k, v) in [
        ("volatile.uuid", "9ffd1eae"),
        ("volatile.idmap.next", "[{\"Isuid\":true}]"),
        ("volatile.last_state.power", "RUNNING"),
        ("image.os", "busybox"),
        ("limits.memory", "64MiB"),
        ("user.incus-hpa.owner", "default/web-a/9ffd1eae"),
        ("user.note", "kept"),
    ] {
        i.config.insert(k.into(), v.into());
    }
    let read = i.clone();
    s.listed("default", s.ticket(), vec![i], t0);
    let keys = |s: &Store| {
        let got = s
            .group_instances("default", "web", t0, Duration::MAX)
            .unwrap();
        let mut k: Vec<String> = got[0].config.keys().cloned().collect();
        k.sort();
        k
    };
    let want = [
        "limits.memory",
        "user.incus-hpa.group",
        "user.incus-hpa.owner",
        "user.note",
        "volatile.uuid",
    ];
    assert_eq!(keys(&s), want, "after a listing");
    s.put("default", "web-a", s.ticket(), Some(read));
    assert_eq!(keys(&s), want, "after a read");
}
