//! An in-memory Incus behind the daemon's own traits, with failure injection and call counts.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use async_trait::async_trait;
use incus_hpa::events::{EventSource, EventStream, Lifecycle};
use incus_hpa::incus::{
    ClusterMember, CreateInstance, HostMemory, Incus, IncusError, Instance, LeaseHome, StateChange,
    STORE_KEY, STORE_VALUE,
};
use incus_hpa::memory::MemorySource;
use incus_hpa::model::{Memory, GROUP_KEY, OWNER_KEY, UUID_KEY};

/// How long a creation takes in the fake.
pub const CREATE_TIME: std::time::Duration = std::time::Duration::from_millis(200);

/// Images whose instances are created but fail to start (left stopped, as Incus does).
pub const FAILS_TO_START: &str = "broken";
/// Images that do not exist: creation fails inside the operation, nothing is left.
pub const MISSING_IMAGE: &str = "missing";
/// Images whose workload dies right after every start: the instance starts, then stops.
pub const CRASHES: &str = "crashy";
/// The status Incus lists an instance with while its cluster member is offline.
pub const OFFLINE_STATUS: &str = "Error";

#[derive(Debug, Clone)]
pub struct FakeInstance {
    pub project: String,
    pub status: String,
    pub config: HashMap<String, String>,
    pub created: u64,
    /// When it was last started (real time: the daemon compares it with the real clock).
    pub last_start: Option<std::time::SystemTime>,
    pub image: String,
    pub memory: Option<Memory>,
    /// The cluster member it is on (empty when the fake is not a cluster).
    pub location: String,
}

#[derive(Default)]
struct State {
    /// The cluster's members (none: a single server), the offline ones, and cluster groups.
    members: Vec<String>,
    offline: std::collections::BTreeSet<String>,
    cluster_groups: BTreeMap<String, Vec<String>>,
    instances: BTreeMap<String, FakeInstance>,
    /// Each delete that removed an instance, with when it did.
    deletions: Vec<(String, std::time::SystemTime)>,
    clock: u64,
    calls: BTreeMap<&'static str, u64>,
    down: bool,
    /// Starts fail (a bridge or pool that is not there yet).
    starts_fail: bool,
    /// The socket cannot be reached at all (incusd stopped).
    unreachable: bool,
    /// The next creation meets a person's instance of the same name ("already exists").
    collide: bool,
    /// Creations under way, and stops or deletes that began while one was (see
    /// [`FakeIncus::overlaps`]).
    creating: usize,
    overlaps: u64,
    /// Lease store writes that came while a creation was in flight ([`FakeIncus::lease_writes_beside_creations`]).
    lease_writes_beside: u64,
    /// When each lease store write came ([`FakeIncus::lease_write_times`]).
    lease_writes_at: Vec<tokio::time::Instant>,
    /// Drain commands run, by instance; their exit status; how long they take.
    drains: Vec<(String, Vec<String>)>,
    drain_exit: i64,
    drain_time: Option<std::time::Duration>,
    /// How long a graceful stop takes (none: at once).
    stop_time: Option<std::time::Duration>,
    /// How long a listing takes (none: at once).
    list_time: Option<std::time::Duration>,
    /// Followers of the lifecycle events.
    followers: Vec<tokio::sync::mpsc::UnboundedSender<Lifecycle>>,
    /// Lease stores by project, and a version per project for its ETag.
    projects: BTreeMap<String, (LeaseHome, u64)>,
    /// The learned store of each project (its config) and how often it was written.
    learned: BTreeMap<String, (BTreeMap<String, String>, u64)>,
    /// Projects made with `features.profiles=false`: their profiles are the default project's.
    default_profiles: std::collections::BTreeSet<String>,
    /// The next project writes meet another writer first (HTTP 412).
    put_conflicts: u32,
    /// Writes of the lease store that pass whatever their ETag (Incus checks and writes in two
    /// steps: two writers at the same instant can both be told they won).
    stale_puts_pass: u32,
    /// Lease writes are refused (HTTP 403), as for a certificate without the right.
    leases_refused: bool,
    /// Creations happen, but their wait ends before Incus tells how (a slow image unpack).
    creates_unfinished: bool,
    /// How long an instance read (`get`) takes to answer, the reads in flight and the most
    /// that ever were at once (see [`FakeIncus::set_read_time`]).
    read_time: Option<std::time::Duration>,
    reading: usize,
    most_reading: usize,
    /// Each host's memory (`""`: the single server), as set; [`ROOMY`] where not set.
    hosts: BTreeMap<String, HostMemory>,
    /// Addresses of instances on any interface, as set ([`FakeIncus::set_addresses`]); a
    /// running instance not set has [`LOCAL_ADDRESS`].
    addresses: BTreeMap<String, Vec<std::net::IpAddr>>,
}

/// The address of every running instance of the fake unless set otherwise: checks of it
/// reach listeners of the test on this host.
pub const LOCAL_ADDRESS: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// A host's memory unless set: 64 GiB, 60 GiB of it available.
pub const ROOMY: HostMemory = HostMemory {
    total: 64 << 30,
    available: 60 << 30,
};

impl State {
    /// The project whose profiles `project` uses.
    fn profiles_of(&self, project: &str) -> String {
        if self.default_profiles.contains(project) {
            "default".to_owned()
        } else {
            project.to_owned()
        }
    }

    /// Where a new instance goes: `target` (a member or `@GROUP`), else the online member
    /// with the fewest instances, as Incus' scheduler does; empty when not a cluster.
    fn place(&self, target: Option<&str>) -> Result<String, IncusError> {
        if self.members.is_empty() {
            return Ok(String::new());
        }
        let candidates: Vec<&String> = match target {
            Some(t) if t.starts_with('@') => match self.cluster_groups.get(&t[1..]) {
                Some(members) => members.iter().collect(),
                None => return Err(api(404, "Cluster group not found")),
            },
            Some(m) if self.members.iter().any(|x| x == m) => {
                vec![self.members.iter().find(|x| *x == m).unwrap()]
            }
            Some(_) => return Err(api(404, "Cluster member not found")),
            None => self.members.iter().collect(),
        };
        let load = |m: &str| self.instances.values().filter(|i| i.location == m).count();
        candidates
            .into_iter()
            .filter(|m| !self.offline.contains(*m))
            .min_by_key(|m| load(m))
            .cloned()
            .ok_or_else(|| api(503, "No online cluster member to place the instance on"))
    }

    /// An instance as the API lists it: on an offline member, as Incus does, only its name,
    /// project and member, in Error, without its config.
    fn to_api(&self, name: &str, i: &FakeInstance) -> Instance {
        let mut out = to_api(name, i);
        if self.offline.contains(&i.location) {
            out.status = OFFLINE_STATUS.into();
            out.config.clear();
            out.created_at.clear();
            out.last_used_at.clear();
        }
        out
    }

    fn member_offline(&self, member: &str) -> IncusError {
        api(
            500,
            &format!("Failed to connect to cluster member {member}: connection refused"),
        )
    }

    /// Tells the followers, as Incus' event stream does.
    fn emit(&mut self, action: &str, name: &str, old_name: Option<&str>) {
        let ev = Lifecycle {
            project: "default".into(),
            action: format!("instance-{action}"),
            name: name.into(),
            old_name: old_name.map(str::to_owned),
        };
        self.followers.retain(|f| f.send(ev.clone()).is_ok());
    }
}

/// The fake server. Memory readings are set per instance; new instances read `default_memory`.
#[derive(Default)]
pub struct FakeIncus {
    state: Mutex<State>,
    pub default_memory: Mutex<Option<Memory>>,
}

fn api(status: u16, message: &str) -> IncusError {
    IncusError::Api {
        what: "fake".into(),
        status,
        message: message.into(),
    }
}

impl FakeIncus {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    fn call(&self, name: &'static str) -> Result<(), IncusError> {
        self.with(|s| {
            *s.calls.entry(name).or_default() += 1;
            if s.unreachable {
                Err(IncusError::Transport(incus_hpa::incus::Unreachable {
                    socket: "/fake.socket".into(),
                    problem: incus_hpa::incus::Problem::Refused,
                }))
            } else if s.down {
                Err(api(503, "incusd is down"))
            } else {
                Ok(())
            }
        })
    }

    /// Adds an instance as a person (or a crash) would have left it.
    pub fn add(&self, name: &str, status: &str, config: &[(&str, &str)]) {
        self.with(|s| {
            s.clock += 1;
            let created = s.clock;
            s.instances.insert(
                name.into(),
                FakeInstance {
                    project: "default".into(),
                    status: status.into(),
                    config: config
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    created,
                    last_start: None,
                    image: "busybox".into(),
                    memory: None,
                    location: String::new(),
                },
            );
            s.emit("created", name, None);
        });
    }

    /// Adds an instance as the daemon would have created it for `group` (left by a crash of
    /// the daemon, a reboot…).
    pub fn add_owned(&self, group: &str, name: &str, status: &str) {
        let uuid = incus_hpa::act::new_uuid();
        let owner = incus_hpa::decide::owner_value("default", name, &uuid);
        self.add(
            name,
            status,
            &[(GROUP_KEY, group), (OWNER_KEY, &owner), (UUID_KEY, &uuid)],
        );
    }

    /// `incus copy FROM TO`: every config key but a new uuid; stopped.
    pub fn copy(&self, from: &str, to: &str) {
        self.with(|s| {
            let mut i = s.instances[from].clone();
            i.config.insert(UUID_KEY.into(), incus_hpa::act::new_uuid());
            i.status = "Stopped".into();
            s.clock += 1;
            i.created = s.clock;
            s.instances.insert(to.into(), i);
            s.emit("created", to, None);
        });
    }

    /// `incus rename FROM TO`.
    pub fn rename(&self, from: &str, to: &str) {
        self.with(|s| {
            let i = s.instances.remove(from).unwrap();
            s.instances.insert(to.into(), i);
            s.emit("renamed", to, Some(from));
        });
    }

    /// Sets an instance's status behind the daemon's back (`incus pause`, a crash…).
    pub fn set_status(&self, name: &str, status: &str) {
        self.with(|s| {
            s.instances.get_mut(name).unwrap().status = status.into();
            let action = match status {
                "Frozen" => "paused",
                "Stopped" => "stopped",
                "Running" => "started",
                _ => "updated",
            };
            s.emit(action, name, None);
        });
    }

    /// Sets or removes a config key behind the daemon's back (`incus config set/unset`).
    pub fn set_config(&self, name: &str, key: &str, value: Option<&str>) {
        self.with(|s| {
            let c = &mut s.instances.get_mut(name).unwrap().config;
            match value {
                Some(v) => c.insert(key.into(), v.into()),
                None => c.remove(key),
            };
            s.emit("updated", name, None);
        });
    }

    /// Makes the socket unreachable (true) or reachable again (false).
    pub fn set_unreachable(&self, unreachable: bool) {
        self.with(|s| s.unreachable = unreachable);
    }

    /// Makes the next creation meet an instance of the same name that a person made.
    pub fn collide_next_create(&self) {
        self.with(|s| s.collide = true);
    }

    /// Makes every creation's wait end before Incus tells how it went (true), or not (false).
    pub fn set_creates_unfinished(&self, unfinished: bool) {
        self.with(|s| s.creates_unfinished = unfinished);
    }

    /// Makes every start fail (true) or work again (false).
    pub fn set_starts_fail(&self, fail: bool) {
        self.with(|s| s.starts_fail = fail);
    }

    /// Deletes an instance behind the daemon's back.
    pub fn remove(&self, name: &str) {
        self.with(|s| {
            s.instances.remove(name);
            s.emit("deleted", name, None);
        });
    }

    pub fn set_down(&self, down: bool) {
        self.with(|s| s.down = down);
    }

    /// Sets every running instance of `group` to `percent` of a 100 MiB limit.
    pub fn set_group_memory(&self, group: &str, percent: f64) {
        self.with(|s| {
            for i in s.instances.values_mut() {
                if i.config.get(GROUP_KEY).map(String::as_str) == Some(group) {
                    i.memory = Some(mem(percent));
                }
            }
        });
    }

    pub fn set_memory(&self, name: &str, memory: Option<Memory>) {
        self.with(|s| s.instances.get_mut(name).unwrap().memory = memory);
    }

    /// Names of the instances carrying `group`'s key, by status.
    pub fn managed(&self, group: &str) -> Vec<(String, String)> {
        self.with(|s| {
            s.instances
                .iter()
                .filter(|(_, i)| i.config.get(GROUP_KEY).map(String::as_str) == Some(group))
                .map(|(n, i)| (n.clone(), i.status.clone()))
                .collect()
        })
    }

    pub fn running(&self, group: &str) -> usize {
        self.managed(group)
            .iter()
            .filter(|(_, s)| s == "Running")
            .count()
    }

    pub fn exists(&self, name: &str) -> bool {
        self.with(|s| s.instances.contains_key(name))
    }

    pub fn get_instance(&self, name: &str) -> Option<FakeInstance> {
        self.with(|s| s.instances.get(name).cloned())
    }

    /// Makes the fake a cluster of `members`, with cluster groups `groups` (name, members).
    pub fn cluster(&self, members: &[&str], groups: &[(&str, &[&str])]) {
        self.with(|s| {
            s.members = members.iter().map(|m| m.to_string()).collect();
            s.cluster_groups = groups
                .iter()
                .map(|(g, ms)| (g.to_string(), ms.iter().map(|m| m.to_string()).collect()))
                .collect();
        });
    }

    /// Takes a cluster member offline (or back).
    pub fn set_offline(&self, member: &str, offline: bool) {
        self.with(|s| {
            if offline {
                s.offline.insert(member.into());
            } else {
                s.offline.remove(member);
            }
        });
    }

    /// How many of the group's instances each member holds.
    pub fn locations(&self, group: &str) -> BTreeMap<String, usize> {
        self.with(|s| {
            let mut out = BTreeMap::new();
            for i in s.instances.values() {
                if i.config.get(GROUP_KEY).is_some_and(|g| g == group) {
                    *out.entry(i.location.clone()).or_default() += 1;
                }
            }
            out
        })
    }

    /// Sets the memory of the host (`member` `""`: the single server) as Incus reports it.
    pub fn set_host_memory(&self, member: &str, total: u64, available: u64) {
        self.with(|s| {
            s.hosts
                .insert(member.to_owned(), HostMemory { total, available })
        });
    }

    /// Sets the addresses an instance has while it runs (on any interface); empty: none yet.
    pub fn set_addresses(&self, name: &str, addresses: Vec<std::net::IpAddr>) {
        self.with(|s| s.addresses.insert(name.to_owned(), addresses));
    }

    /// Each delete that removed an instance, in order, with when it did.
    pub fn deletions(&self) -> Vec<(String, std::time::SystemTime)> {
        self.with(|s| s.deletions.clone())
    }

    pub fn calls(&self, name: &str) -> u64 {
        self.with(|s| s.calls.get(name).copied().unwrap_or(0))
    }
}

/// `percent` of a 100 MiB limit.
pub fn mem(percent: f64) -> Memory {
    Memory {
        usage: (percent * 1_048_576.0) as u64,
        limit: 100 * 1_048_576,
        oom_kills: None,
        ..Default::default()
    }
}

#[async_trait]
impl Incus for FakeIncus {
    async fn exec(
        &self,
        _project: &str,
        name: &str,
        command: &[String],
    ) -> Result<i64, IncusError> {
        self.call("exec")?;
        let (exit, time) = self.with(|s| {
            s.drains.push((name.to_owned(), command.to_vec()));
            (s.drain_exit, s.drain_time)
        });
        if let Some(t) = time {
            tokio::time::sleep(t).await;
        }
        Ok(exit)
    }

    async fn server_version(&self) -> Result<String, IncusError> {
        self.call("server_version")?;
        Ok("fake".into())
    }

    async fn list(&self, project: &str) -> Result<Vec<Instance>, IncusError> {
        self.call("list")?;
        if let Some(t) = self.with(|s| s.list_time) {
            tokio::time::sleep(t).await;
        }
        Ok(self.with(|s| {
            s.instances
                .iter()
                .filter(|(_, i)| i.project == project)
                .map(|(n, i)| s.to_api(n, i))
                .collect()
        }))
    }

    async fn list_by_config(
        &self,
        project: &str,
        key: &str,
        value: &str,
    ) -> Result<Vec<Instance>, IncusError> {
        self.call("list")?;
        // Like Incus: a case-insensitive match, so callers must check the exact value.
        Ok(self.with(|s| {
            s.instances
                .iter()
                .filter(|(_, i)| i.project == project)
                .filter(|(_, i)| {
                    // Like Incus: an anchored, case-insensitive pattern (only `.+` and plain
                    // values are used).
                    i.config.get(key).is_some_and(|v| {
                        (value == ".+" && !v.is_empty()) || v.eq_ignore_ascii_case(value)
                    })
                })
                .map(|(n, i)| s.to_api(n, i))
                .collect()
        }))
    }

    async fn get(&self, _project: &str, name: &str) -> Result<Option<Instance>, IncusError> {
        self.call("get")?;
        let found = self.with(|s| match s.instances.get(name) {
            Some(i) if s.offline.contains(&i.location) => Err(s.member_offline(&i.location)),
            found => Ok(found.map(|i| s.to_api(name, i))),
        });
        // What was read when the request came is what arrives, `read_time` later.
        if let Some(t) = self.with(|s| s.read_time) {
            self.with(|s| {
                s.reading += 1;
                s.most_reading = s.most_reading.max(s.reading);
            });
            tokio::time::sleep(t).await;
            self.with(|s| s.reading -= 1);
        }
        found
    }

    async fn create(&self, project: &str, req: &CreateInstance) -> Result<(), IncusError> {
        self.call("create")?;
        // Like a real create+start, this takes a while (free under tokio's paused clock).
        self.with(|s| s.creating += 1);
        tokio::time::sleep(CREATE_TIME).await;
        self.with(|s| s.creating -= 1);
        let image = req.source.alias.clone().unwrap_or_default();
        if image == MISSING_IMAGE {
            return Err(IncusError::Operation {
                what: "create".into(),
                message: "Image not found".into(),
            });
        }
        let memory = *self.default_memory.lock().unwrap();
        self.with(|s| {
            if std::mem::take(&mut s.collide) {
                // A person made an instance by that name, with the group's key even.
                s.clock += 1;
                let mut theirs = s
                    .instances
                    .values()
                    .next()
                    .cloned()
                    .unwrap_or(FakeInstance {
                        project: project.into(),
                        status: "Running".into(),
                        config: HashMap::new(),
                        created: 0,
                        last_start: None,
                        image: "busybox".into(),
                        memory: None,
                        location: String::new(),
                    });
                theirs
                    .config
                    .insert(UUID_KEY.into(), incus_hpa::act::new_uuid());
                theirs.created = s.clock;
                s.instances.insert(req.name.clone(), theirs);
            }
            if s.instances.contains_key(&req.name) {
                return Err(IncusError::Operation {
                    what: "create".into(),
                    message: "already exists".into(),
                });
            }
            let location = s.place(req.target.as_deref())?;
            s.clock += 1;
            let ok = image != FAILS_TO_START && !s.starts_fail;
            let stays_up = ok && image != CRASHES;
            s.instances.insert(
                req.name.clone(),
                FakeInstance {
                    project: project.into(),
                    status: if stays_up && req.start {
                        "Running"
                    } else {
                        "Stopped"
                    }
                    .into(),
                    config: req.config.clone(),
                    created: s.clock,
                    last_start: (ok && req.start).then(std::time::SystemTime::now),
                    image: image.clone(),
                    memory: if ok { memory } else { None },
                    location,
                },
            );
            s.emit("created", &req.name, None);
            if ok && req.start {
                s.emit("started", &req.name, None);
                if image == CRASHES {
                    s.emit("stopped", &req.name, None);
                }
            }
            if s.creates_unfinished {
                return Err(IncusError::Unfinished {
                    what: format!("creating {}", req.name),
                    status: "running".into(),
                    waited: std::time::Duration::from_secs(120),
                });
            }
            if ok {
                Ok(())
            } else {
                Err(IncusError::Operation {
                    what: "start".into(),
                    message: "failed to start".into(),
                })
            }
        })
    }

    async fn change_state(
        &self,
        _project: &str,
        name: &str,
        change: StateChange,
    ) -> Result<(), IncusError> {
        self.call("change_state")?;
        self.with(|s| s.overlaps += u64::from(s.creating > 0 && change != StateChange::Start));
        if let (StateChange::Stop { force: false, .. }, Some(t)) =
            (change, self.with(|s| s.stop_time))
        {
            tokio::time::sleep(t).await;
        }
        self.with(|s| {
            let fail = s.starts_fail;
            let i = s
                .instances
                .get_mut(name)
                .ok_or_else(|| api(404, "not found"))?;
            let events: &[&str] = match change {
                StateChange::Start if fail => {
                    return Err(IncusError::Operation {
                        what: "start".into(),
                        message: "Failed to start device \"eth0\": no such bridge".into(),
                    })
                }
                StateChange::Start => {
                    i.last_start = Some(std::time::SystemTime::now());
                    if i.image == CRASHES {
                        i.status = "Stopped".into();
                        &["started", "stopped"]
                    } else {
                        i.status = "Running".into();
                        &["started"]
                    }
                }
                StateChange::Stop { .. } => {
                    i.status = "Stopped".into();
                    &["stopped"]
                }
            };
            for action in events {
                s.emit(action, name, None);
            }
            Ok(())
        })
    }

    async fn delete(&self, _project: &str, name: &str) -> Result<(), IncusError> {
        self.call("delete")?;
        self.with(|s| s.overlaps += u64::from(s.creating > 0));
        self.with(|s| match s.instances.get(name) {
            None => Err(api(404, "not found")),
            Some(i) if s.offline.contains(&i.location) => Err(s.member_offline(&i.location)),
            Some(i) if i.status == "Running" => Err(api(400, "Instance is running")),
            Some(_) => {
                s.instances.remove(name);
                s.deletions
                    .push((name.to_owned(), std::time::SystemTime::now()));
                s.emit("deleted", name, None);
                Ok(())
            }
        })
    }

    async fn set_config(
        &self,
        _project: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<(), IncusError> {
        self.call("set_config")?;
        self.with(|s| {
            let i = s
                .instances
                .get_mut(name)
                .ok_or_else(|| api(404, "not found"))?;
            i.config.insert(key.into(), value.into());
            s.emit("updated", name, None);
            Ok(())
        })
    }

    async fn memory_state(&self, _project: &str, name: &str) -> Result<Option<Memory>, IncusError> {
        self.call("memory_state")?;
        self.with(|s| {
            let i = s.instances.get(name);
            if let Some(i) = i.filter(|i| s.offline.contains(&i.location)) {
                return Err(s.member_offline(&i.location));
            }
            Ok(i.and_then(|i| i.memory))
        })
    }

    async fn addresses(
        &self,
        _project: &str,
        name: &str,
        _interface: &str,
    ) -> Result<Vec<std::net::IpAddr>, IncusError> {
        self.call("addresses")?;
        self.with(|s| {
            let i = s.instances.get(name).ok_or_else(|| api(404, "not found"))?;
            if s.offline.contains(&i.location) {
                return Err(s.member_offline(&i.location));
            }
            if !matches!(i.status.as_str(), "Running" | "Ready" | "Frozen") {
                return Ok(Vec::new());
            }
            Ok(s.addresses
                .get(name)
                .cloned()
                .unwrap_or_else(|| vec![LOCAL_ADDRESS]))
        })
    }

    async fn memory_metrics(
        &self,
        project: &str,
        member: Option<&str>,
    ) -> Result<HashMap<String, Memory>, IncusError> {
        self.call("memory_metrics")?;
        // Like incusd: every running (or frozen) instance of the project that has a reading,
        // on the member asked (on a cluster, the first member answers when none is named).
        let member = member
            .map(str::to_owned)
            .or_else(|| self.with(|s| s.members.first().cloned()))
            .unwrap_or_default();
        if self.with(|s| s.offline.contains(&member)) {
            return Err(self.with(|s| s.member_offline(&member)));
        }
        Ok(self.with(|s| {
            s.instances
                .iter()
                .filter(|(_, i)| i.project == project)
                .filter(|(_, i)| i.location == member)
                .filter(|(_, i)| matches!(i.status.as_str(), "Running" | "Ready" | "Frozen"))
                .filter_map(|(n, i)| Some((n.clone(), i.memory?)))
                .collect()
        }))
    }

    async fn host_memory(&self, member: Option<&str>) -> Result<HostMemory, IncusError> {
        self.call("host_memory")?;
        self.with(|s| match member {
            Some(m) if !s.members.iter().any(|x| x == m) => {
                Err(api(404, "Cluster member not found"))
            }
            Some(m) if s.offline.contains(m) => Err(s.member_offline(m)),
            _ => Ok(s.hosts.get(member.unwrap_or("")).copied().unwrap_or(ROOMY)),
        })
    }

    async fn cluster_members(&self) -> Result<Vec<ClusterMember>, IncusError> {
        self.call("cluster_members")?;
        Ok(self.with(|s| {
            s.members
                .iter()
                .map(|m| ClusterMember {
                    server_name: m.clone(),
                    status: if s.offline.contains(m) {
                        "Offline"
                    } else {
                        "Online"
                    }
                    .into(),
                    groups: s
                        .cluster_groups
                        .iter()
                        .filter(|(_, ms)| ms.contains(m))
                        .map(|(g, _)| g.clone())
                        .collect(),
                })
                .collect()
        }))
    }

    async fn leases(&self, project: &str) -> Result<LeaseHome, IncusError> {
        self.call("leases")?;
        Ok(self.with(|s| {
            let at = s.profiles_of(project);
            // Made, marked, when missing, as the client does.
            let (home, version) = s.projects.entry(at.clone()).or_insert_with(|| {
                let mut home = LeaseHome::default();
                home.config.insert(STORE_KEY.into(), STORE_VALUE.into());
                (home, 0)
            });
            LeaseHome {
                etag: format!("v{version}"),
                project: at,
                ..home.clone()
            }
        }))
    }

    async fn put_leases(&self, project: &str, new: &LeaseHome) -> Result<bool, IncusError> {
        self.call("put_leases")?;
        self.with(|s| {
            s.lease_writes_beside += u64::from(s.creating > 0);
            s.lease_writes_at.push(tokio::time::Instant::now());
        });
        if self.with(|s| s.leases_refused) {
            return Err(api(403, "Certificate is restricted"));
        }
        Ok(self.with(|s| {
            let raced = s.put_conflicts > 0;
            s.put_conflicts = s.put_conflicts.saturating_sub(1);
            let stale_passes = s.stale_puts_pass > 0;
            s.stale_puts_pass = s.stale_puts_pass.saturating_sub(1);
            let at = s.profiles_of(project);
            let entry = s.projects.entry(at).or_default();
            if raced {
                // Another daemon's write got in first.
                entry.1 += 1;
                return false;
            }
            if format!("v{}", entry.1) != new.etag && !stale_passes {
                return false;
            }
            // What a PUT of a profile replaces; `used_by` is Incus' own.
            let kept = std::mem::take(&mut entry.0.used_by);
            *entry = (
                LeaseHome {
                    used_by: kept,
                    etag: String::new(),
                    ..new.clone()
                },
                entry.1 + 1,
            );
            true
        }))
    }

    async fn learned(&self, project: &str) -> Result<LeaseHome, IncusError> {
        self.call("learned")?;
        Ok(self.with(|s| {
            let (config, version) = s.learned.entry(project.to_owned()).or_insert_with(|| {
                let mut c = BTreeMap::new();
                c.insert(STORE_KEY.into(), incus_hpa::incus::LEARNED_VALUE.into());
                (c, 0)
            });
            LeaseHome {
                config: config.clone(),
                etag: format!("v{version}"),
                project: project.to_owned(),
                ..LeaseHome::default()
            }
        }))
    }

    async fn put_learned(&self, project: &str, new: &LeaseHome) -> Result<bool, IncusError> {
        self.call("put_learned")?;
        Ok(self.with(|s| {
            let entry = s.learned.entry(project.to_owned()).or_default();
            if format!("v{}", entry.1) != new.etag {
                return false;
            }
            *entry = (new.config.clone(), entry.1 + 1);
            true
        }))
    }
}

impl FakeIncus {
    /// What the learned store of `project` holds under `key`, and how often it was written.
    pub fn learned_value(&self, project: &str, key: &str) -> (Option<String>, u64) {
        self.with(|s| {
            s.learned
                .get(project)
                .map_or((None, 0), |(c, n)| (c.get(key).cloned(), *n))
        })
    }

    /// Makes every instance read (`get`) answer `time` after it came (what it says is the
    /// state when it came), or at once (`None`), and counts the reads in flight at once.
    pub fn set_read_time(&self, time: Option<std::time::Duration>) {
        self.with(|s| s.read_time = time);
    }

    /// The most instance reads that were in flight at once (with a read time set).
    pub fn most_reads_at_once(&self) -> usize {
        self.with(|s| s.most_reading)
    }

    /// Refuses lease writes (HTTP 403), or stops refusing them.
    pub fn refuse_leases(&self, refused: bool) {
        self.with(|s| s.leases_refused = refused);
    }

    /// Lets the next `n` lease store writes pass even with an old ETag, as two writers at the
    /// same instant can both be answered 200 by Incus.
    pub fn pass_stale_puts(&self, n: u32) {
        self.with(|s| s.stale_puts_pass = n);
    }

    /// Makes the next `n` project writes lose a race with another writer.
    pub fn conflict_next_puts(&self, n: u32) {
        self.with(|s| s.put_conflicts = n);
    }

    /// Makes `project` one made with `features.profiles=false`: its lease store is the
    /// default project's, as Incus serves it.
    pub fn use_default_profiles(&self, project: &str) {
        self.with(|s| s.default_profiles.insert(project.to_owned()));
    }

    /// A config key of a project's lease store.
    pub fn project_key(&self, project: &str, key: &str) -> Option<String> {
        self.with(|s| s.projects.get(project)?.0.config.get(key).cloned())
    }

    /// Puts a profile of the lease store's name in `project`, as a person could have made it.
    pub fn put_store(&self, project: &str, home: LeaseHome) {
        self.with(|s| {
            s.projects.insert(project.to_owned(), (home, 1));
        });
    }

    /// The lease store of `project` as it is now.
    pub fn store(&self, project: &str) -> Option<LeaseHome> {
        self.with(|s| s.projects.get(project).map(|(h, _)| h.clone()))
    }
}

#[async_trait]
impl MemorySource for FakeIncus {
    async fn read(&self, project: &str, names: &[String]) -> Vec<Option<Memory>> {
        let mut out = Vec::new();
        for n in names {
            out.push(self.memory_state(project, n).await.ok().flatten());
        }
        out
    }

    /// As the cgroup files would tell it: no request.
    fn usage(&self, project: &str, name: &str) -> Option<u64> {
        self.peek(project, name).map(|m| m.usage)
    }

    fn peek(&self, _project: &str, name: &str) -> Option<Memory> {
        self.with(|s| s.instances.get(name).and_then(|i| i.memory))
    }
}

fn to_api(name: &str, i: &FakeInstance) -> Instance {
    // Creation times one second apart, in Incus' RFC 3339 form.
    let created = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000 + i.created);
    Instance {
        name: name.into(),
        status: i.status.clone(),
        config: i.config.clone(),
        created_at: humantime::format_rfc3339_nanos(created).to_string(),
        last_used_at: i.last_start.map_or_else(
            || "1970-01-01T00:00:00Z".to_owned(),
            |t| humantime::format_rfc3339_nanos(t).to_string(),
        ),
        project: i.project.clone(),
        unreachable: false,
        location: if i.location.is_empty() {
            "none".into()
        } else {
            i.location.clone()
        },
    }
}

#[async_trait]
impl EventSource for FakeIncus {
    async fn connect(&self) -> Result<EventStream, String> {
        self.call("events").map_err(|e| e.to_string())?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        self.with(|s| s.followers.push(tx));
        Ok(Box::pin(futures_util::stream::poll_fn(move |cx| {
            rx.poll_recv(cx).map(|ev| ev.map(Ok))
        })))
    }
}

impl FakeIncus {
    /// Ends every event stream (as a restart of incusd does).
    /// Drain commands: every later one exits `exit` after `time`.
    pub fn set_drain(&self, exit: i64, time: Option<std::time::Duration>) {
        self.with(|s| {
            s.drain_exit = exit;
            s.drain_time = time;
        });
    }

    /// Graceful stops: every later one takes `time` (none: at once).
    pub fn set_stop_time(&self, time: Option<std::time::Duration>) {
        self.with(|s| s.stop_time = time);
    }

    /// Listings: every later one takes `time` (none: at once).
    pub fn set_list_time(&self, time: Option<std::time::Duration>) {
        self.with(|s| s.list_time = time);
    }

    /// The drain commands run so far: (instance, command).
    pub fn drains(&self) -> Vec<(String, Vec<String>)> {
        self.with(|s| s.drains.clone())
    }

    /// How many stops and deletes began while a creation was under way.
    /// How many lease store writes came while a creation was in flight (Incus 6.0 can stall
    /// a start beside a profile write).
    pub fn lease_writes_beside_creations(&self) -> u64 {
        self.with(|s| s.lease_writes_beside)
    }

    /// When each write of a lease store came, in order.
    pub fn lease_write_times(&self) -> Vec<tokio::time::Instant> {
        self.with(|s| s.lease_writes_at.clone())
    }

    pub fn overlaps(&self) -> u64 {
        self.with(|s| s.overlaps)
    }

    pub fn drop_followers(&self) {
        self.with(|s| s.followers.clear());
    }

    /// The instances carrying a group key, (name, status), as a fresh list would show them.
    pub fn listing(&self) -> Vec<(String, String)> {
        self.with(|s| {
            s.instances
                .iter()
                .filter(|(_, i)| i.config.contains_key(GROUP_KEY))
                .map(|(n, i)| (n.clone(), i.status.clone()))
                .collect()
        })
    }
}
