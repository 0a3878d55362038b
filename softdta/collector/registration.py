"""A collector's membership in a fleet: its advertisement (core.fleet.Member) kept under a lease at
/softdta/<fleet>/members/<name> (docs/fleet.md, "Control plane on etcd")."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

from softdta.collector.config import CollectorConfig
from softdta.core.fleet import MEMBERS, SLOT_MAP, FleetError, Member, SlotMap, fleet_prefix
from softdta.etcd.client import Etcd, EtcdUnavailable
from softdta.etcd.lease import KeptKey
from softdta.wire.frames import ip_str, mac_str

DEFAULT_LEASE_TTL_S = 5
UNSPECIFIED_HOSTS = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class FleetSettings:
    """`softdta collector up --etcd URL --fleet NAME [--weight W] [--lease-ttl S]`."""

    etcd: str
    fleet: str
    weight: float = 1.0
    lease_ttl: int = DEFAULT_LEASE_TTL_S

    def validate(self) -> None:
        if not self.fleet or "/" in self.fleet:
            raise FleetError(f"fleet name {self.fleet!r} must be non-empty and without '/'; give --fleet NAME")
        Etcd(self.etcd)  # a URL that is not http://HOST:PORT is refused now, not once the collector runs
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise FleetError(f"--weight {self.weight} must be a positive number")
        if self.lease_ttl < 2:
            raise FleetError(f"--lease-ttl {self.lease_ttl} is below etcd's shortest lease, 2 s; give 2 or more")


def layout_fingerprint(config: CollectorConfig) -> str:
    """What translators lay their writes out by: each region's name, advertised fields and size. Another
    fingerprint under the same name means the collector came back with other regions."""
    regions = [[spec.name, dict(spec.advertised()), spec.length, spec.ring_bytes] for spec in config.regions()]
    return hashlib.sha256(json.dumps(regions, sort_keys=True).encode()).hexdigest()[:16]


def member_of(config: CollectorConfig, *, control_host: str, query_host: str, weight: float) -> Member:
    """The collector's advertisement; a service listening on every address is advertised at the collector's IP."""
    ip = ip_str(config.ip)
    control = ip if control_host in UNSPECIFIED_HOSTS else control_host
    query = ip if query_host in UNSPECIFIED_HOSTS else query_host
    return Member(config.name, ip, mac_str(config.mac), f"{control}:{config.control_port}",
                  f"http://{query}:{config.query_port}", weight, layout_fingerprint(config))


def register(config: CollectorConfig, settings: FleetSettings, *, control_host: str, query_host: str) -> KeptKey:
    """Start keeping the collector's membership (a thread); `close()` it at stop to leave at once."""
    settings.validate()
    member = member_of(config, control_host=control_host, query_host=query_host, weight=settings.weight)
    key = fleet_prefix(settings.fleet) + MEMBERS + member.name
    return KeptKey(Etcd(settings.etcd), key, member.to_json(), settings.lease_ttl,
                   what=f"collector {member.name} in fleet {settings.fleet}").start()


def current_epoch(settings: FleetSettings, known: int) -> int:
    """The epoch of the fleet's slot map in etcd (what the collector stamps on exported telemetry); `known` while
    etcd does not answer or holds no valid map."""
    try:
        value = Etcd(settings.etcd, timeout=1.0).get(fleet_prefix(settings.fleet) + SLOT_MAP)
        return SlotMap.from_json(value.value).epoch if value is not None else known
    except (EtcdUnavailable, FleetError):
        return known
