//! `envctl init`: make a directory an environment and capture what is in it.

use std::path::{Path, PathBuf};

use environment_core::{ActorId, MAIN};
use serde_json::json;

use crate::failure::{ExitCode, Failure, Outcome};
use crate::output::print_json;
use crate::progress::Progress;
use crate::stores::Stores;
use crate::workspace::{MARKER, ROOTFS_DIR, Session, Workspace};

/// Creates the environment of `dir` (default: the current directory).
pub fn run(
    dir: Option<PathBuf>,
    rootfs: Option<&Path>,
    home: Option<&Path>,
    stores: &Stores,
    actor: ActorId,
    json: bool,
) -> Outcome<()> {
    // A shared store named badly is refused before anything is made.
    stores.check()?;
    let dir = match dir {
        Some(d) => d,
        None => std::env::current_dir()
            .map_err(|e| Failure::io("read the current directory", Path::new("."), e))?,
    };
    if let Some(r) = rootfs
        && !r.exists()
    {
        return Err(Failure::not_found(format!(
            "the rootfs source {} does not exist",
            r.display()
        ))
        .hint("pass a directory or a .tar file"));
    }
    if Workspace::at(&dir)?.is_some() {
        return Err(Failure::new(
            ExitCode::Conflict,
            format!("{} is an environment already", dir.display()),
        )
        .hint("use it as it is; `envctl status` shows it"));
    }
    std::fs::create_dir_all(&dir).map_err(|e| Failure::io("create", &dir, e))?;
    let dir = dir
        .canonicalize()
        .map_err(|e| Failure::io("resolve", &dir, e))?;
    let marker = dir.join(MARKER);
    // What a home given with --home held before: a failed init leaves exactly that.
    let kept: Option<Vec<std::ffi::OsString>> = home.filter(|h| h.exists()).map(|h| {
        std::fs::read_dir(h)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name())
            .collect()
    });
    let home = match home {
        None => {
            std::fs::create_dir(&marker).map_err(|e| Failure::io("create", &marker, e))?;
            marker.clone()
        }
        Some(h) => {
            std::fs::create_dir_all(h).map_err(|e| Failure::io("create", h, e))?;
            let h = h.canonicalize().map_err(|e| Failure::io("resolve", h, e))?;
            std::fs::write(&marker, format!("{}\n", h.display()))
                .map_err(|e| Failure::io("write", &marker, e))?;
            h
        }
    };
    let ws = Workspace {
        dir,
        home,
        credentials: Default::default(),
    };
    // The rootfs first, so that the first capture takes it too; an init that fails takes back
    // what it made, so that nothing half-made is left for `status` to accept and a second
    // `init` to refuse.
    let made = (|| -> Outcome<_> {
        if *stores != Stores::default() {
            stores.write(&ws.home)?;
            // Reached now, so that an environment whose shared stores cannot be reached is not
            // made.
            stores.open_queue()?;
            stores.open_policy()?;
            stores.open_effects()?;
        }
        let rootfs_at = match rootfs {
            Some(src) => Some(seed_rootfs(src, &ws.home.join(ROOTFS_DIR))?),
            None => None,
        };
        Ok((Session::open(ws.clone(), actor)?, rootfs_at))
    })();
    let (session, rootfs_at) = match made {
        Ok(m) => m,
        Err(f) => {
            take_back(&ws.home, &marker, kept.as_deref());
            return Err(f);
        }
    };
    let head = session.head()?;
    let files = session.env.op(&head)?.summary.total();
    if json {
        print_json(&json!({
            "dir": ws.dir.display().to_string(),
            "home": ws.home.display().to_string(),
            "branch": MAIN,
            "version": head.to_string(),
            "captured": files,
            "rootfs": rootfs_at.map(|p| p.display().to_string()),
            "shared_queue": stores.queue.is_some(),
            "shared_policy": stores.policy.is_some(),
            "shared_effects": stores.effects.is_some(),
        }));
    } else {
        println!(
            "Initialized an environment in {} (home {}): {files} path(s) captured at {}.",
            ws.dir.display(),
            ws.home.display(),
            head.short()
        );
        if let Some(r) = rootfs_at {
            println!("Managed rootfs seeded at {}.", r.display());
        }
        if stores.queue.is_some() {
            println!("The queue is shared through PostgreSQL (see stores.toml in the home).");
        }
        if stores.policy.is_some() {
            println!("The policy is shared through PostgreSQL (see stores.toml in the home).");
        }
        if stores.effects.is_some() {
            println!("The effect log is shared through PostgreSQL (see stores.toml in the home).");
        }
    }
    Ok(())
}

/// Removes what a failed `init` made: the marker, and the home, or, if the home was there
/// before, what init put in it (`kept` names what was there).
fn take_back(home: &Path, marker: &Path, kept: Option<&[std::ffi::OsString]>) {
    match kept {
        None => {
            let _ = std::fs::remove_dir_all(home);
        }
        Some(kept) => {
            for entry in std::fs::read_dir(home).into_iter().flatten().flatten() {
                if !kept.contains(&entry.file_name()) {
                    let p = entry.path();
                    let _ = std::fs::remove_dir_all(&p).or_else(|_| std::fs::remove_file(&p));
                }
            }
        }
    }
    let _ = std::fs::remove_file(marker).or_else(|_| std::fs::remove_dir_all(marker));
}

/// Copies a directory tree, or unpacks a tar file, into `dest`.
fn seed_rootfs(src: &Path, dest: &Path) -> Outcome<PathBuf> {
    use environment_sandbox::Rootfs;
    let progress = Progress::spinner("seeding the rootfs");
    let result = if src.is_dir() {
        Rootfs::seed_from_dir(src, dest)
    } else {
        Rootfs::seed_from_tar(src, dest)
    };
    progress.finish();
    result?;
    Ok(dest.to_owned())
}
