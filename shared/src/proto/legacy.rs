//! The text protocol of versions 1 to 10 (`VERB key=value …` lines), as far as a peer of
//! this version still meets it: an old process's `HELLO`, which urdmad must refuse in words
//! that process reads, and an old urdmad's refusal of this client's `HELLO`, which the
//! client reports in one line. Nothing else of that protocol is spoken.

/// The version that an old process's `HELLO version=N pid=P` announces; `None` for any
/// other line.
pub fn hello_version(line: &str) -> Option<u32> {
    let rest = line.trim_end_matches(['\n', '\r']).strip_prefix("HELLO ")?;
    rest.split(' ')
        .find_map(|f| f.strip_prefix("version="))?
        .parse()
        .ok()
}

/// The refusal an old process reads: `ERROR code=EVERSION message=…`, the message's spaces
/// (and `=`) as underscores, as that protocol carried them.
pub fn version_refusal(message: &str) -> String {
    let message: String = message
        .chars()
        .map(|c| {
            if c.is_whitespace() || c == '=' {
                '_'
            } else {
                c
            }
        })
        .collect();
    format!("ERROR code=EVERSION message={message}\n")
}

/// What an old urdmad's line says, for the user: the message of an `ERROR code=C
/// message=M` in words, else the line itself (trimmed, at most 200 characters).
pub fn answer_text(line: &str) -> String {
    let line = line.trim_end_matches(['\n', '\r']);
    if let Some(rest) = line.strip_prefix("ERROR ") {
        let field = |k: &str| {
            rest.split(' ')
                .find_map(|f| f.strip_prefix(k))
                .unwrap_or("")
        };
        return format!("{} {}", field("code="), field("message=").replace('_', " "));
    }
    line.chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_old_hello_is_recognised_and_nothing_else_is() {
        assert_eq!(hello_version("HELLO version=10 pid=1\n"), Some(10));
        assert_eq!(hello_version("HELLO pid=1 version=3"), Some(3));
        assert_eq!(hello_version("HELLO version=x pid=1"), None);
        assert_eq!(hello_version("HELLO"), None);
        assert_eq!(hello_version("{\"req\":\"HELLO\",\"version\":11}"), None);
        assert_eq!(hello_version("QP dev=0 qpn=1"), None);
    }

    #[test]
    fn the_refusal_is_one_line_an_old_process_decodes() {
        let r = version_refusal("protocol version 10 is not supported, urdmad speaks 11");
        assert_eq!(
            r,
            "ERROR code=EVERSION message=protocol_version_10_is_not_supported,_urdmad_speaks_11\n"
        );
    }

    #[test]
    fn an_old_daemon_s_answer_is_told_in_words() {
        assert_eq!(
            answer_text("ERROR code=EINVAL message=unknown_message_\"{\\\"req\\\"\"\n"),
            "EINVAL unknown message \"{\\\"req\\\"\""
        );
        assert_eq!(
            answer_text("HELLO version=10 daemon=urdmad_0.1.0\n"),
            "HELLO version=10 daemon=urdmad_0.1.0"
        );
    }
}
