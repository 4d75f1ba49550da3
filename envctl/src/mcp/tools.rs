//! The tools: each one action of the server's actor, answered in text for a model.

use std::time::Duration;

use environment_core::{
    Action, EntryKind, HistoryOptions, Intent, IntentKind, Key, KeyPrefix, MAIN, Namespace,
    Resource,
};
use environment_sandbox::RestoreStep;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData, tool, tool_router};
use serde_json::json;

use super::params::*;
use super::{EnvServer, truncated};
use crate::commands::{policy as policy_cmd, process, queue};
use crate::failure::{Failure, Outcome};
use crate::output::{change_json, change_letter};
use crate::workspace::Session;

/// A resource as the policy tools name it (`path:GLOB`, `topic:T`, `program:PROG ARGS…`,
/// `environment`, a bare path) in the shape of the control socket's `resource` parameter.
fn resource_param(text: &str) -> serde_json::Value {
    if text == "environment" {
        return json!({ "environment": true });
    }
    match text.split_once(':') {
        Some(("program", rest)) => {
            let mut words = rest.split_whitespace().map(str::to_owned);
            let program = words.next().unwrap_or_default();
            json!({ "program": program, "args": words.collect::<Vec<_>>() })
        }
        Some((kind, rest))
            if [
                "path", "prefix", "object", "branch", "topic", "service", "secret",
            ]
            .contains(&kind) =>
        {
            json!({ kind: rest })
        }
        _ => json!({ "path": text }),
    }
}

fn version_or_head(s: &Session, v: Option<&str>) -> Outcome<environment_core::OpId> {
    Ok(s.env.resolve(v.unwrap_or("HEAD"))?)
}

fn pretty(v: &serde_json::Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

fn fs_key(path: &str) -> Outcome<Key> {
    Key::fs(path.trim_start_matches("./")).map_err(|e| {
        Failure::usage(format!("{path:?} is not a workspace path: {e}")).hint(
            "use a path relative to the workspace, without `..`, a leading `/` or empty segments",
        )
    })
}

fn restore_text(
    s: &Session,
    target: environment_core::OpId,
    intent: Intent,
    dry_run: bool,
) -> Outcome<String> {
    if dry_run {
        s.precheck(Action::Read, Resource::Branch(MAIN.into()), "restore")?;
    } else {
        s.precheck(Action::Write, Resource::Branch(MAIN.into()), "restore")?;
    }
    let t = s.tracker()?;
    let plan = if dry_run {
        t.plan_restore(&target)?
    } else {
        t.restore(&s.actor, &target, intent)?
    };
    let mut lines = Vec::new();
    for step in &plan.steps {
        match step {
            RestoreStep::Write(k) => lines.push(format!("write  {}", k.display_path())),
            RestoreStep::Remove(k) => lines.push(format!("remove {}", k.display_path())),
        }
    }
    let head = if dry_run {
        format!(
            "Dry run: restoring {} would change {} path(s); nothing was changed.",
            target.short(),
            plan.steps.len()
        )
    } else {
        format!(
            "Restored the workspace to {} ({} path(s) changed); the new head is {}.",
            target.short(),
            plan.steps.len(),
            s.head()?.short()
        )
    };
    Ok(format!("{head}\n{}", lines.join("\n")))
}

#[tool_router(vis = "pub(super)")]
impl EnvServer {
    /// The history.
    #[tool(
        description = "Read the history of the workspace, newest first: who changed what and why; automatic captures are squashed unless all=true.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn history(
        &self,
        Parameters(p): Parameters<HistoryParams>,
    ) -> Result<CallToolResult, ErrorData> {
        self.routed("history", "history", json!({"all": p.all, "branch": p.branch, "limit": p.limit.unwrap_or(30).clamp(1, 1000)}), move |s| {
            let branch = p.branch.unwrap_or_else(|| MAIN.to_owned());
            let opts = HistoryOptions {
                all: p.all,
                limit: p.limit.unwrap_or(30),
            };
            let entries = s.env.history(&s.actor, &branch, &opts)?;
            Ok(entries
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n"))
        })
        .await
    }

    /// The refused changes.
    #[tool(
        description = "List the changes refused on the workspace, newest first: what a command or an agent changed that its actor may not change, put back to its state before and kept with the decision (the path, write or delete, who, why).",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn refused(
        &self,
        Parameters(p): Parameters<RefusedParams>,
    ) -> Result<CallToolResult, ErrorData> {
        let limit = p.limit.unwrap_or(30).clamp(1, 1000);
        self.routed("refused", "refused", json!({"limit": limit}), move |s| {
            let refused = s.env.refused(&s.actor, MAIN, limit)?;
            let listed: Vec<_> = refused.iter().map(|r| r.to_json()).collect();
            Ok(super::refused_text(&listed))
        })
        .await
    }

    /// One operation.
    #[tool(
        description = "Show one operation of the history (by op id prefix, mark, branch or HEAD~N): actor, intent, flags and the paths it changed.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn show(
        &self,
        Parameters(p): Parameters<VersionParams>,
    ) -> Result<CallToolResult, ErrorData> {
        self.routed("show", "show", json!({"version": p.version}), move |s| {
            let id = s.env.resolve(&p.version)?;
            let shown = s.env.show(&s.actor, &id)?;
            let mut j = shown.op.to_json();
            j["marks"] = json!(shown.marks);
            if let Some(changes) = &shown.changes {
                j["changes"] = json!(changes.iter().map(change_json).collect::<Vec<_>>());
            }
            Ok(pretty(&j))
        })
        .await
    }

    /// A diff.
    #[tool(
        description = "List the paths that differ between two versions (A added, M modified, D deleted).",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn diff(
        &self,
        Parameters(p): Parameters<DiffParams>,
    ) -> Result<CallToolResult, ErrorData> {
        self.routed(
            "diff",
            "diff",
            json!({"from": p.from, "to": p.to}),
            move |s| {
                let a = s.env.resolve(&p.from)?;
                let b = version_or_head(s, p.to.as_deref())?;
                let changes = s.env.diff(&s.actor, &a, &b, None)?;
                let mut lines: Vec<String> = changes
                    .iter()
                    .map(|c| format!("{} {}", change_letter(c), c.key.display_path()))
                    .collect();
                lines.push(format!(
                    "{} path(s) differ between {} and {}.",
                    changes.len(),
                    a.short(),
                    b.short()
                ));
                Ok(lines.join("\n"))
            },
        )
        .await
    }

    /// A mark.
    #[tool(
        description = "Name a version (default the current head) so you can restore it later by that name, e.g. before a risky change.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn mark(
        &self,
        Parameters(p): Parameters<MarkParams>,
    ) -> Result<CallToolResult, ErrorData> {
        self.routed(
            "mark",
            "mark",
            json!({"name": p.name, "version": p.version}),
            move |s| {
                let v = version_or_head(s, p.version.as_deref())?;
                s.env.mark(&s.actor, &p.name, &v)?;
                Ok(format!("Marked {} as {}.", v.short(), p.name))
            },
        )
        .await
    }

    /// A restore.
    #[tool(
        description = "Bring the workspace files back to an earlier version (history is kept; this appends a rollback). Use dry_run=true to preview.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn restore(
        &self,
        Parameters(p): Parameters<RestoreParams>,
    ) -> Result<CallToolResult, ErrorData> {
        self.routed(
            "restore",
            "restore",
            json!({"version": p.version, "dry_run": p.dry_run}),
            move |s| {
                let target = s.env.resolve(&p.version)?;
                let intent = Intent::new(IntentKind::Restore, format!("restore to {}", p.version));
                restore_text(s, target, intent, p.dry_run)
            },
        )
        .await
    }

    /// An undo.
    #[tool(
        description = "Undo the last operation on the workspace not undone yet (its files go back to the version before it). Repeated undos step further back; redo walks forward again.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn undo(&self) -> Result<CallToolResult, ErrorData> {
        self.routed("undo", "undo", json!({}), move |s| {
            let step = s.env.undo_step(&s.actor, MAIN)?;
            restore_text(s, step.target, step.intent, false)
        })
        .await
    }

    /// A redo.
    #[tool(
        description = "Redo the last undo not redone yet (the workspace's files come back as they were before that undo). Refused when the last operation is not an undo.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn redo(&self) -> Result<CallToolResult, ErrorData> {
        self.routed("redo", "redo", json!({}), move |s| {
            let step = s.env.redo_step(&s.actor, MAIN)?;
            restore_text(s, step.target, step.intent, false)
        })
        .await
    }

    /// A command.
    #[tool(
        description = "Run a command in the workspace (argv list, no shell); its file changes are recorded as one operation. Returns exit status and output.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn exec(
        &self,
        Parameters(p): Parameters<ExecParams>,
    ) -> Result<CallToolResult, ErrorData> {
        self.routed("exec", "exec", json!({"argv": p.command, "intent": p.intent}), move |s| {
            if p.command.is_empty() {
                return Err(Failure::usage("the command is empty").hint("pass e.g. [\"ls\", \"-l\"]"));
            }
            let done = process::shell_exec(
                s,
                &p.command,
                p.intent.as_deref(),
                &crate::cli::SandboxArgs::default(),
            )?;
            let refused = environment_core::put_back_note(&done.refused_json())
                .map(|(sentence, next)| format!("\n{sentence}. Next: {next}."))
                .unwrap_or_default();
            Ok(format!(
                "The command ran and exited with status {}; recorded as operation {} ({} file(s) changed).{refused}\n--- stdout ---\n{}\n--- stderr ---\n{}",
                done.status(),
                done.outcome.op.short(),
                done.outcome.files_changed,
                truncated(&done.stdout),
                truncated(&done.stderr)
            ))
        })
        .await
    }

    /// A read.
    #[tool(
        description = "Read a file of the workspace at the current head or at an earlier version (a version is an op id prefix, a mark, a branch or HEAD~N): its text, or for a file that is not UTF-8 its bytes in base64 after a line `encoding: base64`.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn read_file(
        &self,
        Parameters(p): Parameters<ReadParams>,
    ) -> Result<CallToolResult, ErrorData> {
        let params = json!({ "path": p.path, "version": p.version });
        self.routed("read_file", "file.read", params, move |s| {
            let key = fs_key(&p.path)?;
            let v = version_or_head(s, p.version.as_deref())?;
            let value = s.env.read(&s.actor, &key, &v)?.ok_or_else(|| {
                Failure::not_found(format!(
                    "there is no file {} at version {}",
                    p.path,
                    v.short()
                ))
                .hint("list the files with list_files")
            })?;
            if value.meta.kind != EntryKind::File {
                return Err(Failure::usage(format!("{} is not a regular file", p.path))
                    .hint("list a directory with list_files"));
            }
            let bytes = s.env.content(&value)?;
            let (text, base64) = environment_supervisor::bytes_json(&bytes);
            Ok(super::file_text(
                &key.display_path(),
                bytes.len() as u64,
                text.as_deref(),
                base64.as_deref(),
            ))
        })
        .await
    }

    /// A write.
    #[tool(
        description = "Write a whole text file in the workspace (created or replaced), recorded as one operation.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn write_file(
        &self,
        Parameters(p): Parameters<WriteParams>,
    ) -> Result<CallToolResult, ErrorData> {
        let params = json!({ "path": p.path, "content": p.content, "intent": p.intent });
        self.routed("write_file", "file.write", params, move |s| {
            let rel = fs_key(&p.path)?.display_path();
            let intent = Intent::edit(p.intent.unwrap_or_else(|| format!("write {}", p.path)));
            let obs = s
                .tracker()?
                .write_file(&s.actor, &rel, p.content.into_bytes(), intent)?;
            Ok(format!(
                "Wrote {}; recorded as {}.",
                p.path,
                obs.version.short()
            ))
        })
        .await
    }

    /// A listing.
    #[tool(
        description = "List the files of the workspace (or under a directory) at the current head or an earlier version.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_files(
        &self,
        Parameters(p): Parameters<ListParams>,
    ) -> Result<CallToolResult, ErrorData> {
        let params = json!({ "prefix": p.prefix, "version": p.version });
        self.routed("list_files", "file.list", params, move |s| {
            let prefix = match p.prefix.as_deref().map(|x| x.trim_matches('/')) {
                None | Some("") | Some(".") => KeyPrefix::all(Namespace::Fs),
                Some(d) => KeyPrefix::new(Namespace::Fs, d)
                    .map_err(|e| Failure::usage(format!("{d:?} is not a workspace path: {e}")))?,
            };
            let v = version_or_head(s, p.version.as_deref())?;
            let list = s.env.list(&s.actor, &prefix, &v)?;
            let lines: Vec<String> = list
                .iter()
                .map(|(k, val)| match val.meta.kind {
                    EntryKind::Dir => format!("{}/", k.display_path()),
                    EntryKind::Symlink => format!("{} -> symlink", k.display_path()),
                    _ => format!("{} ({} bytes)", k.display_path(), val.meta.size),
                })
                .collect();
            Ok(if lines.is_empty() {
                "No files.".to_owned()
            } else {
                lines.join("\n")
            })
        })
        .await
    }

    /// Publish.
    #[tool(
        description = "Publish a message to a queue topic for other agents or humans (e.g. task.created).",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn queue_publish(
        &self,
        Parameters(p): Parameters<PublishParams>,
    ) -> Result<CallToolResult, ErrorData> {
        self.routed("queue_publish", "queue.publish", json!({"topic": p.topic, "payload": p.payload, "ordering_key": p.key, "dedup_id": p.dedup}), move |s| {
            let bus = s.ws.open_bus()?;
            let out = queue::publish(
                s,
                &bus,
                &p.topic,
                p.payload.into_bytes(),
                p.key.as_deref(),
                p.dedup.as_deref(),
            )?;
            Ok(pretty(&out))
        })
        .await
    }

    /// Claim.
    #[tool(
        description = "Claim (lease) messages of a consumer group; settle each with queue_ack when done or queue_nack to retry later.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn queue_claim(
        &self,
        Parameters(p): Parameters<ClaimParams>,
    ) -> Result<CallToolResult, ErrorData> {
        self.routed("queue_claim", "queue.claim", json!({"group": p.group, "max": p.max, "lease_ms": p.lease_secs.map(|s| s.saturating_mul(1000))}), move |s| {
            let bus = s.ws.open_bus()?;
            let lease = Duration::from_secs(p.lease_secs.unwrap_or(60));
            Ok(pretty(&queue::claim(
                s,
                &bus,
                &p.group,
                lease,
                p.max.unwrap_or(1),
            )?))
        })
        .await
    }

    /// Ack.
    #[tool(
        description = "Acknowledge a claimed message by its receipt: the work is done and it is not delivered again.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn queue_ack(
        &self,
        Parameters(p): Parameters<ReceiptParams>,
    ) -> Result<CallToolResult, ErrorData> {
        self.routed(
            "queue_ack",
            "queue.ack",
            json!({"receipt": p.receipt}),
            move |s| {
                let bus = s.ws.open_bus()?;
                Ok(pretty(&queue::ack(s, &bus, &p.receipt)?))
            },
        )
        .await
    }

    /// Nack.
    #[tool(
        description = "Give a claimed message back by its receipt when the work failed; it is retried after a backoff.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn queue_nack(
        &self,
        Parameters(p): Parameters<NackParams>,
    ) -> Result<CallToolResult, ErrorData> {
        self.routed(
            "queue_nack",
            "queue.nack",
            json!({"receipt": p.receipt, "error": p.error}),
            move |s| {
                let bus = s.ws.open_bus()?;
                Ok(pretty(&queue::nack(
                    s,
                    &bus,
                    &p.receipt,
                    p.error.as_deref(),
                )?))
            },
        )
        .await
    }

    /// Explain.
    #[tool(
        description = "Ask the policy whether you may do an action on a resource, and why (the rules that decide and what to do if refused).",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn policy_explain(
        &self,
        Parameters(p): Parameters<AccessParams>,
    ) -> Result<CallToolResult, ErrorData> {
        self.routed(
            "policy_explain",
            "policy.explain",
            json!({"action": p.action, "resource": resource_param(&p.resource)}),
            move |s| {
                let req = policy_cmd::request(
                    s.actor.clone(),
                    policy_cmd::parse_action(&p.action)?,
                    policy_cmd::parse_resource(&p.resource)?,
                );
                let Some(policy) = &s.policy else {
                    return Ok(
                        "Allowed: no policy is loaded, so every action is allowed.".to_owned()
                    );
                };
                let d = policy.evaluate(&req);
                Ok(d.explain(&req))
            },
        )
        .await
    }

    /// What may I do.
    #[tool(
        description = "List what you are allowed to do under a resource (default the whole workspace), so you can plan instead of probing.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn what_may_i_do(
        &self,
        Parameters(p): Parameters<MayParams>,
    ) -> Result<CallToolResult, ErrorData> {
        self.routed(
            "what_may_i_do",
            "policy.what_may_i_do",
            json!({"resource": resource_param(p.resource.as_deref().unwrap_or("prefix:"))}),
            move |s| {
                let under = match p.resource.as_deref() {
                    Some(r) => policy_cmd::parse_resource(r)?,
                    None => Resource::Prefix(KeyPrefix::all(Namespace::Fs)),
                };
                let Some(policy) = &s.policy else {
                    return Ok("No policy is loaded: every action is allowed.".to_owned());
                };
                let perms = policy.what_may(s.actor.as_str(), &under);
                if perms.is_empty() {
                    return Ok(format!("{} may do nothing there.", s.actor));
                }
                Ok(perms
                    .iter()
                    .map(|p| {
                        let mut line = format!("{} on {} (rule {})", p.action, p.resource, p.rule);
                        if !p.conditions.is_empty() {
                            line.push_str(&format!(" when {}", p.conditions));
                        }
                        if !p.except.is_empty() {
                            line.push_str(&format!(" except {}", p.except.join(", ")));
                        }
                        line
                    })
                    .collect::<Vec<_>>()
                    .join("\n"))
            },
        )
        .await
    }

    /// Request approval.
    #[tool(
        description = "File a request for a human to approve an action the policy allows only with approval; then wait for it to be granted.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn request_approval(
        &self,
        Parameters(p): Parameters<AccessParams>,
    ) -> Result<CallToolResult, ErrorData> {
        self.routed("request_approval", "approval.request", json!({"action": p.action, "resource": resource_param(&p.resource)}), move |s| {
            let req = policy_cmd::request(
                s.actor.clone(),
                policy_cmd::parse_action(&p.action)?,
                policy_cmd::parse_resource(&p.resource)?,
            );
            let Some(policy) = &s.policy else {
                return Err(Failure::usage("no policy is loaded, so nothing needs approval")
                    .hint("just do the action"));
            };
            let a = policy.request_approval(&req)?;
            Ok(format!(
                "Approval request {} is {}; it must be decided by {}. Do not do the action before it is granted.",
                a.id,
                policy_cmd::state_name(&a.state),
                if a.from.is_empty() { "an authorized approver".to_owned() } else { a.from.join(" or ") }
            ))
        })
        .await
    }
}
