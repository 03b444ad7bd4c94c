"""gpufleet.upgrade.intake_check through ansible-playbook (ansible-runner)."""
from __future__ import annotations

QUOTA = {'apiVersion': 'v1', 'kind': 'ResourceQuota',
         'metadata': {'name': 'gpu-intake', 'namespace': 'tenant-a', 'uid': 'q-uid', 'resourceVersion': '7'},
         'spec': {'hard': {'requests.nvidia.com/gpu': '0'}}}
BINDING = {'apiVersion': 'admissionregistration.k8s.io/v1', 'kind': 'ValidatingAdmissionPolicyBinding',
           'metadata': {'name': 'deny-gpu-vmi'}, 'spec': {'validationActions': ['Deny']}}
CHECKS = [
    {'api_version': 'v1', 'kind': 'ResourceQuota', 'namespace': 'tenant-a', 'name': 'gpu-intake',
     'field': 'spec.hard["requests.nvidia.com/gpu"]', 'closed_values': [0, '0m']},
    {'api_version': 'admissionregistration.k8s.io/v1', 'kind': 'ValidatingAdmissionPolicyBinding',
     'name': 'deny-gpu-vmi', 'field': 'spec.validationActions', 'closed_values': [['Deny']]},
]


def _play(args, check=False):
    return [{'name': 'intake', 'hosts': 'localhost', 'gather_facts': False, 'check_mode': check, 'tasks': [
        {'name': 'intake', 'gpufleet.upgrade.intake_check': args, 'register': 'intake', 'ignore_errors': True},
    ]}]


def test_closed_passes_with_evidence(run_playbook):
    for check in (False, True):
        res = run_playbook(_play({'checks': CHECKS, 'objects': [BINDING, QUOTA]}, check)).result('intake')
        assert res['_event'] == 'runner_on_ok' and res['changed'] is False
        assert res['closed'] is True and res['summary'] == 'GPU intake closed: 2/2 check(s) closed'
        assert [(c['status'], c['value']) for c in res['checks']] == [('closed', '0'), ('closed', ['Deny'])]
        assert res['checks'][0]['uid'] == 'q-uid' and res['checks'][0]['resource_version'] == '7'


def test_open_or_missing_fails_with_evidence(run_playbook):
    open_quota = {**QUOTA, 'spec': {'hard': {'requests.nvidia.com/gpu': '16'}}}
    res = run_playbook(_play({'checks': CHECKS, 'objects': [open_quota]})).result('intake')
    assert res['_event'] == 'runner_on_failed' and res['closed'] is False
    assert [c['status'] for c in res['checks']] == ['open', 'missing_object']
    assert res['msg'].startswith('GPU intake NOT closed: 2/2 check(s) open or missing: v1 ResourceQuota '
                                 "tenant-a/gpu-intake spec.hard[\"requests.nvidia.com/gpu\"] = '16' is not one of")


def test_malformed_field_fails_naming_it(run_playbook):
    bad = [dict(CHECKS[0], field='spec..hard')]
    res = run_playbook(_play({'checks': bad, 'objects': [QUOTA]})).result('intake')
    assert res['_event'] == 'runner_on_failed'
    assert res['msg'] == "checks[0].field: 'spec..hard' has an empty segment at position 5"
