"""TLS on the hub's HTTP: throwaway certificates (trustme); clients verify the hub against a CA file."""

import subprocess
import sys

import pytest
import torch
import trustme

import tensorhub_verl as th
from tensorhub_verl.errors import ConfigError, HubUnavailable, PlainHttpToTls
from tensorhub_verl.ros.hub.server import HubServer


@pytest.fixture
def pki(tmp_path):
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    paths = {"ca": tmp_path / "ca.pem", "cert": tmp_path / "hub.pem", "key": tmp_path / "hub.key"}
    ca.cert_pem.write_to_path(paths["ca"])
    cert.cert_chain_pems[0].write_to_path(paths["cert"])
    cert.private_key_pem.write_to_path(paths["key"])
    other = trustme.CA()
    paths["other_ca"] = tmp_path / "other.pem"
    other.cert_pem.write_to_path(paths["other_ca"])
    return {k: str(v) for k, v in paths.items()}


def test_a_tls_hub_serves_clients_that_trust_its_ca(pki):
    hub = th.start_hub(token="t", tls_cert=pki["cert"], tls_key=pki["key"])
    try:
        assert hub.url.startswith("https://")
        with th.connect(hub.url, "trainer", token="t", job_key="k", tls_ca_file=pki["ca"]) as trainer, \
                th.connect(hub.url, "reader", token="t", job_key="k", tls_ca_file=pki["ca"]) as reader:
            trainer.publish("policy", 1, {"w": torch.arange(1000.0)})
            assert torch.equal(reader.fetch("policy", 1).buffers["w"], torch.arange(1000.0))
        with pytest.raises(HubUnavailable, match="TLS verification failed"):
            th.connect(hub.url, "mallory", token="t", tls_ca_file=pki["other_ca"])  # a hub it cannot verify
        with pytest.raises(PlainHttpToTls, match="https://"):
            th.connect(hub.url.replace("https://", "http://"), "plain", token="t", hub_retry_s=30.0)
    finally:
        hub.stop()


def test_tls_settings_are_checked(pki):
    with pytest.raises(ConfigError, match="both"):
        HubServer(tls_cert=pki["cert"])
    with pytest.raises(ConfigError, match="does not exist"):
        HubServer(tls_cert=pki["cert"], tls_key=pki["cert"] + ".missing")
    hub = th.start_hub()
    try:
        with pytest.raises(ConfigError, match="not https"):
            th.connect(hub.url, "w", tls_ca_file=pki["ca"])
    finally:
        hub.stop()


def test_the_cli_warns_about_a_token_on_the_command_line():
    process = subprocess.run([sys.executable, "-m", "tensorhub_verl.cli", "hub", "--port", "0", "--token", "x",
                              "--token-file", "/nonexistent"], capture_output=True, text=True, timeout=60)
    assert "visible to every local user" in process.stderr
