"""The lab reboot path: what a reboot (or a driver reload) does to an emulated lab node.

    python lab_node.py <lab dir> reboot|reload <node>

Used by the node_upgrade and rollback roles when `*_activation: lab` (never on real hosts):

1. the NVML stand-in state follows the install root: its driver version is rewritten from
   `dpkg-query` of the node's root (what loading the installed kernel module does);
2. the Node's driver labels follow, as GPU Feature Discovery relabels a real node;
3. `reboot` marks the Node NotReady and then Ready again (a simulated reboot: no sleep), except for
   nodes listed in lab.json `stuck` (they stay NotReady: a node that does not come back);
4. on the node named in lab.json `fault`, when the NEW driver came up, a critical Xid 79
   ("GPU has fallen off the bus") is appended to the node's kernel log: the lab's injected fault
   (`fault_kind: xid`, the default; with `fault_kind: temperature` the DCGM stand-in reports a hot
   GPU instead, tests/tools/lab_dcgm.py);
5. the node's dcgm-exporter restarts with the driver (`dcgm.since`, the time from which the DCGM
   stand-in counts Xids) and, when the lab runs Prometheus (lab.json `prometheus`), the hook waits
   (bounded) until Prometheus has scraped the node as it now is, so a metric gate that follows
   sees the new driver, as it would once a real node's dcgm-exporter pod is back.

Prints one JSON line: {"changed": true, "driver": ..., "ready": ..., "fault": ..., "scraped": ...}.
"""
from __future__ import annotations

import datetime
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request

SCRAPE_TIMEOUT = 15.0   # seconds the hook waits for Prometheus to scrape the node after the change

# This hook runs on every lab activation, so it stays light: no kubernetes client, no pytest; the
# API is the emulator's plain HTTP on loopback, and only the driver_version line of the stand-in's
# state file changes (tests/tools/nvml_stub/README.md).


def installed_driver(root: pathlib.Path) -> str | None:
    """The upstream version of the driver package installed under `root` (dpkg-query)."""
    out = subprocess.run(['dpkg-query', '--admindir=%s/var/lib/dpkg' % root, '-W', '-f=${Version} ${db:Status-Abbrev}',
                          'nvidia-driver-580-server'], capture_output=True, text=True, check=False)
    parts = out.stdout.split()
    if out.returncode != 0 or len(parts) < 2 or parts[1] not in ('ii', 'hi'):
        return None
    return parts[0].split('-', 1)[0]


def _patch(api: str, path: str, body: dict) -> None:
    req = urllib.request.Request(api + path, data=json.dumps(body).encode(), method='PATCH',
                                 headers={'Content-Type': 'application/merge-patch+json'})
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()


def _ready_patch(ready: bool) -> dict:
    now = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')
    return {'status': {'conditions': [{
        'type': 'Ready', 'status': 'True' if ready else 'False',
        'reason': 'KubeletReady' if ready else 'KubeletNotReady',
        'message': 'kubelet is posting ready status' if ready else 'node is rebooting (lab)',
        'lastHeartbeatTime': now, 'lastTransitionTime': now}]}}


def _write(path: pathlib.Path, text: str) -> None:
    """Atomically: the DCGM stand-in reads these files at every scrape."""
    tmp = path.with_name(path.name + '.tmp')
    tmp.write_text(text)
    os.replace(tmp, path)


def wait_scraped(prometheus: str, name: str, driver: str | None, since: float) -> float | None:
    """Seconds until Prometheus holds a sample of the node taken after `since`; None past the bound."""
    query = 'timestamp(dcgm_lab_driver_info{Hostname="%s",DCGM_FI_DRIVER_VERSION="%s"})' % (name, driver or '')
    url = prometheus.rstrip('/') + '/api/v1/query?' + urllib.parse.urlencode({'query': query})
    deadline = time.monotonic() + SCRAPE_TIMEOUT
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                result = json.loads(resp.read().decode())['data']['result']
            if result and float(result[0]['value'][1]) >= since:
                return round(time.time() - since, 2)
        except (OSError, ValueError, KeyError, IndexError):
            pass
        time.sleep(0.2)
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ('reboot', 'reload'):
        print(json.dumps({'failed': True, 'msg': 'usage: lab_node.py <lab dir> reboot|reload <node>'}))
        return 2
    lab, mode, name = pathlib.Path(argv[0]), argv[1], argv[2]
    conf = json.loads((lab / 'lab.json').read_text())
    node_dir = lab / 'nodes' / name
    driver = installed_driver(node_dir / 'root')
    state = json.loads((node_dir / 'nvml.json').read_text())
    state['driver_version'] = driver
    _write(node_dir / 'nvml.json', json.dumps(state, indent=1))
    text = (node_dir / 'nvml.state').read_text()
    (node_dir / 'nvml.state').write_text(re.sub(r'(?m)^driver_version .*$', 'driver_version %s' % driver, text))
    api, path = conf['api'], '/api/v1/nodes/' + name
    major, minor, rev = (driver or '0.0.0').split('.')
    _patch(api, path, {'metadata': {'labels': {
        'nvidia.com/cuda.driver.major': major, 'nvidia.com/cuda.driver.minor': minor,
        'nvidia.com/cuda.driver.rev': rev}}})
    stuck = name in conf.get('stuck', [])
    if mode == 'reboot' or stuck:
        _patch(api, path + '/status', _ready_patch(False))
        if not stuck:
            _patch(api, path + '/status', _ready_patch(True))
    fault = conf.get('fault') == name and driver == conf['target_driver']
    when = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%S+00:00')
    _write(node_dir / 'dcgm.since', when + '\n')
    if fault and conf.get('fault_kind', 'xid') == 'xid':
        bus = state['gpus'][3]['bus_id'][4:14].lower()
        with open(node_dir / 'kern.log', 'a', encoding='utf-8') as log:
            log.write('%s %s kernel: NVRM: Xid (PCI:%s): 79, pid=0, name=lab, GPU has fallen off the bus.\n'
                      % (when, name, bus))
    scraped = wait_scraped(conf['prometheus'], name, driver, time.time()) if conf.get('prometheus') else None
    print(json.dumps({'changed': True, 'driver': driver, 'ready': not stuck, 'fault': fault, 'mode': mode,
                      'scraped': scraped}))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
