"""Webhook endpoints may not point into the server's own network (docs/security.md, "Outbound
requests"): a private, loopback or link-local target — by address or by what its name resolves
to, IPv4 and IPv6, ``localhost`` — is refused when registered and again before each delivery,
unless the operator added it with ``--allow-private``; a checked endpoint is sent to at the
address that was checked. The rule is app/addresses.py's, one for every outbound URL."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest

from app.addresses import IPAddress, PrivateTarget, address_reason, check_url, pinned
from app.api.app import create_app
from app.cli import main
from app.config import Settings, get_settings
from app.service.webhooks import WebhookWorker
from app.store.stores import Stores

PRIVATE_URLS = [
    "http://127.0.0.1:8080/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://[::1]/hook",
    "http://localhost:6379/",
    "http://api.localhost/",
    "http://10.1.2.3/",
    "http://172.16.0.1/",
    "http://192.168.1.10/",
    "http://100.64.0.1/",
    "http://0.0.0.0:8000/",
    "http://[fe80::1]/",
    "http://[fd00::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 of 169.254.169.254
    "http://[2002:7f00:1::]/",  # 6to4 of 127.0.0.1
]


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("10.0.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.0.1", "private"),
        ("fc00::1", "private"),
        ("100.64.0.1", "shared"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("::ffff:10.0.0.1", "private"),
        ("64:ff9b::7f00:1", "loopback"),
        ("93.184.216.34", None),
        ("2606:4700:4700::1111", None),
        ("::ffff:93.184.216.34", None),
    ],
)
def test_the_address_rule(address: str, reason: str | None) -> None:
    assert address_reason(ipaddress.ip_address(address)) == reason


def _resolver(table: dict[str, list[str]]) -> Any:
    async def resolve(host: str, port: int) -> Sequence[IPAddress]:
        if host not in table:
            raise OSError(f"[Errno -2] Name or service not known: {host!r}")
        return [ipaddress.ip_address(a) for a in table[host]]

    return resolve


async def test_names_are_judged_by_every_address_they_resolve_to() -> None:
    resolve = _resolver(
        {
            "hooks.example.com": ["93.184.216.34", "2606:2800:220:1::1"],
            "internal.example.com": ["10.0.0.5"],
            "both.example.com": ["93.184.216.34", "127.0.0.1"],
        }
    )
    target = await check_url("https://hooks.example.com/in", allow_private=False, resolver=resolve)
    assert target.addresses[0] == ipaddress.ip_address("93.184.216.34")
    for url, reason in [
        ("http://internal.example.com/", "private"),
        ("http://both.example.com/", "loopback"),
        ("http://nowhere.example.com/", "unresolved"),
    ]:
        with pytest.raises(PrivateTarget) as refused:
            await check_url(url, allow_private=False, resolver=resolve)
        assert refused.value.reason == reason
    for url in PRIVATE_URLS:
        with pytest.raises(PrivateTarget):
            await check_url(url, allow_private=False, resolver=resolve)
        assert (await check_url(url, allow_private=True, resolver=resolve)).addresses == ()


async def test_a_checked_target_is_sent_to_at_the_address_checked() -> None:
    resolve = _resolver({"hooks.example.com": ["93.184.216.34"], "six.example.com": ["2606::1"]})
    target = await check_url(
        "https://hooks.example.com:8443/in?x=1", allow_private=False, resolver=resolve
    )
    assert pinned(target) == (
        "https://93.184.216.34:8443/in?x=1",
        {"host": "hooks.example.com:8443"},
        {"sni_hostname": "hooks.example.com"},
    )
    six = await check_url("http://six.example.com/in", allow_private=False, resolver=resolve)
    assert pinned(six) == ("http://[2606::1]/in", {"host": "six.example.com"}, {})


# --- registering: carryover webhooks add ------------------------------------------------------


@pytest.fixture
def cli_database(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for name in [n for n in os.environ if n.startswith("CARRYOVER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("CARRYOVER_DATABASE_URL", database_url)
    get_settings.cache_clear()
    yield database_url
    get_settings.cache_clear()


@pytest.mark.parametrize("url", PRIVATE_URLS[:4])
def test_adding_a_private_target_is_refused_without_allow_private(
    cli_database: str, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["webhooks", "add", "--tenant", "acme", url]) == 2
    err = capsys.readouterr().err
    assert "--allow-private" in err and "private target" in err
    assert main(["webhooks", "list"]) == 0
    assert url not in capsys.readouterr().out  # nothing was registered

    assert main(["webhooks", "add", "--tenant", "acme", url, "--allow-private"]) == 0
    assert "secret: whsec_" in capsys.readouterr().out
    assert main(["webhooks", "list"]) == 0
    assert url in capsys.readouterr().out


# --- delivering ------------------------------------------------------------------------------


async def _delivery_of_one_run(
    database_url: str, url: str, allow_private: bool, resolve: Any
) -> tuple[list[httpx.Request], str | None]:
    """One run's webhook to ``url``, delivered once by a worker whose HTTP client records what
    it was asked to send (and answers 204)."""
    settings = Settings(
        database_url=database_url, webhook_worker=False, webhook_backoff_seconds=3600
    )
    app = create_app(settings)
    sent: list[httpx.Request] = []
    async with app.router.lifespan_context(app):
        stores: Stores = app.state.services.stores
        hook = await stores.webhooks.add_webhook(
            "default", url, ["run.completed"], allow_private=allow_private
        )
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://carryover.test") as http:
            conv = (await http.post("/conversations", json={})).json()["id"]
            ran = await http.post(f"/conversations/{conv}/runs", json={"prompts": ["hi"]})
            assert ran.status_code == 201
        worker = WebhookWorker(stores, settings, app.state.services.runs.clock, lambda r: {})
        worker.resolver = resolve
        worker._http = httpx.AsyncClient(
            transport=httpx.MockTransport(
                lambda request: (sent.append(request), httpx.Response(204))[1]
            )
        )
        try:
            assert await worker.deliver_due() == 1
        finally:
            await worker._http.aclose()
        [delivery] = await stores.webhooks.list_deliveries(webhook_id=hook.id)
        await stores.webhooks.remove_webhook(hook.id)  # the next call of the test has its own
    return sent, delivery.last_error


async def test_a_private_target_is_not_delivered_to(database_url: str) -> None:
    # registered while the name pointed elsewhere; it resolves to this machine now
    resolve = _resolver({"hooks.example.com": ["127.0.0.1"]})
    for url in ("http://127.0.0.1:9/hook", "http://hooks.example.com/hook"):
        sent, error = await _delivery_of_one_run(database_url, url, False, resolve)
        assert sent == []
        assert error is not None and error.startswith("refused:") and "loopback" in error


async def test_delivery_goes_to_the_checked_address_or_as_allowed(database_url: str) -> None:
    resolve = _resolver({"hooks.example.com": ["93.184.216.34"]})
    sent, error = await _delivery_of_one_run(
        database_url, "https://hooks.example.com/hook", False, resolve
    )
    assert error is None and len(sent) == 1
    assert sent[0].url == "https://93.184.216.34/hook"
    assert sent[0].headers["host"] == "hooks.example.com"
    assert sent[0].extensions["sni_hostname"] == "hooks.example.com"

    sent, error = await _delivery_of_one_run(database_url, "http://127.0.0.1:9/hook", True, resolve)
    assert error is None and [str(r.url) for r in sent] == ["http://127.0.0.1:9/hook"]
