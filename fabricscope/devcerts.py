"""A local certificate authority and a server certificate for the demo stack and tests.

The sidecar refuses to serve without TLS unless told `--insecure-no-tls`; the demo keeps
TLS on by minting, once per work directory, a CA (ca.pem) and a certificate for
127.0.0.1/localhost signed by it (server.pem, server-key.pem). Clients trust ca.pem:
`curl --cacert ca.pem https://127.0.0.1:19500/...`. Never for production: the CA key sits
next to the certificate it signs.
"""
from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from fabricscope.atomicfile import write_atomically

VALID_DAYS = 30
# Re-mint when the certificate would expire within this long.
RENEW_BEFORE = dt.timedelta(days=2)


@dataclass(frozen=True)
class DevCerts:
    ca: Path
    cert: Path
    key: Path


def ensure_dev_certs(directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> DevCerts:
    """The CA and server certificate in `directory`, minted if missing or expiring."""
    directory = Path(directory)
    certs = DevCerts(directory / "ca.pem", directory / "server.pem", directory / "server-key.pem")
    if all(p.exists() for p in (certs.ca, certs.cert, certs.key)) and _still_valid(certs.cert, hosts):
        return certs
    # cryptography comes with the sidecar extra; imported here so that importing the stack
    # (e.g. `fabricscope stack --help` from a core install) does not need it.
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fabricscope demo CA")])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=VALID_DAYS))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))
    server_key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.IPAddress(ipaddress.ip_address(h)) if _is_ip(h) else x509.DNSName(h) for h in hosts]
    server_cert = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
                   .issuer_name(ca_name).public_key(server_key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5))
                   .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
                   .add_extension(x509.SubjectAlternativeName(names), critical=False)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                   .sign(ca_key, hashes.SHA256()))
    write_atomically(certs.ca, ca_cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    write_atomically(certs.cert, server_cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    write_atomically(certs.key, server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()), mode=0o600)
    return certs


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def _still_valid(cert_path: Path, hosts: tuple[str, ...]) -> bool:
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return False
    present = {str(v) for v in names.get_values_for_type(x509.IPAddress)} | \
        set(names.get_values_for_type(x509.DNSName))
    fresh = cert.not_valid_after_utc - dt.datetime.now(dt.timezone.utc) > RENEW_BEFORE
    return fresh and set(hosts) <= present
