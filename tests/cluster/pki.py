"""The test control plane's certificates: one CA, serving certificates for 127.0.0.1, client
certificates for the components, and the service-account signing key (all with `cryptography`)."""
from __future__ import annotations

import datetime
import ipaddress
import pathlib

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID = datetime.timedelta(days=30)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: pathlib.Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _write_cert(path: pathlib.Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


class Pki:
    """Writes `ca.crt`/`ca.key` into `directory` and issues certificates signed by it."""

    def __init__(self, directory: pathlib.Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca_key = _key()
        now = datetime.datetime.now(datetime.timezone.utc)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, 'gpufleet-test-ca')])
        self.ca_cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                        .public_key(self.ca_key.public_key()).serial_number(x509.random_serial_number())
                        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALID)
                        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                     content_commitment=False, key_encipherment=False,
                                                     data_encipherment=False, key_agreement=False,
                                                     encipher_only=False, decipher_only=False), critical=True)
                        .sign(self.ca_key, hashes.SHA256()))
        self.ca_path = self.dir / 'ca.crt'
        _write_cert(self.ca_path, self.ca_cert)
        _write_key(self.dir / 'ca.key', self.ca_key)

    def issue(self, stem: str, common_name: str, organizations: tuple[str, ...] = (), server: bool = False,
              client: bool = True) -> tuple[pathlib.Path, pathlib.Path]:
        """A certificate (`stem.crt`, `stem.key`): a server one valid for 127.0.0.1 and localhost,
        and/or a client one whose CN is the user and whose O entries are its groups."""
        key = _key()
        now = datetime.datetime.now(datetime.timezone.utc)
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (x509.CertificateBuilder().subject_name(x509.Name(attrs)).issuer_name(self.ca_cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALID)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.DNSName('localhost'), x509.DNSName('kubernetes'), x509.DNSName('kubernetes.default.svc'),
                x509.IPAddress(ipaddress.ip_address('127.0.0.1')),
                x509.IPAddress(ipaddress.ip_address('10.43.0.1'))]), critical=False)
        cert = builder.sign(self.ca_key, hashes.SHA256())
        crt, keyp = self.dir / ('%s.crt' % stem), self.dir / ('%s.key' % stem)
        _write_cert(crt, cert)
        _write_key(keyp, key)
        return crt, keyp

    def service_account_keys(self) -> tuple[pathlib.Path, pathlib.Path]:
        """The key pair the API server signs service-account tokens with (`sa.key`, `sa.pub`)."""
        key = _key()
        priv, pub = self.dir / 'sa.key', self.dir / 'sa.pub'
        _write_key(priv, key)
        pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo))
        return priv, pub
