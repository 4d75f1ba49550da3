//! Progress for long work (the first capture of a large tree, a big restore, gc): a spinner on
//! a terminal, nothing at all when stderr is a pipe or a file.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// A spinner shown while work runs; hidden off a terminal.
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// Starts a spinner saying `what` (only on a terminal).
    pub fn spinner(what: &str) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress { bar: None };
        }
        let bar = ProgressBar::new_spinner();
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            bar.set_style(style);
        }
        bar.set_message(what.to_owned());
        // Short work never shows: the first tick comes after a moment.
        bar.enable_steady_tick(Duration::from_millis(120));
        Progress { bar: Some(bar) }
    }

    /// Clears the spinner.
    pub fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}
