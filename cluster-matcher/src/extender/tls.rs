//! TLS for the extender's server, with client certificates required: the scheduler verbs
//! (`filter`, `prioritize`, `bind`) place and bind pods, so only kube-scheduler, presenting a
//! certificate the operator's client CA signed (its extender `tlsConfig.certFile`/`keyFile`),
//! may reach them; every other client is refused at the handshake.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

/// A client verifier that also requires the certificate to name one of `names` (a DNS subject
/// alternative name): a CA that signs for others too (a shared issuer) then gives them no way
/// to `bind`.
#[derive(Debug)]
struct NamedClients {
    inner: Arc<dyn ClientCertVerifier>,
    names: Vec<ServerName<'static>>,
}

impl ClientCertVerifier for NamedClients {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }
    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }
    fn verify_client_cert(
        &self, end_entity: &CertificateDer<'_>, intermediates: &[CertificateDer<'_>], now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self.inner.verify_client_cert(end_entity, intermediates, now)?;
        let cert = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|e| rustls::Error::InvalidCertificate(rustls::CertificateError::Other(rustls::OtherError(Arc::new(e)))))?;
        if self.names.iter().any(|n| cert.verify_is_valid_for_subject_name(n).is_ok()) {
            Ok(verified)
        } else {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
        }
    }
    fn verify_tls12_signature(
        &self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The files the server's TLS is made of (PEM), and the names a client certificate must carry.
#[derive(Debug, Clone)]
pub struct TlsFiles<'a> {
    /// DNS names (subject alternative names) of which a client's certificate must carry one
    /// (`--client-name`); empty: any certificate `client_ca` signed.
    pub client_names: &'a [String],
    /// The server's certificate chain, leaf first.
    pub cert: &'a Path,
    /// The server certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: &'a Path,
    /// The CA certificates a client's certificate must chain to.
    pub client_ca: &'a Path,
}

fn certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let bad = |e: rustls_pki_types::pem::Error| format!("{what} {}: {e}", path.display());
    let certs = CertificateDer::pem_file_iter(path).map_err(bad)?.collect::<Result<Vec<_>, _>>().map_err(bad)?;
    if certs.is_empty() {
        return Err(format!("{what} {}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

/// The server's TLS configuration: its certificate and key, and a verifier that requires
/// every client to present a certificate chaining to `client_ca` (TLS 1.2 and 1.3, ring).
/// Each error names the file and what is wrong with it.
pub fn server_config(files: &TlsFiles<'_>) -> Result<Arc<ServerConfig>, String> {
    let chain = certs(files.cert, "--tls-cert")?;
    let key = PrivateKeyDer::from_pem_file(files.key).map_err(|e| format!("--tls-key {}: {e}", files.key.display()))?;
    let mut roots = RootCertStore::empty();
    for c in certs(files.client_ca, "--client-ca")? {
        roots.add(c).map_err(|e| format!("--client-ca {}: {e}", files.client_ca.display()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain_verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| format!("--client-ca {}: {e}", files.client_ca.display()))?;
    let names = files
        .client_names
        .iter()
        .map(|n| ServerName::try_from(n.clone()).map_err(|e| format!("--client-name {n:?}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let verifier: Arc<dyn ClientCertVerifier> =
        if names.is_empty() { chain_verifier } else { Arc::new(NamedClients { inner: chain_verifier, names }) };
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| format!("--tls-cert {} with --tls-key {}: {e}", files.cert.display(), files.key.display()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tls").join(name)
    }

    #[test]
    fn the_fixtures_make_a_config() {
        let (cert, key, ca) = (fixture("server.crt"), fixture("server.key"), fixture("client-ca.crt"));
        server_config(&TlsFiles { cert: &cert, key: &key, client_ca: &ca, client_names: &[] }).unwrap();
        let names = ["xshare-scheduler".to_string()];
        server_config(&TlsFiles { cert: &cert, key: &key, client_ca: &ca, client_names: &names }).unwrap();
    }

    #[test]
    fn each_bad_file_is_named() {
        let (cert, key, ca) = (fixture("server.crt"), fixture("server.key"), fixture("client-ca.crt"));
        let missing = fixture("nothing-here.pem");
        let err = |files: TlsFiles<'_>| server_config(&files).map(|_| ()).unwrap_err();
        let e = err(TlsFiles { cert: &missing, key: &key, client_ca: &ca, client_names: &[] });
        assert!(e.starts_with("--tls-cert ") && e.contains("nothing-here.pem"), "{e}");
        // A key file given as the certificate: no certificate in it.
        let e = err(TlsFiles { cert: &key, key: &key, client_ca: &ca, client_names: &[] });
        assert!(e.contains("no PEM certificate"), "{e}");
        let e = err(TlsFiles { cert: &cert, key: &cert, client_ca: &ca, client_names: &[] });
        assert!(e.starts_with("--tls-key "), "{e}");
        let e = err(TlsFiles { cert: &cert, key: &key, client_ca: &missing, client_names: &[] });
        assert!(e.starts_with("--client-ca "), "{e}");
        // The key of another certificate.
        let other = fixture("scheduler.key");
        let e = err(TlsFiles { cert: &cert, key: &other, client_ca: &ca, client_names: &[] });
        assert!(e.contains("--tls-cert") && e.contains("--tls-key"), "{e}");
        let bad = ["not a name!".to_string()];
        let e = err(TlsFiles { cert: &cert, key: &key, client_ca: &ca, client_names: &bad });
        assert!(e.starts_with("--client-name"), "{e}");
    }
}
