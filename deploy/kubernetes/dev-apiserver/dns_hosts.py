"""Cluster DNS for the dev kubelet's pods (kubelet.sh), in place of CoreDNS, which Debian does not package.

    python dns_hosts.py --kubeconfig admin.kubeconfig --hosts FILE --dnsmasq-pid PIDFILE

Watches the Endpoints objects of every namespace and writes the names CoreDNS's kubernetes plugin answers for
them into FILE, an `--addn-hosts` file of Debian's dnsmasq, which it then tells to read it again (SIGHUP):
  <service>.<namespace>.svc.cluster.local             every address of the Service's endpoints
  <hostname>.<service>.<namespace>.svc.cluster.local  a pod whose spec sets hostname and subdomain=<service>
                                                      (how a JobSet's or a headless Service's pods are named)
Not-ready addresses are included (the project's Services publish them, and boot.py waits for the name before
the pod is ready). Plain REST with apply.py's client; a watch that ends or fails is started again.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from apply import Api

DOMAIN = "svc.cluster.local"


def records(endpoints: dict[str, Any]) -> list[tuple[str, str]]:
    """(ip, name) for every address of one Endpoints object, as CoreDNS would answer them."""
    meta = endpoints["metadata"]
    service = f"{meta['name']}.{meta['namespace']}.{DOMAIN}"
    out = []
    for subset in endpoints.get("subsets") or []:
        for address in [*(subset.get("addresses") or []), *(subset.get("notReadyAddresses") or [])]:
            out.append((address["ip"], service))
            if address.get("hostname"):
                out.append((address["ip"], f"{address['hostname']}.{service}"))
    return out


def write_hosts(path: Path, objects: dict[str, dict[str, Any]]) -> None:
    lines = sorted({f"{ip} {name}" for obj in objects.values() for ip, name in records(obj)})
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{line}\n" for line in lines))
    os.replace(tmp, path)


def watch(api: Api, hosts: Path, dnsmasq_pid: Path) -> None:
    """List, write, then follow the watch stream from the list's resourceVersion, writing at every event."""
    code, listed = api.call("GET", "/api/v1/endpoints")
    if code != 200:
        raise OSError(f"list endpoints: HTTP {code}")
    objects = {f"{o['metadata']['namespace']}/{o['metadata']['name']}": o for o in listed["items"]}

    def publish() -> None:
        write_hosts(hosts, objects)
        os.kill(int(dnsmasq_pid.read_text()), signal.SIGHUP)

    publish()
    version = listed["metadata"]["resourceVersion"]
    req = urllib.request.Request(f"{api.server}/api/v1/endpoints?watch=1&resourceVersion={version}",
                                 headers={"Authorization": f"Bearer {api.token}"})
    with urllib.request.urlopen(req, context=api.tls, timeout=600) as stream:
        for line in stream:
            event = json.loads(line)
            obj = event["object"]
            if event["type"] == "ERROR":
                return  # e.g. 410 Gone: list again
            key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
            if event["type"] == "DELETED":
                objects.pop(key, None)
            else:
                objects[key] = obj
            publish()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", type=Path, required=True)
    ap.add_argument("--hosts", type=Path, required=True)
    ap.add_argument("--dnsmasq-pid", type=Path, required=True)
    a = ap.parse_args()
    api = Api(a.kubeconfig)
    while True:
        try:
            watch(api, a.hosts, a.dnsmasq_pid)
        except (OSError, urllib.error.URLError, ValueError, KeyError) as e:  # never dies: names would go stale
            print(f"dns_hosts: {e}; watching again in 1 s", flush=True)
            time.sleep(1)


if __name__ == "__main__":
    main()
