//! Ownership: which instances carrying a group's key the daemon created for that group.
//!
//! Incus copies every `user.*` key with an instance, so the group key alone says nothing about
//! who made it. At creation the daemon records the instance's identity in [`OWNER_KEY`] as
//! `PROJECT/NAME/UUID`, and gives it that `volatile.uuid` itself, in the same request. What
//! Incus does to the identity (verified on Incus 6.0):
//!
//! | operation                         | name | project | volatile.uuid |
//! |-----------------------------------|------|---------|---------------|
//! | `incus copy` (also from snapshot) | new  | same*   | new           |
//! | `incus rename` / `move` same project | new | same  | same          |
//! | `incus move --target-project`     | same*| new     | same          |
//! | `incus import` of an export       | any  | same*   | same          |
//!
//! so a copy, a rename and a move never match their record. An export imported under its
//! original name once the original is gone is the original instance restored (Incus keeps every
//! identity key), and is treated as such.

use std::collections::HashMap;

use crate::model::{GROUP_KEY, OWNER_KEY, UUID_KEY};

/// Whose an instance is, for one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// Created by the daemon for this group: counted, measured, started and removed.
    Owned,
    /// Carries the group's key but is not the instance the daemon created; why, for people.
    Foreign(String),
    /// Not in this group at all.
    NotInGroup,
}

/// The [`OWNER_KEY`] value of the instance `name` in `project` with `uuid`.
pub fn owner_value(project: &str, name: &str, uuid: &str) -> String {
    format!("{project}/{name}/{uuid}")
}

/// Whose the instance `name` of `project`, with this `config`, is for `group`.
pub fn ownership(
    group: &str,
    project: &str,
    name: &str,
    config: &HashMap<String, String>,
) -> Ownership {
    if config.get(GROUP_KEY).map(String::as_str) != Some(group) {
        return Ownership::NotInGroup;
    }
    let uuid = config.get(UUID_KEY).map(String::as_str);
    let Some(owner) = config.get(OWNER_KEY) else {
        return Ownership::Foreign(
            "it has no owner record: it was created by hand, or by incus-hpa 0.1".into(),
        );
    };
    let mut parts = owner.splitn(3, '/');
    let (Some(p), Some(n), Some(u)) = (parts.next(), parts.next(), parts.next()) else {
        return Ownership::Foreign(format!(
            "its owner record {owner:?} is not PROJECT/NAME/UUID"
        ));
    };
    if p != project {
        Ownership::Foreign(format!("it was moved here from project {p}"))
    } else if n != name && uuid == Some(u) {
        Ownership::Foreign(format!("it was renamed (or imported) from {n}"))
    } else if n != name {
        Ownership::Foreign(format!("it is a copy of {n}"))
    } else if uuid != Some(u) {
        Ownership::Foreign(format!(
            "it is a copy put in the place of {n} (its volatile.uuid is not the one incus-hpa gave it)"
        ))
    } else {
        Ownership::Owned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const U1: &str = "7995a161-ba12-43b3-8397-941bcbcfc766";
    const U2: &str = "eeeebe41-cb14-4924-9a25-550af174c998";

    #[test]
    fn only_the_instance_as_created_is_owned() {
        let owner = owner_value("default", "web-a", U1);
        let ours = config(&[(GROUP_KEY, "web"), (OWNER_KEY, &owner), (UUID_KEY, U1)]);
        let own = |project: &str, name: &str, c: &HashMap<String, String>| {
            ownership("web", project, name, c)
        };
        assert_eq!(own("default", "web-a", &ours), Ownership::Owned);
        assert_eq!(
            ownership("api", "default", "web-a", &ours),
            Ownership::NotInGroup
        );
        assert_eq!(
            ownership("WEB", "default", "web-a", &ours),
            Ownership::NotInGroup
        );

        let foreign =
            |project: &str, name: &str, c: &HashMap<String, String>| match own(project, name, c) {
                Ownership::Foreign(why) => why,
                other => panic!("{name} in {project}: {other:?}"),
            };
        // `incus copy web-a web-debug`: new name, new uuid.
        let copy = config(&[(GROUP_KEY, "web"), (OWNER_KEY, &owner), (UUID_KEY, U2)]);
        assert_eq!(
            foreign("default", "web-debug", &copy),
            "it is a copy of web-a"
        );
        // `incus rename web-a web-b`, or an export imported as web-b: same uuid.
        assert!(foreign("default", "web-b", &ours).contains("renamed (or imported) from web-a"));
        // `incus move web-a --target-project staging`.
        assert!(foreign("staging", "web-a", &ours).contains("moved here from project default"));
        // A copy renamed into the original's place once it is gone.
        assert!(foreign("default", "web-a", &copy).contains("copy put in the place of web-a"));
        // A person's instance with the group key only, or a damaged record.
        let by_hand = config(&[(GROUP_KEY, "web"), (UUID_KEY, U1)]);
        assert!(foreign("default", "web-x", &by_hand).contains("no owner record"));
        let damaged = config(&[(GROUP_KEY, "web"), (OWNER_KEY, "web-a"), (UUID_KEY, U1)]);
        assert!(foreign("default", "web-a", &damaged).contains("not PROJECT/NAME/UUID"));
        let no_uuid = config(&[(GROUP_KEY, "web"), (OWNER_KEY, &owner)]);
        assert!(foreign("default", "web-a", &no_uuid).contains("copy put in the place"));
    }
}
