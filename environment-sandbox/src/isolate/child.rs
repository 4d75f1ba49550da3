//! What runs between fork and exec: the namespaces, the process tree (outer → init → agent, see
//! the module docs of `isolate`), the mounts and the limits.
//!
//! Everything here runs in a child of a possibly multi-threaded process, so it is restricted to
//! async-signal-safe work: system calls on data prepared before the fork ([`Plan`]), no
//! allocation, no locks, no panics.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use rustix::fs::{Mode, OFlags};
use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};
use rustix::thread::UnshareFlags;

use super::lockdown;
use super::plan::{Plan, Step};

/// Installs the sandbox as the command's first `pre_exec` step.
/// `ruleset` is the Landlock ruleset of this spawn, made before the fork (close-on-exec).
pub(crate) fn install(
    command: &mut Command,
    plan: Arc<Plan>,
    cwd: CString,
    ruleset: Option<OwnedFd>,
) {
    #[allow(unsafe_code)]
    // SAFETY: `outer` runs between fork and exec and keeps to async-signal-safe system calls on
    // data prepared before the fork (the plan, the working directory and the ruleset are owned
    // by the closure); it never returns in the intermediate processes (they `_exit`).
    unsafe {
        command.pre_exec(move || outer(&plan, &cwd, ruleset.as_ref()));
    }
}

/// Signals forwarded from outer to init and from init to the agent: every catchable signal
/// except those that report the process's own faults and `SIGCHLD`, which both handle.
fn forwarded(sig: i32) -> bool {
    !matches!(
        sig,
        libc::SIGKILL
            | libc::SIGSTOP
            | libc::SIGCHLD
            | libc::SIGSEGV
            | libc::SIGBUS
            | libc::SIGILL
            | libc::SIGFPE
            | libc::SIGTRAP
            | libc::SIGSYS
    ) && !(32..libc::SIGRTMIN()).contains(&sig)
}

/// The process a received signal is passed on to (0: none yet). Each process of the tree has
/// its own copy.
static FORWARD_TO: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Signals a terminal sends to its whole foreground process group (si_code > 0, SI_KERNEL)
    // reach the agent directly; passing them on would deliver them twice.
    #[allow(unsafe_code)]
    // SAFETY: the kernel hands a valid siginfo to an SA_SIGINFO handler.
    let code = unsafe { (*info).si_code };
    let to = FORWARD_TO.load(Ordering::Relaxed);
    if code <= 0 && to > 0 {
        #[allow(unsafe_code)]
        // SAFETY: kill is async-signal-safe.
        unsafe {
            libc::kill(to, sig);
        }
    }
}

/// Blocks every signal, returning the previous mask.
fn block_all() -> libc::sigset_t {
    #[allow(unsafe_code)]
    // SAFETY: sigset_t is plain data; sigfillset/sigprocmask only write to the sets passed.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_BLOCK, &all, &mut old);
        old
    }
}

fn set_mask(mask: &libc::sigset_t) {
    #[allow(unsafe_code)]
    // SAFETY: restores a mask obtained from sigprocmask.
    unsafe {
        libc::sigprocmask(libc::SIG_SETMASK, mask, std::ptr::null_mut());
    }
}

/// Installs `forward` (or the default action) for every forwarded signal. `SIGCHLD` gets its
/// default action: a caller that ignores it would otherwise have children reaped behind
/// `waitpid`'s back.
fn handlers(install: bool) {
    #[allow(unsafe_code)]
    // SAFETY: resets one disposition; no handler involved.
    unsafe {
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
    }
    for sig in 1..=libc::SIGRTMAX() {
        if !forwarded(sig) {
            continue;
        }
        #[allow(unsafe_code)]
        // SAFETY: a zeroed sigaction is valid; the handler is an extern "C" fn with the
        // SA_SIGINFO signature and only calls async-signal-safe functions.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            if install {
                act.sa_sigaction = forward as *const () as usize;
                act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            } else {
                act.sa_sigaction = libc::SIG_DFL;
            }
            libc::sigfillset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
}

fn fork() -> io::Result<libc::pid_t> {
    #[allow(unsafe_code)]
    // SAFETY: the calling process is itself a fresh child with one thread; the new child keeps
    // to async-signal-safe calls as well.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(pid)
    }
}

fn exit(code: i32) -> ! {
    #[allow(unsafe_code)]
    // SAFETY: _exit ends the process without running any user-space cleanup.
    unsafe {
        libc::_exit(code)
    }
}

/// Closes every descriptor except those in `keep` (ascending): the intermediate processes never
/// exec, so they must not hold the caller's descriptors (std's exec-status pipe, sockets,
/// stdio) open.
fn close_all_but(keep: &[RawFd]) {
    let mut from: u32 = 0;
    let mut ok = true;
    for &k in keep {
        if (k as u32) > from {
            ok &= close_range(from, k as u32 - 1, 0);
        }
        from = k as u32 + 1;
    }
    ok &= close_range(from, u32::MAX, 0);
    if !ok {
        // Before Linux 5.9: one by one, up to the descriptor limit.
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(65536)
            .min(65536) as RawFd;
        for fd in (0..limit).filter(|fd| !keep.contains(fd)) {
            #[allow(unsafe_code)]
            // SAFETY: closes a descriptor that is not used afterwards.
            unsafe {
                libc::close(fd);
            }
        }
    }
}

/// `close_range(first, last, flags)`; false where the kernel lacks it (before Linux 5.9, or
/// 5.11 for `CLOSE_RANGE_CLOEXEC`).
fn close_range(first: u32, last: u32, flags: u32) -> bool {
    #[allow(unsafe_code)]
    // SAFETY: close_range only closes descriptors (or marks them close-on-exec); none closed is
    // used afterwards.
    unsafe {
        libc::syscall(libc::SYS_close_range, first, last, flags) == 0
    }
}

/// `CLOSE_RANGE_CLOEXEC`: mark instead of close.
const CLOSE_RANGE_CLOEXEC: u32 = 4;

/// The write end of a pipe the calling process holds until it dies, close-on-exec, so that
/// nothing it starts keeps it: every sandbox's outer watches the read end and ends the sandbox
/// when it reads end of file. (A parent-death signal fires when the *thread* that forked dies,
/// and a runtime's threads come and go; the process's death is what matters.)
pub(crate) fn lifeline() -> io::Result<RawFd> {
    static LIFELINE: std::sync::OnceLock<(OwnedFd, OwnedFd)> = std::sync::OnceLock::new();
    if let Some((r, _)) = LIFELINE.get() {
        return Ok(r.as_raw_fd());
    }
    let pair = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let (r, _) = LIFELINE.get_or_init(|| pair);
    Ok(r.as_raw_fd())
}

/// Waits for init to end, or for the caller's process to die (its lifeline reads end of file),
/// in which case init is killed, and with it the whole pid namespace.
fn watch_init(init: libc::pid_t, lifeline: RawFd) {
    let Some(pid) = rustix::process::Pid::from_raw(init) else {
        return;
    };
    let Ok(pidfd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) else {
        return;
    };
    #[allow(unsafe_code)]
    // SAFETY: the lifeline's read end stays open in this process until it exits.
    let line = unsafe { std::os::fd::BorrowedFd::borrow_raw(lifeline) };
    loop {
        use rustix::event::{PollFd, PollFlags, poll};
        let mut fds = [
            PollFd::new(&pidfd, PollFlags::IN),
            PollFd::new(&line, PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Ok(_) if !fds[0].revents().is_empty() => return,
            Ok(_) if !fds[1].revents().is_empty() => {
                #[allow(unsafe_code)]
                // SAFETY: kill is async-signal-safe; init is our child, not yet reaped.
                unsafe {
                    libc::kill(init, libc::SIGKILL);
                }
                return;
            }
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => return,
        }
    }
}

fn waitpid(pid: libc::pid_t) -> io::Result<(libc::pid_t, i32)> {
    let mut status = 0;
    loop {
        #[allow(unsafe_code)]
        // SAFETY: waitpid writes the status to a local.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r >= 0 {
            return Ok((r, status));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn write_all(fd: impl AsFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match rustix::io::write(&fd, buf) {
            Ok(n) => buf = &buf[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn write_file(path: &CStr, data: &[u8]) -> io::Result<()> {
    let fd = rustix::fs::open(path, OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())?;
    write_all(&fd, data)
}

/// Reads up to `buf.len()` bytes, stopping early only at end of file.
fn read_full(fd: impl AsFd, buf: &mut [u8]) -> usize {
    let mut got = 0;
    while got < buf.len() {
        match rustix::io::read(&fd, &mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => break,
        }
    }
    got
}

/// Writes "environment-sandbox: sandbox setup failed: <what> (errno N)" to stderr.
fn report(what: &str, errno: i32) {
    let mut num = [0u8; 12];
    let mut i = num.len();
    let mut n = errno.unsigned_abs();
    loop {
        i -= 1;
        num[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 || i == 0 {
            break;
        }
    }
    let stderr = rustix::stdio::stderr();
    let _ = write_all(stderr, b"environment-sandbox: sandbox setup failed: ");
    let _ = write_all(stderr, what.as_bytes());
    let _ = write_all(stderr, b" (errno ");
    let _ = write_all(stderr, &num[i..]);
    let _ = write_all(stderr, b")\n");
}

/// Setup stages that are not mount steps, as reported from init to outer.
const STAGE_BASE: u32 = 1 << 16;
const STAGES: &[&str] = &[
    "make the mounts private",
    "mount the staging tmpfs",
    "enter the staging root (pivot_root)",
    "enter the sandbox root (pivot_root)",
    "set the host name",
    "bring up lo",
];

fn stage_name(plan: &Plan, stage: u32) -> &str {
    if stage >= STAGE_BASE {
        STAGES
            .get((stage - STAGE_BASE) as usize)
            .copied()
            .unwrap_or("setup")
    } else {
        plan.steps.get(stage as usize).map_or("setup", |s| s.what())
    }
}

/// Runs in `outer`, the process std forked. Returns only in the agent.
fn outer(plan: &Plan, cwd: &CStr, ruleset: Option<&OwnedFd>) -> io::Result<()> {
    // outer dies with the caller's process (see `lifeline`), init with outer. The cgroup is
    // joined while this process is still the caller's, so everything the sandbox starts is in it.
    if let Some(procs) = &plan.cgroup {
        write_file(procs, b"0")
            .inspect_err(|e| report("join the sandbox's cgroup", e.raw_os_error().unwrap_or(0)))?;
    }
    let mut flags = UnshareFlags::NEWUSER
        | UnshareFlags::NEWNS
        | UnshareFlags::NEWPID
        | UnshareFlags::NEWUTS
        | UnshareFlags::NEWIPC;
    if !plan.network {
        flags |= UnshareFlags::NEWNET;
    }
    #[allow(unsafe_code)]
    // SAFETY: the process has a single thread, so no other thread can observe the change.
    unsafe { rustix::thread::unshare_unsafe(flags) }.inspect_err(|e| {
        report("unshare the namespaces", e.raw_os_error());
    })?;
    // One uid and gid: root inside is the caller outside. setgroups must be denied before an
    // unprivileged process may write gid_map.
    write_file(c"/proc/self/setgroups", b"deny")
        .and_then(|()| write_file(c"/proc/self/uid_map", plan.uid_map.as_bytes()))
        .and_then(|()| write_file(c"/proc/self/gid_map", plan.gid_map.as_bytes()))
        .inspect_err(|e| report("write the uid/gid maps", e.raw_os_error().unwrap_or(0)))?;

    let (setup_r, setup_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let (status_r, status_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let mask = block_all();
    let init = fork()?;
    if init == 0 {
        drop(setup_r);
        drop(status_r);
        return init_process(plan, cwd, ruleset, setup_w, status_w, &mask);
    }
    drop(setup_w);
    drop(status_w);

    // A record on the setup pipe is a failure; end of file means the agent exec'd (or failed
    // to, which std reports through its own pipe).
    let mut rec = [0u8; 8];
    if read_full(&setup_r, &mut rec) == rec.len() {
        let stage = u32::from_ne_bytes([rec[0], rec[1], rec[2], rec[3]]);
        let errno = i32::from_ne_bytes([rec[4], rec[5], rec[6], rec[7]]);
        report(stage_name(plan, stage), errno);
        let _ = waitpid(init);
        return Err(io::Error::from_raw_os_error(errno));
    }
    FORWARD_TO.store(init, Ordering::Relaxed);
    handlers(true);
    let mut keep = [status_r.as_raw_fd(), plan.lifeline];
    keep.sort_unstable();
    close_all_but(&keep);
    std::mem::forget(setup_r); // already closed by close_all_but
    set_mask(&mask);

    watch_init(init, plan.lifeline);
    let own = waitpid(init).map(|(_, s)| s).unwrap_or(0);
    let mut buf = [0u8; 4];
    let status = if read_full(&status_r, &mut buf) == 4 {
        i32::from_ne_bytes(buf)
    } else {
        own
    };
    mirror(status)
}

/// Ends this process the way the agent ended: the same exit code, or the same signal.
fn mirror(status: i32) -> ! {
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        // No core dump of ours: the agent's is the one that matters.
        let _ =
            rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
        #[allow(unsafe_code)]
        // SAFETY: resets one handler to the default, unblocks the signal and sends it to
        // ourselves; all async-signal-safe.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
        }
        exit(128 + sig);
    }
    exit(if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        1
    })
}

/// Runs in init, pid 1 of the new pid namespace. Returns only in the agent.
fn init_process(
    plan: &Plan,
    cwd: &CStr,
    ruleset: Option<&OwnedFd>,
    setup_w: OwnedFd,
    status_w: OwnedFd,
    mask: &libc::sigset_t,
) -> io::Result<()> {
    // Die with outer. If outer is already gone, nobody reads the setup pipe: stop here.
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    let mut pfd = [rustix::event::PollFd::new(
        &setup_w,
        rustix::event::PollFlags::OUT,
    )];
    if rustix::event::poll(&mut pfd, Some(&rustix::event::Timespec::default())).is_ok()
        && pfd[0].revents().contains(rustix::event::PollFlags::ERR)
    {
        exit(1);
    }
    if let Err((stage, errno)) = build_root(plan) {
        let mut rec = [0u8; 8];
        rec[..4].copy_from_slice(&stage.to_ne_bytes());
        rec[4..].copy_from_slice(&errno.to_ne_bytes());
        let _ = write_all(&setup_w, &rec);
        exit(1);
    }
    handlers(true);
    let agent = match fork() {
        Ok(pid) => pid,
        Err(e) => {
            let mut rec = [0u8; 8];
            rec[..4].copy_from_slice(&(STAGE_BASE + 5).to_ne_bytes());
            rec[4..].copy_from_slice(&e.raw_os_error().unwrap_or(0).to_ne_bytes());
            let _ = write_all(&setup_w, &rec);
            exit(1);
        }
    };
    if agent == 0 {
        drop(status_w);
        handlers(false);
        set_mask(mask);
        rustix::process::chdir(cwd)?;
        for l in &plan.limits {
            let cur = rustix::process::getrlimit(l.resource);
            let cap = |v: Option<u64>| Some(v.map_or(l.value, |hard| hard.min(l.value)));
            let new = rustix::process::Rlimit {
                current: cap(cur.maximum),
                maximum: cap(cur.maximum),
            };
            rustix::process::setrlimit(l.resource, new)?;
        }
        lock_down(plan, ruleset)?;
        drop(setup_w); // close-on-exec as well; the exec closes the last writer
        return Ok(());
    }
    FORWARD_TO.store(agent, Ordering::Relaxed);
    // init keeps no privilege either: it only reaps and forwards signals, and a process that
    // holds none and is not dumpable is no target for the agent (ptrace, /proc/1/mem).
    let _ = lockdown::child::drop_capabilities();
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    close_all_but(&[status_w.as_raw_fd()]);
    std::mem::forget(setup_w); // already closed by close_all_but
    set_mask(mask);
    // Reap everything; when the agent ends, report its status and end the namespace.
    loop {
        match waitpid(-1) {
            Ok((pid, status)) if pid == agent => {
                let _ = write_all(&status_w, &status.to_ne_bytes());
                exit(0);
            }
            Ok(_) => {}
            Err(_) => exit(1),
        }
    }
}

/// The agent's last steps before exec, in the order bubblewrap, nsjail and minijail use (see
/// `lockdown`): no descriptor of the caller's survives the exec but stdio, every capability
/// is dropped, no-new-privs is set, Landlock restricts the filesystem, and the seccomp filter
/// goes on last. A failure names its step on stderr and fails the spawn: the agent never runs
/// with a layer missing that the plan holds.
fn lock_down(plan: &Plan, ruleset: Option<&OwnedFd>) -> io::Result<()> {
    let step = |what: &'static str| {
        move |e: rustix::io::Errno| {
            report(what, e.raw_os_error());
            io::Error::from_raw_os_error(e.raw_os_error())
        }
    };
    // Close-on-exec for every descriptor above stderr: whatever the caller's process had open
    // (a watcher, a database, a socket) is not the agent's. std's own exec-status pipe and the
    // ruleset are close-on-exec already.
    if !close_range(3, u32::MAX, CLOSE_RANGE_CLOEXEC) {
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(65536)
            .min(1 << 20) as RawFd;
        for fd in 3..limit {
            #[allow(unsafe_code)]
            // SAFETY: sets FD_CLOEXEC; a descriptor that is not open fails with EBADF.
            unsafe {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            }
        }
    }
    lockdown::child::drop_capabilities().map_err(step("drop every capability"))?;
    rustix::thread::set_no_new_privs(true).map_err(step("set no_new_privs"))?;
    if let (Some(ll), Some(fd)) = (&plan.landlock, ruleset) {
        lockdown::child::landlock(ll, fd).map_err(step("restrict the filesystem with Landlock"))?;
    }
    lockdown::child::seccomp(&plan.seccomp).map_err(step("install the seccomp filter"))?;
    Ok(())
}

/// Assembles the root and pivots into it. On failure, the stage and errno.
fn build_root(plan: &Plan) -> Result<(), (u32, i32)> {
    let stage = |n: u32| move |e: rustix::io::Errno| (STAGE_BASE + n, e.raw_os_error());
    use rustix::mount::{mount, mount_bind_recursive, mount_change};
    // Nothing we mount may propagate back to the host, and host mounts stop appearing.
    mount_change(
        c"/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(stage(0))?;
    // A tmpfs holds the staging root; the host moves under it at OLD.
    mount(
        c"tmpfs",
        &*plan.staging,
        c"tmpfs",
        MountFlags::empty(),
        c"mode=0755",
    )
    .map_err(stage(1))?;
    let _ = rustix::fs::mkdir(&*plan.new_root, Mode::from_raw_mode(0o755));
    let _ = rustix::fs::mkdir(&*plan.old_root, Mode::from_raw_mode(0o755));
    rustix::process::pivot_root(&*plan.staging, &*plan.old_root).map_err(stage(2))?;
    rustix::process::chdir(c"/").map_err(stage(2))?;

    for (i, step) in plan.steps.iter().enumerate() {
        let fail = |e: rustix::io::Errno| (i as u32, e.raw_os_error());
        match step {
            Step::Mkdir(p) => match rustix::fs::mkdir(&**p, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(fail(e)),
            },
            Step::Touch(p) => {
                if rustix::fs::lstat(&**p).is_err() {
                    rustix::fs::open(
                        &**p,
                        OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC,
                        Mode::from_raw_mode(0o644),
                    )
                    .map_err(fail)?;
                }
            }
            Step::Tmpfs {
                target,
                data,
                readonly,
            } => {
                let mut flags = MountFlags::NOSUID | MountFlags::NODEV;
                if *readonly {
                    flags |= MountFlags::RDONLY;
                }
                match mount(c"tmpfs", &**target, c"tmpfs", flags, &**data) {
                    Ok(()) => {}
                    // A mask whose path is hidden by a fresh mount (e.g. under /tmp): absent.
                    Err(rustix::io::Errno::NOENT) if *readonly => {}
                    Err(e) => return Err(fail(e)),
                }
            }
            Step::Bind {
                source,
                target,
                readonly,
                optional,
            } => {
                match mount_bind_recursive(&**source, &**target) {
                    Ok(()) => {}
                    Err(rustix::io::Errno::NOENT) if *optional || *readonly => continue,
                    Err(e) => return Err(fail(e)),
                }
                if *readonly {
                    read_only(target).map_err(fail)?;
                }
            }
            Step::Overlay { target, data } => {
                mount(
                    c"overlay",
                    &**target,
                    c"overlay",
                    MountFlags::empty(),
                    &**data,
                )
                .map_err(fail)?;
            }
            Step::Proc {
                target,
                host,
                fresh,
            } => {
                let flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
                let done = *fresh && mount(c"proc", &**target, c"proc", flags, None).is_ok();
                if !done {
                    mount_bind_recursive(&**host, &**target).map_err(fail)?;
                }
            }
            Step::Devpts { target } => {
                // Optional: without it, PTYs opened inside fail, nothing else does.
                let _ = mount(
                    c"devpts",
                    &**target,
                    c"devpts",
                    MountFlags::NOSUID | MountFlags::NOEXEC,
                    c"newinstance,ptmxmode=0666,mode=0620",
                );
            }
            Step::Symlink { target, link } => match rustix::fs::symlink(&**target, &**link) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(fail(e)),
            },
        }
    }

    // Into the new root; the old one (host and staging) is stacked on top and detached.
    rustix::process::chdir(c"/newroot").map_err(stage(3))?;
    rustix::process::pivot_root(c".", c".").map_err(stage(3))?;
    rustix::mount::unmount(c".", UnmountFlags::DETACH).map_err(stage(3))?;
    rustix::process::chdir(c"/").map_err(stage(3))?;

    rustix::system::sethostname(&plan.hostname).map_err(stage(4))?;
    if !plan.network {
        loopback_up().map_err(stage(5))?;
    }
    Ok(())
}

/// Every mount at and under `path` read-only (`mount_setattr`, Linux 5.12): a remount would
/// have to repeat each submount's locked flags.
pub(crate) fn read_only(path: &CStr) -> Result<(), rustix::io::Errno> {
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    #[allow(unsafe_code)]
    // SAFETY: the path is a valid C string and the attribute struct lives across the call;
    // the size passed is its size.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            (libc::AT_RECURSIVE | libc::AT_SYMLINK_NOFOLLOW) as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        Err(
            rustix::io::Errno::from_io_error(&io::Error::last_os_error())
                .unwrap_or(rustix::io::Errno::INVAL),
        )
    } else {
        Ok(())
    }
}

/// `ip link set lo up` in the new network namespace.
fn loopback_up() -> Result<(), rustix::io::Errno> {
    let err = || {
        rustix::io::Errno::from_io_error(&io::Error::last_os_error())
            .unwrap_or(rustix::io::Errno::INVAL)
    };
    #[allow(unsafe_code)]
    // SAFETY: a datagram socket for the interface ioctls; ifreq is plain data, zeroed and then
    // filled with the name "lo"; the socket is closed before returning.
    unsafe {
        let sock = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if sock < 0 {
            return Err(err());
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        req.ifr_name[0] = b'l' as libc::c_char;
        req.ifr_name[1] = b'o' as libc::c_char;
        let mut r = libc::ioctl(sock, libc::SIOCGIFFLAGS, &mut req);
        if r == 0 {
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            r = libc::ioctl(sock, libc::SIOCSIFFLAGS, &req);
        }
        let e = if r < 0 { Some(err()) } else { None };
        libc::close(sock);
        e.map_or(Ok(()), Err)
    }
}
