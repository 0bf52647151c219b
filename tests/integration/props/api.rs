//! Incus API JSON and lifecycle events: no panic on any input, exact decoding.

use super::*;

// ---------------------------------------------------------------------------------------------
// 2. Incus API JSON and lifecycle events
// ---------------------------------------------------------------------------------------------

const JSON_STRINGS: &[&str] = &[
    "Running",
    "Ready",
    "Stopped",
    "Frozen",
    "Error",
    "Starting",
    "",
    "default",
    "lifecycle",
    "logging",
    "instance-stopped",
    "instance-shutdown",
    "instance-deleted",
    "instance-paused",
    "instance-renamed",
    "instance-updated",
    "instance-created",
    "instance-started",
    "2026-11-30T04:56:52.166537123Z",
    "2026-11-30T04:56:52Z",
    "1970-01-01T00:00:00Z",
    "1969-12-31T23:59:59Z",
    "0001-01-01T00:00:00Z",
    "0000-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999999999Z",
    "2026-02-30T00:00:00Z",
    "2026-13-45T99:99:99Z",
    "2026-11-30T24:00:00Z",
    "2026-11-30T23:59:60Z",
    "2026-11-30T04:56:52.1234567891234Z",
    "2026-11-30T04:56:52+02:00",
    "2026-11-30 04:56:52",
    "Z",
    "ZZZ",
];

const JSON_KEYS: &[&str] = &[
    "name",
    "status",
    "config",
    "created_at",
    "last_used_at",
    "project",
    "type",
    "metadata",
    "action",
    "context",
    "old_name",
    "location",
];

fn json_string() -> BoxedStrategy<String> {
    prop_oneof![3 => select_str(JSON_STRINGS), 1 => "\\PC{0,12}", 1 => any::<String>()].boxed()
}

/// Any JSON value, nested.
fn json_value() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        json_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![select_str(JSON_KEYS), "\\PC{0,6}"],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
    .boxed()
}

/// Strings a JSON parser has to work through: random, made of JSON syntax, deeply nested.
fn json_text() -> BoxedStrategy<String> {
    prop_oneof![
        any::<String>(),
        "\\PC*",
        "[\\[\\]{}\":,.0-9a-zA-Z\\\\ eE+-]{0,60}",
        (
            0usize..2000,
            prop::sample::select(vec!["[", "{\"a\":", "{\"metadata\":"])
        )
            .prop_map(|(n, open)| open.repeat(n)),
        json_value().prop_map(|v| v.to_string()),
    ]
    .boxed()
}

/// Decodes an instance, calls everything on it, checks what it says.
fn exercise_instance(i: &Instance) -> Result<(), TestCaseError> {
    let expected = match i.status.as_str() {
        "Running" => InstanceStatus::Running,
        "Ready" => InstanceStatus::Ready,
        "Stopped" => InstanceStatus::Stopped,
        "Frozen" => InstanceStatus::Frozen,
        "Error" => InstanceStatus::Error,
        _ => InstanceStatus::Transition,
    };
    prop_assert_eq!(i.status(), expected);
    prop_assert!(i.created_nanos() >= 0);
    // Nothing was started before the epoch: there is no time since a start at the epoch.
    prop_assert_eq!(i.since_start(UNIX_EPOCH), None);
    let now = SystemTime::now();
    if let Some(d) = i.since_start(now) {
        prop_assert!(d <= now.duration_since(UNIX_EPOCH).unwrap(), "{d:?}");
    }
    Ok(())
}

/// A field of an object: missing, a string, or a value of another type.
#[derive(Debug, Clone)]
enum Field {
    Absent,
    Str(String),
    Other(Value),
}

impl Field {
    fn put(&self, key: &str, into: &mut serde_json::Map<String, Value>) {
        match self {
            Field::Absent => {}
            Field::Str(s) => {
                into.insert(key.into(), Value::String(s.clone()));
            }
            Field::Other(v) => {
                into.insert(key.into(), v.clone());
            }
        }
    }

    fn is_other(&self) -> bool {
        matches!(self, Field::Other(_))
    }

    fn text(&self) -> String {
        match self {
            Field::Str(s) => s.clone(),
            _ => String::new(),
        }
    }
}

fn field(strings: BoxedStrategy<String>) -> BoxedStrategy<Field> {
    prop_oneof![
        1 => Just(Field::Absent),
        5 => strings.prop_map(Field::Str),
        1 => json_value().prop_filter("not a string", |v| !v.is_string()).prop_map(Field::Other),
    ]
    .boxed()
}

/// Keys that no struct field has, with any value (they are ignored).
fn extra_keys(known: &'static [&'static str]) -> BoxedStrategy<Vec<(String, Value)>> {
    prop::collection::vec(
        (
            prop_oneof![
                select_str(&["location", "source", "requestor", "x"]),
                "\\PC{0,6}"
            ]
            .prop_filter("an unknown key", move |k| !known.contains(&k.as_str())),
            json_value(),
        ),
        0..3,
    )
    .boxed()
}

/// An object shaped like `GET /1.0/instances?recursion=1` items, fields of any type.
#[derive(Debug, Clone)]
struct InstanceShape {
    name: Field,
    status: Field,
    created_at: Field,
    last_used_at: Field,
    project: Field,
    location: Field,
    /// `None`: absent; `Ok`: a map of strings; `Err`: anything that is not one.
    config: Option<Result<BTreeMap<String, String>, Value>>,
    extra: Vec<(String, Value)>,
}

const INSTANCE_KEYS: &[&str] = &[
    "name",
    "status",
    "config",
    "created_at",
    "last_used_at",
    "project",
    "location",
];

fn instance_shape() -> BoxedStrategy<InstanceShape> {
    let strings = || json_string();
    let config = prop::option::weighted(
        0.8,
        prop_oneof![
            4 => prop::collection::btree_map("\\PC{0,8}", json_string(), 0..4).prop_map(Ok),
            1 => json_value()
                .prop_filter("not a map of strings", |v| {
                    !v.as_object().is_some_and(|m| m.values().all(Value::is_string))
                })
                .prop_map(Err),
        ],
    );
    (
        field(strings()),
        field(strings()),
        field(strings()),
        field(strings()),
        field(strings()),
        field(strings()),
        config,
        extra_keys(INSTANCE_KEYS),
    )
        .prop_map(
            |(name, status, created_at, last_used_at, project, location, config, extra)| {
                InstanceShape {
                    name,
                    status,
                    created_at,
                    last_used_at,
                    project,
                    location,
                    config,
                    extra,
                }
            },
        )
        .boxed()
}

impl InstanceShape {
    fn to_value(&self) -> Value {
        let mut m = serde_json::Map::new();
        for (k, v) in &self.extra {
            m.insert(k.clone(), v.clone());
        }
        self.name.put("name", &mut m);
        self.status.put("status", &mut m);
        self.created_at.put("created_at", &mut m);
        self.last_used_at.put("last_used_at", &mut m);
        self.project.put("project", &mut m);
        self.location.put("location", &mut m);
        match &self.config {
            None => {}
            Some(Ok(c)) => {
                m.insert("config".into(), serde_json::to_value(c).unwrap());
            }
            Some(Err(v)) => {
                m.insert("config".into(), v.clone());
            }
        }
        Value::Object(m)
    }

    /// What decoding must give: the instance, or `None` for an error.
    fn expected(&self) -> Option<Instance> {
        let Field::Str(name) = &self.name else {
            return None;
        };
        let strings = [
            &self.status,
            &self.created_at,
            &self.last_used_at,
            &self.project,
            &self.location,
        ];
        if strings.iter().any(|f| f.is_other()) {
            return None;
        }
        let config = match &self.config {
            None => Default::default(),
            Some(Ok(c)) => c.clone().into_iter().collect(),
            // What a cluster lists for an instance on a member that does not answer.
            Some(Err(Value::Null)) => Default::default(),
            Some(Err(_)) => return None,
        };
        Some(Instance {
            location: self.location.text(),
            unreachable: false,
            name: name.clone(),
            status: self.status.text(),
            config,
            created_at: self.created_at.text(),
            last_used_at: self.last_used_at.text(),
            project: self.project.text(),
        })
    }
}

/// A struct-typed field of an event: missing, an object, or some other value.
#[derive(Debug, Clone)]
enum Nested<T> {
    Absent,
    Obj(T),
    Other(Value),
}

fn nested<T: std::fmt::Debug + Clone + 'static>(obj: BoxedStrategy<T>) -> BoxedStrategy<Nested<T>> {
    prop_oneof![
        1 => Just(Nested::Absent),
        6 => obj.prop_map(Nested::Obj),
        1 => json_value().prop_filter("not an object", |v| !v.is_object()).prop_map(Nested::Other),
    ]
    .boxed()
}

/// An object shaped like an Incus event, every field of any type.
#[derive(Debug, Clone)]
struct EventShape {
    kind: Field,
    project: Field,
    metadata: Nested<MetaShape>,
    extra: Vec<(String, Value)>,
}

#[derive(Debug, Clone)]
struct MetaShape {
    action: Field,
    name: Field,
    project: Field,
    /// `context.old_name`.
    context: Nested<Field>,
    extra: Vec<(String, Value)>,
}

fn event_shape() -> BoxedStrategy<EventShape> {
    let kind = field(
        prop_oneof![
            4 => select_str(&["lifecycle"]),
            1 => select_str(&["logging", "operation", "", "Lifecycle"]),
            1 => json_string(),
        ]
        .boxed(),
    );
    let action = field(
        prop_oneof![
            4 => select_str(incus_hpa::events::TRIGGERS),
            1 => select_str(&["instance-created", "instance-started", "", "instance-stopped "]),
            1 => json_string(),
        ]
        .boxed(),
    );
    let names = || {
        prop_oneof![
            select_str(&["web-a", "", "default", "staging"]),
            json_string()
        ]
        .boxed()
    };
    let meta = (
        action,
        field(names()),
        field(names()),
        nested(field(names())),
        extra_keys(&["action", "name", "project", "context"]),
    )
        .prop_map(|(action, name, project, context, extra)| MetaShape {
            action,
            name,
            project,
            context,
            extra,
        })
        .boxed();
    (
        kind,
        field(names()),
        nested(meta),
        extra_keys(&["type", "project", "metadata"]),
    )
        .prop_map(|(kind, project, metadata, extra)| EventShape {
            kind,
            project,
            metadata,
            extra,
        })
        .boxed()
}

impl EventShape {
    fn to_value(&self) -> Value {
        let mut m = serde_json::Map::new();
        for (k, v) in &self.extra {
            m.insert(k.clone(), v.clone());
        }
        self.kind.put("type", &mut m);
        self.project.put("project", &mut m);
        match &self.metadata {
            Nested::Absent => {}
            Nested::Other(v) => {
                m.insert("metadata".into(), v.clone());
            }
            Nested::Obj(meta) => {
                let mut mm = serde_json::Map::new();
                for (k, v) in &meta.extra {
                    mm.insert(k.clone(), v.clone());
                }
                meta.action.put("action", &mut mm);
                meta.name.put("name", &mut mm);
                meta.project.put("project", &mut mm);
                match &meta.context {
                    Nested::Absent => {}
                    Nested::Other(v) => {
                        mm.insert("context".into(), v.clone());
                    }
                    Nested::Obj(old) => {
                        let mut cm = serde_json::Map::new();
                        old.put("old_name", &mut cm);
                        mm.insert("context".into(), Value::Object(cm));
                    }
                }
                m.insert("metadata".into(), Value::Object(mm));
            }
        }
        Value::Object(m)
    }

    /// What `trigger` must say, when the shape tells: `None` when a struct field is given in
    /// some other form (serde accepts an array for a struct, which is not modelled here).
    fn expected(&self) -> Option<Option<(String, String)>> {
        let error = Some(None);
        if self.kind.is_other() || self.project.is_other() {
            return error;
        }
        let (action, name, project, old) = match &self.metadata {
            Nested::Absent => return error, // no action: nothing to wake up for
            Nested::Other(v) if v.is_array() => return None,
            Nested::Other(_) => return error,
            Nested::Obj(m) => {
                if m.action.is_other() || m.name.is_other() || m.project.is_other() {
                    return error;
                }
                let old = match &m.context {
                    Nested::Absent => String::new(),
                    Nested::Other(v) if v.is_array() => return None,
                    Nested::Other(_) => return error,
                    Nested::Obj(f) if f.is_other() => return error,
                    Nested::Obj(f) => f.text(),
                };
                (m.action.text(), m.name.text(), m.project.text(), old)
            }
        };
        if self.kind.text() != "lifecycle"
            || !incus_hpa::events::TRIGGERS.contains(&action.as_str())
        {
            return error;
        }
        let project = [project, self.project.text()]
            .into_iter()
            .find(|p| !p.is_empty())
            .unwrap_or_else(|| "default".into());
        let name = if old.is_empty() { name } else { old };
        Some(Some((project, name)))
    }
}

fn check_trigger(text: &str) -> Result<(), TestCaseError> {
    if let Some((project, _name)) = trigger(text) {
        prop_assert!(!project.is_empty());
        let v: Value = serde_json::from_str(text).expect("trigger accepted invalid JSON");
        prop_assert_eq!(v.get("type").and_then(Value::as_str), Some("lifecycle"));
    }
    Ok(())
}

proptest! {
    #[test]
    fn instances_decode_from_any_string_without_panic(text in json_text()) {
        if let Ok(i) = serde_json::from_str::<Instance>(&text) {
            exercise_instance(&i)?;
        }
    }

    #[test]
    fn instances_decode_from_any_json_value_without_panic(v in json_value()) {
        if let Ok(i) = serde_json::from_value::<Instance>(v.clone()) {
            prop_assert!(v.is_object() || v.is_array(), "decoded from {v}");
            exercise_instance(&i)?;
        }
        if let Ok(i) = serde_json::from_str::<Instance>(&v.to_string()) {
            exercise_instance(&i)?;
        }
    }

    #[test]
    fn instance_shaped_objects_decode_exactly_when_well_typed(shape in instance_shape()) {
        let text = shape.to_value().to_string();
        let decoded = serde_json::from_str::<Instance>(&text).ok();
        prop_assert_eq!(&decoded, &shape.expected(), "{}", text);
        if let Some(i) = decoded {
            exercise_instance(&i)?;
        }
    }

    #[test]
    fn trigger_survives_any_string(text in json_text()) {
        check_trigger(&text)?;
    }

    #[test]
    fn trigger_follows_lifecycle_events_of_any_field_types(shape in event_shape(), pretty in any::<bool>()) {
        let v = shape.to_value();
        let text = if pretty {
            serde_json::to_string_pretty(&v).unwrap()
        } else {
            v.to_string()
        };
        check_trigger(&text)?;
        if let Some(expected) = shape.expected() {
            prop_assert_eq!(trigger(&text), expected, "{}", text);
        }
    }
}
