//! Secret redaction of a byte stream that arrives in chunks.

use environment_core::SecretValue;

/// Replaces every occurrence of a secret's value by `[redacted:NAME]`, also when an occurrence
/// is split across chunks: the last bytes of a chunk that could begin a secret are held back
/// until the next chunk (or the end) decides.
#[derive(Default)]
pub struct Redactor {
    /// (value, replacement), longest value first, so a secret containing another is replaced whole.
    secrets: Vec<(Vec<u8>, Vec<u8>)>,
    held: Vec<u8>,
    longest: usize,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor")
            .field("secrets", &self.secrets.len())
            .finish_non_exhaustive()
    }
}

impl Redactor {
    /// A redactor for these (name, value) pairs; empty values are ignored.
    pub fn new<'a>(secrets: impl IntoIterator<Item = (&'a str, &'a SecretValue)>) -> Redactor {
        let mut list: Vec<(Vec<u8>, Vec<u8>)> = secrets
            .into_iter()
            .filter(|(_, v)| !v.expose().is_empty())
            .map(|(n, v)| {
                (
                    v.expose().as_bytes().to_vec(),
                    format!("[redacted:{n}]").into_bytes(),
                )
            })
            .collect();
        list.sort_by_key(|s| std::cmp::Reverse(s.0.len()));
        let longest = list.first().map_or(0, |s| s.0.len());
        Redactor {
            secrets: list,
            held: Vec::new(),
            longest,
        }
    }

    /// Whether there is anything to redact.
    pub fn is_active(&self) -> bool {
        !self.secrets.is_empty()
    }

    /// Feeds a chunk; returns what can be passed on now.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        if !self.is_active() {
            return chunk.to_vec();
        }
        self.held.extend_from_slice(chunk);
        let buf = std::mem::take(&mut self.held);
        let (mut out, rest) = self.replace(&buf, false);
        self.held = buf[rest..].to_vec();
        out.shrink_to_fit();
        out
    }

    /// The end of the stream: whatever was held back.
    pub fn finish(&mut self) -> Vec<u8> {
        let buf = std::mem::take(&mut self.held);
        self.replace(&buf, true).0
    }

    /// Replaces whole occurrences in `buf`; unless `last`, stops before the earliest position
    /// where a secret could still begin and returns that position as the rest to hold.
    fn replace(&self, buf: &[u8], last: bool) -> (Vec<u8>, usize) {
        let mut out = Vec::with_capacity(buf.len());
        let mut i = 0;
        'scan: while i < buf.len() {
            for (value, replacement) in &self.secrets {
                if buf[i..].starts_with(value) {
                    out.extend_from_slice(replacement);
                    i += value.len();
                    continue 'scan;
                }
            }
            // Near the end, a secret may continue in the next chunk.
            if !last && buf.len() - i < self.longest {
                let tail = &buf[i..];
                if self.secrets.iter().any(|(v, _)| v.starts_with(tail)) {
                    return (out, i);
                }
            }
            out.push(buf[i]);
            i += 1;
        }
        (out, buf.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(secrets: &[(&str, &str)], chunks: &[&[u8]]) -> Vec<u8> {
        let values: Vec<(String, SecretValue)> = secrets
            .iter()
            .map(|(n, v)| (n.to_string(), SecretValue::new(*v)))
            .collect();
        let mut r = Redactor::new(values.iter().map(|(n, v)| (n.as_str(), v)));
        let mut out = Vec::new();
        for c in chunks {
            out.extend(r.push(c));
        }
        out.extend(r.finish());
        out
    }

    #[test]
    fn replaces_occurrences_split_across_chunks() {
        let out = run(
            &[("TOKEN", "s3cr3t")],
            &[b"a s3", b"cr", b"3t b s3cr3ts3cr3t", b" s3cr"],
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "a [redacted:TOKEN] b [redacted:TOKEN][redacted:TOKEN] s3cr"
        );
    }

    #[test]
    fn every_split_point_of_every_input_is_redacted() {
        let input = b"xxhunter2yhunter2hunter";
        for cut in 0..input.len() {
            let out = run(&[("P", "hunter2")], &[&input[..cut], &input[cut..]]);
            assert_eq!(out, b"xx[redacted:P]y[redacted:P]hunter", "cut at {cut}");
        }
    }

    #[test]
    fn the_longer_of_two_overlapping_secrets_wins() {
        let out = run(&[("A", "abc"), ("B", "abcdef")], &[b"abcdef abc"]);
        assert_eq!(out, b"[redacted:B] [redacted:A]");
    }
}
