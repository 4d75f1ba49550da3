//! The Shell capabilities through their core traits: recorded commands and their attribution,
//! background processes, terminal sessions, secret redaction. Every scenario also runs as an
//! unprivileged user: run as root (as CI does), `shell_as_an_unprivileged_user` re-executes this
//! binary as uid/gid 65534 with `setpriv`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use environment_core::{
    AccessRequest, Action, ActorId, Authorizer, BackgroundProcesses, Cancel, Capability, Decision,
    EnvError, ExecRequest, Exit, HistoryOptions, IntentKind, Key, LocalEnvironment, Namespace,
    OpFlags, Options, PtyRequest, PtySessions, SecretProvider, SecretRef, SecretValue, ShellExec,
    Signal, SpawnRequest, Verdict,
};
use environment_sandbox::{Shell, Tracker, TrackerConfig, Unconfined};

const SECRET: &str = "hunter2-very-secret-value";

fn agent() -> ActorId {
    ActorId::new("agent:coder").unwrap()
}

/// Refuses `execute` on programs and `read` on secrets; allows the rest.
struct NoExec;

impl Authorizer for NoExec {
    fn decide(&self, r: &AccessRequest) -> Decision {
        let denied = matches!(r.action, Action::Execute)
            || matches!(r.resource, environment_core::Resource::Secret(_));
        if denied {
            Decision {
                verdict: Verdict::Deny,
                rules: vec!["test:no-exec".into()],
                policy_version: 1,
                next: String::new(),
                explanation: "running programs is not allowed here".into(),
                spend: Vec::new(),
            }
        } else {
            Decision::allow_unconditionally()
        }
    }
}

/// Allows running programs but not writing a command's record (`obj:` keys).
struct NoRecord;

impl Authorizer for NoRecord {
    fn decide(&self, r: &AccessRequest) -> Decision {
        match &r.resource {
            environment_core::Resource::Key(k)
                if k.namespace() == Namespace::Obj && r.action == Action::Write =>
            {
                Decision {
                    verdict: Verdict::Deny,
                    rules: vec!["test:no-record".into()],
                    policy_version: 1,
                    next: String::new(),
                    explanation: "objects are read-only here".into(),
                    spend: Vec::new(),
                }
            }
            _ => Decision::allow_unconditionally(),
        }
    }
}

/// Holds one secret.
struct OneSecret;

#[async_trait]
impl SecretProvider for OneSecret {
    async fn resolve(&self, secret: &SecretRef) -> environment_core::Result<SecretValue> {
        if secret.name == "api-token" {
            Ok(SecretValue::new(SECRET))
        } else {
            Err(EnvError::SecretUnavailable {
                name: secret.name.clone(),
                detail: "unknown".into(),
            })
        }
    }
}

struct Fixture {
    env: LocalEnvironment,
    shell: Shell,
    work: std::path::PathBuf,
}

fn fixture(dir: &Path, name: &str, options: Options) -> Fixture {
    let work = dir.join(name).join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("a.txt"), "old a\n").unwrap();
    std::fs::write(work.join("old.txt"), "to be removed\n").unwrap();
    let env = LocalEnvironment::open(dir.join(name).join("home"), options).unwrap();
    let mut cfg = TrackerConfig::new(&work, ActorId::new("service:watcher").unwrap());
    // Automatic captures on, and eager: without the hold they would split a command's changes.
    cfg.quiet_period = Duration::from_millis(20);
    cfg.max_wait = Duration::from_millis(100);
    let tracker = Arc::new(Tracker::open(env.clone(), cfg).unwrap());
    let shell = Shell::new(
        Arc::new(Unconfined::new(&work)),
        tracker,
        Some(Arc::new(OneSecret)),
    )
    .unwrap();
    Fixture { env, shell, work }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn fs_keys_changed(env: &LocalEnvironment, op: &environment_core::OpId) -> BTreeSet<String> {
    let rec = env.op(op).unwrap();
    env.diff(&agent(), &rec.parents[0], op, None)
        .unwrap()
        .into_iter()
        .filter(|c| c.key.namespace() == Namespace::Fs)
        .map(|c| String::from_utf8(c.key.path().to_vec()).unwrap())
        .collect()
}

async fn exec_attribution(dir: &Path) {
    let f = fixture(dir, "attribution", Options::default());
    let offered = f.shell.capabilities();
    for c in [
        Capability::ShellExec,
        Capability::BackgroundProcesses,
        Capability::Pty,
    ] {
        offered.require(c).unwrap();
    }
    let shell: Arc<dyn ShellExec> = Arc::new(f.shell.clone());
    // The first change comes long before the command ends: an automatic capture would take it
    // were the command not holding them off.
    let script = "echo new a > a.txt; sleep 0.4; echo one > n1.txt; mkdir d; echo two > d/n2.txt; \
                  rm old.txt; echo out; echo err >&2";
    let outcome = shell
        .exec(ExecRequest::new(agent(), ["sh", "-c", script]).intent("generate the files"))
        .await
        .unwrap();
    assert_eq!(outcome.exit, Exit::Code(0));
    let changed = fs_keys_changed(&f.env, &outcome.op);
    for k in ["a.txt", "n1.txt", "d/n2.txt", "old.txt"] {
        assert!(
            changed.contains(k),
            "{k} not attributed to the command: {changed:?}"
        );
    }
    assert_eq!(outcome.files_changed, changed.len() as u64);
    let op = f.env.op(&outcome.op).unwrap();
    assert_eq!(op.actor, agent());
    assert_eq!(op.intent.text, "generate the files");
    assert_eq!(op.intent.kind, IntentKind::Command);
    assert!(op.flags.contains(OpFlags::COMMAND));
    assert!(!op.flags.contains(OpFlags::FAILED));
    assert!(!op.flags.contains(OpFlags::AUTO_CAPTURE));
    // The history names it.
    let history = f
        .env
        .history(&agent(), "main", &HistoryOptions::default())
        .unwrap();
    let line = history
        .iter()
        .map(|h| h.to_string())
        .find(|l| l.starts_with(&outcome.op.short()))
        .expect("the command is a node of the history");
    assert!(line.contains("generate the files"), "{line}");
    // Its output is in the blob store and under the output keys at its version.
    assert_eq!(f.env.blobs().get(&outcome.stdout.blob).unwrap(), b"out\n");
    assert_eq!(f.env.blobs().get(&outcome.stderr.blob).unwrap(), b"err\n");
    assert_eq!(outcome.stdout.preview, "out\n");
    let v = f
        .env
        .read(&agent(), &Key::obj("exec/stdout").unwrap(), &outcome.op)
        .unwrap()
        .unwrap();
    assert_eq!(f.env.content(&v).unwrap(), b"out\n");
    let status = f
        .env
        .read(&agent(), &Key::obj("exec/status").unwrap(), &outcome.op)
        .unwrap()
        .unwrap();
    let status: serde_json::Value =
        serde_json::from_slice(&f.env.content(&status).unwrap()).unwrap();
    assert_eq!(status["exit"], serde_json::json!({"code": 0}));

    // A command in a subdirectory, changing nothing, is still one operation.
    let quiet = shell
        .exec(ExecRequest::new(agent(), ["true"]).cwd("d"))
        .await
        .unwrap();
    assert_ne!(quiet.op, outcome.op);
    assert_eq!(quiet.files_changed, 0);
    assert_eq!(f.env.head("main").unwrap(), quiet.op);

    // Truncation: counted whole, stored up to the limit, and said so.
    let big = shell
        .exec(
            ExecRequest::new(agent(), ["sh", "-c", "yes abcdefghi | head -c 100000"])
                .output_limit(100),
        )
        .await
        .unwrap();
    assert_eq!(big.stdout.total, 100_000);
    assert_eq!(big.stdout.stored, 100);
    assert!(big.stdout.truncated);
    assert!(!big.stderr.truncated);
    assert_eq!(f.env.blobs().get(&big.stdout.blob).unwrap().len(), 100);

    // Standard input reaches the command.
    let cat = shell
        .exec(ExecRequest::new(agent(), ["cat"]).stdin(b"fed in".to_vec()))
        .await
        .unwrap();
    assert_eq!(f.env.blobs().get(&cat.stdout.blob).unwrap(), b"fed in");

    // A failure is recorded as such.
    let failed = shell
        .exec(ExecRequest::new(
            agent(),
            ["sh", "-c", "echo half > half.txt; exit 3"],
        ))
        .await
        .unwrap();
    assert_eq!(failed.exit, Exit::Code(3));
    let op = f.env.op(&failed.op).unwrap();
    assert!(op.flags.contains(OpFlags::COMMAND | OpFlags::FAILED));
    assert!(fs_keys_changed(&f.env, &failed.op).contains("half.txt"));

    // A timeout kills the command and what it started.
    let timed = shell
        .exec(
            ExecRequest::new(agent(), ["sh", "-c", "sleep 30 & echo $! > bg.pid; wait"])
                .timeout(Duration::from_millis(300)),
        )
        .await
        .unwrap();
    assert_eq!(timed.exit, Exit::TimedOut);
    assert!(f.env.op(&timed.op).unwrap().flags.contains(OpFlags::FAILED));
    let pid: u32 = std::fs::read_to_string(f.work.join("bg.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(gone(pid), "the command's child {pid} survived the timeout");

    // A cancellation does the same from elsewhere: what the command changed until then is its
    // operation, recorded as cancelled.
    let cancel = Cancel::new();
    let calling_off = {
        let (cancel, started) = (cancel.clone(), f.work.join("bg2.pid"));
        std::thread::spawn(move || {
            while !started.exists() {
                std::thread::sleep(Duration::from_millis(10));
            }
            cancel.cancel();
        })
    };
    let off = shell
        .exec(
            ExecRequest::new(
                agent(),
                [
                    "sh",
                    "-c",
                    "echo a > before.txt; sleep 30 & echo $! > bg2.pid; wait",
                ],
            )
            .cancelled_by(cancel),
        )
        .await
        .unwrap();
    calling_off.join().unwrap();
    assert_eq!(off.exit, Exit::Cancelled);
    assert!(f.env.op(&off.op).unwrap().flags.contains(OpFlags::FAILED));
    assert!(fs_keys_changed(&f.env, &off.op).contains("before.txt"));
    let pid: u32 = std::fs::read_to_string(f.work.join("bg2.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        gone(pid),
        "the command's child {pid} survived the cancellation"
    );

    // A bad working directory is refused before anything runs.
    let head = f.env.head("main").unwrap();
    let err = shell
        .exec(ExecRequest::new(agent(), ["true"]).cwd("../.."))
        .await
        .unwrap_err();
    assert!(matches!(err, EnvError::Exec { .. }), "{err}");
    assert_eq!(f.env.head("main").unwrap(), head);
}

/// Whether a process is gone (or a zombie, killed, that nobody has reaped yet).
fn gone(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat) => {
                let state = stat.rsplit(')').next().unwrap_or("").trim_start();
                if state.starts_with('Z') || state.starts_with('X') {
                    return true;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

async fn denied_exec(dir: &Path) {
    let options = Options {
        authorizer: Arc::new(NoExec),
        ..Options::default()
    };
    let f = fixture(dir, "denied", options);
    let head = f.env.head("main").unwrap();
    let ops_before = f.env.op(&head).unwrap().seq;
    let err = f
        .shell
        .exec(ExecRequest::new(agent(), ["touch", "ran.txt"]))
        .await
        .unwrap_err();
    assert!(matches!(err, EnvError::NotAllowed(_)), "{err}");
    let err = BackgroundProcesses::spawn(&f.shell, SpawnRequest::new(agent(), ["touch", "bg.txt"]))
        .await
        .unwrap_err();
    assert!(matches!(err, EnvError::NotAllowed(_)), "{err}");
    let err = PtySessions::open(&f.shell, PtyRequest::new(agent(), ["touch", "pty.txt"]))
        .await
        .unwrap_err();
    assert!(matches!(err, EnvError::NotAllowed(_)), "{err}");
    std::thread::sleep(Duration::from_millis(200));
    for name in ["ran.txt", "bg.txt", "pty.txt"] {
        assert!(!f.work.join(name).exists(), "{name}: a refused command ran");
    }
    let head_now = f.env.head("main").unwrap();
    assert_eq!(head_now, head, "a refused command recorded something");
    assert_eq!(f.env.op(&head_now).unwrap().seq, ops_before);

    // An actor that may run programs but not write the command's record is refused before the
    // command runs, not after.
    let options = Options {
        authorizer: Arc::new(NoRecord),
        ..Options::default()
    };
    let f = fixture(dir, "unrecordable", options);
    let head = f.env.head("main").unwrap();
    let err = f
        .shell
        .exec(ExecRequest::new(agent(), ["touch", "ran.txt"]))
        .await
        .unwrap_err();
    assert!(matches!(err, EnvError::NotAllowed(_)), "{err}");
    assert!(!f.work.join("ran.txt").exists());
    assert_eq!(f.env.head("main").unwrap(), head);
}

async fn background(dir: &Path) {
    let f = fixture(dir, "background", Options::default());
    let spawner: Arc<dyn BackgroundProcesses> = Arc::new(f.shell.clone());
    let id = spawner
        .spawn(SpawnRequest::new(
            agent(),
            [
                "sh",
                "-c",
                "echo line1; echo line2 >&2; echo line3; exec sleep 30",
            ],
        ))
        .await
        .unwrap();
    let quick = spawner
        .spawn(SpawnRequest::new(
            agent(),
            ["sh", "-c", "echo done; exit 4"],
        ))
        .await
        .unwrap();
    // The caller that started them goes away; the processes stay with the shell.
    drop(spawner);
    let procs: Arc<dyn BackgroundProcesses> = Arc::new(f.shell.clone());
    let mut all = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(&all).contains("line3") {
        assert!(Instant::now() < deadline, "no output: {all:?}");
        let chunk = procs.read(id, all.len() as u64, 1 << 20).await.unwrap();
        assert!(!chunk.eof);
        assert_eq!(chunk.next_offset, (all.len() + chunk.bytes.len()) as u64);
        all.extend(chunk.bytes);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(all, b"line1\nline2\nline3\n");
    // From an offset, bounded.
    let part = procs.read(id, 6, 5).await.unwrap();
    assert_eq!(part.bytes, b"line2");
    assert_eq!(part.next_offset, 11);
    assert_eq!(
        procs
            .wait(id, Some(Duration::from_millis(50)))
            .await
            .unwrap(),
        None
    );
    let list = procs.list().await.unwrap();
    let info = list.iter().find(|p| p.id == id).unwrap();
    assert_eq!(info.exit, None);
    assert_eq!(info.actor, agent());
    assert_eq!(info.output_len, 18);
    assert_eq!(
        procs
            .wait(quick, Some(Duration::from_secs(10)))
            .await
            .unwrap(),
        Some(Exit::Code(4))
    );
    // A wait that saw the exit answers once the output is in the log: a read right after it
    // sees all of it, up to the end, a descendant's writes after the parent's exit included.
    let done = procs.read(quick, 0, 100).await.unwrap();
    assert_eq!((done.bytes.as_slice(), done.eof), (&b"done\n"[..], true));
    let late = procs
        .spawn(SpawnRequest::new(
            agent(),
            ["sh", "-c", "(sleep 0.3; echo late) & echo early"],
        ))
        .await
        .unwrap();
    assert_eq!(
        procs
            .wait(late, Some(Duration::from_secs(10)))
            .await
            .unwrap(),
        Some(Exit::Code(0))
    );
    let out = procs.read(late, 0, 100).await.unwrap();
    assert_eq!(
        (out.bytes.as_slice(), out.eof),
        (&b"early\nlate\n"[..], true)
    );
    procs.signal(id, Signal::Terminate).await.unwrap();
    assert_eq!(
        procs.wait(id, Some(Duration::from_secs(10))).await.unwrap(),
        Some(Exit::Signal(15))
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let end = procs.read(id, 18, 100).await.unwrap();
        if end.eof {
            assert!(end.bytes.is_empty());
            break;
        }
        assert!(Instant::now() < deadline, "no end of output");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let info = procs.list().await.unwrap();
    assert_eq!(
        info.iter().find(|p| p.id == id).unwrap().exit,
        Some(Exit::Signal(15))
    );
    let err = procs
        .read(environment_core::ProcessId(9999), 0, 10)
        .await
        .unwrap_err();
    assert!(matches!(err, EnvError::NoSuchProcess { .. }));
    // The logs are outside the workspace.
    assert!(!f.shell.run_dir().starts_with(&f.work));
}

/// Reads a session until its output contains `needle`.
async fn read_until(
    ptys: &dyn PtySessions,
    id: environment_core::SessionId,
    needle: &str,
) -> String {
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !seen.contains(needle) {
        assert!(
            Instant::now() < deadline,
            "never saw {needle:?} in {seen:?}"
        );
        let out = ptys.read(id).await.unwrap();
        seen.push_str(&String::from_utf8_lossy(&out.bytes));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    seen
}

async fn pty_sessions(dir: &Path) {
    let f = fixture(dir, "pty", Options::default());
    let ptys: Arc<dyn PtySessions> = Arc::new(f.shell.clone());
    let id = ptys
        .open(
            PtyRequest::new(agent(), ["sh"])
                .size(24, 80)
                .env("PS1", "$ "),
        )
        .await
        .unwrap();
    ptys.write(id, b"stty size\n").await.unwrap();
    read_until(ptys.as_ref(), id, "24 80").await;
    ptys.resize(id, 40, 100).await.unwrap();
    ptys.write(id, b"stty size\n").await.unwrap();
    read_until(ptys.as_ref(), id, "40 100").await;
    // Start something that prints later, then go away.
    ptys.write(id, b"sleep 0.3; echo later-$((6*7))\n")
        .await
        .unwrap();
    ptys.detach(id).await.unwrap();
    let info = ptys.list().await.unwrap();
    assert!(!info.iter().find(|s| s.id == id).unwrap().attached);
    std::thread::sleep(Duration::from_millis(800));
    // Back: what was printed meanwhile is there.
    let back = ptys.attach(id).await.unwrap();
    let text = String::from_utf8_lossy(&back.bytes).into_owned();
    assert!(text.contains("later-42"), "missed while detached: {text:?}");
    assert_eq!(back.missed, 0);
    // And read afterwards starts after it.
    let next = ptys.read(id).await.unwrap();
    assert!(!String::from_utf8_lossy(&next.bytes).contains("later-42"));
    assert_eq!(next.offset, back.offset + back.bytes.len() as u64);
    ptys.write(id, b"exit 5\n").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while ptys.read(id).await.unwrap().exit.is_none() {
        assert!(Instant::now() < deadline, "the shell did not exit");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let exit = ptys.close(id).await.unwrap();
    assert_eq!(exit, Some(Exit::Code(5)));
    assert!(ptys.list().await.unwrap().iter().all(|s| s.id != id));
    assert!(matches!(
        ptys.read(id).await.unwrap_err(),
        EnvError::NoSuchProcess { .. }
    ));

    // Nobody comes back: the idle timeout closes it.
    let idle = ptys
        .open(PtyRequest::new(agent(), ["sh"]).idle_timeout(Duration::from_millis(200)))
        .await
        .unwrap();
    ptys.detach(idle).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while ptys.list().await.unwrap().iter().any(|s| s.id == idle) {
        assert!(Instant::now() < deadline, "the idle session stayed open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn secret_redaction(dir: &Path) {
    let f = fixture(dir, "secrets", Options::default());
    let token = SecretRef {
        name: "api-token".into(),
        provider: "test".into(),
    };
    // The secret is printed whole, split across two writes, and to both streams.
    let script = r#"echo "token=$API_TOKEN"; printf %s "$(echo "$API_TOKEN" | cut -c1-7)"; sleep 0.1; echo "$API_TOKEN" | cut -c8-; echo "$API_TOKEN" >&2"#;
    let out = f
        .shell
        .exec(
            ExecRequest::new(agent(), ["sh", "-c", script])
                .secret("API_TOKEN", token.clone())
                .intent("use the token"),
        )
        .await
        .unwrap();
    assert_eq!(out.exit, Exit::Code(0));
    let stdout = String::from_utf8(f.env.blobs().get(&out.stdout.blob).unwrap()).unwrap();
    assert_eq!(
        stdout, "token=[redacted:API_TOKEN]\n[redacted:API_TOKEN]\n",
        "{stdout}"
    );
    let stderr = String::from_utf8(f.env.blobs().get(&out.stderr.blob).unwrap()).unwrap();
    assert_eq!(stderr, "[redacted:API_TOKEN]\n");
    assert!(!out.stdout.preview.contains(SECRET));
    // Nowhere in the store: no blob, no operation record, no value.
    for hash in f.env.blobs().list().unwrap() {
        let bytes = f.env.blobs().get(&hash).unwrap();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(SECRET),
            "the secret is in blob {hash}"
        );
    }
    let op = f.env.op(&out.op).unwrap();
    assert!(!serde_json::to_string(&*op).unwrap().contains(SECRET));
    for file in ["env.db", "env.db-wal", "sandbox.db", "sandbox.db-wal"] {
        if let Ok(db) = std::fs::read(f.env.home().join(file)) {
            assert!(
                !db.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
                "the secret is in {file}"
            );
        }
    }

    // In a background process's log too.
    let id = BackgroundProcesses::spawn(
        &f.shell,
        SpawnRequest::new(agent(), ["sh", "-c", "echo \"bg $API_TOKEN\""])
            .secret("API_TOKEN", token.clone()),
    )
    .await
    .unwrap();
    BackgroundProcesses::wait(&f.shell, id, None).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut log = Vec::new();
    loop {
        let c = BackgroundProcesses::read(&f.shell, id, log.len() as u64, 1 << 20)
            .await
            .unwrap();
        log.extend(c.bytes);
        if c.eof {
            break;
        }
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(log, b"bg [redacted:API_TOKEN]\n");

    // An unknown secret: nothing runs.
    let head = f.env.head("main").unwrap();
    let err = f
        .shell
        .exec(ExecRequest::new(agent(), ["touch", "x.txt"]).secret(
            "X",
            SecretRef {
                name: "missing".into(),
                provider: "test".into(),
            },
        ))
        .await
        .unwrap_err();
    assert!(matches!(err, EnvError::SecretUnavailable { .. }), "{err}");
    assert_eq!(f.env.head("main").unwrap(), head);
    assert!(!f.work.join("x.txt").exists());
}

async fn shell_end(dir: &Path) {
    let f = fixture(dir, "end", Options::default());
    let id = BackgroundProcesses::spawn(&f.shell, SpawnRequest::new(agent(), ["sleep", "30"]))
        .await
        .unwrap();
    let session = PtySessions::open(&f.shell, PtyRequest::new(agent(), ["sh"]))
        .await
        .unwrap();
    // A shell ignoring hang-ups still ends.
    PtySessions::write(&f.shell, session, b"trap '' HUP; echo $$ > pty.pid\n")
        .await
        .unwrap();
    let pid_file = f.work.join("pty.pid");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&pid_file).map_or(true, |s| !s.ends_with('\n')) {
        assert!(Instant::now() < deadline, "the terminal's shell never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pty_pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let bg_pid = BackgroundProcesses::list(&f.shell)
        .await
        .unwrap()
        .into_iter()
        .find(|p| p.id == id)
        .unwrap()
        .pid;
    drop(f.shell);
    assert!(gone(bg_pid), "a background process outlived its shell");
    assert!(gone(pty_pid), "a terminal's program outlived its shell");
}

fn all_scenarios(dir: &Path) {
    let rt = runtime();
    rt.block_on(exec_attribution(dir));
    rt.block_on(denied_exec(dir));
    rt.block_on(background(dir));
    rt.block_on(pty_sessions(dir));
    rt.block_on(secret_redaction(dir));
    rt.block_on(shell_end(dir));
}

#[test]
fn exec_is_one_attributed_operation() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(exec_attribution(dir.path()));
}

#[test]
fn a_refused_command_runs_nothing_and_records_nothing() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(denied_exec(dir.path()));
}

#[test]
fn background_processes_outlive_their_caller() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(background(dir.path()));
}

#[test]
fn a_terminal_session_keeps_what_was_printed_while_detached() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(pty_sessions(dir.path()));
}

#[test]
fn secrets_never_reach_the_store() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(secret_redaction(dir.path()));
}

#[test]
fn processes_and_sessions_end_with_their_shell() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(shell_end(dir.path()));
}

#[test]
fn shell_as_an_unprivileged_user() {
    common::as_nobody(
        "shell_as_an_unprivileged_user",
        common::always,
        all_scenarios,
    );
}
