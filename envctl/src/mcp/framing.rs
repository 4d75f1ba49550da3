//! The stdio transport, with JSON-RPC's parse errors.
//!
//! MCP over stdio is one JSON-RPC message per line. The server library skips a line that is
//! not JSON without a word, so a client that sent one waits for an answer that never comes.
//! Here every line is checked first: one that is not JSON is answered with `-32700` (id
//! `null`, as JSON-RPC says for a request whose id cannot be read) and goes no further; the
//! others reach the server unchanged. One task owns stdout, so the server's answers and the
//! parse errors never interleave within a line.

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::mpsc;

/// How much is buffered between stdio and the server, each way.
const PIPE: usize = 1 << 16;

/// The server's ends: what it reads (the checked lines of stdin) and where it writes (stdout,
/// through the writer task), and the task that must finish for everything to be written.
pub(super) struct Framed {
    pub input: DuplexStream,
    pub output: DuplexStream,
    pub written: tokio::task::JoinHandle<()>,
}

/// Starts the tasks between stdin, stdout and the server.
pub(super) fn stdio() -> Framed {
    framed(tokio::io::stdin(), tokio::io::stdout())
}

fn framed(
    from: impl AsyncRead + Unpin + Send + 'static,
    to: impl AsyncWrite + Unpin + Send + 'static,
) -> Framed {
    let (input, mut feed) = tokio::io::duplex(PIPE);
    let (output, answers) = tokio::io::duplex(PIPE);
    let (errors, mut refused) = mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        let mut lines = BufReader::new(from);
        let mut line = Vec::new();
        loop {
            line.clear();
            match lines.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let text = line.trim_ascii();
            if text.is_empty() {
                continue;
            }
            match serde_json::from_slice::<serde::de::IgnoredAny>(text) {
                Ok(_) => {
                    if feed.write_all(&line).await.is_err() {
                        break;
                    }
                    if !line.ends_with(b"\n") && feed.write_all(b"\n").await.is_err() {
                        break;
                    }
                }
                Err(e) => {
                    let _ = errors.send(parse_error(&e));
                }
            }
        }
        // Dropping the feed ends the server's input: it stops as at the end of stdin.
    });
    let written = tokio::spawn(async move {
        let mut to = to;
        let mut answers = BufReader::new(answers);
        let mut line = Vec::new();
        loop {
            line.clear();
            tokio::select! {
                read = answers.read_until(b'\n', &mut line) => match read {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                },
                Some(refusal) = refused.recv() => line = refusal,
            }
            if to.write_all(&line).await.is_err() || to.flush().await.is_err() {
                break;
            }
        }
        let _ = to.flush().await;
    });
    Framed {
        input,
        output,
        written,
    }
}

/// The answer to a line that is not JSON.
fn parse_error(e: &serde_json::Error) -> Vec<u8> {
    let mut line = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {
            "code": -32700,
            "message": format!("Parse error: the line is not JSON ({e}); nothing was done"),
        },
    })
    .to_string()
    .into_bytes();
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn a_line_that_is_not_json_is_answered_and_the_rest_pass() {
        let input: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":1}\nnot json\n\n[1,2]";
        let (out, mut seen) = tokio::io::duplex(PIPE);
        let mut f = framed(input, out);
        let mut passed = String::new();
        f.input.read_to_string(&mut passed).await.unwrap();
        assert_eq!(passed, "{\"jsonrpc\":\"2.0\",\"id\":1}\n[1,2]\n");
        drop(f.output);
        f.written.await.unwrap();
        let mut said = String::new();
        seen.read_to_string(&mut said).await.unwrap();
        let answer: serde_json::Value = serde_json::from_str(said.trim()).unwrap();
        assert_eq!(answer["error"]["code"], -32700);
        assert_eq!(answer["id"], serde_json::Value::Null);
    }
}
