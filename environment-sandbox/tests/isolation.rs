#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use std::process::Command;
use environment_sandbox::{Isolation, IsolationSpec, Launcher};

#[test]
fn smoke() {
    let ws = tempfile::tempdir().unwrap();
    let iso = Isolation::new(IsolationSpec::host(ws.path())).unwrap();
    eprintln!("{}", iso.describe());
    let mut c = Command::new("/bin/sh");
    c.args(["-c", "echo pid=$$; pwd; id; ls /proc; touch x && echo ok; touch /usr/x; cat /proc/self/mountinfo | wc -l; hostname; env"]);
    iso.confine(&mut c).unwrap();
    let out = c.output().unwrap();
    eprintln!("{:?}\n{}\n{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}
