//! What the envctl suites share: a workspace made an environment, envctl run in it as a user
//! runs it, and the re-run of a test as an unprivileged uid.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value as Json;

pub mod serving;

/// A prerequisite of the test is missing: under `CI=true` (CI sets it) the test fails, since a
/// skip there would report success for a test that never ran; elsewhere it says SKIPPED and why.
pub fn missing_prerequisite(reason: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("a prerequisite is missing under CI=true: {reason}");
    }
    eprintln!("SKIPPED: {reason}");
}

pub const BIN: &str = env!("CARGO_BIN_EXE_envctl");

/// Rules for a human who may do everything and an agent who reads, runs `sh`, writes under
/// `src/`, and writes under `release/` with the human's approval.
pub const ALICE_AND_BOB: &str = r#"
[[rule]]
id = "alice-everything"
effect = "permit"
principal = "human:alice"
actions = ["read", "write", "delete", "execute", "publish", "consume", "approve"]
resource = "*"

[[rule]]
id = "bob-reads"
effect = "permit"
principal = "agent:bob"
actions = ["read"]
resource = "*"

[[rule]]
id = "bob-runs-sh"
effect = "permit"
principal = "agent:bob"
actions = ["execute"]
resource = { program = "sh", args = ["..."] }

[[rule]]
id = "bob-records-commands"
effect = "permit"
principal = "agent:bob"
actions = ["write"]
resource = { object = "exec", key = "*" }

[[rule]]
id = "bob-writes-src"
effect = "permit"
principal = "agent:bob"
actions = ["write"]
resource = { path = "src/**" }

[[rule]]
id = "bob-releases-with-approval"
effect = "permit"
principal = "agent:bob"
actions = ["write"]
resource = { path = "release/**" }
approval_from = ["human:alice"]
"#;
/// How many rules [`ALICE_AND_BOB`] holds.
pub const ALICE_AND_BOB_RULES: usize = 6;

/// Set in a test binary re-run as uid 65534.
const UNPRIVILEGED: &str = "ENVCTL_TEST_UNPRIVILEGED";

/// A workspace with two files, made an environment.
pub struct Ws {
    pub _tmp: tempfile::TempDir,
    pub dir: PathBuf,
    /// The actor envctl acts as by default (`ENVIRONMENT_ACTOR`); the user's own when `None`.
    pub actor: Option<&'static str>,
}

impl Ws {
    pub fn new() -> Ws {
        Ws::acting_as(None)
    }

    pub fn acting_as(actor: Option<&'static str>) -> Ws {
        Ws::made_with(actor, &[])
    }

    /// A workspace made an environment by `envctl init ARGS…`.
    pub fn made_with(actor: Option<&'static str>, init: &[&str]) -> Ws {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("work");
        std::fs::create_dir_all(dir.join("src")).unwrap();
        std::fs::write(dir.join("README.md"), "# demo\n").unwrap();
        std::fs::write(dir.join("src/main.rs"), "fn main() {}\n").unwrap();
        let ws = Ws {
            _tmp: tmp,
            dir,
            actor,
        };
        let mut args = vec!["init"];
        args.extend_from_slice(init);
        let out = ws.run(&args);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(
            out.stderr.is_empty(),
            "nothing on stderr off a terminal: {}",
            stderr(&out)
        );
        ws
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    pub fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.path(rel)).ok()
    }

    pub fn home(&self) -> PathBuf {
        self.path(".environment")
    }

    pub fn socket(&self) -> PathBuf {
        self.home().join("run/control.sock")
    }

    /// envctl in the workspace, not yet started.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = envctl_cmd(&self.dir, args);
        if let Some(actor) = self.actor {
            c.env("ENVIRONMENT_ACTOR", actor);
        }
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    /// envctl that must succeed.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert_eq!(code(&out), 0, "envctl {args:?}: {}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    }

    /// envctl --json that must succeed.
    pub fn json(&self, args: &[&str]) -> Json {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        serde_json::from_str(&self.ok(&all)).unwrap()
    }

    /// Every operation of main, as JSON, read as `actor`.
    pub fn full_log(&self, actor: &str) -> Json {
        self.json(&["--actor", actor, "log", "--all", "--limit", "1000"])
    }

    /// The head of main, read as `actor`.
    pub fn head(&self, actor: &str) -> String {
        self.json(&["--actor", actor, "status"])["head"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// envctl that must fail with `expected`, saying why in one sentence and a hint (what a
    /// command printed before it failed, such as the output of a command `exec` ran, stays).
    pub fn fails(&self, args: &[&str], expected: i32) -> String {
        let out = self.run(args);
        assert_eq!(code(&out), expected, "envctl {args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert_one_sentence(&err);
        err
    }
}

/// envctl started in `dir`, with nothing of the caller's environment variables for it.
pub fn envctl_cmd(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .current_dir(dir)
        .env_remove("ENVIRONMENT_DIR")
        .env_remove("ENVIRONMENT_ACTOR")
        .env_remove("ENVIRONMENT_SOCKET")
        .env_remove("ENVIRONMENT_TOKEN");
    c
}

pub fn envctl_in(dir: &Path, args: &[&str]) -> Output {
    envctl_cmd(dir, args).output().unwrap()
}

pub fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `envctl: <one sentence>.` then `hint: ...`.
pub fn assert_one_sentence(err: &str) {
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "one sentence and a hint: {err:?}");
    assert!(
        lines[0].starts_with("envctl: ") && lines[0].ends_with('.'),
        "{err:?}"
    );
    assert!(lines[1].starts_with("hint: "), "{err:?}");
}

/// Whether this process is a test re-run as uid 65534 by [`also_unprivileged`].
pub fn in_unprivileged_run() -> bool {
    std::env::var_os(UNPRIVILEGED).is_some()
}

pub fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Run as root (as CI does), re-runs `test` of this binary as uid/gid 65534 and checks that it
/// passed there; does nothing in that re-run or when not root.
pub fn also_unprivileged(test: &str) {
    if in_unprivileged_run() || !running_as_root() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(&exe)
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(UNPRIVILEGED, "1")
        .env("HOME", "/tmp")
        .env("TMPDIR", "/tmp")
        .current_dir("/")
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            missing_prerequisite(&format!("the unprivileged run of {test}: setpriv ({e})"));
            return;
        }
    };
    let text = format!("{}{}", stderr(&out), stdout(&out));
    if !out.status.success() && text.contains("Permission denied") && text.contains(BIN) {
        missing_prerequisite(&format!(
            "the unprivileged run of {test}: uid 65534 cannot reach the binaries"
        ));
        return;
    }
    assert!(
        out.status.success(),
        "unprivileged run of {test} failed: {text}"
    );
    assert!(
        text.contains("1 passed"),
        "the unprivileged run ran nothing: {text}"
    );
}

/// The test server's connection string with a new, empty schema of its own, or `None` (a
/// failure under `CI=true`) when no server is configured.
pub fn fresh_schema() -> Option<String> {
    let url = environment_conformance::prerequisite::postgres()?;
    let schema = format!(
        "envctl_{}_{:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    let admin: postgres::Config = url.parse().unwrap();
    let mut client = admin.connect(postgres::NoTls).unwrap();
    client
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .unwrap();
    Some(format!("{url} options='-c search_path={schema}'"))
}

/// A new prefix in the test bucket, or `None` (a failure under `CI=true`) without one.
pub fn fresh_bucket() -> Option<String> {
    let url = environment_conformance::prerequisite::s3()?;
    Some(format!(
        "{}/envctl-{}-{:08x}",
        url.trim_end_matches('/'),
        std::process::id(),
        rand::random::<u32>()
    ))
}
