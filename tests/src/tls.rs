//! TLS for the tests, on the OpenSSL the binaries link: a certificate
//! authority of the test's own that signs server certificates for the names
//! and addresses a test gives, and a listener that serves TLS with one of
//! them, recording the handshakes that fail.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};

use openssl::asn1::{Asn1Integer, Asn1Time};
use openssl::bn::BigNum;
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::x509::extension::{
    AuthorityKeyIdentifier, BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName,
    SubjectKeyIdentifier,
};
use openssl::x509::{X509, X509Builder, X509Name, X509NameBuilder, X509NameRef};
use tokio::net::{TcpListener, TcpStream};
use tokio_native_tls::native_tls::{Identity, TlsAcceptor};
use tokio_native_tls::{TlsStream, native_tls};

/// A name a server certificate is issued for.
#[derive(Debug, Clone)]
pub enum SubjectName {
    Dns(String),
    Ip(IpAddr),
}

/// A certificate authority that exists only in the test: trusted by whoever
/// is handed [`Authority::pem`].
#[derive(Debug)]
pub struct Authority {
    key: PKey<Private>,
    certificate: X509,
}

/// A fresh P-256 key.
fn new_key() -> PKey<Private> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap()
}

fn common_name(text: &str) -> X509Name {
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_nid(Nid::COMMONNAME, text).unwrap();
    name.build()
}

/// A random serial number, as RFC 5280 asks of an issuer.
fn serial() -> Asn1Integer {
    let mut serial = BigNum::new().unwrap();
    serial
        .rand(127, openssl::bn::MsbOption::MAYBE_ZERO, false)
        .unwrap();
    serial.to_asn1_integer().unwrap()
}

/// A builder of a certificate valid from a minute ago for a day.
fn builder(subject: &X509NameRef, issuer: &X509NameRef, key: &PKey<Private>) -> X509Builder {
    let mut builder = X509Builder::new().unwrap();
    builder.set_version(2).unwrap();
    builder.set_serial_number(&serial()).unwrap();
    builder.set_subject_name(subject).unwrap();
    builder.set_issuer_name(issuer).unwrap();
    builder.set_pubkey(key).unwrap();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    builder
        .set_not_before(&Asn1Time::from_unix(now - 60).unwrap())
        .unwrap();
    builder
        .set_not_after(&Asn1Time::days_from_now(1).unwrap())
        .unwrap();
    builder
}

impl Authority {
    /// A self-signed authority called `name`.
    pub fn new(name: &str) -> Self {
        let key = new_key();
        let name = common_name(name);
        let mut builder = builder(&name, &name, &key);
        builder
            .append_extension(BasicConstraints::new().critical().ca().build().unwrap())
            .unwrap();
        builder
            .append_extension(
                KeyUsage::new()
                    .critical()
                    .key_cert_sign()
                    .crl_sign()
                    .build()
                    .unwrap(),
            )
            .unwrap();
        let identifier = SubjectKeyIdentifier::new()
            .build(&builder.x509v3_context(None, None))
            .unwrap();
        builder.append_extension(identifier).unwrap();
        builder.sign(&key, MessageDigest::sha256()).unwrap();
        Self {
            key,
            certificate: builder.build(),
        }
    }

    /// The authority's certificate in PEM, as `SSL_CERT_FILE` takes it.
    pub fn pem(&self) -> Vec<u8> {
        self.certificate.to_pem().unwrap()
    }

    /// A server certificate for `names`, signed by this authority, with its key.
    pub fn issue(&self, names: &[SubjectName]) -> Identity {
        let key = new_key();
        let subject = common_name("skyport test server");
        let mut builder = builder(&subject, self.certificate.subject_name(), &key);
        builder
            .append_extension(BasicConstraints::new().critical().build().unwrap())
            .unwrap();
        builder
            .append_extension(
                KeyUsage::new()
                    .critical()
                    .digital_signature()
                    .build()
                    .unwrap(),
            )
            .unwrap();
        builder
            .append_extension(ExtendedKeyUsage::new().server_auth().build().unwrap())
            .unwrap();
        let mut alternative = SubjectAlternativeName::new();
        for name in names {
            match name {
                SubjectName::Dns(dns) => alternative.dns(dns),
                SubjectName::Ip(ip) => alternative.ip(&ip.to_string()),
            };
        }
        let context = builder.x509v3_context(Some(&self.certificate), None);
        let alternative = alternative.build(&context).unwrap();
        let authority_key = AuthorityKeyIdentifier::new()
            .keyid(true)
            .build(&context)
            .unwrap();
        builder.append_extension(alternative).unwrap();
        builder.append_extension(authority_key).unwrap();
        builder.sign(&self.key, MessageDigest::sha256()).unwrap();
        let certificate = builder.build().to_pem().unwrap();
        let key = key.private_key_to_pem_pkcs8().unwrap();
        Identity::from_pkcs8(&certificate, &key).unwrap()
    }
}

/// A TCP listener that serves TLS with one identity; a connection whose
/// handshake fails is dropped and its error kept ([`TlsListener::failures`]).
#[derive(Debug)]
pub struct TlsListener {
    tcp: TcpListener,
    acceptor: tokio_native_tls::TlsAcceptor,
    failures: Arc<Mutex<Vec<String>>>,
}

impl TlsListener {
    /// Listens on `ip`, port 0, presenting `identity`.
    pub async fn bind(ip: IpAddr, identity: Identity) -> Self {
        let tcp = TcpListener::bind(SocketAddr::new(ip, 0)).await.unwrap();
        let acceptor = TlsAcceptor::builder(identity)
            .min_protocol_version(Some(native_tls::Protocol::Tlsv12))
            .build()
            .unwrap();
        Self {
            tcp,
            acceptor: acceptor.into(),
            failures: Arc::default(),
        }
    }

    /// The failed handshakes' errors, shared with the listener.
    pub fn failures(&self) -> Arc<Mutex<Vec<String>>> {
        Arc::clone(&self.failures)
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, peer)) = self.tcp.accept().await else {
                // Out of descriptors, most likely: let some close.
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            };
            match self.acceptor.accept(stream).await {
                Ok(tls) => return (tls, peer),
                Err(error) => self
                    .failures
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(error.to_string()),
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}
