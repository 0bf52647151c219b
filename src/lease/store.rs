//! Whether a project's lease store can be used ([`StoreProblem`]), and why a round of leases
//! did not go through ([`LeaseError`]).

use crate::incus::{IncusError, LeaseHome, LEASE_PROFILE, STORE_KEY, STORE_VALUE};

/// Why a project's lease store cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreProblem {
    /// A profile of that name exists that the daemon did not make.
    #[error(
        "the profile {LEASE_PROFILE} of project {project} was not made by incus-hpa (it has no \
         {STORE_KEY}={STORE_VALUE}): it is left as it is, and nothing is done in {project} until \
         it is renamed or removed (incus profile rename {LEASE_PROFILE} NEW-NAME --project {project})"
    )]
    NotOurs { project: String },
    /// Instances use the store profile.
    #[error(
        "the profile {LEASE_PROFILE} of project {project} is used by {used} instance(s) ({names}): \
         a lease store is attached to none, so it is left as it is, and nothing is done in \
         {project} until it is detached (incus profile remove INSTANCE {LEASE_PROFILE} --project \
         {project})"
    )]
    InUse {
        project: String,
        used: usize,
        names: String,
    },
}

impl StoreProblem {
    /// What is wrong with `home`, the store of `project` as read, if anything.
    pub fn of(project: &str, home: &LeaseHome) -> Option<StoreProblem> {
        if home.config.get(STORE_KEY).map(String::as_str) != Some(STORE_VALUE) {
            return Some(StoreProblem::NotOurs {
                project: project.to_owned(),
            });
        }
        if !home.used_by.is_empty() {
            let names: Vec<&str> = home
                .used_by
                .iter()
                .take(3)
                .map(|u| {
                    let path = u.split('?').next().unwrap_or(u);
                    path.rsplit('/').next().unwrap_or(path)
                })
                .collect();
            return Some(StoreProblem::InUse {
                project: project.to_owned(),
                used: home.used_by.len(),
                names: names.join(", "),
            });
        }
        None
    }
}

/// Why one round of leases did not go through.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error(transparent)]
    Incus(#[from] IncusError),
    #[error("{0}")]
    Store(StoreProblem),
}

impl LeaseError {
    /// True when Incus could not be reached.
    pub fn is_transport(&self) -> bool {
        matches!(self, LeaseError::Incus(e) if e.is_transport())
    }
}
