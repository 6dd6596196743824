//! Who may use urdmad: root and the members of one configured group, decided from the
//! kernel's credentials of the connecting process (SO_PEERCRED), never from what it says.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

/// Credentials of a connected peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

pub fn peer_of(stream: &UnixStream) -> std::io::Result<Peer> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt fills at most `len` bytes of `cred`.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Peer {
        pid: cred.pid as u32,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// Supplementary groups of a live process (the `Groups:` line of /proc/PID/status).
pub fn supplementary_groups(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The id of a group from /etc/group.
pub fn group_id(name: &str) -> Option<u32> {
    if name.is_empty() {
        return None;
    }
    let text = std::fs::read_to_string("/etc/group").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == name).then_some(())?;
        f.next()?;
        f.next()?.parse().ok()
    })
}

/// Why a peer may not use urdmad; its text is the refusal sent back to the peer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// No group is configured (or it does not exist).
    #[error("uid {uid} is not allowed: urdmad accepts only root")]
    RootOnly { uid: u32 },
    #[error("uid {uid} is not allowed: urdmad accepts only root and members of group {group}")]
    NotInGroup { uid: u32, group: String },
}

/// `Ok` when the peer may attach, otherwise the refusal.
pub fn check(
    peer: Peer,
    groups: &[u32],
    allowed_gid: Option<u32>,
    group_name: &str,
) -> Result<(), AccessError> {
    if peer.uid == 0 {
        return Ok(());
    }
    if let Some(g) = allowed_gid {
        if peer.gid == g || groups.contains(&g) {
            return Ok(());
        }
    }
    Err(if group_name.is_empty() {
        AccessError::RootOnly { uid: peer.uid }
    } else {
        AccessError::NotInGroup {
            uid: peer.uid,
            group: group_name.to_string(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(uid: u32, gid: u32) -> Peer {
        Peer { pid: 1, uid, gid }
    }

    #[test]
    fn root_and_group_members_only() {
        assert!(check(p(0, 0), &[], None, "").is_ok());
        assert!(check(p(1000, 50), &[], Some(50), "urdma").is_ok());
        assert!(check(p(1000, 100), &[7, 50], Some(50), "urdma").is_ok());
        let e = check(p(1000, 100), &[7], Some(50), "urdma")
            .unwrap_err()
            .to_string();
        assert!(e.contains("uid 1000") && e.contains("urdma"), "{e}");
        assert!(check(p(1000, 100), &[], None, "").is_err());
    }

    #[test]
    fn refusal_messages_are_pinned() {
        let e = check(p(1000, 100), &[7], Some(50), "urdma").unwrap_err();
        assert_eq!(
            e.to_string(),
            "uid 1000 is not allowed: urdmad accepts only root and members of group urdma"
        );
        let e = check(p(65534, 100), &[], None, "").unwrap_err();
        assert_eq!(
            e.to_string(),
            "uid 65534 is not allowed: urdmad accepts only root"
        );
    }
}
