//! The lease store (`crate::lease`) over the API: the project's profile [`LEASE_PROFILE`],
//! read with its ETag (made first, marked [`STORE_KEY`], when no profile has that name), and
//! written back whole (config, description, devices) with `If-Match`; and the learned store
//! ([`LEARNED_PROFILE`]) the same way.

use std::collections::BTreeMap;

use reqwest::Method;
use serde::Deserialize;
use serde_json::Value;

use super::{enc, incus_text, Client};
use crate::incus::{
    IncusError, LeaseHome, LEARNED_PROFILE, LEARNED_VALUE, LEASE_PROFILE, STORE_KEY, STORE_VALUE,
};

/// One of the daemon's stores: its profile's name, the value of [`STORE_KEY`] that marks it,
/// the description it is made with, and whether a read makes it when it is missing (the
/// learned store is made by its first write: a daemon that only reads it makes nothing).
pub(super) struct Kind {
    profile: &'static str,
    value: &'static str,
    description: &'static str,
    made_by_reads: bool,
}

pub(super) const LEASES: Kind = Kind {
    profile: LEASE_PROFILE,
    value: STORE_VALUE,
    description: "incus-hpa's lease store (user.incus-hpa.lease.GROUP): made by incus-hpa; attach it to no instance",
    made_by_reads: true,
};

pub(super) const LEARNED: Kind = Kind {
    profile: LEARNED_PROFILE,
    value: LEARNED_VALUE,
    description: "what incus-hpa's lease holders learned, for the next (user.incus-hpa.learned.PROJECT.GROUP): made by incus-hpa; attach it to no instance",
    made_by_reads: false,
};

pub(super) async fn read(
    client: &Client,
    project: &str,
    kind: &Kind,
) -> Result<LeaseHome, IncusError> {
    let profile = kind.profile;
    let what = format!("reading profile {profile} of project {project}");
    let path = format!("/1.0/profiles/{profile}?project={}", enc(project));
    let read = client
        .exchange(Method::GET, &path, None, client.timeout, &what, None)
        .await;
    let (_, etag, env) = match read {
        Err(e) if e.is_not_found() && kind.made_by_reads => {
            let config = BTreeMap::from([(STORE_KEY.to_owned(), kind.value.to_owned())]);
            match make(client, project, kind, &config).await {
                // Another daemon made it first (or a person did: the caller checks).
                Ok(()) | Err(IncusError::Api { status: 409, .. }) => {}
                Err(e) => return Err(e),
            }
            client
                .exchange(Method::GET, &path, None, client.timeout, &what, None)
                .await?
        }
        other => other?,
    };
    let decode = |message: String| IncusError::Decode {
        what: what.clone(),
        message: incus_text(&message),
    };
    #[derive(Deserialize)]
    struct Profile {
        #[serde(default)]
        config: BTreeMap<String, String>,
        #[serde(default)]
        description: String,
        #[serde(default)]
        devices: Option<serde_json::Map<String, Value>>,
        #[serde(default)]
        used_by: Option<Vec<String>>,
        #[serde(default)]
        project: Option<String>,
    }
    let p: Profile = env.metadata().map_err(|e| decode(e.to_string()))?;
    Ok(LeaseHome {
        config: p.config,
        description: p.description,
        devices: p.devices.unwrap_or_default(),
        used_by: p.used_by.unwrap_or_default(),
        project: p.project.unwrap_or_default(),
        etag: etag.ok_or_else(|| decode("no ETag in the answer".into()))?,
    })
}

pub(super) async fn write(
    client: &Client,
    project: &str,
    new: &LeaseHome,
    kind: &Kind,
) -> Result<bool, IncusError> {
    let profile = kind.profile;
    if new.etag.is_empty() {
        // Not read: made with what it holds (409: another writer made it first).
        return match make(client, project, kind, &new.config).await {
            Ok(()) => Ok(true),
            Err(IncusError::Api { status: 409, .. }) => Ok(false),
            Err(e) => Err(e),
        };
    }
    let what = format!("writing profile {profile} of project {project}");
    let path = format!("/1.0/profiles/{profile}?project={}", enc(project));
    // A PUT replaces the whole profile: what was read goes back with it.
    let body = serde_json::json!({
        "config": new.config,
        "description": new.description,
        "devices": new.devices,
    });
    match client
        .exchange(
            Method::PUT,
            &path,
            Some(&body),
            client.timeout,
            &what,
            Some(&new.etag),
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(IncusError::Api { status: 412, .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Makes `kind`'s profile in `project`, holding `config` (409: one of that name exists).
async fn make(
    client: &Client,
    project: &str,
    kind: &Kind,
    config: &BTreeMap<String, String>,
) -> Result<(), IncusError> {
    let profile = kind.profile;
    let body = serde_json::json!({
        "name": profile,
        "description": kind.description,
        "config": config,
        "devices": {},
    });
    let create = format!("/1.0/profiles?project={}", enc(project));
    let what = format!("creating profile {profile} in project {project}");
    client
        .send(Method::POST, &create, Some(&body), client.timeout, &what)
        .await
        .map(drop)
}
