//! Istio's mTLS between sidecars, on 127.0.0.1: one mesh CA and a certificate per
//! workload whose URI SAN is its SPIFFE id, `spiffe://cluster.local/ns/NS/sa/SA`, as
//! istiod's CA issues them. A listener that requires a client certificate from the CA
//! ([`MeshCa::downstream`]) is the inbound side of a sidecar; a cluster presenting one
//! ([`MeshCa::upstream`]) is the outbound side. RBAC's `authenticated.principal_name`
//! then matches the caller's SPIFFE id, as in the mesh. The certificates are made by
//! the `openssl` binary, valid for a day, kept in a [`TestDir`].
//!
//! Not rendered: Istio's ALPN values and its peer metadata exchange (Envoy filters
//! that upstream Envoy does not have).

use std::path::PathBuf;
use std::process::Command;

use serde_json::{json, Value};

use crate::process::TestDir;

/// The trust domain of every SPIFFE id.
pub const TRUST_DOMAIN: &str = "cluster.local";

/// A workload's certificate and key.
#[derive(Clone, Debug)]
pub struct Identity {
    /// `spiffe://cluster.local/ns/NS/sa/SA`.
    pub spiffe_id: String,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A mesh CA in its own directory.
pub struct MeshCa {
    dir: TestDir,
    pub cert: PathBuf,
    key: PathBuf,
}

fn openssl(args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run openssl ({e}): install it with `apt-get install -y openssl`")
        });
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn path_str(p: &std::path::Path) -> String {
    p.to_string_lossy().into_owned()
}

impl MeshCa {
    pub fn new() -> MeshCa {
        let dir = TestDir::new("mesh-ca");
        let (cert, key) = (dir.join("ca.crt"), dir.join("ca.key"));
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/O=cluster.local",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            &path_str(&key),
            "-out",
            &path_str(&cert),
        ]);
        MeshCa { dir, cert, key }
    }

    /// The certificate of service account `sa` in namespace `ns`.
    pub fn identity(&self, ns: &str, sa: &str) -> Identity {
        let name = format!("{ns}.{sa}");
        let spiffe_id = format!("spiffe://{TRUST_DOMAIN}/ns/{ns}/sa/{sa}");
        let (cert, key, csr) = (
            self.dir.join(format!("{name}.crt")),
            self.dir.join(format!("{name}.key")),
            self.dir.join(format!("{name}.csr")),
        );
        let ext = self.dir.write(
            &format!("{name}.ext"),
            format!(
                "subjectAltName=URI:{spiffe_id}\nextendedKeyUsage=serverAuth,clientAuth\n\
                 keyUsage=critical,digitalSignature,keyEncipherment\n"
            ),
        );
        openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            "/O=weir-e2e",
            "-keyout",
            &path_str(&key),
            "-out",
            &path_str(&csr),
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            &path_str(&csr),
            "-CA",
            &path_str(&self.cert),
            "-CAkey",
            &path_str(&self.key),
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            &path_str(&ext),
            "-out",
            &path_str(&cert),
        ]);
        Identity {
            spiffe_id,
            cert,
            key,
        }
    }

    fn common(&self, me: &Identity, peer_san: Option<&str>) -> Value {
        let mut validation = json!({ "trusted_ca": { "filename": path_str(&self.cert) } });
        if let Some(san) = peer_san {
            validation["match_typed_subject_alt_names"] =
                json!([{ "san_type": "URI", "matcher": { "exact": san } }]);
        }
        json!({
            "tls_certificates": [{
                "certificate_chain": { "filename": path_str(&me.cert) },
                "private_key": { "filename": path_str(&me.key) },
            }],
            "validation_context": validation,
        })
    }

    /// A listener's `transport_socket`: `me`'s certificate, a client certificate from
    /// this CA required (Istio's STRICT mTLS).
    pub fn downstream(&self, me: &Identity) -> Value {
        json!({
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                "require_client_certificate": true,
                "common_tls_context": self.common(me, None),
            },
        })
    }

    /// A cluster's `transport_socket`: `me`'s certificate presented, the server's
    /// checked to be this CA's and to carry `server`'s SPIFFE id.
    pub fn upstream(&self, me: &Identity, server: &Identity) -> Value {
        json!({
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "common_tls_context": self.common(me, Some(&server.spiffe_id)),
            },
        })
    }
}

impl Default for MeshCa {
    fn default() -> Self {
        MeshCa::new()
    }
}
