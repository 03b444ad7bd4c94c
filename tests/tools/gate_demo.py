"""`make lab` until the emulated fleet exists: the upgrade gate on a fresh example record.

Writes `.lab/gpu-upgrade-qualification.yaml` (the seed 004 record, canary stamped now), runs
`playbooks/upgrade_check.yml` on it through ansible-runner for the seed's passing tuple and for a
blocked one (a driver the canary never qualified, on a node with one more GPU model), prints both
verdicts, and exits 0 only when the PASS passed and the block blocked.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shutil
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / '.venv' / 'collections'), str(REPO / 'tests')]

import ansible_runner  # noqa: E402

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _qualification as q  # noqa: E402
from tools.records import CURRENT, PCI_IDS, TARGET, seed_dict, with_canary  # noqa: E402

GATE_TASK = 'Run the GPU upgrade gate'


def write_record(lab: pathlib.Path) -> pathlib.Path:
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    path = lab / 'gpu-upgrade-qualification.yaml'
    path.write_text(q.dump_record(with_canary(seed_dict(), completedAt=now)))
    return path


def run_gate(lab: pathlib.Path, name: str, extravars: dict) -> tuple[str, dict]:
    """Run the playbook; return (runner status, the gate task's result)."""
    pdd = lab / 'runner' / name
    shutil.rmtree(pdd, ignore_errors=True)
    (pdd / 'project').mkdir(parents=True)
    gate: dict = {}

    def on_event(event: dict) -> bool:
        data = event.get('event_data', {})
        if data.get('task') == GATE_TASK and event.get('event') in ('runner_on_ok', 'runner_on_failed'):
            gate.update(data.get('res') or {})
        return True

    env = {key: os.environ[key] for key in ('PATH', 'HOME') if key in os.environ}
    env.update({
        'ANSIBLE_COLLECTIONS_PATH': str(REPO / '.venv' / 'collections'),
        'ANSIBLE_NOCOLOR': '1',
        'ANSIBLE_RETRY_FILES_ENABLED': '0',
    })
    inventory = {'all': {'hosts': {'localhost': {'ansible_connection': 'local',
                                                 'ansible_python_interpreter': sys.executable}}}}
    result = ansible_runner.run(
        private_data_dir=str(pdd), playbook=str(REPO / 'playbooks' / 'upgrade_check.yml'),
        inventory=inventory, extravars=extravars, envvars=env, quiet=True, event_handler=on_event,
        timeout=300)
    return result.status, gate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--dir', type=pathlib.Path, default=REPO / '.lab', help='where to write (default: .lab)')
    lab = parser.parse_args().dir.resolve()
    lab.mkdir(parents=True, exist_ok=True)
    record = write_record(lab)
    print('lab: wrote %s (canary completed now)' % record)
    cases = [
        ('pass', True, {'gpufleet_qualification_file': str(record), 'gpufleet_pci_ids': PCI_IDS,
                        'gpufleet_current': CURRENT, 'gpufleet_target': TARGET}),
        ('block', False, {'gpufleet_qualification_file': str(record),
                          'gpufleet_pci_ids': PCI_IDS + ['10de:2330/10de:16c1'],
                          'gpufleet_current': CURRENT,
                          'gpufleet_target': dict(TARGET, driver='580.130.01')}),
    ]
    ok = True
    for name, want_pass, extravars in cases:
        (lab / ('%s-vars.json' % name)).write_text(json.dumps(extravars, indent=2))
        status, gate = run_gate(lab, name, extravars)
        passed = gate.get('passed')
        verdict = 'PASS' if passed is True else ('BLOCKED' if passed is False else 'NO VERDICT (%s)' % status)
        expected = status == ('successful' if want_pass else 'failed') and passed is want_pass
        ok = ok and expected
        print('\n== %s tuple: %s (%s)' % (name, verdict, 'as expected' if expected else 'NOT as expected'))
        print('   ' + gate.get('msg', 'the gate task did not run; see %s' % (lab / 'runner' / name)))
        for problem in gate.get('problems', []):
            print('   - ' + problem)
    print('\nlab: %s' % ('OK: the qualified tuple passed and the other one was blocked' if ok else 'FAILED'))
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
