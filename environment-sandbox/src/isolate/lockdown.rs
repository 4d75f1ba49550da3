//! The layers that leave the agent no privilege, applied in the agent process after the mounts
//! and before its program's first instruction, in the order bubblewrap, nsjail and minijail
//! use: every capability dropped from every set, `PR_SET_NO_NEW_PRIVS`, Landlock, then the
//! seccomp filter, then exec.
//!
//! The mounts alone do not hold: they are mounts of a namespace the agent's user namespace owns,
//! so with a capability it could unmount a mask or remount `/` writable. Without capabilities it
//! cannot, the seccomp filter refuses the calls outright, and Landlock confines writes by the
//! files' identity rather than by mounts.
//!
//! What is prepared here runs before the fork (it allocates): the seccomp programs are compiled
//! by `seccompiler` and the Landlock ruleset is created by the `landlock` crate, which negotiates
//! the access rights with the running kernel. Between fork and exec the child only adds its
//! rules (paths inside the new root, which do not exist before it) and restricts itself, with
//! raw system calls on this prepared data.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};

use landlock::{ABI, Access, AccessFs, Ruleset, RulesetAttr, Scope};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::error::{Result, SandboxError};

/// A system call the filter refuses, and why.
#[derive(Clone, Copy, Debug)]
pub struct Denied {
    /// Its number on this architecture.
    pub nr: i64,
    /// Its name.
    pub name: &'static str,
    /// Why it is refused.
    pub why: &'static str,
}

const fn denied(nr: i64, name: &'static str, why: &'static str) -> Denied {
    Denied { nr, name, why }
}

/// The system calls refused with `EPERM` (so programs degrade instead of crashing), and why.
/// An agent holds no capability, so the kernel refuses most of them already; the filter is the
/// second wall, and the one that holds if a capability ever leaks. Beyond this list:
/// - `clone` with any namespace flag: `EPERM`;
/// - `clone3`: `ENOSYS`, because its flags are in memory the filter cannot read; the C library
///   then falls back to `clone`, whose flags it can;
/// - `ioctl` `TIOCSTI` and `TIOCLINUX`: they push keystrokes into a terminal, which may be the
///   one of the person who started the agent;
/// - on x86-64, the x32 system call numbers: `ENOSYS`, so no call is reachable under a second
///   number the rules do not name; any other architecture's calls end the process.
///
/// `ptrace` is allowed, so debuggers and `strace` work inside: the pid namespace hides every
/// process outside, the sandbox's init holds no capability and is not dumpable, and Landlock
/// refuses to trace a process outside the agent's domain.
pub const DENIED: &[Denied] = &[
    // The mounts are what the sandbox's view is made of: none may be changed, moved, stacked
    // or looked beneath.
    denied(
        libc::SYS_mount,
        "mount",
        "could unmount a mask or remount the read-only host writable",
    ),
    denied(
        libc::SYS_umount2,
        "umount2",
        "could uncover what a mask or a bind hides",
    ),
    denied(
        libc::SYS_mount_setattr,
        "mount_setattr",
        "could clear the read-only flag of a mount",
    ),
    denied(
        libc::SYS_move_mount,
        "move_mount",
        "the new mount API: could attach or move mounts",
    ),
    denied(
        libc::SYS_open_tree,
        "open_tree",
        "could clone a mount tree and attach it elsewhere",
    ),
    denied(
        libc::SYS_fsopen,
        "fsopen",
        "the new mount API: could make a fresh filesystem",
    ),
    denied(
        libc::SYS_fsmount,
        "fsmount",
        "the new mount API: could make a mount from a filesystem context",
    ),
    denied(
        libc::SYS_fsconfig,
        "fsconfig",
        "the new mount API: configures what fsopen made",
    ),
    denied(
        libc::SYS_fspick,
        "fspick",
        "the new mount API: could reconfigure an existing mount",
    ),
    denied(
        libc::SYS_pivot_root,
        "pivot_root",
        "could change the root the sandbox pivoted into",
    ),
    denied(
        libc::SYS_chroot,
        "chroot",
        "could change the root (and, with a descriptor kept, leave it)",
    ),
    // A new namespace gives its creator every capability inside it again.
    denied(
        libc::SYS_unshare,
        "unshare",
        "a new user namespace would hand the agent capabilities again",
    ),
    denied(
        libc::SYS_setns,
        "setns",
        "could enter another namespace through a descriptor",
    ),
    // Kernel interfaces with a long record of privilege escalations, unused by ordinary work.
    denied(
        libc::SYS_keyctl,
        "keyctl",
        "the kernel keyring is not namespaced; a shared secret store",
    ),
    denied(
        libc::SYS_add_key,
        "add_key",
        "the kernel keyring (as keyctl)",
    ),
    denied(
        libc::SYS_request_key,
        "request_key",
        "the kernel keyring (as keyctl)",
    ),
    denied(libc::SYS_bpf, "bpf", "loads programs into the kernel"),
    denied(
        libc::SYS_perf_event_open,
        "perf_event_open",
        "kernel profiling: a side channel and a frequent escalation vector",
    ),
    denied(
        libc::SYS_userfaultfd,
        "userfaultfd",
        "used to win kernel races in exploits",
    ),
    // Kernel administration, as Docker's default profile denies it.
    denied(
        libc::SYS_acct,
        "acct",
        "process accounting for the whole system",
    ),
    denied(
        libc::SYS_clock_adjtime,
        "clock_adjtime",
        "the system clock is not namespaced",
    ),
    denied(
        libc::SYS_clock_settime,
        "clock_settime",
        "the system clock is not namespaced",
    ),
    denied(
        libc::SYS_settimeofday,
        "settimeofday",
        "the system clock is not namespaced",
    ),
    denied(libc::SYS_init_module, "init_module", "loads kernel modules"),
    denied(
        libc::SYS_finit_module,
        "finit_module",
        "loads kernel modules",
    ),
    denied(
        libc::SYS_delete_module,
        "delete_module",
        "unloads kernel modules",
    ),
    denied(
        libc::SYS_kexec_load,
        "kexec_load",
        "replaces the running kernel",
    ),
    denied(
        libc::SYS_kexec_file_load,
        "kexec_file_load",
        "replaces the running kernel",
    ),
    denied(
        libc::SYS_reboot,
        "reboot",
        "reboots the machine (or the pid namespace)",
    ),
    denied(libc::SYS_swapon, "swapon", "changes the system's swap"),
    denied(libc::SYS_swapoff, "swapoff", "changes the system's swap"),
    denied(libc::SYS_quotactl, "quotactl", "changes disk quotas"),
    denied(
        libc::SYS_syslog,
        "syslog",
        "reads and clears the kernel log",
    ),
    denied(
        libc::SYS_lookup_dcookie,
        "lookup_dcookie",
        "kernel profiling interface",
    ),
    denied(
        libc::SYS_name_to_handle_at,
        "name_to_handle_at",
        "with open_by_handle_at, reaches files outside any mount",
    ),
    denied(
        libc::SYS_open_by_handle_at,
        "open_by_handle_at",
        "opens a file by handle, around every mount (the shocker escape)",
    ),
    denied(
        libc::SYS_kcmp,
        "kcmp",
        "compares kernel objects of other processes",
    ),
    denied(
        libc::SYS_process_vm_readv,
        "process_vm_readv",
        "reads another process's memory",
    ),
    denied(
        libc::SYS_process_vm_writev,
        "process_vm_writev",
        "writes another process's memory",
    ),
    #[cfg(target_arch = "x86_64")]
    denied(libc::SYS_ioperm, "ioperm", "direct I/O port access"),
    #[cfg(target_arch = "x86_64")]
    denied(libc::SYS_iopl, "iopl", "direct I/O port access"),
    #[cfg(target_arch = "x86_64")]
    denied(libc::SYS_sysfs, "sysfs", "obsolete, unused"),
    #[cfg(target_arch = "x86_64")]
    denied(libc::SYS_uselib, "uselib", "obsolete, unused"),
    #[cfg(target_arch = "x86_64")]
    denied(libc::SYS_ustat, "ustat", "obsolete, unused"),
    #[cfg(target_arch = "x86_64")]
    denied(libc::SYS__sysctl, "_sysctl", "obsolete, unused"),
    #[cfg(target_arch = "x86_64")]
    denied(libc::SYS_nfsservctl, "nfsservctl", "obsolete, unused"),
];

/// The `clone` flags refused, each one a new namespace (see `unshare` above).
const NAMESPACE_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWCGROUP as u64,
    0x80, // CLONE_NEWTIME
];

fn seccomp_error(e: impl std::fmt::Display) -> SandboxError {
    SandboxError::InvalidSpec {
        detail: format!("the seccomp filter cannot be built: {e}"),
    }
}

fn filter(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> Result<BpfProgram> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(seccomp_error)?;
    let f = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch,
    )
    .map_err(seccomp_error)?;
    f.try_into().map_err(seccomp_error)
}

fn flag_rule(arg: u8, mask: u64, value: u64) -> Result<SeccompRule> {
    let c = SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(mask),
        value,
    )
    .map_err(seccomp_error)?;
    SeccompRule::new(vec![c]).map_err(seccomp_error)
}

/// The seccomp programs, installed in order (the kernel runs every one and the strictest
/// answer wins): [`DENIED`] and the rules said there.
pub(crate) fn seccomp_programs() -> Result<Vec<BpfProgram>> {
    let mut eperm: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for d in DENIED {
        eperm.insert(d.nr, Vec::new());
    }
    eperm.insert(
        libc::SYS_clone,
        NAMESPACE_FLAGS
            .iter()
            .map(|f| flag_rule(0, *f, *f))
            .collect::<Result<_>>()?,
    );
    eperm.insert(
        libc::SYS_ioctl,
        [libc::TIOCSTI, libc::TIOCLINUX]
            .iter()
            .map(|r| flag_rule(1, 0xffff_ffff, *r))
            .collect::<Result<_>>()?,
    );
    let mut enosys: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    enosys.insert(libc::SYS_clone3, Vec::new());
    let mut programs = vec![filter(eperm, libc::EPERM)?, filter(enosys, libc::ENOSYS)?];
    #[cfg(target_arch = "x86_64")]
    programs.push(x32_guard());
    Ok(programs)
}

/// The seccomp programs as the kernel takes them (arrays of `struct sock_filter`, native byte
/// order), for a tool that takes a compiled filter, such as bubblewrap's `--add-seccomp-fd`.
pub fn compiled_filters() -> Result<Vec<Vec<u8>>> {
    Ok(seccomp_programs()?
        .iter()
        .map(|p| {
            p.iter()
                .flat_map(|i| {
                    let mut b = Vec::with_capacity(8);
                    b.extend_from_slice(&i.code.to_ne_bytes());
                    b.push(i.jt);
                    b.push(i.jf);
                    b.extend_from_slice(&i.k.to_ne_bytes());
                    b
                })
                .collect()
        })
        .collect())
}

/// x86-64 only: system call numbers with the x32 bit set answer `ENOSYS`. The rules above
/// name calls by their 64-bit numbers; on a kernel built with x32 support the same call is
/// reachable under a second number. (The arch check of the other programs kills any process
/// that makes a call under another architecture, such as i386's `int 0x80`.)
#[cfg(target_arch = "x86_64")]
fn x32_guard() -> BpfProgram {
    use seccompiler::sock_filter;
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JMP_JEQ_K: u16 = 0x05 | 0x10;
    const JMP_JGE_K: u16 = 0x05 | 0x30;
    const RET_K: u16 = 0x06;
    const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
    const X32_BIT: u32 = 0x4000_0000;
    let ins = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        ins(LD_W_ABS, 0, 0, 4), // seccomp_data.arch
        ins(JMP_JEQ_K, 0, 3, AUDIT_ARCH_X86_64),
        ins(LD_W_ABS, 0, 0, 0), // seccomp_data.nr
        ins(JMP_JGE_K, 0, 1, X32_BIT),
        ins(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        ins(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}

/// The Landlock ABI the running kernel offers (0: none).
pub(crate) fn landlock_abi() -> i32 {
    #[allow(unsafe_code)]
    // SAFETY: LANDLOCK_CREATE_RULESET_VERSION takes no attribute and returns the ABI version.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    i32::try_from(v).unwrap_or(0).max(0)
}

/// Whether the kernel runs seccomp filters that answer with an errno.
pub(crate) fn seccomp_available() -> bool {
    let action: u32 = libc::SECCOMP_RET_ERRNO;
    #[allow(unsafe_code)]
    // SAFETY: SECCOMP_GET_ACTION_AVAIL reads one u32 from the pointer given.
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            2u32, // SECCOMP_GET_ACTION_AVAIL
            0u32,
            &action as *const u32,
        )
    };
    r == 0
}

/// What the child grants through Landlock, by paths inside the sandbox.
#[derive(Debug)]
pub(crate) struct LandlockPlan {
    /// Every right the ruleset handles (denied unless granted below).
    pub handled: u64,
    /// Read and execute: granted on `/`.
    pub read: u64,
    /// The rights a rule on a regular file may grant (no directory right).
    pub file: u64,
    /// The paths granted every handled right (the writable set), in order; missing ones are
    /// skipped.
    pub writable: Vec<CString>,
    /// The ABI in force.
    pub abi: i32,
}

impl LandlockPlan {
    /// The plan for a kernel offering Landlock ABI `abi`, or `None` when it offers none.
    pub(crate) fn new(abi_num: i32, writable: Vec<CString>) -> Option<LandlockPlan> {
        if abi_num <= 0 {
            return None;
        }
        let abi = ABI::from(abi_num);
        Some(LandlockPlan {
            handled: AccessFs::from_all(abi).bits(),
            read: AccessFs::from_read(abi).bits(),
            file: AccessFs::from_file(abi).bits(),
            writable,
            abi: abi_num,
        })
    }

    /// A fresh ruleset handling every right and scope this kernel knows (one per spawn: the
    /// child adds the rules of its own new root to it).
    pub(crate) fn ruleset(&self) -> Result<Option<OwnedFd>> {
        let abi = ABI::from(self.abi);
        let err = |e: landlock::RulesetError| SandboxError::InvalidSpec {
            detail: format!("the Landlock ruleset cannot be made: {e}"),
        };
        let created = Ruleset::default()
            .handle_access(AccessFs::from_all(abi))
            .map_err(err)?
            .scope(Scope::from_all(abi))
            .map_err(err)?
            .create()
            .map_err(err)?;
        Ok(created.into())
    }
}

/// Child side, between fork and exec: no allocation, no locks, system calls only.
pub(crate) mod child {
    use super::*;
    use rustix::fs::{FileType, Mode, OFlags};

    /// Drops every capability from every set, for good: the securebits that would let uid 0
    /// regain them at exec are locked first (while the agent may still set them), then the
    /// bounding set, the ambient set, and the effective, permitted and inheritable sets.
    pub(crate) fn drop_capabilities() -> std::result::Result<(), rustix::io::Errno> {
        use rustix::thread::CapabilitiesSecureBits as B;
        rustix::thread::set_capabilities_secure_bits(
            B::NO_ROOT
                | B::NO_ROOT_LOCKED
                | B::NO_SETUID_FIXUP
                | B::NO_SETUID_FIXUP_LOCKED
                | B::KEEP_CAPS_LOCKED
                | B::NO_CAP_AMBIENT_RAISE
                | B::NO_CAP_AMBIENT_RAISE_LOCKED,
        )?;
        for cap in 0..64 {
            #[allow(unsafe_code)]
            // SAFETY: PR_CAPBSET_DROP takes a capability number; EINVAL past the last one.
            let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
            if r != 0 {
                let e = errno();
                if e == rustix::io::Errno::INVAL {
                    break;
                }
                return Err(e);
            }
        }
        rustix::thread::clear_ambient_capability_set()?;
        let none = rustix::thread::CapabilitySet::empty();
        rustix::thread::set_capabilities(
            None,
            rustix::thread::CapabilitySets {
                effective: none,
                permitted: none,
                inheritable: none,
            },
        )?;
        Ok(())
    }

    #[repr(C, packed)]
    struct PathBeneath {
        allowed_access: u64,
        parent_fd: i32,
    }

    fn errno() -> rustix::io::Errno {
        rustix::io::Errno::from_raw_os_error(
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        )
    }

    fn add_rule(
        ruleset: &OwnedFd,
        path: &std::ffi::CStr,
        access: u64,
        file: u64,
    ) -> std::result::Result<(), rustix::io::Errno> {
        let fd = match rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(()),
            Err(e) => return Err(e),
        };
        let is_dir = rustix::fs::fstat(&fd)
            .map(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
            .unwrap_or(false);
        let rule = PathBeneath {
            allowed_access: if is_dir { access } else { access & file },
            parent_fd: fd.as_raw_fd(),
        };
        #[allow(unsafe_code)]
        // SAFETY: LANDLOCK_RULE_PATH_BENEATH (1) reads a landlock_path_beneath_attr, which
        // `rule` is, laid out as the kernel's packed struct.
        let r = unsafe {
            libc::syscall(
                libc::SYS_landlock_add_rule,
                ruleset.as_raw_fd(),
                1u32,
                &rule as *const PathBeneath,
                0u32,
            )
        };
        if r != 0 { Err(errno()) } else { Ok(()) }
    }

    /// Adds the plan's rules (read everywhere, every right in the writable set) to `ruleset`
    /// and restricts this process and everything it starts. No-new-privs must be set.
    pub(crate) fn landlock(
        plan: &LandlockPlan,
        ruleset: &OwnedFd,
    ) -> std::result::Result<(), rustix::io::Errno> {
        add_rule(ruleset, c"/", plan.read, plan.file)?;
        for p in &plan.writable {
            add_rule(ruleset, p, plan.handled, plan.file)?;
        }
        #[allow(unsafe_code)]
        // SAFETY: landlock_restrict_self takes a ruleset descriptor and flags (none).
        let r =
            unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32) };
        if r != 0 { Err(errno()) } else { Ok(()) }
    }

    /// Installs the seccomp programs in order.
    pub(crate) fn seccomp(programs: &[BpfProgram]) -> std::result::Result<(), rustix::io::Errno> {
        for p in programs {
            seccompiler::apply_filter(p).map_err(|e| match e {
                seccompiler::Error::Seccomp(io) | seccompiler::Error::Prctl(io) => {
                    rustix::io::Errno::from_raw_os_error(io.raw_os_error().unwrap_or(0))
                }
                _ => rustix::io::Errno::INVAL,
            })?;
        }
        Ok(())
    }
}
