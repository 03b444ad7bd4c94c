"""The emulator's pod-lifecycle simulator (scheduler, kubelet, Job controller), through the real
kubernetes client and kubectl."""
from __future__ import annotations

import shutil
import subprocess

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from emulator import fixtures as f


@pytest.fixture
def core(emulator):
    return client.CoreV1Api(config.new_client_from_config(config_file=emulator.kubeconfig))


@pytest.fixture
def batch(emulator):
    return client.BatchV1Api(config.new_client_from_config(config_file=emulator.kubeconfig))


def job_pods(emu, job, ns='default'):
    return emu.list('v1', 'Pod', ns, label_selector='batch.kubernetes.io/job-name=%s' % job)


def test_bound_pod_becomes_running_and_ready(emulator, core):
    emulator.apply(f.node('n1', internal_ip='10.9.9.9'))
    core.create_namespaced_pod('default', {'metadata': {'name': 'p'}, 'spec': {
        'nodeName': 'n1', 'containers': [{'name': 'a', 'image': 'x'}, {'name': 'b', 'image': 'y'}]}})
    pod = emulator.wait_for(lambda: (emulator.get('v1', 'Pod', 'p') or {}).get('status', {}).get('phase') == 'Running'
                            and emulator.get('v1', 'Pod', 'p'), message='pod Running')
    conds = {c['type']: c['status'] for c in pod['status']['conditions']}
    assert conds['Ready'] == 'True' and conds['ContainersReady'] == 'True'
    assert [c['name'] for c in pod['status']['containerStatuses']] == ['a', 'b']
    assert all(c['ready'] and 'running' in c['state'] for c in pod['status']['containerStatuses'])
    assert pod['status']['hostIP'] == '10.9.9.9'


def test_job_runs_on_a_matching_node_and_succeeds_with_logs(emulator, batch, core):
    emulator.apply([f.gpu_node('cpu-1', gpus=0, labels={'pool': 'cpu'}),
                    f.gpu_node('gpu-1', labels={'pool': 'gpu'}, unschedulable=True),
                    f.gpu_node('gpu-2', labels={'pool': 'gpu'})])
    emulator.simulator.job('burn', duration=0.3, logs='gpu-burn: 8 GPUs OK\nPASS\n')
    batch.create_namespaced_job('default', f.job('burn', node_selector={'pool': 'gpu'}))
    done = emulator.wait_for(lambda: (emulator.get('batch/v1', 'Job', 'burn').get('status') or {}).get('succeeded'),
                             message='job succeeded')
    assert done == 1
    job = batch.read_namespaced_job('burn', 'default')
    assert [c.type for c in job.status.conditions if c.status == 'True'] == ['SuccessCriteriaMet', 'Complete']
    assert job.status.completion_time is not None and job.status.active == 0
    pods = job_pods(emulator, 'burn')
    assert len(pods) == 1
    pod = pods[0]
    assert pod['spec']['nodeName'] == 'gpu-2'      # gpu-1 is cordoned, cpu-1 does not match
    assert pod['status']['phase'] == 'Succeeded'
    assert pod['status']['containerStatuses'][0]['state']['terminated']['exitCode'] == 0
    assert core.read_namespaced_pod_log(pod['metadata']['name'], 'default') == 'gpu-burn: 8 GPUs OK\nPASS\n'
    assert core.read_namespaced_pod_log(pod['metadata']['name'], 'default', tail_lines=1) == 'PASS\n'


def test_job_failure_retries_up_to_backoff_limit(emulator, batch):
    emulator.apply(f.node('n1'))
    emulator.simulator.job('flaky', duration=0.05, outcome=['Failed', 'Failed', 'Succeeded'], logs='boom')
    batch.create_namespaced_job('default', f.job('flaky', backoff_limit=1))
    emulator.wait_for(lambda: any(c['type'] == 'Failed' for c in
                                  (emulator.get('batch/v1', 'Job', 'flaky').get('status') or {}).get('conditions', [])),
                      message='job failed')
    status = emulator.get('batch/v1', 'Job', 'flaky')['status']
    assert status['failed'] == 2 and status['succeeded'] == 0
    phases = sorted(p['status']['phase'] for p in job_pods(emulator, 'flaky'))
    assert phases == ['Failed', 'Failed']
    assert job_pods(emulator, 'flaky')[0]['status']['containerStatuses'][0]['state']['terminated']['exitCode'] == 1


def test_job_pod_stays_pending_without_a_fitting_node(emulator, batch):
    emulator.apply(f.node('n1', labels={'pool': 'cpu'}))
    batch.create_namespaced_job('default', f.job('wait', node_selector={'pool': 'gpu'}))
    pod = emulator.wait_for(lambda: job_pods(emulator, 'wait'), message='job pod')[0]
    emulator.settle()
    pod = emulator.get('v1', 'Pod', pod['metadata']['name'])
    assert pod['status']['phase'] == 'Pending' and 'nodeName' not in pod['spec']
    assert pod['status']['conditions'][0]['reason'] == 'Unschedulable'
    # a node that fits appears: the pod is scheduled and runs
    emulator.simulator.job('wait', duration=30)
    emulator.apply(f.node('g1', labels={'pool': 'gpu'}))
    pod = emulator.wait_for(lambda: emulator.get('v1', 'Pod', pod['metadata']['name'])['status']['phase'] == 'Running'
                            and emulator.get('v1', 'Pod', pod['metadata']['name']), message='scheduled')
    assert pod['spec']['nodeName'] == 'g1'


def test_pods_tolerating_the_cordon_are_scheduled_there(emulator, core):
    emulator.apply(f.node('n1', unschedulable=True))
    core.create_namespaced_pod('default', {'metadata': {'name': 'ds-like'}, 'spec': {
        'tolerations': [{'key': 'node.kubernetes.io/unschedulable', 'operator': 'Exists', 'effect': 'NoSchedule'}],
        'containers': [{'name': 'c', 'image': 'x'}]}})
    core.create_namespaced_pod('default', {'metadata': {'name': 'plain'}, 'spec': {
        'containers': [{'name': 'c', 'image': 'x'}]}})
    emulator.settle()
    assert emulator.get('v1', 'Pod', 'ds-like')['spec']['nodeName'] == 'n1'
    assert 'nodeName' not in emulator.get('v1', 'Pod', 'plain')['spec']


def test_deleted_replicaset_pod_comes_back_with_a_new_uid(emulator, core):
    emulator.simulator.recreate_owned_pods = True
    rs = f.replicaset('web')
    emulator.apply([f.node('n1'), f.node('n2'), rs, f.replicaset_pod(rs, 'n1', name='web-0')])
    old_uid = emulator.get('v1', 'Pod', 'web-0')['metadata']['uid']
    core.patch_node('n1', {'spec': {'unschedulable': True}})
    core.delete_namespaced_pod('web-0', 'default', grace_period_seconds=0)
    new = emulator.wait_for(lambda: emulator.get('v1', 'Pod', 'web-0'), message='recreated pod')
    assert new['metadata']['uid'] != old_uid
    emulator.settle()
    assert emulator.get('v1', 'Pod', 'web-0')['spec']['nodeName'] == 'n2'   # not on the cordoned node
    # without the owner nothing comes back
    emulator.delete('apps/v1', 'ReplicaSet', 'web')   # garbage collection deletes its pod too
    emulator.wait_for(lambda: emulator.get('v1', 'Pod', 'web-0') is None, message='pod collected')


def test_graceful_deletion_is_two_phase(emulator, core):
    emulator.simulator.max_grace_seconds = 2   # long enough to observe the terminating state under load
    emulator.apply([f.node('n1'), f.pod('p', 'n1', termination_grace=60)])
    deleted = core.delete_namespaced_pod('p', 'default')
    assert deleted.metadata.deletion_timestamp is not None and deleted.metadata.deletion_grace_period_seconds == 60
    assert emulator.get('v1', 'Pod', 'p') is not None
    emulator.wait_for(lambda: emulator.get('v1', 'Pod', 'p') is None, message='pod removed')
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod('p', 'default')
    assert exc.value.status == 404


def test_finalizers_hold_deletion(emulator, core):
    emulator.apply(f.configmap('c', {'a': 'b'}))
    emulator.patch('v1', 'ConfigMap', 'c', {'metadata': {'finalizers': ['example.com/hold']}})
    core.delete_namespaced_config_map('c', 'default')
    held = emulator.get('v1', 'ConfigMap', 'c')
    assert held['metadata']['deletionTimestamp']
    core.patch_namespaced_config_map('c', 'default', {'metadata': {'finalizers': None}})
    assert emulator.get('v1', 'ConfigMap', 'c') is None


@pytest.mark.skipif(shutil.which('kubectl') is None, reason='kubectl is not installed')
def test_kubectl_logs_and_wait_on_a_job(emulator, tmp_path):
    emulator.apply(f.gpu_node('gpu-1'))
    manifest = tmp_path / 'job.yaml'
    manifest.write_text('''
apiVersion: batch/v1
kind: Job
metadata: {name: smoke}
spec:
  backoffLimit: 0
  template:
    metadata:
      annotations: {emulator.gpufleet.io/duration: "0.2", emulator.gpufleet.io/logs: "all GPUs healthy\\n"}
    spec:
      restartPolicy: Never
      nodeSelector: {nvidia.com/gpu.present: "true"}
      containers: [{name: smoke, image: nvcr.io/nvidia/cuda:13.0.0-base-ubuntu24.04}]
''')
    base = [shutil.which('kubectl'), '--kubeconfig', emulator.kubeconfig]
    r = subprocess.run(base + ['create', '-f', str(manifest)], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(base + ['wait', '--for=condition=complete', 'job/smoke', '--timeout=20s'],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0 and 'condition met' in r.stdout, r.stderr
    r = subprocess.run(base + ['logs', 'job/smoke'], capture_output=True, text=True, check=False)
    assert r.returncode == 0 and r.stdout == 'all GPUs healthy\n', r.stderr


def test_virtual_machine_stop_and_start(emulator):
    emulator.simulator.vm_controller = True
    vm = f.virtual_machine('gpu-vm', running=True, gpus=[{'name': 'gpu0', 'deviceName': 'nvidia.com/GH100'}])
    vmi = f.vmi('gpu-vm', 'gpu-1', vm=vm)
    emulator.apply([f.gpu_node('gpu-1'), f.gpu_node('gpu-2'), vm, vmi, f.virt_launcher_pod(vmi)])
    assert emulator.get('kubevirt.io/v1', 'VirtualMachine', 'gpu-vm')['status']['printableStatus'] == 'Running'
    emulator.patch('kubevirt.io/v1', 'VirtualMachine', 'gpu-vm', {'spec': {'running': False}})
    emulator.wait_for(lambda: emulator.get('kubevirt.io/v1', 'VirtualMachineInstance', 'gpu-vm') is None,
                      message='VMI deleted')
    emulator.wait_for(lambda: emulator.list('v1', 'Pod', label_selector='kubevirt.io=virt-launcher') == [],
                      message='launcher pod deleted')
    emulator.settle()
    status = emulator.get('kubevirt.io/v1', 'VirtualMachine', 'gpu-vm')['status']
    assert (status['printableStatus'], status['ready'], status['created']) == ('Stopped', False, False)
    emulator.apply(f.node('gpu-1', unschedulable=True))   # gpu-1 cordoned: it starts on gpu-2
    emulator.patch('kubevirt.io/v1', 'VirtualMachine', 'gpu-vm', {'spec': {'running': None,
                                                                           'runStrategy': 'Always'}})
    new = emulator.wait_for(lambda: emulator.get('kubevirt.io/v1', 'VirtualMachineInstance', 'gpu-vm'),
                            message='VMI recreated')
    assert new['status']['nodeName'] == 'gpu-2' and new['metadata']['uid'] != vmi['metadata']['uid']
    assert new['spec']['domain']['devices']['gpus'][0]['deviceName'] == 'nvidia.com/GH100'
    emulator.settle()
    assert emulator.get('kubevirt.io/v1', 'VirtualMachine', 'gpu-vm')['status']['printableStatus'] == 'Running'
    launchers = emulator.list('v1', 'Pod', label_selector='kubevirt.io=virt-launcher')
    assert len(launchers) == 1 and launchers[0]['spec']['nodeName'] == 'gpu-2'
    assert launchers[0]['status']['phase'] == 'Running'


def test_readme_fixture_example(emulator):
    """The example in tests/emulator/README.md applies as written."""
    rs = f.replicaset('train', 'ml', replicas=2)
    vm = f.virtual_machine('vm-gpu', 'vms')
    vmi = f.vmi('vm-gpu', 'gpu-1', 'vms', gpus=1, vm=vm)
    emulator.apply([
        f.gpu_node('gpu-1', gpus=8), f.gpu_node('gpu-2', mig={'1g.10gb': 7}),
        rs, f.gpu_pod('train-0', 'gpu-1', namespace='ml', owner=f.owner_ref(rs), labels={'app': 'train'}),
        f.gpu_pod('infer', 'gpu-2', resource='nvidia.com/mig-1g.10gb'),
        f.pod('rt-only', 'gpu-1', runtime_class='nvidia'),
        f.pod('scratch', 'gpu-1', volumes=[f.emptydir_volume()]),
        vm, vmi, f.virt_launcher_pod(vmi),
        f.resource_claim('claim', node='gpu-1', devices=['gpu-3']),
        f.pdb('train', {'app': 'train'}, 'ml', min_available=1),
    ])
    gpu2 = emulator.get('v1', 'Node', 'gpu-2')
    assert gpu2['status']['allocatable']['nvidia.com/mig-1g.10gb'] == '7'
    on_gpu1 = emulator.list('v1', 'Pod', field_selector='spec.nodeName=gpu-1')
    assert len(on_gpu1) == 4
    assert emulator.get('policy/v1', 'PodDisruptionBudget', 'train', 'ml')['status']['disruptionsAllowed'] == 0
    claim = emulator.get('resource.k8s.io/v1', 'ResourceClaim', 'claim')
    assert claim['status']['allocation']['devices']['results'][0]['device'] == 'gpu-3'


def test_daemonset_controller(emulator, core):
    emulator.simulator.daemonset_controller = True
    ds = f.daemonset('dcgm-exporter', 'gpu-operator', template_spec={
        'nodeSelector': {'nvidia.com/gpu.present': 'true'}, 'containers': [f.container('dcgm')]})
    emulator.apply([f.gpu_node('gpu-1'), f.gpu_node('gpu-2', unschedulable=True), f.node('cpu-1'), ds])
    emulator.settle()
    pods = emulator.list('v1', 'Pod', 'gpu-operator')
    assert sorted(p['spec']['nodeName'] for p in pods) == ['gpu-1', 'gpu-2']   # the cordon is tolerated
    assert all(p['status']['phase'] == 'Running' for p in emulator.list('v1', 'Pod', 'gpu-operator'))
    status = emulator.get('apps/v1', 'DaemonSet', 'dcgm-exporter', 'gpu-operator')['status']
    assert (status['desiredNumberScheduled'], status['numberReady']) == (2, 2)
    victim = [p for p in pods if p['spec']['nodeName'] == 'gpu-1'][0]
    core.delete_namespaced_pod(victim['metadata']['name'], 'gpu-operator', grace_period_seconds=0)
    emulator.settle()
    again = [p for p in emulator.list('v1', 'Pod', 'gpu-operator') if p['spec']['nodeName'] == 'gpu-1']
    assert len(again) == 1 and again[0]['metadata']['uid'] != victim['metadata']['uid']
    emulator.apply(f.gpu_node('gpu-3'))
    emulator.settle()
    assert len(emulator.list('v1', 'Pod', 'gpu-operator')) == 3
