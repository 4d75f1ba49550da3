//! The text a model reads for each answer of the workspace service. The answer itself goes to
//! the client as the call's structured content; this is its rendering, one per use case, the
//! same in process and through a supervisor.

use environment_workspace::Method;
use serde_json::Value;

/// The most output of a command returned to the model in text, per stream.
pub(super) const MAX_OUTPUT: usize = 32 * 1024;

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

fn short(v: &Value) -> String {
    text(v).chars().take(12).collect()
}

/// The text of `answer`, the result of `method`.
pub(super) fn answer(method: Method, answer: &Value) -> String {
    match method {
        Method::History => lines(&answer["entries"], "No history.", |e| {
            text(&e["text"]).to_owned()
        }),
        Method::Refused => refused(
            answer["refused"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default(),
        ),
        Method::Diff => {
            let mut out = lines(&answer["changes"], "", |c| {
                format!("{} {}", letter(text(&c["change"])), text(&c["path"]))
            });
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&format!(
                "{} path(s) differ between {} and {}{}.",
                answer["total"],
                short(&answer["from"]),
                short(&answer["to"]),
                if answer["truncated"] == true {
                    " (the list is cut)"
                } else {
                    ""
                }
            ));
            out
        }
        Method::FileDiff => {
            match serde_json::from_value::<environment_workspace::patch::FileDiff>(answer.clone()) {
                Ok(diff) => diff.to_string(),
                Err(_) => answer.to_string(),
            }
        }
        Method::Mark => format!(
            "Marked {} as {}.",
            short(&answer["version"]),
            text(&answer["name"])
        ),
        Method::Marks => lines(&answer["marks"], "No marks.", |m| {
            format!("{} {}", text(&m["name"]), short(&m["version"]))
        }),
        Method::BranchList => lines(&answer["branches"], "No branches.", |b| {
            format!("{} {}", text(&b["name"]), short(&b["head"]))
        }),
        Method::BranchCreate => format!(
            "Created branch {} at {}.",
            text(&answer["name"]),
            short(&answer["from"])
        ),
        Method::Restore | Method::Undo | Method::Redo => restored(answer),
        Method::Merge => {
            let conflicts = answer["conflicts"].as_array().map(Vec::len).unwrap_or(0);
            if answer["noop"] == true {
                "Nothing to merge: main already holds that branch.".to_owned()
            } else {
                format!(
                    "Merged; the new head is {} ({} path(s) written, {} removed, {conflicts} \
                     conflict(s) kept main's content).{}",
                    short(&answer["version"]),
                    answer["steps"]["writes"],
                    answer["steps"]["removals"],
                    lines_under(
                        "\nConflicts (main's side kept):",
                        &answer["conflicts"],
                        |c| {
                            format!(
                                "{}: main's change by {} against the branch's by {}",
                                text(&c["path"]),
                                text(&c["ours"]["actor"]),
                                text(&c["theirs"]["actor"])
                            )
                        }
                    ),
                )
            }
        }
        Method::FileRead => file(answer),
        Method::FileList => lines(&answer["entries"], "No files.", |e| {
            match text(&e["kind"]) {
                "dir" => format!("{}/", text(&e["path"])),
                "symlink" => format!("{} -> symlink", text(&e["path"])),
                _ => format!("{} ({} bytes)", text(&e["path"]), e["size"]),
            }
        }),
        Method::FileWrite => format!(
            "Wrote {}; recorded as {}.",
            text(&answer["path"]),
            short(&answer["version"])
        ),
        Method::FileDelete => format!(
            "Deleted {}; recorded as {}.",
            text(&answer["path"]),
            short(&answer["version"])
        ),
        Method::Exec => exec(answer),
        Method::PolicyExplain => text(&answer["explanation"]).to_owned(),
        Method::PolicyWhatMayIDo if answer["policy"] == false => {
            "No policy is loaded here, so there are no rules to list: every action is allowed \
             unless the workspace's authorizer says otherwise (policy_explain asks about one)."
                .to_owned()
        }
        Method::PolicyWhatMayIDo => {
            lines(&answer["permissions"], "You may do nothing there.", |p| {
                let mut line = format!(
                    "{} on {} (rule {})",
                    text(&p["action"]),
                    text(&p["resource"]),
                    text(&p["rule"])
                );
                if !text(&p["conditions"]).is_empty() {
                    line.push_str(&format!(" when {}", text(&p["conditions"])));
                }
                if let Some(except) = p["except"].as_array().filter(|e| !e.is_empty()) {
                    let except: Vec<&str> = except.iter().map(text).collect();
                    line.push_str(&format!(" except {}", except.join(", ")));
                }
                line
            })
        }
        Method::ApprovalRequest | Method::ApprovalStatus => format!(
            "Approval request {} is {}; it is decided by {}.{}",
            text(&answer["id"]),
            text(&answer["state"]),
            answer["from"]
                .as_array()
                .filter(|f| !f.is_empty())
                .map(|f| f
                    .iter()
                    .map(|a| text(a).to_owned())
                    .collect::<Vec<_>>()
                    .join(" or "))
                .unwrap_or_else(|| "an authorized approver".to_owned()),
            if answer["state"] == "granted" {
                format!(
                    " Present it as `approval` with the call: \"{}\".",
                    text(&answer["id"])
                )
            } else {
                " Do not do the action before it is granted.".to_owned()
            }
        ),
        Method::Tournament => {
            let report = &answer["report"];
            let mut out = lines(&report["contestants"], "No candidates.", |c| {
                format!(
                    "{} {} on {}",
                    text(&c["candidate"]["name"]),
                    if c["passed"] == true {
                        "passed"
                    } else {
                        "failed"
                    },
                    text(&c["branch"])
                )
            });
            out.push('\n');
            out.push_str(&match report["adopted"].as_str() {
                Some(v) => format!(
                    "The winner was adopted: the workspace is now {}.",
                    v.chars().take(12).collect::<String>()
                ),
                None => "No candidate passed the test; nothing was adopted.".to_owned(),
            });
            out
        }
        Method::EffectList => lines(&answer["effects"], "No effects.", effect),
        Method::EffectBegin => format!(
            "{}\n{}",
            match text(&answer["outcome"]) {
                "new" =>
                    "Recorded: perform the effect now, then call effect_complete or effect_fail.",
                "already_done" =>
                    "It was performed already: do NOT perform it again; its result follows.",
                "in_flight" =>
                    "It is being performed (or its performer stopped): do NOT perform it again.",
                "needs_reconciliation" =>
                    "It may have happened: check with the target before anything else; do NOT perform it again.",
                _ => "It happened and was compensated: do NOT perform it again.",
            },
            effect(&answer["effect"])
        ),
        Method::EffectComplete | Method::EffectFail => effect(&answer["effect"]),
        Method::Verify => format!(
            "The history is intact: {} operation(s), {} tree node(s) and {} stored file(s) checked{}.",
            answer["ops"],
            answer["nodes"],
            answer["blobs"],
            if answer["deep"] == true {
                " and re-hashed"
            } else {
                ""
            }
        ),
        _ => serde_json::to_string_pretty(answer).unwrap_or_else(|_| answer.to_string()),
    }
}

/// One effect, on one line.
fn effect(e: &Value) -> String {
    let mut line = format!(
        "#{} {} {} → {} ({}, {} attempt(s))",
        e["id"],
        text(&e["state"]),
        text(&e["key"]),
        text(&e["target"]),
        text(&e["actor"]),
        e["attempts"]
    );
    if let Some(r) = e["result"].as_str() {
        line.push_str(&format!(": {r}"));
    }
    if let Some(n) = e["note"].as_str() {
        line.push_str(&format!(" ({n})"));
    }
    line
}

fn letter(change: &str) -> char {
    match change {
        "added" => 'A',
        "removed" => 'D',
        _ => 'M',
    }
}

/// One line per item of `list`, or `empty`.
fn lines(list: &Value, empty: &str, line: impl Fn(&Value) -> String) -> String {
    let out: Vec<String> = list.as_array().into_iter().flatten().map(line).collect();
    if out.is_empty() {
        empty.to_owned()
    } else {
        out.join("\n")
    }
}

fn paths(head: &str, list: &Value) -> String {
    lines_under(head, list, |p| text(p).to_owned())
}

/// `head` and one line per item of `list`, or nothing for an empty list.
fn lines_under(head: &str, list: &Value, line: impl Fn(&Value) -> String) -> String {
    let out = lines(list, "", line);
    if out.is_empty() {
        String::new()
    } else {
        format!("{head}\n{out}")
    }
}

fn restored(answer: &Value) -> String {
    let steps = &answer["steps"];
    let changed = steps["writes"].as_u64().unwrap_or(0) + steps["removals"].as_u64().unwrap_or(0);
    let head = if answer["dry_run"] == true {
        format!(
            "Dry run: restoring {} would change {changed} path(s); nothing was changed.",
            short(&answer["to"])
        )
    } else {
        format!(
            "Restored the workspace to {} ({changed} path(s) changed); the new head is {}.",
            short(&answer["restored_to"]),
            short(&answer["version"])
        )
    };
    let missed = lines(&steps["not_restored"], "", |n| {
        format!("{}: {}", text(&n["path"]), text(&n["why"]))
    });
    let missed = if missed.is_empty() {
        String::new()
    } else {
        format!(
            "\nNOT restored (the tree differs from the version at these paths; do not report \
             the restore as complete):\n{missed}"
        )
    };
    format!(
        "{head}{missed}{}{}",
        paths("\nWritten:", &steps["write"]),
        paths("\nRemoved:", &steps["remove"])
    )
}

/// A file's content: the text when it is UTF-8, else the bytes in base64 with the encoding
/// named.
fn file(answer: &Value) -> String {
    match answer["text"].as_str() {
        Some(t) => t.to_owned(),
        None => format!(
            "{} is not UTF-8 text ({} bytes); its content in base64 (standard alphabet, \
             padded) follows.\nencoding: base64\n{}",
            text(&answer["path"]),
            answer["size"],
            text(&answer["base64"])
        ),
    }
}

/// The refused changes, one line each.
fn refused(refused: &[Value]) -> String {
    if refused.is_empty() {
        return "No change was refused.".to_owned();
    }
    refused
        .iter()
        .map(|r| {
            format!(
                "#{} {} {} {} ({}: {})",
                r["id"],
                text(&r["actor"]),
                text(&r["change"]),
                text(&r["path"]),
                text(&r["verdict"]),
                text(&r["reason"])
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn exec(answer: &Value) -> String {
    let put_back =
        serde_json::from_value::<Vec<environment_core::json::Refused>>(answer["refused"].clone())
            .ok()
            .and_then(|r| environment_core::put_back_note(&r))
            .map(|(sentence, next)| format!("\n{sentence}. Next: {next}."))
            .unwrap_or_default();
    let ended = match &answer["exit"] {
        Value::Object(e) if e.contains_key("code") => format!("exited with status {}", e["code"]),
        Value::Object(e) if e.contains_key("signal") => {
            format!("was killed by signal {}", e["signal"])
        }
        Value::String(s) if s == "cancelled" => {
            "was cancelled and killed, with everything it started".to_owned()
        }
        _ => "ran past its timeout and was killed, with everything it started".to_owned(),
    };
    format!(
        "The command {ended}; recorded as operation {} ({} file(s) changed).{put_back}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        short(&answer["op"]),
        answer["files_changed"],
        stream(&answer["stdout"]),
        stream(&answer["stderr"]),
    )
}

/// A command's output stream: its text, cut for the model.
fn stream(s: &Value) -> String {
    match s["text"].as_str() {
        Some(t) => truncated(t),
        None => format!(
            "[{} bytes that are not UTF-8: see `base64` in the structured result]",
            s["stored"]
        ),
    }
}

/// `text` cut at [`MAX_OUTPUT`] bytes on a character boundary, saying how much was left out.
pub(super) fn truncated(text: &str) -> String {
    if text.len() <= MAX_OUTPUT {
        return text.to_owned();
    }
    let mut end = MAX_OUTPUT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n[… {} more bytes]", &text[..end], text.len() - end)
}
