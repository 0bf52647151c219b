//! `incus-hpa.toml(5)`: the desired-state file, every key from [`crate::config::keys`].

use roff::{bold, italic, roman};

use super::{reference, Page};
use crate::config::keys::{self, Applies, Key, Table};
use crate::config::DEFAULT_PATH;

/// The page's text, in roff.
pub fn file_page() -> String {
    let mut p = Page::new("INCUS-HPA.TOML", "5", "File Formats");
    p.section("NAME");
    p.0.text([roman(
        "incus-hpa.toml - the desired-state file of incus-hpa",
    )]);
    p.section("SYNOPSIS");
    p.0.text([bold(DEFAULT_PATH)]);
    p.section("DESCRIPTION");
    p.para(
        "The desired-state file declares the groups of Incus containers that incus-hpa(8) keeps \
         running: for each group, how few and how many instances, what it scales on (memory, \
         CPU, pressure, numbers a program prints, schedule windows), and the image and config to \
         create them from. The daemon compares it with what \
         Incus reports, at every interval, and creates, starts or deletes instances until they \
         match. It only ever acts on instances it created for a group.",
    );
    p.para(&format!(
        "The file is TOML: an optional [daemon] table, and one [groups.NAME] table per group, \
         NAME made of {}. A file without a group manages nothing. A duration is a string such \
         as \"500ms\", \"30s\", \"5m\" or \"1h 30m\".",
        keys::group_name_rule()
    ));
    p.para(
        "Unknown keys, wrong types and values out of range are errors. All of them are reported \
         at once, each as FILE:LINE:COLUMN: error: KEY: what is wrong, and warnings the same way. \
         incus-hpa validate checks a file as the daemon would; incus-hpa validate --syntax-only \
         checks the content of a copy kept elsewhere.",
    );
    p.para(
        "The daemon reads the file again when it is saved and on SIGHUP (systemctl reload \
         incus-hpa). A file with an error is refused with every error in the journal, and the \
         last good file stays in force. A changed key applies from the next pass, except the \
         keys marked \"read at start\" below: a reload keeps their old value, says so in the \
         journal, and a restart applies them. A group taken out of the file is no longer \
         managed: its instances are left as they are.",
    );
    p.para(
        "The file decides what runs as containers, so it is held to the rule of sshd's \
         StrictModes: the file and every directory on its path must be owned by root or by the \
         daemon's user and writable by no one else (sticky directories such as /tmp excepted), \
         and a symbolic link on the way is followed only when one of them owns it. Otherwise \
         the daemon refuses the file (at start, it exits with status 78), and the error names \
         the chmod or chown that fixes it.",
    );
    p.section("[daemon]");
    p.para("Settings of the daemon itself. Every key is optional.");
    keys_of(&mut p, Table::Daemon);
    p.section("[groups.NAME]");
    p.para(
        "One group of instances. max and image are required, and at least one signal: \
         memory_threshold, cpu_threshold, pressure_threshold or an external table.",
    );
    keys_of(&mut p, Table::Group);
    p.section("EXTERNAL SIGNALS");
    p.para(
        "Each [[groups.NAME.external]] table is a signal of its own: a program that prints a \
         number, such as the depth of a queue or a count of connections, and the value one \
         instance can take. Its reading is taken at most once per interval, in the background: \
         no pass waits for the program, and a new reading reconciles the group at once.",
    );
    keys_of(&mut p, Table::External);
    p.section("SCHEDULES");
    p.para(
        "Each [[groups.NAME.schedule]] table is a window that a cron expression opens, such as \
         working hours. While it is open, its min and max replace the group's; where windows \
         overlap, the highest min and the highest max apply. When it closes the group's own \
         bounds are back, and the instances it allowed above the group's max go through the \
         scale-down stabilization window and the step limits, like any scale-down \
         (REASON window-closed); a max lowered in the file is restored at once, during such a \
         wind-down too. A daemon restarted during a wind-down cannot tell the two apart: it \
         restores max at once.",
    );
    keys_of(&mut p, Table::Schedule);
    p.section("READINESS");
    p.para(
        "A [groups.NAME.ready] table says when an instance of the group is ready to take \
         requests (see ready above). It sets port, for a check from the daemon's host, or \
         command, for a check inside the instance; the other keys are optional. Like the rest \
         of a group, a changed table applies after a reload. Without it, an instance is in \
         service as soon as it runs.",
    );
    keys_of(&mut p, Table::Ready);
    p.section("ENDPOINTS");
    p.para(
        "A [groups.NAME.endpoints] table publishes the group's instances in service to a load \
         balancer (see endpoints above): command is run on the daemon's host, by the daemon \
         holding the group's lease, with {\"group\": ..., \"project\": ..., \"endpoints\": [{\"instance\": ..., \
         \"address\": ..., \"port\": ...}]} on its standard input, whenever the set changes, at \
         start and after a reload. A removal takes the instance out of the set first, waits \
         for the command to succeed and deregistration_delay to pass, then drains and stops it.",
    );
    keys_of(&mut p, Table::Endpoints);
    p.section("EXAMPLE");
    p.literal(EXAMPLE);
    p.section("FILES");
    p.entry(
        vec![bold(DEFAULT_PATH)],
        "The desired-state file the packaged unit runs the daemon with (mode 0640, owned by \
         root and the group incus-hpa).",
    );
    p.entry(
        vec![bold("/usr/share/doc/incus-hpa/examples/")],
        "Annotated example files, and drop-ins for the unit (metrics over TCP, Incus over \
         HTTPS).",
    );
    p.section("SEE ALSO");
    let mut see = reference("incus-hpa", "8");
    see.push(roman(", "));
    see.extend(reference("incus", "1"));
    see.push(roman(", "));
    see.extend(reference("systemctl", "1"));
    see.push(roman(", /usr/share/doc/incus-hpa/README.md"));
    p.0.text(see);
    p.render()
}

/// The example of the page: a first group, as the README starts it.
pub const EXAMPLE: &str = "\
[daemon]
interval = \"15s\"

[groups.web]
min = 1
max = 5
memory_threshold = 70
image = \"busybox\"
max_scale_down_step = 1

[groups.web.config]
\"limits.memory\" = \"256MiB\"

[[groups.web.schedule]]
cron = \"0 8 * * 1-5\"
duration = \"10h\"
min = 3";

fn keys_of(p: &mut Page, table: Table) {
    for k in keys::keys().into_iter().filter(|k| k.table == table) {
        key(p, &k);
    }
}

fn key(p: &mut Page, k: &Key) {
    p.entry(vec![bold(k.name), roman(" = "), italic(k.kind)], k.doc);
    let mut lines = Vec::new();
    lines.push(vec![
        roman("Default: "),
        roman(k.default.as_deref().unwrap_or("none; this key is required")),
        roman("."),
    ]);
    if let Some(range) = &k.range {
        lines.push(vec![roman(format!("Range: {range}."))]);
    }
    if k.applies == Applies::AtStart {
        lines.push(vec![roman(
            "Read at start: a reload keeps the value in force until a restart.",
        )]);
    }
    lines.push(vec![roman("Example: "), bold(k.example)]);
    p.lines(&lines);
}
