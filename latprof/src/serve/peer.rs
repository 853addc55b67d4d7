//! Who is at the other end of a connection, told by what no client can forge: for a
//! connection from this machine (loopback, or one of its own addresses), the user that owns
//! the client's socket, read from the kernel's socket tables (`/proc/net/tcp`, `tcp6`); for
//! one from elsewhere, its address. A scraper's pulls are keyed by it (`pulls`): a local user
//! who names itself as the real scraper, or sends its User-Agent, is still another user.

use std::net::{IpAddr, SocketAddr};

/// The two ends of a connection, put in its requests' extensions by the connection.
#[derive(Clone, Copy, Debug, Default)]
pub struct Peer {
    /// The client's address and port.
    pub addr: Option<SocketAddr>,
    /// Ours (the listening socket's address as the client reached it).
    pub local: Option<SocketAddr>,
}

impl Peer {
    /// Who the client is: `uid N` for a socket of this machine's (the user that owns it),
    /// `local ?` for one of this machine's whose owner is not found (closed meanwhile),
    /// else the client's address.
    #[must_use]
    pub fn identity(&self) -> String {
        let (Some(addr), Some(local)) = (self.addr, self.local) else {
            return "?".to_owned();
        };
        match socket_owner(addr, local) {
            Some(uid) => format!("uid {uid}"),
            None if is_local(addr.ip(), local.ip()) => "local ?".to_owned(),
            None => addr.ip().to_canonical().to_string(),
        }
    }
}

/// Whether `ip` is this machine's: loopback, or the address the client reached us at.
fn is_local(ip: IpAddr, ours: IpAddr) -> bool {
    let ip = ip.to_canonical();
    ip.is_loopback() || ip == ours.to_canonical()
}

/// The user owning the TCP socket whose local end is `client` and remote end `server`, from
/// the kernel's tables of this network namespace (a client elsewhere has no row here).
#[must_use]
pub fn socket_owner(client: SocketAddr, server: SocketAddr) -> Option<u32> {
    // The client's socket may be of either family: an IPv4 client of a server listening on
    // `[::]` has an IPv4 socket, seen here as `::ffff:a.b.c.d`.
    let (client_ip, server_ip) = (client.ip().to_canonical(), server.ip().to_canonical());
    let (table, want_local, want_remote) = match (client_ip, server_ip) {
        (IpAddr::V4(c), IpAddr::V4(s)) => (
            "/proc/net/tcp",
            hex_v4(c.octets(), client.port()),
            hex_v4(s.octets(), server.port()),
        ),
        _ => (
            "/proc/net/tcp6",
            hex_v6(to_v6(client_ip).octets(), client.port()),
            hex_v6(to_v6(server_ip).octets(), server.port()),
        ),
    };
    let text = std::fs::read_to_string(table).ok()?;
    owner_in(&text, &want_local, &want_remote).or_else(|| {
        // An IPv4 connection from an IPv6 socket (Java's default) is in `tcp6`, mapped.
        let (IpAddr::V4(_), IpAddr::V4(_)) = (client_ip, server_ip) else {
            return None;
        };
        let text = std::fs::read_to_string("/proc/net/tcp6").ok()?;
        owner_in(
            &text,
            &hex_v6(to_v6(client_ip).octets(), client.port()),
            &hex_v6(to_v6(server_ip).octets(), server.port()),
        )
    })
}

fn to_v6(ip: IpAddr) -> std::net::Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

/// The uid of the row of `table` (`/proc/net/tcp`'s text) with these ends; a socket in
/// TIME_WAIT (state 06) is no one's (its uid reads 0).
fn owner_in(table: &str, local: &str, remote: &str) -> Option<u32> {
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1)?.eq_ignore_ascii_case(local)
            && fields.get(2)?.eq_ignore_ascii_case(remote)
            && *fields.get(3)? != "06")
            .then(|| fields.get(7)?.parse().ok())
            .flatten()
    })
}

/// An IPv4 end as the kernel prints it: the address's 32 bits as stored (network order),
/// printed as a number of this machine's byte order, then the port.
fn hex_v4(octets: [u8; 4], port: u16) -> String {
    format!("{:08X}:{port:04X}", u32::from_ne_bytes(octets))
}

/// An IPv6 end: its four 32-bit words each as `hex_v4` prints one.
fn hex_v6(octets: [u8; 16], port: u16) -> String {
    let [a, b, c, d] = octets.as_chunks::<4>().0 else {
        unreachable!("16 bytes are four words")
    };
    let word = |w: &[u8; 4]| u32::from_ne_bytes(*w);
    format!(
        "{:08X}{:08X}{:08X}{:08X}:{port:04X}",
        word(a),
        word(b),
        word(c),
        word(d)
    )
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};

    use super::*;

    #[test]
    fn ends_are_written_as_the_kernel_writes_them() {
        #[cfg(target_endian = "little")]
        {
            assert_eq!(hex_v4([127, 0, 0, 1], 9934), "0100007F:26CE");
            assert_eq!(
                hex_v6(std::net::Ipv6Addr::LOCALHOST.octets(), 80),
                "00000000000000000000000001000000:0050"
            );
        }
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:26CE 0100007F:A000 01 00000000:00000000 00:00000000 00000000  65534        0 1 1 0\n";
        assert_eq!(
            owner_in(table, "0100007F:26CE", "0100007F:A000"),
            Some(65534)
        );
        assert_eq!(owner_in(table, "0100007F:A000", "0100007F:26CE"), None);
    }

    /// A connection of this process's own, over IPv4 and IPv6 loopback: its owner is this
    /// process's user.
    #[test]
    fn the_owner_of_a_loopback_client_is_found() {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        for bind in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(listener) = TcpListener::bind(bind) else {
                assert!(bind.starts_with('['), "IPv4 loopback must exist");
                continue;
            };
            let server = listener.local_addr().unwrap();
            let client = TcpStream::connect(server).unwrap();
            let (accepted, addr) = listener.accept().unwrap();
            assert_eq!(addr, client.local_addr().unwrap());
            let peer = Peer {
                addr: Some(addr),
                local: Some(accepted.local_addr().unwrap()),
            };
            assert_eq!(peer.identity(), format!("uid {me}"), "{bind}");
        }
    }
}
