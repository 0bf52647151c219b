//! Properties: no input makes the config parser, the Incus API decoding, the event filter or the
//! decision core panic, and what each returns keeps its documented invariants.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use incus_hpa::config::{self, Severity, DURATION_MAX};
use incus_hpa::decide::{decide, History};
use incus_hpa::events::trigger;
use incus_hpa::incus::Instance;
use incus_hpa::model::{
    Action, Cause, DesiredState, GroupName, GroupSpec, InstanceStatus, Memory, Observation,
    ObservedInstance, Plan, RESTART_BACKOFF_MAX, STOP_TIMEOUT_MAX,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use serde_json::Value;
use tokio::time::Instant;

fn select_str(items: &'static [&'static str]) -> BoxedStrategy<String> {
    prop::sample::select(items).prop_map(str::to_owned).boxed()
}

/// The path parsed files are said to come from.
const FILE: &str = "/etc/incus-hpa/desired-state.toml";

mod api;
mod config_text;
mod decision;
mod headroom;
mod signals;
