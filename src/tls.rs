//! The process's TLS crypto provider. reqwest and rmcp build rustls without
//! one, so capdex installs ring (which async-nats already uses) before any
//! HTTPS client is built; installing twice is harmless.

/// Installs ring as rustls's process-wide default provider, once.
pub fn install_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err means another provider is already the default: that one serves.
        // rustls 0.23.48 deprecates ring's provider (it has no post-quantum key
        // exchange); capdex keeps ring, which async-nats already links, so that
        // a newer rustls in a lock file (the fuzz crate's) builds without warnings.
        #[allow(deprecated)]
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
