//! Progress for long work (the first capture of a large tree, a big restore, gc): a spinner on
//! a terminal once the work has taken a moment, nothing at all when stderr is a pipe or a file.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Work shorter than this shows nothing, so quick commands do not flicker.
const SHOW_AFTER: Duration = Duration::from_millis(400);

/// A spinner shown while work runs; hidden off a terminal.
pub struct Progress {
    bar: Option<(ProgressBar, Arc<Mutex<bool>>)>,
}

impl Progress {
    /// Starts a spinner saying `what` (only on a terminal, and only if the work lasts).
    pub fn spinner(what: &str) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress { bar: None };
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            bar.set_style(style);
        }
        bar.set_message(what.to_owned());
        // Held while the bar is shown or finished, so it is never shown after it finished.
        let done = Arc::new(Mutex::new(false));
        let (b, d) = (bar.clone(), done.clone());
        let shown = std::thread::Builder::new()
            .name("envctl-progress".into())
            .spawn(move || {
                std::thread::sleep(SHOW_AFTER);
                let finished = d.lock().unwrap_or_else(|p| p.into_inner());
                if !*finished {
                    b.set_draw_target(ProgressDrawTarget::stderr());
                    b.enable_steady_tick(Duration::from_millis(120));
                }
            });
        // Without the thread there is simply no spinner.
        drop(shown);
        Progress {
            bar: Some((bar, done)),
        }
    }

    /// Clears the spinner.
    pub fn finish(self) {
        if let Some((bar, done)) = self.bar {
            let mut finished = done.lock().unwrap_or_else(|p| p.into_inner());
            *finished = true;
            bar.finish_and_clear();
        }
    }
}
