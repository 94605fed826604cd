//! The SSRF guard: decides on the addresses a target host resolved to (the
//! shell resolves; the core decides). Private, loopback, link-local,
//! unspecified, multicast, broadcast, shared (CGNAT) and reserved addresses
//! are refused, over IPv4, IPv6 and IPv4-mapped/compatible IPv6, unless an
//! allowlist entry (a CIDR) contains them.

use ::core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What kind of address this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddrClass {
    Public,
    Loopback,
    Private,
    LinkLocal,
    Unspecified,
    Multicast,
    Broadcast,
    Shared,
    Reserved,
}

impl AddrClass {
    pub fn as_str(self) -> &'static str {
        match self {
            AddrClass::Public => "public",
            AddrClass::Loopback => "loopback",
            AddrClass::Private => "private",
            AddrClass::LinkLocal => "link-local",
            AddrClass::Unspecified => "unspecified",
            AddrClass::Multicast => "multicast",
            AddrClass::Broadcast => "broadcast",
            AddrClass::Shared => "shared",
            AddrClass::Reserved => "reserved",
        }
    }
}

/// The IPv4 address an IPv6 address embeds (mapped `::ffff:a.b.c.d` or
/// compatible `::a.b.c.d`), which is what a connection would reach.
pub fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    if s[..5] == [0; 5] && (s[5] == 0xffff || (s[5] == 0 && (s[6] != 0 || s[7] > 1))) {
        let [a, b] = s[6].to_be_bytes();
        let [c, d] = s[7].to_be_bytes();
        return Some(Ipv4Addr::new(a, b, c, d));
    }
    None
}

/// The address itself, or the IPv4 address an IPv6 one embeds.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => embedded_v4(v6).map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn classify_v4(ip: Ipv4Addr) -> AddrClass {
    let [a, b, ..] = ip.octets();
    if ip.is_unspecified() || a == 0 {
        AddrClass::Unspecified
    } else if ip.is_loopback() {
        AddrClass::Loopback
    } else if ip.is_private() {
        AddrClass::Private
    } else if ip.is_link_local() {
        AddrClass::LinkLocal
    } else if ip.is_broadcast() {
        AddrClass::Broadcast
    } else if ip.is_multicast() {
        AddrClass::Multicast
    } else if a == 100 && (64..128).contains(&b) {
        AddrClass::Shared
    } else if a >= 240 || (a == 192 && b == 0 && ip.octets()[2] == 0) || (a == 198 && (18..20).contains(&b)) {
        AddrClass::Reserved
    } else {
        AddrClass::Public
    }
}

/// Classifies an address (IPv4-mapped and -compatible IPv6 as their IPv4 address).
pub fn classify(ip: IpAddr) -> AddrClass {
    match canonical(ip) {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            if v6.is_unspecified() {
                AddrClass::Unspecified
            } else if v6.is_loopback() {
                AddrClass::Loopback
            } else if v6.is_multicast() {
                AddrClass::Multicast
            } else if first & 0xffc0 == 0xfe80 {
                AddrClass::LinkLocal
            } else if first & 0xfe00 == 0xfc00 || first & 0xffc0 == 0xfec0 {
                // Unique local (fc00::/7) and the old site-local (fec0::/10).
                AddrClass::Private
            } else if first == 0x0064 && v6.segments()[1] == 0xff9b {
                // NAT64 (64:ff9b::/96) reaches the IPv4 address in its last 32 bits.
                let s = v6.segments();
                let [a, b] = s[6].to_be_bytes();
                let [c, d] = s[7].to_be_bytes();
                classify_v4(Ipv4Addr::new(a, b, c, d))
            } else if first == 0x2001 && v6.segments()[1] == 0x0db8 || first == 0x0100 && v6.segments()[1..4] == [0; 3]
            {
                AddrClass::Reserved
            } else {
                AddrClass::Public
            }
        }
    }
}

/// An allowlist entry: an address and prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    /// Parses `a.b.c.d`, `a.b.c.d/n`, an IPv6 address, or `v6/n`.
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let (addr, prefix) = match text.trim().split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text.trim(), None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| format!("{text:?} is not an IP address or CIDR"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p.parse::<u8>().ok().filter(|&p| p <= max).ok_or_else(|| format!("bad prefix in {text:?}"))?,
        };
        Ok(Cidr {
            addr: canonical(addr),
            prefix: if addr.is_ipv6() && canonical(addr).is_ipv4() { prefix.saturating_sub(96) } else { prefix },
        })
    }

    /// True when `ip` (canonicalised) lies in this block.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = if self.prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(self.prefix)) };
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = if self.prefix == 0 { 0 } else { u128::MAX << (128 - u32::from(self.prefix)) };
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// Why a target was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SsrfRefusal {
    #[error("the target host resolved to no address")]
    NoAddress,
    #[error("the target address {addr} is {} and not allowlisted", class.as_str())]
    Refused { addr: IpAddr, class: AddrClass },
}

/// Allows a target only if every address it resolved to is public or allowlisted.
pub fn check_addresses(addrs: &[IpAddr], allowlist: &[Cidr]) -> Result<(), SsrfRefusal> {
    if addrs.is_empty() {
        return Err(SsrfRefusal::NoAddress);
    }
    for &addr in addrs {
        let class = classify(addr);
        if class != AddrClass::Public && !allowlist.iter().any(|cidr| cidr.contains(addr)) {
            return Err(SsrfRefusal::Refused { addr, class });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn private_targets_are_refused() {
        for (addr, class) in [
            ("127.0.0.1", AddrClass::Loopback),
            ("10.1.2.3", AddrClass::Private),
            ("172.16.0.1", AddrClass::Private),
            ("192.168.1.1", AddrClass::Private),
            ("169.254.169.254", AddrClass::LinkLocal),
            ("0.0.0.0", AddrClass::Unspecified),
            ("224.0.0.1", AddrClass::Multicast),
            ("255.255.255.255", AddrClass::Broadcast),
            ("100.64.0.1", AddrClass::Shared),
            ("::1", AddrClass::Loopback),
            ("::", AddrClass::Unspecified),
            ("fe80::1", AddrClass::LinkLocal),
            ("fd00::1", AddrClass::Private),
            ("ff02::1", AddrClass::Multicast),
            ("::ffff:127.0.0.1", AddrClass::Loopback),
            ("::ffff:169.254.169.254", AddrClass::LinkLocal),
            ("::10.0.0.1", AddrClass::Private),
            ("64:ff9b::10.0.0.1", AddrClass::Private),
            ("93.184.216.34", AddrClass::Public),
            ("2606:4700::1111", AddrClass::Public),
            ("::ffff:8.8.8.8", AddrClass::Public),
        ] {
            assert_eq!(classify(ip(addr)), class, "{addr}");
        }
        assert!(check_addresses(&[ip("8.8.8.8"), ip("10.0.0.1")], &[]).is_err(), "one bad address is enough");
        assert_eq!(check_addresses(&[], &[]), Err(SsrfRefusal::NoAddress));
    }

    #[test]
    fn the_allowlist_permits() {
        let allow = [Cidr::parse("127.0.0.1/32").unwrap(), Cidr::parse("fd00::/8").unwrap()];
        assert_eq!(check_addresses(&[ip("127.0.0.1")], &allow), Ok(()));
        assert_eq!(check_addresses(&[ip("::ffff:127.0.0.1")], &allow), Ok(()));
        assert!(check_addresses(&[ip("127.0.0.2")], &allow).is_err());
        assert_eq!(check_addresses(&[ip("fd12::1")], &allow), Ok(()));
        assert!(Cidr::parse("127.0.0.1/33").is_err());
        assert!(Cidr::parse("localhost").is_err());
        assert_eq!(Cidr::parse("::ffff:10.0.0.0/104").unwrap(), Cidr::parse("10.0.0.0/8").unwrap());
    }

    proptest! {
        /// An IPv4 address and its IPv4-mapped IPv6 form are classified alike.
        #[test]
        fn mapped_addresses_classify_as_ipv4(bits in any::<u32>()) {
            let v4 = Ipv4Addr::from(bits);
            prop_assert_eq!(classify(IpAddr::V4(v4)), classify(IpAddr::V6(v4.to_ipv6_mapped())));
        }

        /// Nothing in 10/8, 127/8, 169.254/16 or 192.168/16 passes without an allowlist.
        #[test]
        fn private_blocks_never_pass(block in 0usize..4, rest in any::<u32>()) {
            let (net, bits) = [(0x0a00_0000u32, 8), (0x7f00_0000, 8), (0xa9fe_0000, 16), (0xc0a8_0000, 16)][block];
            let addr = Ipv4Addr::from(net | (rest >> bits));
            prop_assert!(check_addresses(&[IpAddr::V4(addr)], &[]).is_err());
            prop_assert!(check_addresses(&[IpAddr::V6(addr.to_ipv6_mapped())], &[]).is_err());
        }
    }
}
