"""Certificates and the admin kubeconfig for the local control plane."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=365)
_SERVING_DNS = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local"]
_SERVING_IPS = ["127.0.0.1", "10.0.0.1"]


ADMIN_GROUPS = ("system:masters", "claimwarden:approvers", "claimwarden:operators")


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(cn: str, *orgs: str) -> x509.Name:
    """A subject: the user `cn` in the groups `orgs` (the apiserver reads each O as a group)."""
    return x509.Name([*(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in orgs),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _signed(subject: x509.Name, key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate | None,
            ca_key: ec.EllipticCurvePrivateKey, extensions: list[tuple[x509.ExtensionType, bool]]
            ) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(subject)
               .issuer_name(ca_cert.subject if ca_cert else subject)
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + _VALIDITY))
    for ext, critical in extensions:
        builder = builder.add_extension(ext, critical=critical)
    return builder.sign(ca_key, hashes.SHA256())


def _usage(*, cert_sign: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=not cert_sign,
                         data_encipherment=False, key_agreement=False, key_cert_sign=cert_sign,
                         crl_sign=cert_sign, encipher_only=False, decipher_only=False)


def write_pki(pki_dir: Path) -> None:
    """Create a CA, the apiserver's serving cert, an admin client cert and the SA signing keys."""
    pki_dir.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_cert = _signed(_name("claimwarden-lab-ca"), ca_key, None, ca_key,
                      [(x509.BasicConstraints(ca=True, path_length=None), True),
                       (_usage(cert_sign=True), True)])
    _write_key(pki_dir / "ca.key", ca_key)
    _write_cert(pki_dir / "ca.crt", ca_cert)

    serving_key = _key()
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in _SERVING_DNS]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in _SERVING_IPS]
    serving = _signed(_name("kube-apiserver"), serving_key, ca_cert, ca_key,
                      [(x509.SubjectAlternativeName(sans), False),
                       (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
                       (_usage(), True)])
    _write_key(pki_dir / "apiserver.key", serving_key)
    _write_cert(pki_dir / "apiserver.crt", serving)

    admin_key = _key()
    # The lab's admin is also the one who approves evictions past the breaker and marks devices (the groups of
    # manifests/approval and manifests/marking), as a cluster's on-call admin would be.
    admin = _signed(_name("admin", *ADMIN_GROUPS), admin_key, ca_cert, ca_key,
                    [(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False), (_usage(), True)])
    _write_key(pki_dir / "admin.key", admin_key)
    _write_cert(pki_dir / "admin.crt", admin)

    sa_key = _key()
    _write_key(pki_dir / "sa.key", sa_key)
    (pki_dir / "sa.pub").write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def write_kubeconfig(path: Path, pki_dir: Path, server: str, *, user: str = "admin") -> None:
    """A kubeconfig for `user` (default the admin) whose certificates are file references into ``pki_dir``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "claimwarden-lab", "cluster": {
            "server": server, "certificate-authority": str(pki_dir / "ca.crt")}}],
        "users": [{"name": user, "user": {
            "client-certificate": str(pki_dir / f"{user}.crt"),
            "client-key": str(pki_dir / f"{user}.key")}}],
        "contexts": [{"name": "claimwarden-lab", "context": {"cluster": "claimwarden-lab", "user": user}}],
        "current-context": "claimwarden-lab",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


def write_user_kubeconfig(path: Path, pki_dir: Path, server: str, *, user: str, groups: tuple[str, ...] = ()) -> None:
    """A person of the lab: a client certificate for `user` in `groups`, signed by the lab's CA, and its kubeconfig.
    Unlike impersonation, any client (kubectl, the plugin) acts as that person with no extra header."""
    ca_key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_cert = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes())
    key = _key()
    cert = _signed(_name(user, *groups), key, ca_cert, ca_key,
                   [(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False), (_usage(), True)])
    _write_key(pki_dir / f"{user}.key", key)
    _write_cert(pki_dir / f"{user}.crt", cert)
    write_kubeconfig(path, pki_dir, server, user=user)
