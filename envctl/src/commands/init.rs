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
    let (ws, marker, kept) = make_home(&dir, home)?;
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
        if stores.shares_history() {
            let session = Session::open_stores(ws.clone(), actor.clone())?;
            let env = &session.env;
            // Another machine's environment: this tree would be recorded over it.
            if env.branches()?.len() > 1 || env.head(MAIN)? != env.first_version()? {
                return Err(Failure::new(
                    ExitCode::Conflict,
                    "the shared log holds an environment already",
                )
                .hint("attach a working copy of it with `envctl attach --stores FILE DIR`"));
            }
            // An init on another machine at the same moment: this tree's files are rebased
            // onto its, never recorded as deleting them.
            let config = session.tracker_config(environment_core::witness(), false);
            environment_sandbox::Tracker::begin_copy(env, &config)?;
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
            "shared_effects": stores.effects_at().is_some(),
            "shared_log": stores.log.is_some(),
            "shared_blobs": stores.blobs.is_some(),
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
        for (part, name) in [
            (stores.queue.is_some(), "queue"),
            (stores.policy.is_some(), "policy"),
            (stores.effects_at().is_some(), "effect log"),
            (stores.log.is_some(), "history (operations and branches)"),
        ] {
            if part {
                println!("The {name} is shared through PostgreSQL (see stores.toml in the home).");
            }
        }
        if stores.blobs.is_some() {
            println!(
                "The file contents are shared through the bucket (see stores.toml in the home)."
            );
        }
    }
    Ok(())
}

/// Makes `dir` a new working copy of the environment whose shared stores `stores_file` names.
pub fn attach(
    stores_file: &Path,
    dir: &Path,
    home: Option<&Path>,
    actor: ActorId,
    json: bool,
) -> Outcome<()> {
    let stores = Stores::parse(stores_file)?;
    if !stores.shares_history() {
        return Err(Failure::usage(format!(
            "{} names no shared log: there is no environment to attach to",
            stores_file.display()
        ))
        .hint("use the stores.toml of an environment made with `envctl init --shared-log --shared-blobs`"));
    }
    if Workspace::at(dir)?.is_some() {
        return Err(Failure::new(
            ExitCode::Conflict,
            format!("{} is an environment already", dir.display()),
        )
        .hint("attach to an empty or new directory"));
    }
    if std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some()) {
        return Err(Failure::new(
            ExitCode::Conflict,
            format!("{} is not empty", dir.display()),
        )
        .hint("attach to an empty or new directory: what is in it would be recorded over the environment"));
    }
    let existed = dir.exists();
    let (ws, marker, kept) = make_home(dir, home)?;
    let attached = (|| -> Outcome<_> {
        stores.write(&ws.home)?;
        let session = Session::open_stores(ws.clone(), actor)?;
        let progress = Progress::spinner("writing the head into the working copy");
        let mut config = session.tracker_config(environment_core::witness(), false);
        config.auto = false;
        let tracker = environment_sandbox::Tracker::attach(session.env.clone(), config);
        progress.finish();
        let version = tracker?.holds()?;
        Ok((session, version))
    })();
    let (session, version) = match attached {
        Ok(a) => a,
        Err(f) => {
            take_back(&ws.home, &marker, kept.as_deref());
            // The directory was empty or missing: what the attach wrote into it goes too.
            if existed {
                for entry in std::fs::read_dir(&ws.dir).into_iter().flatten().flatten() {
                    let p = entry.path();
                    let _ = std::fs::remove_dir_all(&p).or_else(|_| std::fs::remove_file(&p));
                }
            } else {
                let _ = std::fs::remove_dir_all(&ws.dir);
            }
            return Err(f);
        }
    };
    let files = session
        .env
        .list(
            &session.actor,
            &environment_core::KeyPrefix::all(environment_core::Namespace::Fs),
            &version,
        )?
        .len();
    if json {
        print_json(&json!({
            "dir": ws.dir.display().to_string(),
            "home": ws.home.display().to_string(),
            "branch": MAIN,
            "version": version.to_string(),
            "written": files,
        }));
    } else {
        println!(
            "Attached a working copy in {} (home {}): {files} path(s) written at {}.",
            ws.dir.display(),
            ws.home.display(),
            version.short()
        );
    }
    Ok(())
}

/// Makes the home of a new workspace in `dir` (made if missing): `DIR/.environment`, or
/// `home` named by the marker file. Returns the workspace, the marker, and what a home given
/// with --home held before (a failed command leaves exactly that).
fn make_home(
    dir: &Path,
    home: Option<&Path>,
) -> Outcome<(Workspace, PathBuf, Option<Vec<std::ffi::OsString>>)> {
    std::fs::create_dir_all(dir).map_err(|e| Failure::io("create", dir, e))?;
    let dir = dir
        .canonicalize()
        .map_err(|e| Failure::io("resolve", dir, e))?;
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
    Ok((ws, marker, kept))
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
