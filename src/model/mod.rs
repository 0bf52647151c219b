//! Domain types shared by the decision core, the observer and the actor. No IO here.
//!
//! `DesiredState` is what the operator declared (built by `config`), `Observation` is what Incus
//! reported for one group, and `Plan` is what `decide` wants done about the difference.
//!
//! The desired state is in `spec`, where Incus is (its address and TLS files) in `endpoint`,
//! what was observed in `observation`, the plan with its reasons, causes and actions in `plan`,
//! and the keys the daemon writes on instances in `keys`, the host headroom (`[daemon]
//! host_reserve`) in `headroom`, memory sizes in `size`, readiness (`[groups.NAME.ready]`) in
//! `serving`; every name is used as
//! `crate::model::NAME`.

mod endpoint;
mod headroom;
mod keys;
mod observation;
mod plan;
mod serving;
pub mod size;
mod spec;

pub use endpoint::{Endpoint, TlsFiles, DEFAULT_HTTPS_PORT};
pub use headroom::{
    ExpectedUse, Headroom, HeadroomCheck, HostReserve, HostRoom, RESERVE_PERCENT_MAX,
};
pub use keys::{GROUP_KEY, OWNER_KEY, PROTECTED_KEY, UUID_KEY, WARM_KEY};
pub use observation::{
    Foreign, InstanceStatus, Memory, Observation, ObservedInstance, Wanted, Window,
};
pub use plan::{
    Action, Cause, Forecast, HoldWindow, InstanceView, Note, Plan, Reason, SignalState, Summary,
};
pub use serving::{Address, EndpointsSpec, Probe, Readiness, ReadySpec, DEFAULT_INTERFACE};
pub use spec::{
    DaemonSpec, DesiredState, ExternalSpec, GroupName, GroupSpec, MemorySourceKind, Policy,
    ScaleDownOrder, ScheduleSpec, DEFAULT_CONTROL_SOCKET, MAX_INSTANCES, RESTART_BACKOFF_MAX,
    STOP_TIMEOUT_MAX,
};
