//! The SSRF guard: decides on a target's host as written ([`parse_host`],
//! [`check_host`]) and on the addresses a host name resolved to (the shell
//! resolves; the core decides). Private, loopback, link-local, unspecified,
//! multicast, broadcast, shared (CGNAT), reserved and cloud metadata addresses
//! are refused, over IPv4 in every spelling (`2130706433`, `0x7f.1`,
//! `0177.0.0.1`, `127.1`), IPv6, IPv4-mapped/compatible IPv6, NAT64 and 6to4,
//! unless an allowlist entry (a CIDR) contains them; metadata host names
//! (`metadata.google.internal`, ...) are refused by name.

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
    /// A cloud instance-metadata endpoint (`169.254.169.254`, `fd00:ec2::254`, ...).
    Metadata,
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
            AddrClass::Metadata => "a cloud metadata endpoint",
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

/// Instance-metadata addresses of the clouds: AWS, GCP, Azure, OpenStack
/// (`169.254.169.254`), AWS ECS task metadata (`169.254.170.2`), Alibaba
/// (`100.100.100.200`), Oracle (`192.0.0.192`).
const METADATA_V4: [Ipv4Addr; 4] = [
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(169, 254, 170, 2),
    Ipv4Addr::new(100, 100, 100, 200),
    Ipv4Addr::new(192, 0, 0, 192),
];

/// AWS's IPv6 instance-metadata address, `fd00:ec2::254`.
const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254);

/// Host names of metadata endpoints, refused whatever they resolve to.
pub const METADATA_NAMES: &[&str] = &[
    "metadata.google.internal",
    "metadata.goog",
    "metadata",
    "instance-data",
    "instance-data.ec2.internal",
    "metadata.azure.com",
    "metadata.tencentyun.com",
];

fn v4_of(hi: u16, lo: u16) -> Ipv4Addr {
    let [a, b] = hi.to_be_bytes();
    let [c, d] = lo.to_be_bytes();
    Ipv4Addr::new(a, b, c, d)
}

fn classify_v4(ip: Ipv4Addr) -> AddrClass {
    let [a, b, ..] = ip.octets();
    if METADATA_V4.contains(&ip) {
        AddrClass::Metadata
    } else if ip.is_unspecified() || a == 0 {
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
            if v6 == METADATA_V6 {
                AddrClass::Metadata
            } else if v6.is_unspecified() {
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
            } else if first == 0x0064 && v6.segments()[1] == 0xff9b && v6.segments()[2..6] == [0; 4] {
                // NAT64 (64:ff9b::/96) reaches the IPv4 address in its last 32 bits.
                let s = v6.segments();
                classify_v4(v4_of(s[6], s[7]))
            } else if first == 0x2002 {
                // 6to4 (2002::/16) reaches the IPv4 address in its next 32 bits.
                let s = v6.segments();
                match classify_v4(v4_of(s[1], s[2])) {
                    AddrClass::Public => AddrClass::Public,
                    _ => AddrClass::Reserved,
                }
            } else if first == 0x2001 && v6.segments()[1] == 0x0db8
                || first == 0x0100 && v6.segments()[1..4] == [0; 3]
                // Teredo (2001::/32) and local-use NAT64 (64:ff9b:1::/48) hide an IPv4 address.
                || first == 0x2001 && v6.segments()[1] == 0
                || first == 0x0064 && v6.segments()[1] == 0xff9b
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
    #[error("the target host {0} is a cloud metadata endpoint and not allowlisted")]
    MetadataName(String),
    #[error("the target host {0:?} is neither a host name nor an IP address")]
    BadHost(String),
}

/// A target's host, as a connection would read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    /// An IP literal, in any spelling.
    Ip(IpAddr),
    /// A name to resolve (lowercase, without a trailing dot).
    Name(String),
}

/// One part of a numeric IPv4 host: decimal, `0x` hex or `0`-led octal
/// (WHATWG's IPv4 number parser, which is also `inet_aton`'s).
fn ipv4_number(part: &str) -> Option<u64> {
    let (digits, radix) = if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
        (hex, 16)
    } else if part.len() > 1 && part.starts_with('0') {
        (&part[1..], 8)
    } else {
        (part, 10)
    };
    if digits.is_empty() {
        return (radix != 10).then_some(0);
    }
    if digits.len() > 20 || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

/// True when `part` is what WHATWG calls a number: digits, or `0x` and hex digits.
fn looks_numeric(part: &str) -> bool {
    match part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
        Some(hex) => hex.chars().all(|c| c.is_ascii_hexdigit()),
        None => !part.is_empty() && part.chars().all(|c| c.is_ascii_digit()),
    }
}

/// Reads a host as a URL parser or `inet_aton` would: `[v6]` or a bare IPv6
/// address; IPv4 in one to four parts, each decimal, hex or octal, the last
/// filling the remaining bytes (`127.1`, `0x7f000001`, `0177.0.0.1`,
/// `2130706433`); anything whose last label is numeric but is no address is
/// [`SsrfRefusal::BadHost`] (never a name to resolve).
pub fn parse_host(host: &str) -> Result<Host, SsrfRefusal> {
    let bad = || SsrfRefusal::BadHost(host.chars().take(260).collect());
    if host.is_empty() {
        return Err(bad());
    }
    let bracketed = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    if bracketed.is_some() || host.contains(':') {
        let text = bracketed.unwrap_or(host);
        return text.parse::<Ipv6Addr>().map(|v6| Host::Ip(IpAddr::V6(v6))).map_err(|_| bad());
    }
    let trimmed = host.strip_suffix('.').unwrap_or(host);
    let parts: Vec<&str> = trimmed.split('.').collect();
    let last = parts.last().copied().unwrap_or_default();
    if !looks_numeric(last) {
        if trimmed.is_empty() || parts.iter().any(|part| part.is_empty()) {
            return Err(bad());
        }
        return Ok(Host::Name(trimmed.to_ascii_lowercase()));
    }
    if parts.len() > 4 {
        return Err(bad());
    }
    let numbers: Vec<u64> = parts.iter().map(|part| ipv4_number(part)).collect::<Option<_>>().ok_or_else(bad)?;
    let (init, last) = numbers.split_at(numbers.len() - 1);
    if init.iter().any(|&n| n > 255) || last[0] >= 1u64 << (8 * (5 - numbers.len())) {
        return Err(bad());
    }
    let mut value = last[0];
    for (at, &n) in init.iter().enumerate() {
        value += n << (8 * (3 - at));
    }
    Ok(Host::Ip(IpAddr::V4(Ipv4Addr::from(value as u32))))
}

/// Checks a target's host as written, before anything connects: an IP
/// literal (any spelling) must be public or allowlisted, a metadata name is
/// refused; other names answer `Ok(None)` and are checked on the addresses
/// they resolve to ([`check_addresses`]).
pub fn check_host(host: &str, allowlist: &[Cidr]) -> Result<Option<IpAddr>, SsrfRefusal> {
    match parse_host(host)? {
        Host::Ip(ip) => check_addresses(&[ip], allowlist).map(|()| Some(ip)),
        Host::Name(name) if METADATA_NAMES.contains(&name.as_str()) => Err(SsrfRefusal::MetadataName(name)),
        Host::Name(_) => Ok(None),
    }
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
            ("169.254.169.254", AddrClass::Metadata),
            ("169.254.1.1", AddrClass::LinkLocal),
            ("fd00:ec2::254", AddrClass::Metadata),
            ("100.100.100.200", AddrClass::Metadata),
            ("2002:7f00:1::", AddrClass::Reserved),
            ("2002:0808:0808::1", AddrClass::Public),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", AddrClass::Reserved),
            ("64:ff9b::7f00:1", AddrClass::Loopback),
            ("64:ff9b:1::a00:1", AddrClass::Reserved),
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
            ("::ffff:169.254.169.254", AddrClass::Metadata),
            ("::ffff:7f00:1", AddrClass::Loopback),
            ("::7f00:1", AddrClass::Loopback),
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

    fn host_ip(text: &str) -> Result<IpAddr, SsrfRefusal> {
        match parse_host(text)? {
            Host::Ip(ip) => Ok(ip),
            Host::Name(name) => panic!("{text} read as the name {name}"),
        }
    }

    #[test]
    fn every_ipv4_spelling_reads_as_its_address() {
        let loopback = ip("127.0.0.1");
        for text in [
            "127.0.0.1",
            "127.0.0.1.",
            "2130706433",
            "0x7f000001",
            "0X7F000001",
            "0x7f.1",
            "0x7f.0.0.1",
            "0177.0.0.1",
            "0177.1",
            "127.1",
            "127.0.1",
            "0x7f.0x0.0x0.0x1",
            "017700000001",
            "00000000177.0.0.01",
        ] {
            assert_eq!(host_ip(text), Ok(loopback), "{text}");
            assert!(check_host(text, &[]).is_err(), "{text}");
        }
        assert_eq!(host_ip("10.1"), Ok(ip("10.0.0.1")));
        assert_eq!(host_ip("0"), Ok(ip("0.0.0.0")));
        assert_eq!(host_ip("0x"), Ok(ip("0.0.0.0")));
        assert_eq!(host_ip("2852039166"), Ok(ip("169.254.169.254")));
        assert_eq!(host_ip("[::ffff:127.0.0.1]"), Ok(ip("::ffff:127.0.0.1")));
        assert_eq!(host_ip("[::ffff:7f00:1]"), Ok(ip("::ffff:127.0.0.1")));
        assert_eq!(host_ip("[fd00:ec2::254]"), Ok(ip("fd00:ec2::254")));
        for bad in [
            "256.0.0.1",
            "1.2.3.4.5",
            "0x100.1",
            "127.16777216",
            "08.0.0.1",
            "0x7g.1",
            "1..1",
            "",
            ".",
            "[::1",
            "[fe80::1%25eth0]",
            "99999999999999999999999",
            "1.2.3.4.5.6.7",
        ] {
            assert!(matches!(parse_host(bad), Err(SsrfRefusal::BadHost(_))), "{bad:?} gave {:?}", parse_host(bad));
        }
        assert_eq!(parse_host("Example.COM."), Ok(Host::Name("example.com".into())));
        assert_eq!(parse_host("1.2.3.example"), Ok(Host::Name("1.2.3.example".into())));
        assert_eq!(parse_host("0x7f.example"), Ok(Host::Name("0x7f.example".into())));
        for name in ["metadata.google.internal", "METADATA.GOOGLE.INTERNAL.", "metadata", "instance-data"] {
            assert!(matches!(check_host(name, &[]), Err(SsrfRefusal::MetadataName(_))), "{name}");
        }
        assert_eq!(check_host("api.example.com", &[]), Ok(None), "names are judged on what they resolve to");
        assert_eq!(check_host("8.8.8.8", &[]), Ok(Some(ip("8.8.8.8"))));
        let allow = [Cidr::parse("127.0.0.1/32").unwrap()];
        assert_eq!(check_host("0x7f.1", &allow), Ok(Some(loopback)), "allowlisted in any spelling");
        assert!(check_host("169.254.169.254", &[]).unwrap_err().to_string().contains("metadata"));
    }

    /// Spells `addr` with `parts` parts (1 to 4), each in its radix (0 decimal,
    /// 1 hex, 2 octal, 3 upper-case hex), with or without a trailing dot.
    fn spell(addr: u32, parts: usize, radixes: [u8; 4], trailing_dot: bool) -> String {
        let bytes = addr.to_be_bytes();
        let mut numbers: Vec<u64> = bytes[..parts - 1].iter().map(|&b| u64::from(b)).collect();
        numbers.push(u64::from(addr) & ((1u64 << (8 * (5 - parts))) - 1));
        let text: Vec<String> = numbers
            .iter()
            .zip(radixes)
            .map(|(&n, radix)| match radix {
                0 => n.to_string(),
                1 => format!("0x{n:x}"),
                2 => format!("0{n:o}"),
                _ => format!("0X{n:X}"),
            })
            .collect();
        let mut text = text.join(".");
        if trailing_dot {
            text.push('.');
        }
        text
    }

    proptest! {
        /// Every spelling of an address in a refused block reads as that address and is refused.
        #[test]
        fn every_spelling_of_a_blocked_ipv4_address_is_refused(
            block in 0usize..9,
            rest in any::<u32>(),
            parts in 1usize..=4,
            radixes in any::<[u8; 4]>(),
            trailing_dot in any::<bool>(),
        ) {
            // loopback, 10/8, 172.16/12, 192.168/16, link-local, CGNAT, 0/8, multicast, reserved 240/4.
            let (net, bits) = [
                (0x7f00_0000u32, 8), (0x0a00_0000, 8), (0xac10_0000, 12), (0xc0a8_0000, 16), (0xa9fe_0000, 16),
                (0x6440_0000, 10), (0, 8), (0xe000_0000, 4), (0xf000_0000, 4),
            ][block];
            let addr = net | (rest >> bits);
            let text = spell(addr, parts, radixes.map(|r| r % 4), trailing_dot);
            prop_assert_eq!(host_ip(&text), Ok(IpAddr::V4(Ipv4Addr::from(addr))), "{}", text);
            prop_assert!(check_host(&text, &[]).is_err(), "{} passed", text);
            let mapped = format!("[::ffff:{}]", Ipv4Addr::from(addr));
            prop_assert!(check_host(&mapped, &[]).is_err(), "{} passed", mapped);
            let nat64 = format!("[64:ff9b::{}]", Ipv4Addr::from(addr));
            prop_assert!(check_host(&nat64, &[]).is_err(), "{} passed", nat64);
        }

        /// Any address, public or not, in any spelling, reads as the same address.
        #[test]
        fn any_spelling_maps_to_the_same_address(
            addr in any::<u32>(),
            parts in 1usize..=4,
            radixes in any::<[u8; 4]>(),
            trailing_dot in any::<bool>(),
        ) {
            let text = spell(addr, parts, radixes.map(|r| r % 4), trailing_dot);
            let expected = IpAddr::V4(Ipv4Addr::from(addr));
            prop_assert_eq!(host_ip(&text), Ok(expected));
            if classify(expected) == AddrClass::Public {
                prop_assert_eq!(check_host(&text, &[]), Ok(Some(expected)));
            }
        }

        /// No text makes the host parser panic, and a name is never numeric at its end.
        #[test]
        fn hosts_never_panic(text in r"[0-9a-fA-FxX.:\[\]%]{0,30}") {
            if let Ok(Host::Name(name)) = parse_host(&text) {
                prop_assert!(!looks_numeric(name.rsplit('.').next().unwrap_or_default()));
            }
        }

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
