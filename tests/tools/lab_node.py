"""The lab reboot path: what a reboot (or a driver reload) does to an emulated lab node.

    python lab_node.py <lab dir> reboot|reload <node>

Used by the node_upgrade and rollback roles when `*_activation: lab` (never on real hosts):

1. the NVML stand-in state follows the install root: its driver version is rewritten from
   `dpkg-query` of the node's root (what loading the installed kernel module does);
2. the Node's driver labels follow, as GPU Feature Discovery relabels a real node;
3. `reboot` is what a reboot does to the Node on the real control plane (tests/cluster): the
   node's kubelet stops (`stop_kubelet`: Ready False, KWOK no longer plays it), the Node's
   `status.nodeInfo` changes as the kubelet reports it after the boot (a new bootID, the running
   kernel from the node's `proc/sys/kernel/osrelease`), then the kubelet starts again
   (`start_kubelet`: KWOK sets Ready) and, once the Node is Ready, the node's pods are Ready again
   (the kubelet restarted their containers: the node lifecycle controller may have marked them not
   Ready meanwhile). No sleep stands for the boot. Nodes listed in lab.json `stuck` stay stopped
   (a node that does not come back);
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
import uuid

SCRAPE_TIMEOUT = 15.0   # seconds the hook waits for Prometheus to scrape the node after the change

READY_TIMEOUT = 30.0    # seconds the hook waits for KWOK to set a rebooted node Ready

# This hook runs on every lab activation, so it stays light: no kubernetes client, no pytest; it
# talks to the API server with the lab's setup identity (lab.json `kubeconfig`, a client
# certificate, straight to the API server: it plays the kubelet and GPU Feature Discovery, not the
# collection, so its requests are not in the fault proxy's log), and only the driver_version line
# of the stand-in's state file changes (tests/tools/nvml_stub/README.md).


def installed_driver(root: pathlib.Path) -> str | None:
    """The upstream version of the driver package installed under `root` (dpkg-query)."""
    out = subprocess.run(['dpkg-query', '--admindir=%s/var/lib/dpkg' % root, '-W', '-f=${Version} ${db:Status-Abbrev}',
                          'nvidia-driver-580-server'], capture_output=True, text=True, check=False)
    parts = out.stdout.split()
    if out.returncode != 0 or len(parts) < 2 or parts[1] not in ('ii', 'hi'):
        return None
    return parts[0].split('-', 1)[0]


def _api(kubeconfig: str):  # type: ignore[no-untyped-def]
    import yaml
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from cluster.client import ApiClient
    conf = yaml.safe_load(pathlib.Path(kubeconfig).read_text())
    cluster = conf['clusters'][0]['cluster']
    user = conf['users'][0]['user']
    cert = (user['client-certificate'], user['client-key']) if 'client-certificate' in user else None
    return ApiClient(cluster['server'], cluster['certificate-authority'], cert=cert, token=user.get('token'))


MERGE = 'application/merge-patch+json'
STOPPED = 'gpufleet.test/kubelet'     # tests/cluster: KWOK leaves a Node so annotated alone


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')


def stop_kubelet(api, name: str) -> None:  # type: ignore[no-untyped-def]
    """As tests/cluster Cluster.stop_kubelet: KWOK stops playing the node, its Ready condition goes False."""
    path = '/api/v1/nodes/' + name
    api.request('PATCH', path, {'metadata': {'annotations': {STOPPED: 'stopped'}}}, content_type=MERGE)
    cur = api.request('GET', path)
    conds = [c for c in (cur.get('status') or {}).get('conditions') or [] if c.get('type') != 'Ready']
    conds.append({'type': 'Ready', 'status': 'False', 'reason': 'KubeletNotReady',
                  'message': 'node is rebooting (lab)', 'lastHeartbeatTime': _now(), 'lastTransitionTime': _now()})
    api.request('PATCH', path + '/status', {'status': {'conditions': conds}},
                content_type='application/strategic-merge-patch+json')


def start_kubelet(api, name: str) -> None:  # type: ignore[no-untyped-def]
    """As tests/cluster Cluster.start_kubelet: KWOK plays the node's kubelet again (and sets it Ready)."""
    api.request('PATCH', '/api/v1/nodes/' + name, {'metadata': {'annotations': {STOPPED: None}}}, content_type=MERGE)


def boot(api, name: str, node_dir: pathlib.Path) -> bool:  # type: ignore[no-untyped-def]
    """After the kubelet stopped: the boot's nodeInfo, the kubelet back, the node's pods Ready again."""
    path = '/api/v1/nodes/' + name
    info = dict((api.request('GET', path).get('status') or {}).get('nodeInfo') or {})
    kernel = (node_dir / 'proc' / 'sys' / 'kernel' / 'osrelease').read_text().strip()
    info.update(kernelVersion=kernel, bootID=str(uuid.uuid4()))
    api.request('PATCH', path + '/status', {'status': {'nodeInfo': info}}, content_type=MERGE)
    start_kubelet(api, name)
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        conds = {c['type']: c['status'] for c in api.request('GET', path)['status'].get('conditions') or []}
        if conds.get('Ready') == 'True':
            break
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    pods = api.request('GET', '/api/v1/pods', query={'fieldSelector': 'spec.nodeName=' + name})['items']
    for pod in pods:
        meta, status = pod['metadata'], pod.get('status') or {}
        conds = status.get('conditions') or []
        if meta.get('deletionTimestamp') or status.get('phase') != 'Running' or \
                all(c['status'] == 'True' for c in conds if c['type'] in ('Ready', 'ContainersReady')):
            continue
        now = _now()
        fixed = [dict(c, status='True', lastTransitionTime=now) if c['type'] in ('Ready', 'ContainersReady') else c
                 for c in conds if c['type']]
        containers = [dict(c, ready=True, restartCount=c.get('restartCount', 0) + 1, state={'running': {'startedAt': now}})
                      for c in status.get('containerStatuses') or []]
        api.request('PATCH', '/api/v1/namespaces/%s/pods/%s/status' % (meta['namespace'], meta['name']),
                    {'status': {'conditions': fixed, 'containerStatuses': containers}},
                    content_type='application/strategic-merge-patch+json', ok404=True)
    return True


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
    api = _api(conf['kubeconfig'])
    major, minor, rev = (driver or '0.0.0').split('.')
    api.request('PATCH', '/api/v1/nodes/' + name, {'metadata': {'labels': {
        'nvidia.com/cuda.driver.major': major, 'nvidia.com/cuda.driver.minor': minor,
        'nvidia.com/cuda.driver.rev': rev}}}, content_type=MERGE)
    stuck = name in conf.get('stuck', [])
    ready = not stuck
    if mode == 'reboot' or stuck:
        stop_kubelet(api, name)
        if not stuck:
            ready = boot(api, name, node_dir)
    fault = conf.get('fault') == name and driver == conf['target_driver']
    when = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%S+00:00')
    _write(node_dir / 'dcgm.since', when + '\n')
    if fault and conf.get('fault_kind', 'xid') == 'xid':
        bus = state['gpus'][3]['bus_id'][4:14].lower()
        with open(node_dir / 'kern.log', 'a', encoding='utf-8') as log:
            log.write('%s %s kernel: NVRM: Xid (PCI:%s): 79, pid=0, name=lab, GPU has fallen off the bus.\n'
                      % (when, name, bus))
    scraped = wait_scraped(conf['prometheus'], name, driver, time.time()) if conf.get('prometheus') else None
    print(json.dumps({'changed': True, 'driver': driver, 'ready': ready, 'fault': fault, 'mode': mode,
                      'scraped': scraped}))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
